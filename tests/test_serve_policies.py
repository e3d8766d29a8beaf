"""The series' engine choices reach the server: `python -m minipaged.serve
--scheduling-policy, --prefix-cache-policy, --admission, --kv-offload-frames`, and a
request's `priority` field (vLLM's extension) under `--scheduling-policy priority`.
Servers listen on 127.0.0.1 on free ports; every wait is bounded."""

import contextlib
import io
import threading
import time

import httpx
import pytest
from checkpoints import write_checkpoint
from test_serve import metric

from minipaged import LLM
from minipaged.tools.serve import cli as serve_cli
from minipaged.tools.serve.api import Server, ServerConfig
from minipaged.tools.serve.cli import ServerThread


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("policies") / "tiny")


def test_the_command_line_builds_the_engine_it_names(folder):
    args = serve_cli.build_parser().parse_args(
        [
            "--model",
            str(folder),
            "--num-blocks",
            "32",
            "--block-size",
            "4",
            "--scheduling-policy",
            "sjf",
            "--prefix-cache-policy",
            "clock",
            "--admission",
            "working-set",
            "--kv-offload-frames",
            "8",
        ]
    )
    engine = LLM(args.model, device="cpu", **serve_cli.engine_options(args)).engine
    config = engine.config
    assert (config.scheduling_policy, config.prefix_cache_policy, config.admission) == (
        "sjf",
        "clock",
        "working-set",
    )
    assert engine.blocks.num_tier_frames == 8 and engine.blocks.num_frames == 32
    defaults = serve_cli.engine_options(serve_cli.build_parser().parse_args([]))
    assert {
        k: defaults[k]
        for k in (
            "scheduling_policy",
            "prefix_cache_policy",
            "admission",
            "kv_offload_frames",
        )
    } == {
        "scheduling_policy": "fair",
        "prefix_cache_policy": "lru",
        "admission": "greedy",
        "kv_offload_frames": 0,
    }


def test_a_drum_without_the_prefix_cache_is_one_line_and_exit_code_2(folder):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as stop:
        serve_cli.main(
            [
                "--model",
                str(folder),
                "--port",
                "0",
                "--kv-offload-frames",
                "8",
                "--no-enable-prefix-caching",
            ]
        )
    assert stop.value.code == 2
    said = stderr.getvalue()
    assert (
        said.count("\n") == 1
        and "kv_offload_frames" in said
        and "prefix" in said
        and "Traceback" not in said
    ), said


@contextlib.contextmanager
def server(folder, **engine_options):
    """A server whose every step lasts at least 5 ms, with at most one sequence
    running."""
    llm = LLM(
        str(folder),
        device="cpu",
        num_blocks=128,
        block_size=4,
        max_num_seqs=1,
        **engine_options,
    )
    step = llm.engine.step
    llm.engine.step = lambda: (time.sleep(0.005), step())[1]
    with ServerThread(
        Server(llm.engine, llm.tokenizer, ServerConfig(model_name="tiny"))
    ) as url:
        yield url


def wait_for_waiting(url: str, count: int, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while metric(httpx.get(f"{url}/metrics").text, "num_requests_waiting") != count:
        assert time.monotonic() < deadline, f"{count} requests never waited"
        time.sleep(0.01)


def finishing_order_behind_a_stream(
    url: str, requests: list[tuple[str, dict]]
) -> list[str]:
    """A stream holds the one row while `requests` (name, body fields) queue up one by
    one; then it closes (an abort) and they run one at a time: the order in which they
    finished.
    """
    finished: list[str] = []

    def send(name: str, fields: dict) -> None:
        r = httpx.post(
            f"{url}/v1/completions",
            timeout=30,
            json={"prompt": "two", "max_tokens": 4, "ignore_eos": True} | fields,
        )
        assert r.status_code == 200, r.text
        finished.append(name)

    threads = [threading.Thread(target=send, args=request) for request in requests]
    with httpx.Client(base_url=url, timeout=30) as client:
        body = {"prompt": "one", "max_tokens": 100, "ignore_eos": True, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as running:
            assert running.status_code == 200, running.read()
            for waiting, thread in enumerate(threads, start=1):
                thread.start()
                wait_for_waiting(url, waiting)
    for thread in threads:
        thread.join(timeout=30)
    return finished


def test_under_the_priority_policy_a_lower_priority_value_runs_first(folder):
    with server(folder, scheduling_policy="priority") as url:
        finished = finishing_order_behind_a_stream(
            url, [("later", {"priority": 5}), ("urgent", {"priority": -1})]
        )
    assert finished == ["urgent", "later"]


def test_a_priority_on_a_first_come_server_is_a_400_naming_the_option(folder):
    with server(folder) as url:
        r = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=30,
            json={
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
                "priority": 3,
            },
        )
        zero = httpx.post(
            f"{url}/v1/completions",
            timeout=30,
            json={"prompt": "hi", "max_tokens": 2, "priority": 0},
        )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (
        error["param"] == "priority"
        and "--scheduling-policy priority" in error["message"]
    ), error
    # 0, vLLM's default, is every request's priority
    assert zero.status_code == 200, zero.text
