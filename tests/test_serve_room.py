"""Issue 19, a room cannot be swamped: each client's share of the batch
(--max-concurrent-per-client, opt-in since issue 40).

A client past its share gets OpenAI's 429 at once, with a Retry-After estimated from its
requests in flight, while every other client is served; its slots come back when its
answers finish or when it hangs up; a client is its address and its key; 0 (the
default) turns the bound off, and the command line's defaults then serve a batch of 64
from one client by queueing, in the fair order. Servers listen on 127.0.0.1 on free
ports; every wait is bounded.
"""

import concurrent.futures
import contextlib
import io
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from checkpoints import write_checkpoint
from test_serve import metric, wait_until_idle

from minipaged import LLM
from minipaged.tools.serve import cli as serve_cli
from minipaged.tools.serve.api import ClientSlots, Server, ServerConfig
from minipaged.tools.serve.cli import ServerThread
from minipaged.tools.serve.protocol import APIError

ROOT = Path(__file__).resolve().parent.parent
LONG = {
    "prompt": "one two three",
    "max_tokens": 400,
    "ignore_eos": True,
    "stream": True,
}
SHORT = {"prompt": "one two", "max_tokens": 2, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    folder = write_checkpoint(
        tmp_path_factory.mktemp("room") / "tiny", max_positions=512
    )
    return LLM(str(folder), device="cpu", num_blocks=16, block_size=4)


@contextlib.contextmanager
def room(llm, step_seconds: float = 0.01, **config):
    """(server, url): a server whose every step lasts at least step_seconds, so that a
    LONG stream (400 tokens) stays unfinished for seconds while the test looks at it."""
    engine = llm.new_engine(num_blocks=512, block_size=4, max_num_seqs=16)
    step = engine.step
    engine.step = lambda: (time.sleep(step_seconds), step())[1]
    server = Server(engine, llm.tokenizer, ServerConfig(model_name="tiny", **config))
    with ServerThread(server) as url:
        yield server, url


def http(url: str, key: str | None = None, address: str = "127.0.0.1") -> httpx.Client:
    """A client with its own key (or none), from its own loopback address."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(
        base_url=url,
        headers=headers,
        timeout=30,
        transport=httpx.HTTPTransport(local_address=address),
    )


def hold(stack: contextlib.ExitStack, client: httpx.Client, **fields) -> None:
    """Open a LONG stream and keep it open until the stack closes (a hang-up): 200 means
    accepted."""
    response = stack.enter_context(
        client.stream("POST", "/v1/completions", json=LONG | fields)
    )
    assert response.status_code == 200, response.read()


def wait_for(condition, seconds: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def held(server: Server) -> dict[str, int]:
    """Sequences unfinished per client, by key (or address)."""
    return {
        client.split(" Bearer ")[-1]: count
        for client, count in dict(server.slots.held).items()
    }


def test_a_client_past_its_share_gets_a_429_and_the_others_are_served(tiny_llm):
    with (
        room(tiny_llm, max_concurrent_per_client=2) as (server, url),
        contextlib.ExitStack() as stack,
        http(url, "alice") as alice,
        http(url, "bob") as bob,
    ):
        hold(stack, alice)
        hold(stack, alice)
        refused = alice.post("/v1/completions", json=SHORT)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert (
            set(error) == {"message", "type", "param", "code"} and error["code"] == 429
        )
        assert (
            error["type"] == "RateLimitError"
            and "--max-concurrent-per-client 2" in error["message"]
        )
        # an estimate from alice's requests in flight, which a client can honour
        assert 1 <= int(refused.headers["retry-after"]) <= 60, refused.headers
        with pytest.raises(
            openai.RateLimitError, match="already has 2 sequences unfinished"
        ):
            openai.OpenAI(
                base_url=f"{url}/v1", api_key="alice", max_retries=0
            ).chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        answer = bob.post("/v1/completions", json=SHORT)  # while alice's two run
        assert (
            answer.status_code == 200
            and answer.json()["usage"]["completion_tokens"] == 2
        ), answer.text
        hold(stack, bob)
        assert held(server) == {"alice": 2, "bob": 1}
    wait_for(
        lambda: not server.slots.held,
        what=f"slots still held after every hang-up: {server.slots.held}",
    )


def test_slots_come_back_when_answers_finish_and_n_counts(tiny_llm):
    with (
        room(tiny_llm, max_concurrent_per_client=2) as (server, url),
        http(url, "alice") as alice,
    ):
        for _ in range(6):  # one after another: never a 429, nothing left counted
            assert alice.post("/v1/completions", json=SHORT).status_code == 200
            with alice.stream(
                "POST", "/v1/completions", json=SHORT | {"stream": True}
            ) as stream:
                assert stream.status_code == 200 and list(stream.iter_lines())[-2:] == [
                    "data: [DONE]",
                    "",
                ]
            assert not server.slots.held, server.slots.held
        two = alice.post("/v1/completions", json=SHORT | {"n": 2})
        assert two.status_code == 200 and len(two.json()["choices"]) == 2
        for body, param in [
            (SHORT | {"n": 3}, "n"),
            (SHORT | {"prompt": ["one", "two", "three"]}, "prompt"),
        ]:
            # it could never fit: a 400, not a 429 to retry
            never = alice.post("/v1/completions", json=body)
            assert (
                never.status_code == 400 and never.json()["error"]["param"] == param
            ), never.text
            assert "at most 2 unfinished at once" in never.json()["error"]["message"]
        with contextlib.ExitStack() as stack:
            hold(stack, alice)
            # 1 + 2 > 2
            assert (
                alice.post("/v1/completions", json=SHORT | {"n": 2}).status_code == 429
            )
            assert alice.post("/v1/completions", json=SHORT).status_code == 200  # 1 + 1
        # the abort is async
        wait_for(
            lambda: not server.slots.held, what=f"a hang-up left {server.slots.held}"
        )
        assert server.openapi()["paths"]["/v1/completions"]["post"]["responses"]["429"]


def raw_post(port: int, body: bytes) -> socket.socket:
    """POST /v1/completions without a key and without reading the answer (the caller
    hangs up)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type:"
        b" application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    return sock


def test_a_client_that_hangs_up_gives_its_slots_back(tiny_llm):
    with (
        room(tiny_llm, max_concurrent_per_client=2) as (server, url),
        http(url, "alice") as alice,
    ):
        # streams closed mid-answer, twice: the second round is not refused
        for _ in range(2):
            with contextlib.ExitStack() as stack:
                hold(stack, alice)
                hold(stack, alice, n=1)
                assert held(server) == {"alice": 2}
            wait_for(
                lambda: not server.slots.held,
                what=f"a hang-up left {server.slots.held}",
            )
        # not streamed: the answer is never read, the connection closed halfway
        port = int(url.rsplit(":", 1)[1])
        sock = raw_post(
            port,
            b'{"prompt": "one two", "max_tokens": 400, "ignore_eos": true, "n": 2}',
        )
        wait_for(
            lambda: list(server.slots.held.values()) == [2],
            what=f"not counted: {server.slots.held}",
        )
        assert list(server.slots.held) == ["127.0.0.1 "]  # no key: its address alone
        sock.close()
        wait_for(
            lambda: not server.slots.held, what=f"a hang-up left {server.slots.held}"
        )
        wait_until_idle(url)  # and the engine gave every frame back


def test_a_client_is_its_address_and_the_key_it_sends(tiny_llm):
    with (
        room(tiny_llm, max_concurrent_per_client=1) as (server, url),
        contextlib.ExitStack() as stack,
    ):
        hold(stack, stack.enter_context(http(url, "alice")))
        for key, address, status in [
            ("alice", "127.0.0.1", 429),
            ("bob", "127.0.0.1", 200),
            (None, "127.0.0.1", 200),
            ("alice", "127.0.0.2", 200),
        ]:
            with http(url, key, address) as client:
                answer = client.post("/v1/completions", json=SHORT)
                assert answer.status_code == status, (key, address, answer.text)
    # a room shares one --api-key: its laptops are told apart by their addresses
    with (
        room(tiny_llm, max_concurrent_per_client=1, api_key="room42") as (server, url),
        contextlib.ExitStack() as stack,
    ):
        hold(stack, stack.enter_context(http(url, "room42")))
        with http(url, "room42") as same, http(url, "room42", "127.0.0.3") as other:
            assert same.post("/v1/completions", json=SHORT).status_code == 429
            assert other.post("/v1/completions", json=SHORT).status_code == 200
            assert (
                same.post(
                    "/v1/completions", json=SHORT, headers={"Authorization": "Bearer x"}
                ).status_code
                == 401
            )


def test_zero_means_no_bound(tiny_llm):
    with (
        room(tiny_llm, max_concurrent_per_client=0) as (server, url),
        contextlib.ExitStack() as stack,
        http(url, "alice") as alice,
    ):
        for _ in range(6):
            hold(stack, alice)
        assert alice.post("/v1/completions", json=SHORT | {"n": 8}).status_code == 200
        assert not server.slots.held
        assert (
            "429"
            not in server.openapi()["paths"]["/v1/completions"]["post"]["responses"]
        )


def parse_error(*args: str) -> str:
    """The one line argparse prints for a bad command line (it exits 2)."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as stop:
        serve_cli.build_parser().parse_args(list(args))
    assert stop.value.code == 2
    return stderr.getvalue().strip().splitlines()[-1]


def test_retry_after_is_the_typical_hold_less_the_oldest_request_s_age():
    slots = ClientSlots(1)
    assert slots.take("alice", 1, 1) is not None
    assert slots.retry_after("alice") == ClientSlots.FIRST_GUESS  # nothing finished yet
    slots.typical = 20.0
    assert slots.retry_after("alice") in (19, 20)
    slots.since["alice"] = [time.monotonic() - 15]
    assert slots.retry_after("alice") in (5, 6)
    slots.typical = 1000.0
    assert slots.retry_after("alice") == 60  # the most the openai client waits
    slots.typical = 0.1
    assert slots.retry_after("alice") == 1
    with pytest.raises(APIError) as refused:
        slots.take("alice", 1, 1)
    assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "1"}


def test_the_command_line_bounds_tokens_and_queues_by_default(tiny_llm):
    """The defaults a lecturer gets from `make serve`, and what they do in a real
    process: no per-client bound, the fair order, and one client's batch of 8, 16 or 64
    requests (guidellm's, LangChain's .batch(), lm-eval's --batch_size) queued and
    answered, none refused."""
    args = serve_cli.build_parser().parse_args([])
    assert (
        args.max_concurrent_per_client,
        args.max_tokens_limit,
        args.default_max_tokens,
        args.scheduling_policy,
    ) == (0, 1024, 256, "fair")
    assert (
        serve_cli.build_parser()
        .parse_args(["--max-concurrent-per-client", "4"])
        .max_concurrent_per_client
        == 4
    )
    for value, words in [
        ("-1", "below the smallest allowed value, 0"),
        ("two", "not a whole number"),
        ("1.5", "not a whole number"),
    ]:
        line = parse_error("--max-concurrent-per-client", value)
        assert "--max-concurrent-per-client" in line and words in line, line
    command = [
        sys.executable,
        "-m",
        "minipaged.serve",
        "--model",
        str(tiny_llm.folder),
        "--port",
        "0",
        "--served-model-name",
        "tiny",
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        lines = []
        while not re.search(r"http://127\.0\.0\.1:\d+/v1", "".join(lines)):
            assert process.poll() is None and len(lines) < 50, "".join(lines)
            lines.append(process.stdout.readline())
        url = re.search(r"(http://127\.0\.0\.1:\d+)/v1", "".join(lines))[1]
        with httpx.Client(base_url=url, timeout=60) as client:
            eight = client.post("/v1/completions", json=SHORT | {"n": 8})
            batch = client.post(
                "/v1/completions", json=SHORT | {"prompt": ["one two"] * 16}
            )
            with concurrent.futures.ThreadPoolExecutor(64) as pool:
                at_once = list(
                    pool.map(
                        lambda _: client.post("/v1/completions", json=SHORT),
                        range(64),
                    )
                )
            too_long = client.post("/v1/completions", json=SHORT | {"max_tokens": 1025})
    finally:
        process.kill()
        process.wait()
    assert eight.status_code == 200 and len(eight.json()["choices"]) == 8, eight.text
    assert batch.status_code == 200 and len(batch.json()["choices"]) == 16, batch.text
    assert [a.status_code for a in at_once] == [200] * 64, [
        a.text for a in at_once if a.status_code != 200
    ][:1]
    assert (
        too_long.status_code == 400
        and "limit of 1024 tokens" in too_long.json()["error"]["message"]
        and "--max-tokens-limit" in too_long.json()["error"]["message"]
    ), too_long.text


def test_a_bound_that_is_set_names_its_option_in_every_refusal(tiny_llm):
    with (
        room(tiny_llm, max_concurrent_per_client=4) as (server, url),
        http(url, "alice") as alice,
    ):
        five = alice.post("/v1/completions", json=SHORT | {"n": 5})
        assert (
            five.status_code == 400
            and "--max-concurrent-per-client 4" in five.json()["error"]["message"]
        ), five.text


def workshop_script() -> str:
    """docs/workshop.md's client script: its ```python block that makes an OpenAI
    client."""
    blocks = [
        b
        for b in re.findall(
            r"^```python\n(.*?)^```",
            (ROOT / "docs" / "workshop.md").read_text(),
            re.S | re.M,
        )
        if "OpenAI(" in b
    ]
    assert blocks, (
        "docs/workshop.md has no ```python block with the room's `openai` client script"
    )
    return blocks[0]


def test_the_workshop_script_bounds_its_answer_and_runs(tiny_llm):
    """Issue 19: the room's script sent no max_tokens, at the server's default
    temperature 1.0."""
    script = workshop_script()
    max_tokens = re.search(r"\bmax_tokens=(\d+)", script)
    assert max_tokens and int(max_tokens[1]) <= 1024, (
        f"the script must set max_tokens (<= 1024):\n{script}"
    )
    assert re.search(r"\btemperature=0?\.\d+\b|\btemperature=0\b", script), (
        f"the script must set a temperature:\n{script}"
    )
    key = re.search(r'api_key="([^"]+)"', script)[1]
    with room(
        tiny_llm,
        step_seconds=0.0,
        api_key=key,
        max_concurrent_per_client=4,
        max_tokens_limit=1024,
    ) as (server, url):
        printed, names = io.StringIO(), {}
        with contextlib.redirect_stdout(printed):
            exec(script.replace("http://HOST:8000", url), names)
        generated = metric(wait_until_idle(url), "generation_tokens_total")
    # The tiny random model may sample its end-of-text first, or tokens that decode to
    # spaces, so the answer's text can be blank: the script printed exactly what the
    # server answered.
    answer = names["answer"]
    assert printed.getvalue() == answer.choices[0].message.content + "\n", (
        printed.getvalue()
    )
    assert answer.choices[0].finish_reason in ("stop", "length"), answer
    assert 1 <= answer.usage.completion_tokens <= int(max_tokens[1]), answer.usage
    assert 1 <= generated <= int(max_tokens[1]), generated


def test_the_room_benchmark_sees_its_flood_refused_and_serves_everyone_else(tiny_llm):
    """`bench serve --workload room` as a unit: its flood gets 429s past the share, and
    no participant is refused (each has one request in flight, under its own key)."""
    import argparse
    import asyncio

    from minipaged.tools.bench.serve import ROOM_TOKENS, room_plan, room_run

    plans = room_plan(
        argparse.Namespace(seed=0, requests=4, room_clients=2),
        tiny_llm.model.config.vocab_size,
    )
    assert [len(p) for p in plans] == [2, 2] and all(
        len(prompt) == 32 for p in plans for _, prompt in p
    )
    with room(tiny_llm, step_seconds=0.005, max_concurrent_per_client=2) as (
        server,
        url,
    ):
        result = asyncio.run(room_run(url, plans, flood_streams=4))
        wait_for(
            lambda: not server.slots.held,
            what=f"the benchmark's hang-ups left {server.slots.held}",
        )
    assert (result["requests"], result["refused"]) == (4, 0), result
    assert (
        result["flood"]["refused_429"] > 0 and result["flood"]["other_errors"] == 0
    ), result
    assert 0 < result["short_ttft_p50"] <= result["short_e2e_p50"] < 30, result
    # each of its tokens took a step
    assert result["short_e2e_p50"] >= ROOM_TOKENS * 0.005
