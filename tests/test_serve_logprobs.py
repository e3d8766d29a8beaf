"""Logprobs, echo and the sampling controls over HTTP, through the official `openai`
client.

The numbers are the model's: chat's and completions' logprobs equal a teacher-forced
forward of the same tokens (with echo, the prompt's too), penalties and logit_bias
change the greedy answer as tests/test_sampling_controls.py's NumPy specification says,
and a bad value is one 400 that names its field. Every server listens on 127.0.0.1 on a
free port.
"""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest
from checkpoints import write_checkpoint
from test_sampling_controls import reference_greedy, teacher_forced_logits

from minipaged import LLM, SamplingParams
from minipaged.sampling import log_softmax
from minipaged.tools.serve.api import Server, ServerConfig
from minipaged.tools.serve.cli import ServerThread


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    folder = write_checkpoint(
        tmp_path_factory.mktemp("logprobs") / "tiny", max_positions=128
    )
    return LLM(str(folder), device="cpu", num_blocks=256, block_size=4)


@pytest.fixture(scope="module")
def url(tiny_llm):
    engine = tiny_llm.new_engine(num_blocks=256, block_size=4)
    with ServerThread(
        Server(engine, tiny_llm.tokenizer, ServerConfig(model_name="tiny"))
    ) as url:
        yield url


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60
    )


def text_of(llm, token_id: int) -> str:
    return llm.tokenizer.decode([token_id], skip_special_tokens=False)


def greedy_ids(llm, prompt_ids: list[int], max_tokens: int) -> list[int]:
    out = llm.generate(
        [{"prompt_token_ids": prompt_ids}],
        SamplingParams(temperature=0, max_tokens=max_tokens),
        use_tqdm=False,
    )
    return out[0].outputs[0].token_ids


def test_chat_logprobs_and_top_logprobs(tiny_llm, url):
    conversation = [{"role": "user", "content": "what is a page table"}]
    ids = tiny_llm.tokenizer.encode_chat(conversation)
    answer = greedy_ids(tiny_llm, ids, 8)
    want = log_softmax(teacher_forced_logits(tiny_llm.model, ids + answer))[
        len(ids) - 1 :
    ]
    c = client(url)
    r = c.chat.completions.create(
        model="tiny",
        messages=conversation,
        temperature=0,
        max_tokens=8,
        logprobs=True,
        top_logprobs=3,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == len(answer)
    for i, (entry, token) in enumerate(zip(content, answer)):
        assert entry.token == text_of(tiny_llm, token) and entry.bytes == list(
            entry.token.encode()
        )
        assert entry.logprob == pytest.approx(want[i, token], abs=1e-4)
        top = entry.top_logprobs
        assert [t.token for t in top] == [
            text_of(tiny_llm, t) for t in np.argsort(-want[i])[:3]
        ]
        assert [t.logprob for t in top] == sorted(
            (t.logprob for t in top), reverse=True
        )
        assert top[0].token == entry.token  # greedy: the likeliest
        assert np.exp([t.logprob for t in top]).sum() <= 1
    plain = c.chat.completions.create(
        model="tiny", messages=conversation, temperature=0, max_tokens=8
    )
    assert (
        plain.choices[0].logprobs is None
        and plain.choices[0].message.content == r.choices[0].message.content
    )
    bare = c.chat.completions.create(
        model="tiny", messages=conversation, temperature=0, max_tokens=8, logprobs=True
    )
    assert [e.top_logprobs for e in bare.choices[0].logprobs.content] == [[]] * len(
        answer
    )
    assert [e.logprob for e in bare.choices[0].logprobs.content] == [
        e.logprob for e in content
    ]


def test_completion_logprobs_with_echo_match_a_teacher_forced_forward(tiny_llm, url):
    prompt = "hello world the cache is a page"
    ids = tiny_llm.tokenizer.encode(prompt)
    answer = greedy_ids(tiny_llm, ids, 5)
    every = ids + answer
    want = log_softmax(teacher_forced_logits(tiny_llm.model, every))
    r = client(url).completions.create(
        model="tiny", prompt=prompt, temperature=0, max_tokens=5, logprobs=2, echo=True
    )
    choice = r.choices[0]
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
    lp = choice.logprobs
    assert lp.tokens == [text_of(tiny_llm, t) for t in every]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for p in range(1, len(every)):
        assert lp.token_logprobs[p] == pytest.approx(want[p - 1, every[p]], abs=1e-4)
        likeliest = {text_of(tiny_llm, t) for t in np.argsort(-want[p - 1])[:2]}
        # OpenAI's: the token's own and the top 2
        assert set(lp.top_logprobs[p]) == likeliest | {lp.tokens[p]}
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(every))]
    raw = httpx.post(
        f"{url}/v1/completions",
        json={
            "prompt": prompt,
            "temperature": 0,
            "max_tokens": 5,
            "logprobs": 2,
            "echo": True,
        },
        timeout=60,
    ).json()
    # vLLM's, token id -> {logprob, rank, decoded_token}
    prompt_logprobs = raw["choices"][0]["prompt_logprobs"]
    assert len(prompt_logprobs) == len(ids) and prompt_logprobs[0] is None
    assert prompt_logprobs[1][str(ids[1])]["logprob"] == pytest.approx(
        want[0, ids[1]], abs=1e-4
    )
    assert prompt_logprobs[1][str(ids[1])]["decoded_token"] == text_of(tiny_llm, ids[1])


def test_completion_logprobs_without_echo_and_zero_top(tiny_llm, url):
    ids = tiny_llm.tokenizer.encode("one two three")
    answer = greedy_ids(tiny_llm, ids, 6)
    r = client(url).completions.create(
        model="tiny", prompt=ids, temperature=0, max_tokens=6, logprobs=0
    )
    lp = r.choices[0].logprobs
    assert lp.tokens == [text_of(tiny_llm, t) for t in answer]
    # logprobs=0: the token's own only
    assert [list(top) for top in lp.top_logprobs] == [[t] for t in lp.tokens]
    want = log_softmax(teacher_forced_logits(tiny_llm.model, ids + answer))[
        len(ids) - 1 :
    ]
    assert lp.token_logprobs == pytest.approx(
        [want[i, t] for i, t in enumerate(answer)], abs=1e-4
    )
    assert (
        client(url)
        .completions.create(model="tiny", prompt=ids, max_tokens=3)
        .choices[0]
        .logprobs
        is None
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"repetition_penalty": 3.0},
        {"logit_bias": {"30": 3.0, "31": 2.0}},
        {"frequency_penalty": 0.8, "presence_penalty": -0.5, "min_p": 0.2},
    ],
)
def test_penalties_and_logit_bias_change_the_greedy_answer_as_numpy_says(
    tiny_llm, url, fields
):
    ids = tiny_llm.tokenizer.encode("the paged frame block table")
    controls = {k: v for k, v in fields.items() if k != "logit_bias"}
    params = SamplingParams(
        temperature=0,
        max_tokens=10,
        ignore_eos=True,
        **controls,
        logit_bias={int(t): b for t, b in fields.get("logit_bias", {}).items()},
    )
    want = tiny_llm.tokenizer.decode(reference_greedy(tiny_llm.model, ids, params))
    c = client(url)
    got = (
        c.completions.create(
            model="tiny",
            prompt=ids,
            temperature=0,
            max_tokens=10,
            extra_body={"ignore_eos": True, **fields},
        )
        .choices[0]
        .text
    )
    plain = (
        c.completions.create(
            model="tiny",
            prompt=ids,
            temperature=0,
            max_tokens=10,
            extra_body={"ignore_eos": True},
        )
        .choices[0]
        .text
    )
    assert got == want and got != plain


def test_min_tokens_and_a_clamped_bias_over_http(url):
    r = client(url).completions.create(
        model="tiny",
        prompt="hello",
        temperature=0,
        max_tokens=10,
        logit_bias={"2": 500},
        extra_body={"min_tokens": 4},
    )  # 500: clamped to 100
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "route, body, param, message",
    [
        (
            "completions",
            {"presence_penalty": 2.5},
            "presence_penalty",
            "less than or equal to 2",
        ),
        (
            "completions",
            {"frequency_penalty": -3},
            "frequency_penalty",
            "greater than or equal to -2",
        ),
        (
            "completions",
            {"repetition_penalty": 0},
            "repetition_penalty",
            "greater than 0",
        ),
        ("completions", {"min_p": 1.5}, "min_p", "less than or equal to 1"),
        ("completions", {"min_tokens": -1}, "min_tokens", "greater than or equal to 0"),
        (
            "completions",
            {"min_tokens": 50, "max_tokens": 10},
            "min_tokens",
            "at most max_tokens=10",
        ),
        ("completions", {"logit_bias": {"abc": 1}}, "logit_bias", "token ids"),
        ("completions", {"logprobs": 21}, "logprobs", "less than or equal to 20"),
        (
            "completions",
            {"echo": True, "logprobs": 1, "stream": True},
            "echo",
            "not available when `stream=True`",
        ),
        (
            "completions",
            {"prompt_logprobs": 1, "stream": True},
            "prompt_logprobs",
            "not available when `stream=True`",
        ),
        (
            "chat/completions",
            {"top_logprobs": 2},
            "top_logprobs",
            "`logprobs` must be set to true",
        ),
        (
            "chat/completions",
            {"logprobs": True, "top_logprobs": 21},
            "top_logprobs",
            "less than or equal to 20",
        ),
        ("chat/completions", {"logprobs": "true"}, "logprobs", ""),
    ],
)
def test_bad_values_are_one_400_naming_the_field(url, route, body, param, message):
    base = (
        {"prompt": "hello"}
        if route == "completions"
        else {"messages": [{"role": "user", "content": "hi"}]}
    )
    r = httpx.post(f"{url}/v1/{route}", json=base | body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"], error


def test_a_logit_bias_outside_the_vocabulary_is_a_400(tiny_llm, url):
    vocab = tiny_llm.model.config.vocab_size
    r = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": "hello", "logit_bias": {str(vocab): 1}},
        timeout=30,
    )
    assert (
        r.status_code == 400
        and f"logit_bias key {vocab} is out" in r.json()["error"]["message"]
    )


def test_streamed_logprobs_are_the_whole_answers_chunk_by_chunk(tiny_llm, url):
    """stream=True with logprobs: each chunk carries its own tokens' logprobs (chat's
    content entries; completions' four lists, text_offset counting on across chunks),
    and together they are the answer's logprobs without stream."""
    c = client(url)
    messages = [{"role": "user", "content": "what is a page table"}]
    whole = c.chat.completions.create(
        model="tiny",
        messages=messages,
        temperature=0,
        max_tokens=8,
        logprobs=True,
        top_logprobs=2,
    )
    chunks = list(
        c.chat.completions.create(
            model="tiny",
            messages=messages,
            temperature=0,
            max_tokens=8,
            logprobs=True,
            top_logprobs=2,
            stream=True,
        )
    )
    streamed = [
        entry
        for chunk in chunks
        for choice in chunk.choices
        if choice.logprobs
        for entry in choice.logprobs.content
    ]
    assert [
        (e.token, round(e.logprob, 4), [t.token for t in e.top_logprobs])
        for e in streamed
    ] == [
        (e.token, round(e.logprob, 4), [t.token for t in e.top_logprobs])
        for e in whole.choices[0].logprobs.content
    ]
    assert len(streamed) == whole.usage.completion_tokens == 8
    whole = c.completions.create(
        model="tiny", prompt="hello there", temperature=0, max_tokens=6, logprobs=1
    )
    chunks = list(
        c.completions.create(
            model="tiny",
            prompt="hello there",
            temperature=0,
            max_tokens=6,
            logprobs=1,
            stream=True,
        )
    )
    parts = [
        choice.logprobs
        for chunk in chunks
        for choice in chunk.choices
        if choice.logprobs
    ]
    assert len(parts) > 1  # the logprobs really came chunk by chunk
    for key in ("tokens", "text_offset"):
        assert [v for part in parts for v in getattr(part, key)] == getattr(
            whole.choices[0].logprobs, key
        )
    assert np.allclose(
        [v for part in parts for v in part.token_logprobs],
        whole.choices[0].logprobs.token_logprobs,
        atol=1e-4,
    )


def test_a_streamed_echo_starts_with_the_prompt(url):
    """A completion's echo with stream=True: each choice's first chunk is its prompt,
    and the whole text is what the same request without stream answers."""
    c = client(url)
    whole = c.completions.create(
        model="tiny", prompt="hello there", temperature=0, max_tokens=5, echo=True, n=2
    )
    chunks = list(
        c.completions.create(
            model="tiny",
            prompt="hello there",
            temperature=0,
            max_tokens=5,
            echo=True,
            n=2,
            stream=True,
        )
    )
    texts = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts.setdefault(choice.index, []).append(choice.text)
    assert sorted(texts) == [0, 1]
    for index, pieces in texts.items():
        assert pieces[0] == "hello there"
        assert "".join(pieces) == whole.choices[index].text
