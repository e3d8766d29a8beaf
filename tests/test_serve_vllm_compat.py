"""What clients written for `vllm serve` send and read, against python -m
minipaged.serve (issue 31, part B): ignored fields, roles, vLLM's routes and extensions
(return_token_ids, echo, continue_final_message, truncate_prompt_tokens), stop_reason, n
> 1 streaming one choice per chunk, vLLM's refusals (stream_options without stream, a
body that is not JSON), and vLLM's metric names.

Over HTTP with the `openai` client and httpx, against servers on 127.0.0.1 on free ports
(a tiny random model); every loop is bounded in count and time.
"""

import json
import logging
import threading
import time
from importlib.metadata import PackageNotFoundError, version

import httpx
import openai
import pytest
from checkpoints import CHAT_TEMPLATE, write_checkpoint
from prometheus_client.parser import text_string_to_metric_families
from test_serve import serve

from minipaged import LLM, SamplingParams

PROMPT = "the paged frame block table token cache"
CHAT = [{"role": "user", "content": "what is a page table"}]


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    folder = write_checkpoint(tmp_path_factory.mktemp("vllm_compat") / "tiny")
    return LLM(str(folder), device="cpu", num_blocks=256, block_size=4)


@pytest.fixture(scope="module")
def url(tiny_llm):
    with serve(tiny_llm) as url:
        yield url


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30
    )


def greedy(llm, prompt, max_tokens=8, **options):
    """LLM.generate's greedy output for one prompt (text, or {"prompt_token_ids":
    ...})."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, **options)
    return llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=30)


def events(response: httpx.Response) -> list[dict]:
    """The JSON chunks of a server-sent event stream, checked to end with [DONE]."""
    lines = [line for line in response.text.splitlines() if line]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


# ---- fields: unknown ones ignored, known ones checked --------------------------------


def test_unknown_fields_are_ignored_at_the_top_and_in_a_message_and_logged_once(
    tiny_llm, url, caplog
):
    expected = (
        tiny_llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=6)).outputs[0].text
    )
    caplog.set_level(logging.DEBUG, logger="minipaged.serve")
    extra = {
        "store": True,
        "metadata": {"user": "ada"},
        "service_tier": "auto",
        "parallel_tool_calls": False,
        "reasoning_effort": "low",
    }
    for _ in range(2):
        answer = client(url).chat.completions.create(
            model="tiny", messages=CHAT, max_tokens=6, temperature=0, extra_body=extra
        )
        assert answer.choices[0].message.content == expected
    r = post(
        url,
        "/v1/chat/completions",
        {
            "messages": [CHAT[0] | {"cache_control": {"type": "ephemeral"}}],
            "max_tokens": 6,
            "temperature": 0,
            "frobnicate": 1,
        },
    )
    assert (
        r.status_code == 200
        and r.json()["choices"][0]["message"]["content"] == expected
    )
    logged = [
        record.getMessage()
        for record in caplog.records
        if record.name == "minipaged.serve"
    ]
    # once, however often it comes
    assert sum("store" in line for line in logged) == 1, logged
    assert any(
        "messages[].cache_control" in line and "frobnicate" in line for line in logged
    ), logged
    assert all(
        record.levelno == logging.DEBUG
        for record in caplog.records
        if record.name == "minipaged.serve"
    )


@pytest.mark.parametrize(
    "body, param, words",
    [
        (
            {"messages": CHAT, "logprobs": "true"},
            "logprobs",
            "true or false (a JSON boolean), got the string 'true'",
        ),
        ({"messages": CHAT, "n": "2"}, "n", "an integer, got the string '2'"),
        (
            {"messages": CHAT, "stream": 1},
            "stream",
            "true or false (a JSON boolean), got the number 1",
        ),
        ({"messages": CHAT, "temperature": -1}, "temperature", "temperature"),
        (
            {"messages": [{"role": "wizard", "content": "hi"}]},
            "messages[0].role",
            "developer",
        ),
        ({"messages": CHAT, "seed": 2**63}, "seed", "seed"),
    ],
)
def test_known_fields_keep_clear_400s(url, body, param, words):
    r = post(url, "/v1/chat/completions", body)
    error = r.json()["error"]
    assert (r.status_code, error["param"]) == (400, param), r.text
    assert words in error["message"], error["message"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("structural_tag", {"type": "structural_tag"}),
        ("functions", [{"name": "f"}]),
        ("allowed_token_ids", [1, 2]),
    ],
)
def test_fields_minipaged_lacks_are_refused_by_name(url, field, value):
    with pytest.raises(openai.BadRequestError) as refused:
        client(url).chat.completions.create(
            model="tiny", messages=CHAT, max_tokens=2, extra_body={field: value}
        )
    error = refused.value.body
    # the error object, whichever way the client unwrapped it
    error = error.get("error", error)
    assert (
        error["param"] == field and "not supported by minipaged yet" in error["message"]
    ), error


def test_neutral_values_of_fields_minipaged_lacks_are_accepted(url):
    r = post(
        url,
        "/v1/chat/completions",
        {
            "messages": CHAT,
            "max_tokens": 2,
            "response_format": {"type": "text"},
            "tool_choice": "none",
            "tools": [],
            "skip_special_tokens": True,
        },
    )
    assert r.status_code == 200, r.text


def test_roles_developer_and_tool_go_through_the_chat_template(tiny_llm, url):
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "what is a frame"},
        {"role": "tool", "content": "frame block"},
    ]
    ids = tiny_llm.tokenizer.encode_chat(messages)
    assert tiny_llm.tokenizer.apply_chat_template(messages).startswith(
        "<|developer|> be brief <|user|>"
    )
    r = post(url, "/tokenize", {"messages": messages})
    assert r.status_code == 200 and r.json()["tokens"] == ids
    answer = client(url).chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0
    )
    assert (
        answer.choices[0].message.content
        == greedy(tiny_llm, {"prompt_token_ids": ids}, 6).text
    )


def test_a_negative_seed_is_taken_as_vllm_takes_any_int64(tiny_llm, url):
    texts = [
        client(url)
        .completions.create(
            model="tiny", prompt=PROMPT, max_tokens=8, seed=-1, temperature=1.0
        )
        .choices[0]
        .text
        for _ in range(2)
    ]
    seeded = (
        tiny_llm.generate(
            [PROMPT],
            SamplingParams(temperature=1.0, max_tokens=8, seed=2**64 - 1),
            use_tqdm=False,
        )[0]
        .outputs[0]
        .text
    )
    assert texts == [seeded, seeded]
    other = client(url).completions.create(
        model="tiny", prompt=PROMPT, max_tokens=8, seed=-(2**63), temperature=1.0
    )
    assert other.choices[0].finish_reason in ("stop", "length")


# ---- vLLM's routes -------------------------------------------------------------------


def test_tokenize_detokenize_tokenizer_info_version_and_ping(tiny_llm, url):
    tokenizer = tiny_llm.tokenizer
    ids = tokenizer.encode(PROMPT)
    r = post(url, "/tokenize", {"prompt": PROMPT, "return_token_strs": True}).json()
    assert r == {
        "count": len(ids),
        "max_model_len": tiny_llm.engine.max_model_len,
        "tokens": ids,
        "token_strs": PROMPT.split(),
    }
    plain = post(url, "/tokenize", {"prompt": PROMPT}).json()
    assert plain["tokens"] == ids and plain["token_strs"] is None
    chat = post(url, "/tokenize", {"messages": CHAT}).json()
    assert chat["tokens"] == tokenizer.encode_chat(CHAT) and chat["count"] == len(
        chat["tokens"]
    )
    both = post(url, "/tokenize", {"messages": CHAT, "continue_final_message": True})
    assert (
        both.status_code == 400
        and "Cannot set both `continue_final_message`"
        in both.json()["error"]["message"]
    )

    assert post(url, "/detokenize", {"tokens": ids}).json() == {
        "prompt": tokenizer.decode(ids)
    }
    bad = post(
        url, "/detokenize", {"tokens": [5, tiny_llm.engine.model.config.vocab_size]}
    )
    assert (
        bad.status_code == 400 and "out of vocabulary" in bad.json()["error"]["message"]
    )

    info = httpx.get(f"{url}/tokenizer_info").json()
    assert (
        info["chat_template"] == CHAT_TEMPLATE
        and info["eos_token"] == "</s>"
        and info["tokenizer_class"]
    )
    try:
        expected = version("minipaged")
    except PackageNotFoundError:
        expected = "0.1.0"
    assert httpx.get(f"{url}/version").json() == {"version": expected}
    assert (
        httpx.get(f"{url}/ping").status_code
        == httpx.post(f"{url}/ping").status_code
        == 200
    )
    schema = httpx.get(f"{url}/openapi.json").json()["paths"]
    assert {"/tokenize", "/detokenize", "/tokenizer_info", "/version", "/ping"} <= set(
        schema
    )


def test_out_of_vocabulary_prompt_ids_say_so(tiny_llm, url):
    vocab = tiny_llm.engine.model.config.vocab_size
    r = post(url, "/v1/completions", {"prompt": [5, vocab + 3], "max_tokens": 2})
    assert (
        r.status_code == 400
        and f"token id {vocab + 3} is out of vocabulary" in r.json()["error"]["message"]
    )


def test_load_counts_the_requests_not_yet_done(url):
    """vLLM's GET /load: {"server_load": requests in flight}; 0 when idle, 1 while one
    runs."""
    assert httpx.get(f"{url}/load").json() == {"server_load": 0}
    seen, answer = [], []
    body = {"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "temperature": 0}
    worker = threading.Thread(
        target=lambda: answer.append(post(url, "/v1/completions", body))
    )
    worker.start()
    deadline = time.monotonic() + 30
    while worker.is_alive() and time.monotonic() < deadline:
        seen.append(httpx.get(f"{url}/load").json()["server_load"])
    worker.join(30)
    assert answer and answer[0].status_code == 200 and 1 in seen and max(seen) == 1, (
        seen[:20]
    )
    while (
        httpx.get(f"{url}/load").json()["server_load"] and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    assert httpx.get(f"{url}/load").json() == {"server_load": 0}


def test_invocations_answers_a_chat_or_a_completion_as_its_own_route_does(url):
    """vLLM's POST /invocations (SageMaker's): `messages` makes it a chat, `prompt` a
    completion."""
    for route, body in (
        ("/v1/chat/completions", {"messages": CHAT}),
        ("/v1/completions", {"prompt": PROMPT}),
    ):
        body = body | {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
        direct, via = (
            post(url, route, body).json(),
            post(url, "/invocations", body).json(),
        )
        assert (
            via.keys() == direct.keys()
            and via["choices"] == direct["choices"]
            and via["object"] == direct["object"]
        )
    streamed = events(
        post(url, "/invocations", {"prompt": PROMPT, "max_tokens": 2, "stream": True})
    )
    assert streamed and all(c["object"] == "text_completion" for c in streamed)
    neither = post(url, "/invocations", {"input": "hello"})
    assert (
        neither.status_code == 400 and "messages" in neither.json()["error"]["message"]
    )
    assert httpx.post(f"{url}/invocations", content="x", timeout=30).status_code == 415


@pytest.mark.parametrize(
    "route, field, value",
    [
        ("/v1/chat/completions", "stop_token_ids", lambda vocab: [vocab + 1]),
        ("/v1/completions", "stop_token_ids", lambda vocab: [3, vocab]),
        ("/v1/chat/completions", "logit_bias", lambda vocab: {str(vocab + 1): 1.0}),
    ],
)
def test_out_of_vocabulary_stop_ids_and_bias_keys_name_the_id_and_the_vocabulary_size(
    tiny_llm, url, route, field, value
):
    vocab = tiny_llm.engine.model.config.vocab_size
    body = {"messages": CHAT} if "chat" in route else {"prompt": PROMPT}
    r = post(url, route, body | {"max_tokens": 2, field: value(vocab)})
    error = r.json()["error"]
    bad = value(vocab)[-1] if isinstance(value(vocab), list) else vocab + 1
    assert r.status_code == 400 and error["param"] == field, error
    assert (
        f"{bad} is out of vocabulary" in error["message"]
        and f"vocabulary size is {vocab}" in error["message"]
    )
    # the last id is fine
    edge = [vocab - 1] if field == "stop_token_ids" else {str(vocab - 1): 1.0}
    assert post(url, route, body | {"max_tokens": 2, field: edge}).status_code == 200


def test_return_token_ids_on_completions_and_chat_plain_and_streamed(tiny_llm, url):
    out = greedy(tiny_llm, PROMPT, 8, ignore_eos=True)
    ids = tiny_llm.tokenizer.encode(PROMPT)
    body = {
        "prompt": PROMPT,
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    choice = post(url, "/v1/completions", body).json()["choices"][0]
    assert (choice["prompt_token_ids"], choice["token_ids"], choice["text"]) == (
        ids,
        out.token_ids,
        out.text,
    )
    assert (
        "token_ids"
        not in post(url, "/v1/completions", body | {"return_token_ids": False}).json()[
            "choices"
        ][0]
    )

    chunks = events(post(url, "/v1/completions", body | {"stream": True}))
    streamed = [c["choices"][0] for c in chunks]
    assert sum((c["token_ids"] for c in streamed), []) == out.token_ids
    assert streamed[0]["prompt_token_ids"] == ids and all(
        "prompt_token_ids" not in c for c in streamed[1:]
    )
    assert "".join(c["text"] for c in streamed) == out.text

    chat_ids = tiny_llm.tokenizer.encode_chat(CHAT)
    want = greedy(tiny_llm, {"prompt_token_ids": chat_ids}, 6, ignore_eos=True)
    answer = post(
        url,
        "/v1/chat/completions",
        {
            "messages": CHAT,
            "max_tokens": 6,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    ).json()
    assert (
        answer["prompt_token_ids"] == chat_ids
        and answer["choices"][0]["token_ids"] == want.token_ids
    )


def test_chat_echo_and_continue_final_message(tiny_llm, url):
    prefill = CHAT + [{"role": "assistant", "content": "the cache"}]
    tokenizer = tiny_llm.tokenizer
    rendered = tokenizer.apply_chat_template(
        prefill, False, continue_final_message=True
    )
    assert rendered.endswith("<|assistant|> the cache")
    ids = tokenizer.encode_chat(prefill, False, continue_final_message=True)
    # the answer's turn is left open, not closed
    assert ids[-2:] == tokenizer.encode("the cache")
    body = {
        "messages": prefill,
        "add_generation_prompt": False,
        "continue_final_message": True,
        "echo": True,
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
    }
    want = greedy(tiny_llm, {"prompt_token_ids": ids}, 6, ignore_eos=True).text
    message = post(url, "/v1/chat/completions", body).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "the cache" + want}
    chunks = events(post(url, "/v1/chat/completions", body | {"stream": True}))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""} and deltas[1] == {
        "content": "the cache"
    }
    assert "".join(d.get("content", "") for d in deltas) == "the cache" + want
    # without echo, or when the last message is the user's, nothing is repeated
    plain = post(url, "/v1/chat/completions", body | {"echo": False}).json()["choices"][
        0
    ]["message"]["content"]
    assert plain == want
    user = post(
        url,
        "/v1/chat/completions",
        {"messages": CHAT, "echo": True, "max_tokens": 3, "temperature": 0},
    )
    assert not user.json()["choices"][0]["message"]["content"].startswith(
        CHAT[0]["content"]
    )


def test_truncate_prompt_tokens_keeps_the_last_ones(tiny_llm, url):
    ids = tiny_llm.tokenizer.encode(PROMPT)
    out = client(url).completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=5,
        temperature=0,
        extra_body={"truncate_prompt_tokens": 3, "ignore_eos": True},
    )
    assert out.usage.prompt_tokens == 3
    assert (
        out.choices[0].text
        == greedy(tiny_llm, {"prompt_token_ids": ids[-3:]}, 5, ignore_eos=True).text
    )
    r = post(
        url, "/v1/completions", {"prompt": PROMPT, "truncate_prompt_tokens": 10**6}
    )
    assert (
        r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"
    )
    assert "is greater than max_model_len" in r.json()["error"]["message"]


@pytest.mark.parametrize("side", ["left", "right"])
def test_truncation_side_right_keeps_the_first_tokens_left_the_last(
    tiny_llm, url, side
):
    ids = tiny_llm.tokenizer.encode(PROMPT)
    kept = ids[:3] if side == "right" else ids[-3:]
    body = {
        "prompt": ids,
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "truncate_prompt_tokens": 3,
        "truncation_side": side,
    }
    choice = post(url, "/v1/completions", body).json()["choices"][0]
    assert choice["prompt_token_ids"] == kept
    assert (
        choice["text"]
        == greedy(tiny_llm, {"prompt_token_ids": kept}, 4, ignore_eos=True).text
    )
    chat = post(
        url,
        "/v1/chat/completions",
        {
            "messages": CHAT,
            "max_tokens": 1,
            "return_token_ids": True,
            "truncate_prompt_tokens": 3,
            "truncation_side": side,
        },
    ).json()
    whole = tiny_llm.tokenizer.encode_chat(CHAT)
    assert chat["prompt_token_ids"] == (whole[:3] if side == "right" else whole[-3:])
    bad = post(url, "/v1/completions", body | {"truncation_side": "middle"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "truncation_side"


# ---- behaviours ----------------------------------------------------------------------


def test_stop_reason_names_the_stop_string_or_token(tiny_llm, url):
    free = greedy(tiny_llm, PROMPT, 12, ignore_eos=True)
    assert free.stop_reason is None and free.finish_reason == "length"
    word = free.text.split()[2]
    by_string = greedy(
        tiny_llm, PROMPT, 12, ignore_eos=True, stop=[word, "no such stop"]
    )
    assert (by_string.finish_reason, by_string.stop_reason) == ("stop", word)
    token = free.token_ids[3]
    by_token = greedy(tiny_llm, PROMPT, 12, ignore_eos=True, stop_token_ids=[token])
    assert (by_token.finish_reason, by_token.stop_reason) == ("stop", token)

    for extra, reason in (
        ({"stop": [word, "no such stop"]}, word),
        ({"stop_token_ids": [token]}, token),
        ({}, None),
    ):
        body = {
            "prompt": PROMPT,
            "max_tokens": 12,
            "temperature": 0,
            "ignore_eos": True,
        } | extra
        choice = post(url, "/v1/completions", body).json()["choices"][0]
        assert (choice["stop_reason"], choice["finish_reason"]) == (
            reason,
            "stop" if reason else "length",
        )
        last = events(post(url, "/v1/completions", body | {"stream": True}))[-1][
            "choices"
        ][0]
        assert (last["stop_reason"], last["finish_reason"]) == (
            reason,
            "stop" if reason else "length",
        )
        chat = post(url, "/v1/chat/completions", {"messages": CHAT} | body).json()[
            "choices"
        ][0]
        # the chat's own text may not reach the stop
        assert chat["stop_reason"] in (
            reason,
            None,
        )


def seed_with_uneven_samples(llm, prompt, n, params):
    """A seed (of the first 40) whose n samples end at different lengths: one finishes
    early."""
    for seed in range(40):
        outs = llm.generate(
            [prompt], SamplingParams(n=n, seed=seed, **params), use_tqdm=False
        )[0].outputs
        if len({len(o.token_ids) for o in outs}) > 1:
            return seed, outs
    pytest.fail("no seed of 40 gave samples of different lengths")


def test_n_streaming_sends_one_choice_per_chunk_each_finishing_on_its_own(
    tiny_llm, url
):
    params = {
        "temperature": 1.0,
        "max_tokens": 12,
        "ignore_eos": True,
        "stop_token_ids": [9, 10],
    }
    seed, outs = seed_with_uneven_samples(tiny_llm, PROMPT, 3, params)
    body = {
        "prompt": PROMPT,
        "n": 3,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    } | params
    chunks = events(post(url, "/v1/completions", body))
    assert (
        all(len(c["choices"]) == 1 for c in chunks[:-1]) and chunks[-1]["choices"] == []
    )
    finished_at = {}
    for at, chunk in enumerate(chunks[:-1]):
        choice = chunk["choices"][0]
        assert choice["index"] not in finished_at, "a choice sent text after its finish"
        if choice["finish_reason"] is not None:
            finished_at[choice["index"]] = at
    assert sorted(finished_at) == [0, 1, 2]  # each index finishes exactly once
    texts = [
        "".join(
            c["choices"][0]["text"]
            for c in chunks[:-1]
            if c["choices"][0]["index"] == i
        )
        for i in range(3)
    ]
    assert texts == [o.text for o in outs]
    shortest = min(range(3), key=lambda i: len(outs[i].token_ids))
    later = [c["choices"][0] for c in chunks[finished_at[shortest] + 1 : -1]]
    # it did not wait for its siblings
    assert any(c["index"] != shortest and c["token_ids"] for c in later)
    assert [
        sum(
            (
                c["choices"][0]["token_ids"]
                for c in chunks[:-1]
                if c["choices"][0]["index"] == i
            ),
            [],
        )
        for i in range(3)
    ] == [o.token_ids for o in outs]
    assert chunks[-1]["usage"]["completion_tokens"] == sum(
        len(o.token_ids) for o in outs
    )

    chat = events(
        post(
            url,
            "/v1/chat/completions",
            {"messages": CHAT, "n": 2, "max_tokens": 4, "stream": True},
        )
    )
    assert [c["choices"][0]["delta"] for c in chat[:2]] == [
        {"role": "assistant", "content": ""}
    ] * 2
    assert [c["choices"][0]["index"] for c in chat[:2]] == [0, 1]
    assert sorted(
        c["choices"][0]["index"] for c in chat if c["choices"][0]["finish_reason"]
    ) == [0, 1]


def test_stream_options_without_stream_is_vllms_400(url):
    for path, body in (
        ("/v1/completions", {"prompt": PROMPT}),
        ("/v1/chat/completions", {"messages": CHAT}),
    ):
        r = post(url, path, body | {"stream_options": {"include_usage": True}})
        assert r.status_code == 400, r.text
        assert r.json()["error"] | {"code": None} == {
            "message": "Stream options can only be defined when `stream=True`.",
            "type": "BadRequestError",
            "param": "stream_options",
            "code": None,
        }
    assert (
        post(
            url,
            "/v1/completions",
            {"prompt": PROMPT, "max_tokens": 2, "stream_options": {}},
        ).status_code
        == 200
    )


def test_continuous_usage_stats_count_in_every_chunk(tiny_llm, url):
    prompt_tokens = len(tiny_llm.tokenizer.encode(PROMPT))
    body = {
        "prompt": PROMPT,
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    chunks = events(post(url, "/v1/completions", body))
    assert all("usage" in c for c in chunks)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 6 and counts[0] >= 1
    assert {c["usage"]["prompt_tokens"] for c in chunks} == {prompt_tokens}
    plain = events(
        post(url, "/v1/completions", body | {"stream_options": {"include_usage": True}})
    )
    assert [("usage" in c) for c in plain] == [False] * (len(plain) - 1) + [True]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_streams_last_token_comes_in_the_chunk_that_finishes_it(url, route):
    """vLLM's streams end a choice in the chunk of its last token (its text beside
    finish_reason), so that with continuous_usage_stats each chunk with a choice counts
    one token more.
    """
    chat = "chat" in route
    body = ({"messages": CHAT} if chat else {"prompt": PROMPT}) | {
        "max_tokens": 5,
        "temperature": 0,
        "ignore_eos": True,
    }
    plain = post(url, route, body).json()["choices"][0]
    whole = plain["message"]["content"] if chat else plain["text"]
    chunks = events(
        post(
            url,
            route,
            body
            | {
                "stream": True,
                "stream_options": {
                    "include_usage": True,
                    "continuous_usage_stats": True,
                },
            },
        )
    )
    pieces = [
        (c["choices"][0]["delta"].get("content") if chat else c["choices"][0]["text"])
        for c in chunks
        if c["choices"]
    ]
    finished = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finished) == 1 and finished[0]["choices"][0]["finish_reason"] == "length"
    assert pieces[-1] and "".join(p or "" for p in pieces) == whole
    counts = [c["usage"]["completion_tokens"] for c in chunks if c["choices"]]
    # a chat's first chunk is its role, before any token
    texts = counts[1:] if chat else counts
    assert texts == list(range(1, 6)), counts
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("stream", [False, True])
def test_echo_of_token_ids_writes_their_special_tokens_out_as_vllm_does(
    tiny_llm, url, stream
):
    eos = tiny_llm.tokenizer.hf.token_to_id("</s>")
    ids = [eos] + tiny_llm.tokenizer.encode(PROMPT)
    body = {
        "prompt": ids,
        "max_tokens": 3,
        "temperature": 0,
        "ignore_eos": True,
        "echo": True,
        "stream": stream,
    }
    r = post(url, "/v1/completions", body)
    text = (
        "".join(c["choices"][0]["text"] for c in events(r) if c["choices"])
        if stream
        else r.json()["choices"][0]["text"]
    )
    assert text.startswith(
        tiny_llm.tokenizer.decode(ids, skip_special_tokens=False)
    ) and text.startswith("</s>")
    if not stream:  # the second token's text starts where the echoed "</s>" ends
        lp = post(url, "/v1/completions", body | {"logprobs": 0}).json()["choices"][0]
        assert lp["logprobs"]["tokens"][0] == "</s>" and lp["logprobs"]["text_offset"][
            :2
        ] == [0, len("</s>")]


def test_a_chat_choice_that_ends_without_new_text_still_has_content_in_its_last_delta(
    tiny_llm, url
):
    first = (
        tiny_llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=1))
        .outputs[0]
        .token_ids[0]
    )
    chunks = events(
        post(
            url,
            "/v1/chat/completions",
            {
                "messages": CHAT,
                "max_tokens": 5,
                "temperature": 0,
                "stream": True,
                "stop_token_ids": [first],
            },
        )
    )
    last = chunks[-1]["choices"][0]
    assert (
        last["finish_reason"] == "stop"
        and last["stop_reason"] == first
        and last["delta"] == {"content": ""}
    )


def test_stream_options_include_usage_defaults_to_false_as_in_current_vllm_and_openai(
    url,
):
    # ignore_eos: a sampled end of text (the tiny model's vocabulary is 60 words) would
    # stop the answer short of its 3 tokens now and then
    body = {"prompt": PROMPT, "max_tokens": 3, "stream": True, "ignore_eos": True}
    assert not any(
        "usage" in c
        for c in events(post(url, "/v1/completions", body | {"stream_options": {}}))
    )
    asked = events(
        post(url, "/v1/completions", body | {"stream_options": {"include_usage": True}})
    )
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("prompt", [None, "", []])
def test_an_empty_prompt_is_vllms_400(url, prompt):
    r = post(
        url, "/v1/completions", {"prompt": prompt, "max_tokens": 2, "prompt_embeds": []}
    )
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "prompt", error
    assert (
        error["message"]
        == "Either prompt or prompt_embeds must be provided and non-empty."
    )
    with pytest.raises(openai.BadRequestError, match="prompt_embeds is not supported"):
        client(url).completions.create(
            model="tiny", prompt="x", extra_body={"prompt_embeds": "AAAA"}
        )


def test_force_include_usage_puts_the_usage_in_every_chunk_of_every_stream(tiny_llm):
    from minipaged.tools.serve.cli import build_parser

    assert (
        build_parser()
        .parse_args(["--enable-force-include-usage"])
        .enable_force_include_usage
    )
    with serve(tiny_llm, force_include_usage=True) as forced:
        body = {
            "messages": CHAT,
            "max_tokens": 4,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        for options in ({}, {"stream_options": {"include_usage": False}}):
            chunks = events(post(forced, "/v1/chat/completions", body | options))
            # KeyError if a chunk has none
            counts = [c["usage"]["completion_tokens"] for c in chunks]
            assert counts == [0, 1, 2, 3, 4, 4] and chunks[-1]["choices"] == [], counts
        assert (
            "usage"
            in post(
                forced, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2}
            ).json()
        )


def test_root_path_answers_under_the_prefix_and_without_it(tiny_llm):
    from minipaged.tools.serve.cli import build_parser

    assert build_parser().parse_args(["--root-path", "/llm"]).root_path == "/llm"
    with serve(tiny_llm, root_path="/llm", api_key="k") as served:
        for base in (f"{served}/v1", f"{served}/llm/v1"):
            keyed = openai.OpenAI(base_url=base, api_key="k", max_retries=0, timeout=30)
            assert (
                keyed.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2)
                .choices[0]
                .message
            )
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(
                    base_url=base, api_key="wrong", max_retries=0, timeout=30
                ).models.list()
        assert httpx.get(f"{served}/elsewhere/v1/models").status_code == 404


def test_prompt_logprobs_is_null_when_not_asked_as_in_vllms_answers(url):
    chat = post(url, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}).json()
    assert "prompt_logprobs" in chat and chat["prompt_logprobs"] is None
    completion = post(
        url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2}
    ).json()
    assert (
        "prompt_logprobs" in completion["choices"][0]
        and completion["choices"][0]["prompt_logprobs"] is None
    )


def test_a_body_that_is_not_json_is_a_415(url):
    for headers in (
        {"Content-Type": "text/plain"},
        {},
        {"Content-Type": "application/x-www-form-urlencoded"},
    ):
        r = httpx.post(
            f"{url}/v1/completions",
            content=b'{"prompt": "hello"}',
            headers=headers,
            timeout=30,
        )
        assert r.status_code == 415, (headers, r.text)
        error = r.json()["error"]
        assert (
            error["type"] == "UnsupportedMediaTypeError"
            and "application/json" in error["message"]
        )
    ok = httpx.post(
        f"{url}/v1/completions",
        content=b'{"prompt": "hello", "max_tokens": 2}',
        timeout=30,
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 200


# ---- metrics under vLLM's names ------------------------------------------------------

# vLLM's tests/entrypoints/openai/test_metrics.py, EXPECTED_METRICS_V1 (not the
# deprecated gpu_*)
VLLM_NAMES = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:iteration_tokens_total",
    "vllm:cache_config_info",
    "vllm:request_success_total",
    *[
        f"vllm:{name}_{part}"
        for name in (
            "request_prompt_tokens",
            "request_generation_tokens",
            "request_params_n",
            "request_params_max_tokens",
            "time_per_output_token_seconds",
            "time_to_first_token_seconds",
            "inter_token_latency_seconds",
            "e2e_request_latency_seconds",
            "request_queue_time_seconds",
            "request_inference_time_seconds",
            "request_prefill_time_seconds",
            "request_decode_time_seconds",
        )
        for part in ("sum", "bucket", "count")
    ],
]


def samples(text: str) -> dict:
    """{(sample name, sorted labels without le): value} of a /metrics page."""
    return {
        (
            s.name,
            tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")),
        ): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "le" not in s.labels
    }


def test_metrics_serve_vllms_names_beside_minipageds_and_count(tiny_llm):
    prompts = ["one two three four", "red blue green fast slow", "hello world yes"]
    lengths = [len(tiny_llm.tokenizer.encode(p)) for p in prompts]
    with serve(tiny_llm) as url:
        for prompt in prompts:  # one at a time: each request is alone in its steps
            out = client(url).completions.create(
                model="tiny",
                prompt=prompt,
                max_tokens=5,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            assert out.usage.completion_tokens == 5
        text = httpx.get(f"{url}/metrics").text
    for name in VLLM_NAMES:
        assert name in text, name
    values = samples(text)
    vllm = {"engine": "0", "model_name": "tiny"}

    def value(name: str, **labels) -> float:
        ours = values[
            (
                f"minipaged:{name}",
                tuple(sorted({"model_name": "tiny", **labels}.items())),
            )
        ]
        theirs = values[(f"vllm:{name}", tuple(sorted((vllm | labels).items())))]
        assert ours == theirs, name  # one series, two names
        return theirs

    assert value("request_success_total", finished_reason="length") == 3
    assert (
        value("prompt_tokens_total") == sum(lengths)
        and value("generation_tokens_total") == 15
    )
    assert value("request_prompt_tokens_count") == 3 and value(
        "request_prompt_tokens_sum"
    ) == sum(lengths)
    assert (
        value("request_generation_tokens_sum") == 15
        and value("request_params_max_tokens_sum") == 15
    )
    assert value("request_params_n_sum") == 3
    for name in (
        "time_to_first_token_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "request_inference_time_seconds",
        "request_time_per_output_token_seconds",
    ):
        assert value(f"{name}_count") == 3, name
    assert (
        value("inter_token_latency_seconds_count")
        == value("time_per_output_token_seconds_count")
        == 3 * 4
    )
    # a prefill step and four decode steps each
    assert value("iteration_tokens_total_count") == 3 * 5
    assert value("num_preemptions_total") == 0 and value("num_requests_running") == 0
    assert (
        value("e2e_request_latency_seconds_sum")
        >= value("request_decode_time_seconds_sum")
        > 0
    )
