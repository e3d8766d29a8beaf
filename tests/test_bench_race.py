"""`python -m minipaged.bench race` against tiny-model servers: one it starts from a
command, one already running given by URL and PID; the same workload reaches both, every
output token is counted and the server's CPU time is read from its process tree."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import pytest
from checkpoints import write_checkpoint

from minipaged.tools.bench import race

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="CPU time is read from /proc"
)
SERVE = f"{sys.executable} -m minipaged.serve --model {{model}} --port {{port}}"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("race") / "model")


def running_server(folder):
    """A server started by the test itself; returns (process, url)."""
    process = subprocess.Popen(
        SERVE.format(model=folder, port=0).split(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    lines = []
    while not any("API" in line for line in lines):
        assert time.monotonic() < deadline and process.poll() is None, lines
        lines.append(process.stdout.readline())
    return process, re.search(r"(http://127\.0\.0\.1:\d+)", "".join(lines))[1]


def test_race_counts_every_token_of_the_same_workload_and_the_servers_cpu(model):
    process, url = running_server(model)
    try:
        command = [
            sys.executable,
            "-m",
            "minipaged.bench",
            "race",
            "--json",
            "--model",
            str(model),
            "--server",
            f"started={SERVE}",
            "--server",
            f"running={url},{process.pid}",
            "--server",
            f"no-pid={url}",
            "--concurrency",
            "1",
            "3",
            "--prompt-len",
            "4",
            "24",
            "--output-len",
            "5",
            "12",
        ]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=300, check=True
        )
    finally:
        process.terminate()
        process.wait(timeout=30)
    result = json.loads(done.stdout)
    servers = result["servers"]
    # one model behind every server: the same greedy text, every prompt answered
    greedy = result["greedy"]
    assert greedy["agree"] == greedy["of"] == 12
    assert all(len(texts) == 12 and all(texts) for texts in greedy["answers"].values())
    for c, requests in (("1", 2), ("3", 6)):
        runs = [servers[name]["runs"][c][0] for name in servers]
        # the same requests reach every server, and ignore_eos gives each its tokens
        assert {r["expected_tokens"] for r in runs} == {runs[0]["expected_tokens"]}
        assert all(r["tokens"] == r["expected_tokens"] for r in runs)
        assert all(r["requests"] == requests for r in runs)
        assert all(5 * requests <= r["tokens"] <= 12 * requests for r in runs)
        for r in runs:
            assert 0 < r["ttft_p50"] <= r["e2e_p50"]
            assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"])
        for name in ("started", "running"):
            r = servers[name]["runs"][c][0]
            # the server computed something, and no more than the cores allow
            assert 0 < r["server_cpu_seconds"] <= r["seconds"] * result["cores"] + 0.5
            assert r["cpu_ms_per_token"] == pytest.approx(
                1000 * r["server_cpu_seconds"] / r["tokens"]
            )
        # without a PID the server's CPU time is unknown, not made up
        assert "cpu_ms_per_token" not in servers["no-pid"]["runs"][c][0]
        assert "cpu_ms_per_token" not in servers["no-pid"]["median"][c]


def own_cpu_seconds(pid: int) -> float:
    fields = race._stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_tree_cpu_seconds_counts_the_children():
    """A parent that only waits, its child spinning: the tree holds the child's time."""
    spin = (
        "import time\nend = time.process_time() + 3\n"
        "while time.process_time() < end: pass"
    )
    wait = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}])"
    parent = subprocess.Popen([sys.executable, "-c", wait])
    try:
        deadline = time.monotonic() + 30
        children = 0.0
        while children < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
            children = race.tree_cpu_seconds(parent.pid) - own_cpu_seconds(parent.pid)
        assert children >= 0.3
    finally:
        parent.kill()  # its child spins on for at most 3 s of CPU
        parent.wait(timeout=30)
    assert race.tree_cpu_seconds(parent.pid) is None  # reaped: no such process


@pytest.mark.parametrize(
    "spec, says",
    [
        ("vllm", "write NAME=COMMAND"),
        ("vllm=vllm serve model", "{port}"),
        ("vllm=http://127.0.0.1:8000,abc", "not a process id"),
    ],
)
def test_server_option_says_what_is_wrong(spec, says):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(says)):
        race.contestant(spec)


def test_server_option_reads_a_command_and_a_url():
    started = race.contestant("a=vllm serve {model} --port {port}")
    assert started.command == ["vllm", "serve", "{model}", "--port", "{port}"]
    running = race.contestant("b=http://127.0.0.1:8000/,42")
    assert (running.url, running.pid, running.command) == (
        "http://127.0.0.1:8000",
        42,
        None,
    )
