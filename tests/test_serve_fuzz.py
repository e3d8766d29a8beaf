"""The HTTP API fuzzed from its own /openapi.json by Schemathesis (issue 18).

Schemathesis reads the schema the server serves (protocol.py's models with this server's
bounds) and generates requests that fit it (positive) and that break it (negative), on
every route. For each answer: no 5xx, the status and content type documented, the body
as the schema says, every error in OpenAI's shape, and a request that breaks the schema
refused with a 4xx. Bounded: a tiny random model, answers of at most 8 tokens, a fixed
number of examples (seconds on 2 cores).
"""

import json
import time
from collections import Counter

import pytest
import schemathesis
from checkpoints import write_checkpoint
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from test_serve import serve, wait_until_idle

from minipaged import LLM

EXAMPLES = 400  # per generation mode
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
]


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    folder = write_checkpoint(tmp_path_factory.mktemp("fuzz") / "tiny")
    return LLM(str(folder), device="cpu", num_blocks=64, block_size=4)


def openai_error_shape(response) -> None:
    """An error is {"error": {"message", "type", "param", "code"}}, its code the HTTP
    status."""
    if response.status_code < 400:
        return
    body = json.loads(response.content)
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert (
        error["code"] == response.status_code
        and error["message"]
        and error["type"].endswith("Error")
    ), error


@pytest.mark.parametrize(
    "mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str
)
def test_the_api_fuzzed_from_its_own_openapi_schema(tiny_llm, mode, capsys):
    checks = [getattr(schemathesis.checks, name) for name in CHECKS]
    statuses, server_errors, failures = Counter(), [], []
    started = time.monotonic()
    with serve(
        tiny_llm,
        num_blocks=64,
        block_size=4,
        max_num_seqs=4,
        max_waiting=4,
        max_tokens_limit=8,
    ) as url:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=schema.as_strategy(generation_mode=mode))
        def fuzz(case):
            response = case.call(base_url=url, timeout=30)
            statuses[response.status_code] += 1
            if response.status_code >= 500:
                server_errors.append(
                    f"{case.method} {case.path} {case.body!r:.300} ->"
                    f" {response.text[:300]}"
                )
            try:
                case.validate_response(response, checks=checks)
                openai_error_shape(response)
            except (
                AssertionError,
                schemathesis.errors.FailureGroup,
            ) as failure:  # each is reported below
                failures.append(
                    f"{case.method} {case.path} {case.body!r:.300} ->"
                    f" {response.status_code} {response.text[:300]}\n "
                    f" {str(failure)[:600]}"
                )

        fuzz()
        # and nothing of the fuzzing stays in the engine
        wait_until_idle(url, seconds=10)
    seconds = time.monotonic() - started
    with capsys.disabled():  # in `make test`'s output too, not only with -s
        print(
            f"\nSchemathesis ({mode} data): {sum(statuses.values())} requests in"
            f" {seconds:.1f} s, statuses {dict(sorted(statuses.items()))},"
            f" {len(server_errors)} server errors, {len(failures)} failed checks"
        )
    assert sum(statuses.values()) >= EXAMPLES // 2
    assert not server_errors, "\n".join(server_errors[:5])
    assert not failures, "\n".join(failures[:5])
    if mode == GenerationMode.POSITIVE:
        assert statuses[200] >= EXAMPLES // 5  # the engine answered, not only the doors
