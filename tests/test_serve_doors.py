"""Issue 18, the server's doors: what a stranger sends is answered cleanly, and the log
stays clean.

The workshop's n=3 request on a server with the default memory options, a prompt list
that no queue could hold, unknown routes, the dashboard's text behind the API key,
hang-ups, and the command line's mistakes. Servers listen on 127.0.0.1 on free ports;
every wait is bounded.
"""

import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from checkpoints import write_checkpoint
from test_serve import serve, wait_until_idle

from minipaged import LLM


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    folder = write_checkpoint(tmp_path_factory.mktemp("doors") / "tiny")
    return LLM(str(folder), device="cpu", num_blocks=64, block_size=4)


@pytest.fixture(scope="module")
def smollm2_shaped(tmp_path_factory):
    """A random model with SmolLM2's KV shape (30 layers, 3 KV heads of 64) and context
    (8192): with the default memory options its pool is SmolLM2's on a CPU, 728 frames
    of 16 tokens.
    """
    folder = write_checkpoint(
        tmp_path_factory.mktemp("doors") / "smollm2-shaped",
        hidden=192,
        heads=3,
        kv_heads=3,
        layers=30,
        intermediate=64,
        max_positions=8192,
    )
    return LLM(str(folder), device="cpu")


def client(url: str, **options) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{url}/v1",
        api_key=options.pop("api_key", "unused"),
        max_retries=0,
        timeout=60,
        **options,
    )


def test_chat_n3_without_max_tokens_on_the_default_server(smollm2_shaped):
    """docs/workshop.md's step: n=3 without max_tokens was a 400 ("it needs 1536 frames
    ... but the KV pool has 728"), since a chat request's default was the rest of the
    8192-token context.
    """
    conversation = [{"role": "user", "content": "What is a page table? " * 4}]
    with serve(smollm2_shaped) as url:
        assert (
            smollm2_shaped.engine.blocks.num_frames == 728
            and smollm2_shaped.max_model_len == 8192
        )
        for n in (2, 3):
            answer = client(url).chat.completions.create(
                model="tiny",
                messages=conversation,
                n=n,
                extra_body={"ignore_eos": True},
            )
            assert len(answer.choices) == n and {
                c.finish_reason for c in answer.choices
            } == {"length"}
            assert answer.usage.completion_tokens == n * 256  # --default-max-tokens
        # completions keep OpenAI's default of 16
        out = client(url).completions.create(
            model="tiny", prompt="hello", extra_body={"ignore_eos": True}
        )
        assert out.usage.completion_tokens == 16


def test_default_max_tokens_never_asks_more_than_the_pool_holds(smollm2_shaped):
    with serve(smollm2_shaped, num_blocks=30, default_max_tokens=1000) as url:
        answer = client(url).chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            n=3,
            extra_body={"ignore_eos": True},
        )
        prompt = answer.usage.prompt_tokens
        # each of 3 sequences may hold 30 // 3 = 10 frames of 16 slots, its prompt
        # included
        assert answer.usage.completion_tokens == 3 * (10 * 16 - prompt)
        # asked for: the engine's 400
        with pytest.raises(openai.BadRequestError, match="needs 33 frames"):
            client(url).chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "hi"}],
                n=3,
                max_tokens=10 * 16 - prompt + 1,
            )


def test_max_tokens_limit_is_a_400_that_says_it(tiny_llm):
    with serve(tiny_llm, max_tokens_limit=20) as url:
        with pytest.raises(
            openai.BadRequestError, match="limit of 20 tokens"
        ) as refused:
            client(url).completions.create(model="tiny", prompt="hello", max_tokens=21)
        assert refused.value.body["param"] == "max_tokens"
        chat = client(url).chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"ignore_eos": True},
        )
        assert chat.usage.completion_tokens == 20  # the default, cut to the limit
        out = client(url).completions.create(
            model="tiny", prompt="hello", max_tokens=20, extra_body={"ignore_eos": True}
        )
        assert out.usage.completion_tokens == 20


def test_a_prompt_list_no_queue_can_hold_is_a_400_not_a_503(tiny_llm):
    """40 prompts where 8 run and 16 wait: a 503 would have the openai client retry
    forever."""
    with serve(tiny_llm, max_num_seqs=8, max_waiting=16) as url:
        with pytest.raises(
            openai.BadRequestError, match="at most 24 prompts"
        ) as refused:
            client(url).completions.create(
                model="tiny", prompt=["one two"] * 40, max_tokens=2
            )
        assert refused.value.body["param"] == "prompt"
        out = client(url).completions.create(
            model="tiny", prompt=["one two"] * 24, max_tokens=2
        )
        assert len(out.choices) == 24
        wait_until_idle(url)


def test_unknown_routes_and_wrong_methods_answer_in_openai_shape(tiny_llm):
    with serve(tiny_llm) as url:
        for method, path, status in [
            ("GET", "/v1/completions", 405),
            ("POST", "/v1/embeddings", 404),
            ("GET", "/nowhere", 404),
            ("DELETE", "/v1/models", 405),
        ]:
            r = httpx.request(method, url + path, json={"input": "x"})
            assert r.status_code == status and set(r.json()) == {"error"}, r.text
            error = r.json()["error"]
            assert (
                set(error) == {"message", "type", "param", "code"}
                and error["code"] == status
            )
            assert path in error["message"]
        assert httpx.get(url + "/v1/completions").headers["allow"] == "POST"
        # says where to go
        with pytest.raises(openai.NotFoundError, match="/v1/chat/completions"):
            client(url).embeddings.create(model="tiny", input="hello")


@pytest.fixture(scope="module")
def long_context_llm(tmp_path_factory):
    """The tiny model with 4,096 positions: a request of 4,000 tokens outlives the
    dashboard checks even on a busy machine (one of 200 once ended before the first
    snapshot)."""
    folder = write_checkpoint(
        tmp_path_factory.mktemp("doors") / "long", max_positions=4096
    )
    return LLM(str(folder), device="cpu", num_blocks=1100, block_size=4)


def test_dashboard_text_needs_the_api_key(long_context_llm):
    """--api-key with --dashboard-show-text: the page stays open, its prompts and
    answers do not."""
    # a prompt of words outside the tiny vocabulary: <unk>s
    secret = "alpha beta gamma delta"
    prompt = "paged frame block table " + secret
    key = "room42"
    options = {"api_key": key, "dashboard_show_text": True, "max_num_seqs": 1}
    with (
        serve(long_context_llm, num_blocks=1100, block_size=4, **options) as url,
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        body = {"prompt": prompt, "max_tokens": 4000, "ignore_eos": True}
        body["stream"] = True
        with http.stream(
            "POST",
            "/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        ) as running:
            assert running.status_code == 200
            deadline = time.monotonic() + 10
            while '"prompt"' not in (
                shown := http.get("/dashboard/snapshot", params={"key": key}).text
            ):
                assert time.monotonic() < deadline, shown[:500]
                time.sleep(0.05)
            assert secret in shown
            assert (
                secret
                in http.get(
                    "/dashboard/snapshot", headers={"Authorization": f"Bearer {key}"}
                ).text
            )
            for params, headers in [
                ({}, {}),
                ({"key": "wrong"}, {}),
                ({}, {"Authorization": "Bearer wrong"}),
            ]:
                hidden = http.get("/dashboard/snapshot", params=params, headers=headers)
                # ids and counts
                assert hidden.status_code == 200 and hidden.json()["requests"], (
                    hidden.text
                )
                assert (
                    secret not in hidden.text
                    and '"prompt"' not in hidden.text
                    and '"text"' not in hidden.text
                )
            for params, visible in [({}, False), ({"key": key}, True)]:
                with http.stream("GET", "/dashboard/events", params=params) as events:
                    first = next(
                        line for line in events.iter_lines() if line.startswith("data:")
                    )
                assert (secret in first) == visible and '"requests"' in first
            # the page itself: open for the projector
            assert "<title>" in http.get("/").text


def read_until(process, pattern: str, seconds: float = 60) -> str:
    lines = []
    deadline = time.monotonic() + seconds
    while not re.search(pattern, "".join(lines)):
        assert process.poll() is None and time.monotonic() < deadline, "".join(lines)
        lines.append(process.stdout.readline())
    return "".join(lines)


def hang_up(port: int, body: bytes, send: int, wait: float) -> None:
    """POST /v1/completions, send `send` bytes of the body, wait, and close the
    connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type:"
            b" application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:send]
        )
        time.sleep(wait)


def test_the_server_log_stays_clean_through_mistakes_and_hang_ups(tiny_llm, tmp_path):
    """What a lecturer's terminal shows while the room pokes: no traceback for a
    client's mistake or a hang-up (a KeyError for a non-streamed one, ClientDisconnect
    for a half-sent body), and every frame back afterwards."""
    command = [
        sys.executable,
        "-m",
        "minipaged.serve",
        "--model",
        str(tiny_llm.folder),
        "--port",
        "0",
        "--num-blocks",
        "64",
        "--block-size",
        "4",
        "--served-model-name",
        "tiny",
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        url = re.search(r"(http://127\.0\.0\.1:(\d+))/v1", read_until(process, r"API"))
        url, port = url[1], int(url[2])
        # 240 tokens take the tiny model about 0.3 s: each client hangs up before its
        # answer is ready
        long = b'{"prompt": %s, "max_tokens": 240, "ignore_eos": true}'
        # one prompt, not streamed
        hang_up(port, long % b'"one two three"', send=999, wait=0.05)
        # three prompts
        hang_up(port, long % b'["one two", "three", "four"]', send=999, wait=0.05)
        # halfway through its body
        hang_up(port, long % b'"one two three"', send=10, wait=0.05)
        hang_up(
            port,
            (long % b'"one"').replace(b"}", b', "stream": true}'),
            send=999,
            wait=0.05,
        )
        mistakes = [
            b'{"prompt": "alpha \\ud800"}',
            b"[" * 5000,
            b'{"prompt": "a", "max_tokens": ' + b"9" * 5000 + b"}",
            b'{"messages": [{"role": "user"}]}',
            b"not json",
        ]
        for body in mistakes:
            assert (
                httpx.post(
                    f"{url}/v1/completions",
                    content=body,
                    headers={"Content-Type": "application/json"},
                ).status_code
                == 400
            )
        assert httpx.get(f"{url}/v1/completions").status_code == 405
        assert httpx.post(f"{url}/v1/embeddings", json={}).status_code == 404
        wait_until_idle(url, seconds=10)  # no frame leaked
        ok = httpx.post(
            f"{url}/v1/completions",
            json={"prompt": "one", "max_tokens": 3, "ignore_eos": True},
        )
        assert ok.json()["usage"]["completion_tokens"] == 3
        process.send_signal(signal.SIGINT)
        log = process.communicate(timeout=20)[0]
        assert process.returncode == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    for word in ("Traceback", "KeyError", "ClientDisconnect", "Exception", "ERROR"):
        assert word not in log, log


def run_serve(*args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "minipaged.serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_command_line_mistakes_are_one_line_and_exit_code_2(tiny_llm):
    """Checked before the model loads where they can be: one line on stderr, exit code
    2."""
    busy = socket.create_server(("127.0.0.1", 0))
    model = ["--model", str(tiny_llm.folder)]
    cases = {  # (arguments, words of the error)
        "a port in use": (
            [*model, "--port", str(busy.getsockname()[1])],
            "listens there already",
        ),
        "port 99999": (
            [*model, "--port", "99999"],
            "--port: 99999 is above the largest allowed value, 65535",
        ),
        "a host that does not resolve": (
            [*model, "--host", "no-such-host.invalid", "--port", "0"],
            "--host no-such-host.invalid: no such address",
        ),
        "no such model": (
            ["--model", "/nonexistent", "--port", "0"],
            "'/nonexistent' is neither a folder",
        ),
        "max-num-seqs 0": (
            [*model, "--max-num-seqs", "0"],
            "below the smallest allowed value, 1",
        ),
        "num-blocks -1": (
            [*model, "--num-blocks", "-1"],
            "below the smallest allowed value",
        ),
        "default-max-tokens nan": (
            [*model, "--default-max-tokens", "nan"],
            "not a whole number",
        ),
        "kv-cache-memory 0": ([*model, "--kv-cache-memory", "0"], "more than 0 bytes"),
        "max-waiting missing": ([*model, "--max-waiting"], "expected one argument"),
    }
    try:
        running = {what: run_serve(*args) for what, (args, _) in cases.items()}
        for what, process in running.items():
            stdout, stderr = process.communicate(timeout=60)
            assert process.returncode == 2, (what, stdout, stderr)
            last = stderr.strip().splitlines()[-1]
            assert (
                last.startswith("python -m minipaged.serve: error: ")
                and cases[what][1] in last
            ), (what, stderr)
            assert len(stderr.splitlines()) == 1 and not stdout, (
                what,
                stdout,
                stderr,
            )  # no usage, no traceback
    finally:
        busy.close()
        for process in running.values():
            if process.poll() is None:
                process.kill()
