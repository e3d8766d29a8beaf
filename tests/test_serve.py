"""python -m minipaged.serve, through the official `openai` client, httpx and a
subprocess.

Every server listens on 127.0.0.1 on a free port; every load loop is bounded in count
and time. Greedy answers through HTTP must equal LLM.generate's for the same prompts.
"""

import asyncio
import json
import random
import re
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest
from checkpoints import WORDS, write_checkpoint

from minipaged import LLM, SamplingParams
from minipaged.tools.serve.api import Server, ServerConfig
from minipaged.tools.serve.cli import ServerThread

VOCAB = WORDS[5:]  # plain words (no special tokens)


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    folder = write_checkpoint(tmp_path_factory.mktemp("serve") / "tiny")
    return LLM(str(folder), device="cpu", num_blocks=256, block_size=4)


def serve(llm, name="tiny", **options):
    """A ServerThread over a fresh engine of llm: engine options and ServerConfig fields
    mixed."""
    config_fields = set(ServerConfig.__dataclass_fields__)
    config = ServerConfig(
        model_name=name, **{k: v for k, v in options.items() if k in config_fields}
    )
    engine = llm.new_engine(
        **{k: v for k, v in options.items() if k not in config_fields}
    )
    return ServerThread(Server(engine, llm.tokenizer, config))


def words(rng, n):
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def metric(text: str, name: str) -> float:
    match = re.search(rf"^minipaged:{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert match, f"{name} missing from /metrics"
    return float(match[1])


def wait_until_idle(url: str, seconds: float = 5.0) -> str:
    """/metrics once nothing runs, waits or holds a frame (aborts are applied
    asynchronously)."""
    deadline = time.monotonic() + seconds
    while True:
        text = httpx.get(f"{url}/metrics").text
        if all(
            metric(text, m) == 0
            for m in (
                "num_requests_running",
                "num_requests_waiting",
                "num_requests_swapped",
                "kv_cache_usage_perc",
            )
        ):
            return text
        assert time.monotonic() < deadline, (
            f"the engine did not fall idle:\n{text[:1500]}"
        )
        time.sleep(0.05)


def test_openai_client_completions_and_chat_match_generate(tiny_llm):
    prompts = ["hello world the", "paged frame block table token", "one"]
    greedy = SamplingParams(temperature=0, max_tokens=12)
    expected = [
        o.outputs[0].text for o in tiny_llm.generate(prompts, greedy, use_tqdm=False)
    ]
    conversation = [{"role": "user", "content": "what is a page table"}]
    expected_chat = (
        tiny_llm.chat(conversation, SamplingParams(temperature=0, max_tokens=10))
        .outputs[0]
        .text
    )
    seeded = tiny_llm.generate(
        prompts[:1],
        SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=10),
        use_tqdm=False,
    )[0]
    stop_at = expected[0].split()[3]
    stopped = tiny_llm.generate(
        prompts[:1],
        SamplingParams(temperature=0, max_tokens=12, stop=[stop_at]),
        use_tqdm=False,
    )[0].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.text != expected[0]

    with serve(tiny_llm) as url:
        client = openai.OpenAI(
            base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30
        )
        assert [m.id for m in client.models.list().data] == ["tiny"]
        # a batch of prompts, not streamed: each choice equals generate's, with usage
        out = client.completions.create(
            model="tiny", prompt=prompts, max_tokens=12, temperature=0
        )
        assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == expected
        assert all(c.finish_reason in ("stop", "length") for c in out.choices)
        prompt_tokens = sum(len(tiny_llm.tokenizer.encode(p)) for p in prompts)
        assert out.usage.prompt_tokens == prompt_tokens
        assert out.usage.total_tokens == prompt_tokens + out.usage.completion_tokens
        # token ids as the prompt, streamed: the pieces add up to the same text
        ids = tiny_llm.tokenizer.encode(prompts[1])
        pieces = [
            c.choices[0].text
            for c in client.completions.create(
                model="tiny", prompt=ids, max_tokens=12, temperature=0, stream=True
            )
            if c.choices
        ]
        assert "".join(pieces) == expected[1] and len(pieces) > 2
        # chat, plain and streamed, through the chat template
        chat = client.chat.completions.create(
            model="tiny", messages=conversation, max_tokens=10, temperature=0
        )
        assert (
            chat.choices[0].message.content == expected_chat
            and chat.choices[0].message.role == "assistant"
        )
        stream = client.chat.completions.create(
            model="tiny",
            messages=conversation,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert chunks[0].choices[0].delta.role == "assistant"
        assert (
            "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            == expected_chat
        )
        assert (
            chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
            and not chunks[-1].choices
        )
        chat = client.chat.completions.create(
            model="tiny",
            messages=conversation,
            max_completion_tokens=3,
            extra_body={"ignore_eos": True},
        )
        assert (
            chat.usage.completion_tokens == 3
            and chat.choices[0].finish_reason == "length"
        )
        # n=2 with a seed: the same two samples as generate's, and the same again
        for _ in range(2):
            out = client.completions.create(
                model="tiny",
                prompt=prompts[0],
                n=2,
                seed=7,
                temperature=1.0,
                max_tokens=10,
            )
            assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == [
                c.text for c in seeded.outputs
            ]
        # a stop string: cut before it, finish_reason "stop"
        out = client.completions.create(
            model="tiny",
            prompt=prompts[0],
            max_tokens=12,
            temperature=0,
            stop=[stop_at],
        )
        assert (out.choices[0].text, out.choices[0].finish_reason) == (
            stopped.text,
            "stop",
        )
        # vLLM's extensions top_k and ignore_eos
        out = client.completions.create(
            model="tiny",
            prompt=prompts[2],
            max_tokens=7,
            temperature=0,
            extra_body={"top_k": 5, "ignore_eos": True},
        )
        assert (
            out.usage.completion_tokens == 7
            and out.choices[0].finish_reason == "length"
        )
        wait_until_idle(url)


def test_load_with_disconnects_frees_every_frame(tiny_llm):
    """32 clients, 300 requests of mixed lengths, a quarter of them hanging up
    mid-stream: every
    other answer is right, and afterwards nothing runs, waits or holds a frame."""
    rng = random.Random(12)
    specs = []
    for i in range(300):
        # a common 8-word preamble on half of them: prefix-cache hits while the pool is
        # under pressure
        prompt = ("the paged kv cache holds key and value " if i % 2 else "") + words(
            rng, rng.randint(1, 24)
        )
        specs.append(
            {
                "prompt": prompt,
                "max_tokens": rng.choice([1, 2, 5, 10, 20, 40]),
                "ignore_eos": rng.random() < 0.5,
                "stream": rng.random() < 0.6,
                "hang_up": rng.random() < 0.25,
            }
        )
    expected = tiny_llm.generate(
        [s["prompt"] for s in specs],
        [
            SamplingParams(
                temperature=0, max_tokens=s["max_tokens"], ignore_eos=s["ignore_eos"]
            )
            for s in specs
        ],
        use_tqdm=False,
    )
    results = {}

    async def client_task(client, queue):
        while not queue.empty():
            i = queue.get_nowait()
            s = specs[i]
            kwargs = dict(
                model="tiny",
                prompt=s["prompt"],
                max_tokens=s["max_tokens"],
                temperature=0,
                extra_body={"ignore_eos": s["ignore_eos"]},
            )
            if s["hang_up"]:  # read a chunk or two, then close the connection
                stream = await client.completions.create(stream=True, **kwargs)
                async for _ in stream:
                    if rng.random() < 0.5:
                        break
                await stream.close()
            elif s["stream"]:
                stream = await client.completions.create(stream=True, **kwargs)
                chunks = [c async for c in stream]
                results[i] = (
                    "".join(c.choices[0].text for c in chunks if c.choices),
                    [c.choices[0].finish_reason for c in chunks if c.choices][-1],
                )
            else:
                out = await client.completions.create(**kwargs)
                results[i] = (out.choices[0].text, out.choices[0].finish_reason)

    async def load(url):
        queue = asyncio.Queue()
        for i in range(len(specs)):
            queue.put_nowait(i)
        async with openai.AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key="unused",
            max_retries=0,
            timeout=60,
            http_client=openai.DefaultAsyncHttpxClient(
                limits=httpx.Limits(max_connections=64)
            ),
        ) as client:
            await asyncio.wait_for(
                asyncio.gather(*(client_task(client, queue) for _ in range(32))), 120
            )

    with serve(tiny_llm, num_blocks=40, block_size=4, max_num_seqs=16) as url:
        asyncio.run(load(url))
        kept = [i for i, s in enumerate(specs) if not s["hang_up"]]
        assert sorted(results) == kept
        for i in kept:
            want = expected[i].outputs[0]
            assert results[i] == (
                want.text,
                want.finish_reason,
            ), f"request {i}: {specs[i]}"
        text = wait_until_idle(url)
        # the small pool made it preempt
        assert metric(text, "num_preemptions_total") > 0
        assert metric(text, "prefix_cache_hits_total") > 0
        assert metric(text, "e2e_request_latency_seconds_count") == len(specs)
        aborted = float(
            re.search(
                r'request_success_total{[^}]*finished_reason="abort"[^}]*} (\S+)', text
            )[1]
        )
        # hang-ups aborted their requests
        assert 0 < aborted <= sum(s["hang_up"] for s in specs)
        assert httpx.get(f"{url}/health").status_code == 200  # it still answers
        out = httpx.post(
            f"{url}/v1/completions",
            json={
                "prompt": specs[0]["prompt"],
                "temperature": 0,
                "max_tokens": specs[0]["max_tokens"],
                "ignore_eos": specs[0]["ignore_eos"],
            },
        ).json()
        assert out["choices"][0]["text"] == expected[0].outputs[0].text


BAD = [  # (what, body, status, param): each must leave the engine untouched
    ("not JSON", b'{"prompt": "hello"', 400, None),
    ("a JSON array", b'["hello"]', 400, None),
    ("not UTF-8", b'{"prompt": "\xff\xfe"}', 400, None),
    ("prompt of the wrong type", {"prompt": 5}, 400, "prompt"),
    ("prompt missing", {"max_tokens": 5}, 400, "prompt"),
    ("empty prompt list", {"prompt": []}, 400, "prompt"),
    ("negative max_tokens", {"prompt": "hello", "max_tokens": -1}, 400, "max_tokens"),
    ("max_tokens a string", {"prompt": "hello", "max_tokens": "5"}, 400, "max_tokens"),
    (
        "max_tokens past the context",
        {"prompt": "hello", "max_tokens": 10_000},
        400,
        "max_tokens",
    ),
    ("n zero", {"prompt": "hello", "n": 0}, 400, "n"),
    ("n too large", {"prompt": "hello", "n": 1000}, 400, "n"),
    ("n a float", {"prompt": "hello", "n": 1.5}, 400, "n"),
    (
        "temperature negative",
        {"prompt": "hello", "temperature": -0.5},
        400,
        "temperature",
    ),
    (
        "temperature a string",
        {"prompt": "hello", "temperature": "hot"},
        400,
        "temperature",
    ),
    ("top_p above 1", {"prompt": "hello", "top_p": 1.5}, 400, "top_p"),
    ("top_k below -1", {"prompt": "hello", "top_k": -5}, 400, "top_k"),
    ("stop a number", {"prompt": "hello", "stop": 5}, 400, "stop"),
    ("stop an empty string", {"prompt": "hello", "stop": [""]}, 400, "stop[0]"),
    ("seed a string", {"prompt": "hello", "seed": "x"}, 400, "seed"),
    (
        "ignore_eos a string",
        {"prompt": "hello", "ignore_eos": "yes"},
        400,
        "ignore_eos",
    ),
    ("stream a string", {"prompt": "hello", "stream": "true"}, 400, "stream"),
    (
        "a field of vLLM's not here yet",
        {"prompt": "hello", "structural_tag": {"type": "structural_tag"}},
        400,
        "structural_tag",
    ),
    (
        "a regex that is not one",
        {"prompt": "hello", "structured_outputs": {"regex": "(a"}},
        400,
        "structured_outputs",
    ),  # an unknown field is ignored, as vLLM ignores it (test_serve_vllm_compat.py)
    (
        "stream_options without stream",
        {"prompt": "hello", "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),
    (
        "logprobs above vLLM's max_logprobs",
        {"prompt": "hello", "logprobs": 21},
        400,
        "logprobs",
    ),
    ("unknown model", {"prompt": "hello", "model": "gpt-4"}, 404, "model"),
    ("prompt too long", {"prompt": "hello " * 300}, 400, "prompt"),
    ("token id outside the vocabulary", {"prompt": [5, 99999]}, 400, None),
    # issue 18: text that is not Unicode, deep JSON, huge numbers, NaN (each was a 500)
    ("a lone surrogate", b'{"prompt": "alpha \\ud800"}', 400, "prompt"),
    (
        "a lone surrogate in a prompt list",
        b'{"prompt": ["one", "alpha \\udfff"]}',
        400,
        "prompt[1]",
    ),
    (
        "a lone surrogate in a stop string",
        b'{"prompt": "one", "stop": ["\\ud800"]}',
        400,
        "stop[0]",
    ),
    ("5,000 nested [", b"[" * 5000, 400, None),
    (
        "5,000 nested [ in the prompt",
        b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        400,
        None,
    ),
    (
        "40 nested lists",
        {"prompt": json.loads("[" * 40 + "]" * 40)},
        400,
        "prompt" + "[0]" * 16,
    ),
    (
        "max_tokens of 5,000 digits",
        b'{"prompt": "hello", "max_tokens": ' + b"7" * 5000 + b"}",
        400,
        "max_tokens",
    ),
    ("a seed of 40 digits", {"prompt": "hello", "seed": 10**40}, 400, "seed"),
    ("temperature NaN", b'{"prompt": "hello", "temperature": NaN}', 400, "temperature"),
    (
        "temperature 1e999",
        b'{"prompt": "hello", "temperature": 1e999}',
        400,
        "temperature",
    ),
]
BAD_CHAT = [
    ("messages missing", {"max_tokens": 5}, 400, "messages"),
    ("messages a string", {"messages": "hi"}, 400, "messages"),
    (
        "a message without role",
        {"messages": [{"content": "hi"}]},
        400,
        "messages[0].role",
    ),
    (
        "an image part",
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages[0].content[0].type",
    ),
    ("no messages", {"messages": []}, 400, "messages"),
    (
        "an unknown role",
        {"messages": [{"role": "wizard", "content": "hi"}]},
        400,
        "messages[0].role",
    ),
    # issue 18: a message without content (answered, where OpenAI's API says 400), lone
    # surrogates
    (
        "a message without content",
        {"messages": [{"role": "user"}]},
        400,
        "messages[0].content",
    ),
    (
        "content null",
        {"messages": [{"role": "user", "content": None}]},
        400,
        "messages[0].content",
    ),
    (
        "a lone surrogate in content",
        b'{"messages": [{"role": "user", "content": "alpha \\ud800"}]}',
        400,
        "messages[0].content",
    ),
    (
        "a lone surrogate in a content part",
        (
            b'{"messages": [{"role": "user", "content": [{"type": "text", "text":'
            b' "\\udc00 beta"}]}]}'
        ),
        400,
        "messages[0].content[0].text",
    ),
    (
        "a lone surrogate in a system message",
        (
            b'{"messages": [{"role": "system", "content": "\\ud800"}, '
            b'{"role": "user", "content": "hi"}]}'
        ),
        400,
        "messages[0].content",
    ),
]


def test_bad_requests_get_openai_errors_and_leave_the_engine_alone(tiny_llm):
    expected = (
        tiny_llm.generate(
            ["one two three"],
            SamplingParams(temperature=0, max_tokens=200, ignore_eos=True),
            use_tqdm=False,
        )[0]
        .outputs[0]
        .text
    )
    key = "room42"
    with serve(tiny_llm, api_key=key, max_body_bytes=100_000) as url:
        auth = {"Authorization": f"Bearer {key}"}
        http = httpx.Client(
            base_url=url,
            headers=auth | {"Content-Type": "application/json"},
            timeout=30,
        )
        streamed = []
        with http.stream(
            "POST",
            "/v1/completions",
            json={
                "prompt": "one two three",
                "max_tokens": 200,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            },
        ) as good:
            assert good.status_code == 200
            lines = good.iter_lines()
            cases = [
                (what, "/v1/completions", body, status, param)
                for what, body, status, param in BAD
            ]
            cases += [
                (what, "/v1/chat/completions", body, status, param)
                for what, body, status, param in BAD_CHAT
            ]
            for what, route, body, status, param in cases:
                r = http.post(
                    route,
                    **(
                        {"content": body} if isinstance(body, bytes) else {"json": body}
                    ),
                )
                error = r.json()["error"]
                assert (r.status_code, error["code"], error["param"]) == (
                    status,
                    status,
                    param,
                ), (what, r.text)
                assert error["message"] and error["type"].endswith("Error"), what
                streamed.append(next(lines))  # the good request goes on meanwhile
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": key},
            ):
                r = httpx.post(
                    f"{url}/v1/completions", json={"prompt": "hello"}, headers=headers
                )
                assert (
                    r.status_code == 401
                    and r.json()["error"]["type"] == "AuthenticationError"
                )
            assert httpx.get(f"{url}/v1/models").status_code == 401
            r = http.post(
                "/v1/completions", content=b'{"prompt": "' + b"a" * 200_000 + b'"}'
            )
            assert r.status_code == 413 and r.json()["error"]["code"] == 413
            streamed = [line for line in streamed + list(lines) if line]
        text = "".join(
            re.search(r'"text":"([^"]*)"', line)[1]
            for line in streamed
            if '"text"' in line
        )
        assert text == expected and streamed[-1] == "data: [DONE]"
        metrics = wait_until_idle(url)
        # only the good request ran
        assert metric(metrics, "e2e_request_latency_seconds_count") == 1
        assert metric(metrics, "prompt_tokens_total") == len(
            tiny_llm.tokenizer.encode("one two three")
        )
        assert (
            httpx.get(f"{url}/health").status_code == 200
            and httpx.get(f"{url}/metrics").status_code == 200
        )


def test_full_queue_gets_503_and_a_hang_up_frees_its_frames(tiny_llm):
    body = {
        "prompt": "frame block",
        "max_tokens": 240,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with serve(tiny_llm, max_num_seqs=1, max_waiting=1) as url:
        with (
            httpx.Client(base_url=url, timeout=30) as a,
            httpx.Client(base_url=url, timeout=30) as b,
        ):
            with (
                a.stream("POST", "/v1/completions", json=body) as first,
                b.stream("POST", "/v1/completions", json=body) as second,
            ):
                # one runs, one waits
                assert first.status_code == second.status_code == 200
                r = httpx.post(f"{url}/v1/completions", json=body | {"stream": False})
                assert (
                    r.status_code == 503
                    and r.json()["error"]["type"] == "ServiceUnavailableError"
                )
                assert (
                    metric(httpx.get(f"{url}/metrics").text, "kv_cache_usage_perc") > 0
                )
        # both clients hung up mid-stream: their requests are aborted, their frames back
        # at once
        metrics = wait_until_idle(url, seconds=2.0)
        assert metric(metrics, "generation_tokens_total") < 2 * 240
        r = httpx.post(
            f"{url}/v1/completions", json=body | {"stream": False, "max_tokens": 3}
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_dashboard_snapshot_shows_frames_shared_between_requests(tiny_llm):
    """Two requests with a common prompt prefix map the same frames (the prefix cache);
    the snapshot says which frames each request maps, and they agree with its page
    tables.
    """
    from minipaged.tools.serve.dashboard import Dashboard

    engine = tiny_llm.new_engine(num_blocks=32, block_size=4)
    preamble = "the paged kv cache holds key and value "
    engine.add_request(
        "a", preamble + "one", SamplingParams(temperature=0, max_tokens=8)
    )
    engine.step()  # a's prompt blocks are now in the prefix cache
    engine.add_request(
        "b", preamble + "two three", SamplingParams(temperature=0, max_tokens=8, n=2)
    )
    engine.step()
    dashboard = Dashboard("tiny", show_text=False)
    snap = dashboard.snapshot(engine, time.perf_counter())
    ids = [r["id"] for r in snap["requests"]]
    assert ids == ["a", "b"] and snap["queues"]["running"] == ["a", "b"]
    shared = [
        f
        for f, cell in enumerate(snap["frames"])
        if isinstance(cell, list) and cell[1:] == [0, 1]
    ]
    # a's full prompt blocks
    assert len(shared) == len(tiny_llm.tokenizer.encode(preamble + "one")) // 4
    for i, request in enumerate(snap["requests"]):
        for seq in request["seqs"]:
            assert seq["blocks"] == engine.blocks.block_table(
                engine.requests[request["id"]].seqs[seq["index"]].seq_id
            )
            assert all(i in snap["frames"][f][1:] for f in seq["blocks"])
        # a room shares one screen
        assert "prompt" not in request and "text" not in request["seqs"][0]
    shown = Dashboard("tiny", show_text=True).snapshot(engine, time.perf_counter())[
        "requests"
    ][1]
    # --dashboard-show-text: prompts and answers
    assert shown["prompt"] == preamble + "two three"
    assert [seq["text"] for seq in shown["seqs"]] == [
        seq.text[: seq.released] for seq in engine.requests["b"].seqs
    ]
    while engine.has_unfinished_requests():
        engine.step()
    snap = dashboard.snapshot(engine, time.perf_counter())
    assert snap["requests"] == [] and all(
        cell in (None, "c") for cell in snap["frames"]
    )
    assert snap["frames"].count("c") >= len(shared)  # finished prompts stay findable


def test_command_line_server(tiny_llm):
    """python -m minipaged.serve prints its URLs, wants its API key, and stops on
    Ctrl-C."""
    command = [
        sys.executable,
        "-m",
        "minipaged.serve",
        "--model",
        str(tiny_llm.folder),
        "--port",
        "0",
        "--api-key",
        "k3y",
        "--num-blocks",
        "32",
        "--block-size",
        "4",
        "--served-model-name",
        "tiny",
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        lines = []
        deadline = time.monotonic() + 60
        while not any("API" in line for line in lines):
            assert process.poll() is None and time.monotonic() < deadline, "".join(
                lines
            )
            lines.append(process.stdout.readline())
        url = re.search(r"(http://127\.0\.0\.1:\d+)/v1", "".join(lines))[1]
        assert f"dashboard: {url}/" in "".join(lines)
        assert httpx.get(f"{url}/v1/models").status_code == 401
        models = httpx.get(
            f"{url}/v1/models", headers={"Authorization": "Bearer k3y"}
        ).json()
        assert models["data"][0]["id"] == "tiny"
        assert httpx.get(f"{url}/health").status_code == 200
        assert "<title>" in httpx.get(f"{url}/").text
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_real_model_greedy_through_the_server_equals_generate(smollm2):
    prompt = "The capital of France is"
    conversation = [{"role": "user", "content": "What is the capital of France?"}]
    greedy = SamplingParams(temperature=0, max_tokens=12)
    expected = smollm2.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].text
    expected_chat = smollm2.chat(conversation, greedy).outputs[0].text
    with serve(smollm2, name="smollm2", num_blocks=64) as url:
        client = openai.OpenAI(
            base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120
        )
        out = client.completions.create(
            model="smollm2", prompt=prompt, max_tokens=12, temperature=0
        )
        assert out.choices[0].text == expected
        stream = client.chat.completions.create(
            model="smollm2",
            messages=conversation,
            max_tokens=12,
            temperature=0,
            stream=True,
        )
        assert (
            "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            == expected_chat
        )
        assert "Paris" in expected_chat


def test_an_aborted_request_stops_counting_as_unfinished_at_once(tiny_llm):
    """The server's 503 ("full") counts unfinished requests: one whose abort was asked
    for (its client left, or a sibling prompt was refused) holds no place, though the
    engine thread frees it a little later; an abort that comes after the request
    finished changes nothing.
    """
    from minipaged.tools.serve.loop import EngineLoop

    async def run():
        loop = EngineLoop(tiny_llm.new_engine(num_blocks=64, block_size=4))
        updates = asyncio.Queue()
        params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
        for rid in ("a", "b"):
            loop.add_request(rid, "a page table", params, updates)
        loop.abort("a")  # before the engine thread has even seen it
        assert loop.num_unfinished == 1
        loop.start()
        try:
            finished = set()
            while finished != {"a", "b"}:  # "a" ends aborted, "b" answered
                update = await asyncio.wait_for(updates.get(), timeout=30)
                if update.output is not None:
                    finished.add(update.request_id)
            assert loop.num_unfinished == 0
            loop.abort("b")  # too late: it had finished
            deadline = time.monotonic() + 10
            while loop.aborting and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert loop.num_unfinished == 0 and not loop.aborting
        finally:
            loop.stop()

    asyncio.run(run())
