"""LLM.generate / chat / stream on a tiny checkpoint: batching changes nothing, bad
input is named."""

import pytest

from minipaged import LLM, SamplingParams
from minipaged.model.oracle import greedy_generate

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture
def llm(tiny):
    return LLM(
        str(tiny(hidden=96, heads=6, kv_heads=2, max_positions=64)), device="cpu"
    )


def test_batched_greedy_equals_oracle_run_alone(llm):
    prompts = [[1, 5, 9, 10], [1, 20], [1, 30, 31, 32, 33, 34, 35, 36], [7]]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False
    )
    for prompt, out in zip(prompts, outs):
        assert out.prompt_token_ids == prompt
        assert out.outputs[0].token_ids == greedy_generate(llm.model, prompt, 12)
        assert out.outputs[0].finish_reason == "length"


def test_string_prompt_and_text(llm):
    out = llm.generate(["hello world the cache"], GREEDY, use_tqdm=False)[0]
    assert out.prompt_token_ids == llm.tokenizer.encode("hello world the cache")
    assert out.outputs[0].text == llm.tokenizer.decode(out.outputs[0].token_ids)


def test_bad_prompts_are_rejected_and_the_others_still_run(llm):
    good = {"prompt_token_ids": [1, 5, 9]}
    outs = llm.generate(
        [
            good,
            "",
            {"prompt_token_ids": [1, 10_000]},
            {"prompt_token_ids": [1] * 64},
            {"tokens": [1]},
            good,
        ],
        GREEDY,
        use_tqdm=False,
    )
    assert [o.error is None for o in outs] == [True, False, False, False, False, True]
    assert "prompt is empty" in outs[1].error
    assert "token id 10000 is out of vocabulary" in outs[2].error
    assert "prompt has 64 tokens; this model's max_model_len is 64" in outs[3].error
    assert "must be a string or" in outs[4].error
    assert (
        outs[0].outputs[0].token_ids
        == outs[5].outputs[0].token_ids
        == greedy_generate(llm.model, [1, 5, 9], 12)
    )
    assert outs[1].outputs[0].finish_reason == "rejected"


def test_stop_conditions(llm):
    base = llm.generate([{"prompt_token_ids": [1, 5]}], GREEDY, use_tqdm=False)[
        0
    ].outputs[0]
    stop_token = base.token_ids[3]
    first = base.token_ids.index(stop_token)
    out = llm.generate(
        [{"prompt_token_ids": [1, 5]}],
        SamplingParams(
            temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_token]
        ),
        use_tqdm=False,
    )[0].outputs[0]
    assert out.token_ids == base.token_ids[: first + 1] and out.finish_reason == "stop"
    word = llm.tokenizer.decode([base.token_ids[2]])
    out = llm.generate(
        [{"prompt_token_ids": [1, 5]}],
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[word]),
        use_tqdm=False,
    )[0].outputs[0]
    assert word not in out.text and out.finish_reason == "stop"
    assert base.text.startswith(out.text)


def test_eos_ends_a_sequence_unless_ignored(llm):
    prompt = {"prompt_token_ids": [1, 5]}
    base = llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    # pretend the model's eos is a token it is about to produce
    llm.eos_token_ids = {base[4]}
    out = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False
    )[0]
    first = base.index(base[4])
    assert (
        out.outputs[0].token_ids == base[: first + 1]
        and out.outputs[0].finish_reason == "stop"
    )
    ignored = llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0]
    assert ignored.token_ids == base and ignored.finish_reason == "length"


def test_seeded_samples_do_not_depend_on_the_batch(llm):
    p = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    alone = llm.generate([{"prompt_token_ids": [1, 5, 9]}], p, use_tqdm=False)[0]
    other = SamplingParams(temperature=0.8, seed=1, max_tokens=4, ignore_eos=True)
    batched = llm.generate(
        [{"prompt_token_ids": [1, 44]}, {"prompt_token_ids": [1, 5, 9]}],
        [other, p],
        use_tqdm=False,
    )[1]
    assert [c.token_ids for c in alone.outputs] == [
        c.token_ids for c in batched.outputs
    ]
    assert len({tuple(c.token_ids) for c in alone.outputs}) > 1  # the samples differ
    assert [c.index for c in alone.outputs] == [0, 1, 2]


def test_stream_yields_the_same_text_as_generate(llm):
    prompt = {"prompt_token_ids": [1, 5, 9]}
    pieces = list(llm.stream(prompt, GREEDY))
    assert len(pieces) > 1
    assert (
        "".join(pieces)
        == llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].text
    )


def test_chat_uses_the_template(llm):
    messages = [{"role": "user", "content": "hello world"}]
    out = llm.chat(messages, GREEDY)
    assert out.prompt_token_ids == llm.tokenizer.encode(
        "<|user|> hello world <|assistant|>", add_special_tokens=False
    )
    with pytest.raises(
        ValueError, match="message 0 must be a dict with 'role' and 'content'"
    ):
        llm.chat([{"content": "no role"}])


def test_sampling_params_errors():
    for bad, said in [
        (dict(temperature=-1), "temperature must be a number >= 0"),
        (dict(top_p=0), "top_p"),
        (dict(top_k=0), "top_k must be -1"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(n=0), "n must be an integer >= 1"),
        (dict(stop=[""]), "non-empty strings"),
    ]:
        with pytest.raises(ValueError, match=said):
            SamplingParams(**bad)


def test_params_list_must_match_prompts(llm):
    with pytest.raises(ValueError, match="got 2 prompts but 1 SamplingParams"):
        llm.generate(["a", "b"], [GREEDY])
