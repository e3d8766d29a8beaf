"""vLLM's controls of the logits (penalties, logit_bias, min_p, min_tokens) and
logprobs, in the engine.

Neutral values change nothing; each control changes the logits as a plain NumPy loop
over one row says; logprobs are the model's own distribution (vLLM's default
"raw_logprobs"), whatever the sampling does, and never change the tokens; prompt
logprobs equal a teacher-forced forward.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from minipaged import LLM, SamplingParams
from minipaged.backend import to_numpy
from minipaged.model.oracle import ContiguousKVCache
from minipaged.sampling import adjust, log_softmax

EOS = 2  # tests/checkpoints.py writes eos_token_id 2
PROMPT = [1, 5, 9, 10, 12, 5, 9]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from checkpoints import write_checkpoint

    folder = write_checkpoint(
        tmp_path_factory.mktemp("controls") / "tiny",
        hidden=64,
        layers=2,
        max_positions=128,
    )
    return LLM(str(folder), device="cpu", num_blocks=128, block_size=4)


# ---- the plain NumPy specification ---------------------------------------------------


def teacher_forced_logits(model, token_ids: list[int]) -> np.ndarray:
    """The model's logits (len(token_ids), vocab) at every position, one forward with a
    plain cache."""
    cache = ContiguousKVCache(model.config, 1, len(token_ids), model.xp, model.dtype)
    positions = cache.begin_step([0], [len(token_ids)])
    return to_numpy(model.forward(token_ids, positions, cache)).astype(np.float64)


def reference_adjust(
    logits: np.ndarray,
    p: SamplingParams,
    token_ids: list[int],
    prompt_len: int,
    eos=(EOS,),
) -> np.ndarray:
    """One row (vocab,), token by token, as vLLM's documentation states each control."""
    x = np.array(logits, dtype=np.float64)
    output = token_ids[prompt_len:]
    if len(output) < p.min_tokens:
        for t in {*eos, *p.stop_token_ids}:
            x[t] = -np.inf
    for t, bias in p.logit_bias.items():
        x[t] += bias
    for t in set(token_ids):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(output):
        x[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return x


def reference_greedy(model, prompt: list[int], p: SamplingParams) -> list[int]:
    """Greedy tokens with the controls applied by reference_adjust, recomputed from
    scratch each token."""
    tokens = list(prompt)
    while len(tokens) - len(prompt) < p.max_tokens:
        tokens.append(
            int(
                reference_adjust(
                    teacher_forced_logits(model, tokens)[-1], p, tokens, len(prompt)
                ).argmax()
            )
        )
    return tokens[len(prompt) :]


def generate(llm, prompt, params, **engine_options):
    """One prompt's output on a fresh engine with these options."""
    engine = llm.new_engine(**({"num_blocks": 128, "block_size": 4} | engine_options))
    engine.add_request("r", {"prompt_token_ids": prompt}, params)
    for _ in range(10_000):
        for output in engine.step().finished:
            return output
    raise AssertionError("the request did not finish")


GREEDY = dict(temperature=0, max_tokens=12, ignore_eos=True)


# ---- neutral values ------------------------------------------------------------------


def test_neutral_controls_change_nothing(llm):
    plain = generate(llm, PROMPT, SamplingParams(**GREEDY))
    neutral = SamplingParams(
        **GREEDY,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        repetition_penalty=1.0,
        logit_bias={},
        min_p=0.0,
        min_tokens=0,
    )
    assert not neutral.adjusts_logits
    assert (
        generate(llm, PROMPT, neutral).outputs[0].token_ids
        == plain.outputs[0].token_ids
    )
    seeded = dict(temperature=1.0, seed=11, max_tokens=12, ignore_eos=True)
    assert (
        generate(llm, PROMPT, SamplingParams(**seeded, min_p=0.0)).outputs[0].token_ids
        == generate(llm, PROMPT, SamplingParams(**seeded)).outputs[0].token_ids
    )
    # the adjusting path itself, with neutral numbers, leaves a row bit for bit as it
    # was
    logits = np.random.default_rng(0).standard_normal((2, 50)).astype(np.float32)
    seq = SimpleNamespace(token_ids=[3, 4, 4, 7], prompt_len=2)
    params = [SamplingParams(logit_bias={3: 0.0}), SamplingParams()]
    assert params[0].adjusts_logits
    assert np.array_equal(adjust(logits, params, [seq, seq]), logits)


# ---- each control against NumPy ------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"presence_penalty": 1.5},
        {"presence_penalty": -2.0},
        {"frequency_penalty": 0.7},
        {"frequency_penalty": -1.0},
        {"repetition_penalty": 1.8},
        {"repetition_penalty": 0.5},
        {"logit_bias": {4: 5.0, 40: -100.0}},
        {"min_tokens": 6, "stop_token_ids": [17]},
        {
            "presence_penalty": 0.5,
            "frequency_penalty": 0.3,
            "repetition_penalty": 1.3,
            "logit_bias": {7: 2.5},
        },
    ],
)
def test_each_control_changes_the_logits_as_numpy_says(options):
    rng = np.random.default_rng(1)
    logits = (3 * rng.standard_normal((3, 64))).astype(np.float32)
    seqs = [
        SimpleNamespace(
            token_ids=[1, 4, 7, 7, 9, 4, 4, 20], prompt_len=3
        ),  # output: 7 9 4 4 20
        SimpleNamespace(token_ids=[5, 6], prompt_len=2),
        SimpleNamespace(token_ids=[8, 8, 8, 3], prompt_len=1),
    ]
    p = SamplingParams(**options)
    params = [
        p,
        SamplingParams(),
        p,
    ]  # a row without controls, in the same batch, stays as it was
    out = adjust(logits, params, seqs, eos_token_ids={EOS})
    assert not np.shares_memory(out, logits)
    assert np.array_equal(out[1], logits[1])
    for row in (0, 2):
        want = reference_adjust(
            logits[row], p, seqs[row].token_ids, seqs[row].prompt_len
        )
        assert np.array_equal(np.isinf(out[row]), np.isinf(want))
        assert np.allclose(
            out[row][np.isfinite(want)], want[np.isfinite(want)], rtol=1e-6, atol=1e-5
        )
        assert not np.allclose(out[row], logits[row])  # every case changes something


@pytest.mark.parametrize("penalty", [1e-300, 1e300])
def test_an_extreme_repetition_penalty_keeps_the_logits_finite(penalty):
    from minipaged.sampling import distribution

    logits = np.random.default_rng(2).standard_normal(50).astype(np.float32)
    logits[3], logits[4], logits[5] = -0.5, 1.0, -1.0
    seq = SimpleNamespace(token_ids=[3, 4, 5], prompt_len=1)
    out = adjust(logits[None], [SamplingParams(repetition_penalty=penalty)], [seq])[0]
    assert np.isfinite(out).all()
    probs = distribution(out, SamplingParams(temperature=0.5))
    assert np.isfinite(probs).all() and probs.sum() == pytest.approx(1.0)
    if penalty < 1:  # the seen token with a positive logit is now all but certain
        assert probs[4] == pytest.approx(1.0)
    else:  # the seen tokens are all but ruled out
        assert probs[[3, 4, 5]].sum() < probs.max()


@pytest.mark.parametrize(
    "options",
    [
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"repetition_penalty": 3.0},
        {"logit_bias": {30: 3.0, 31: 2.0}},
    ],
)
def test_penalties_change_the_greedy_answer_as_numpy_says(llm, options):
    p = SamplingParams(**GREEDY, **options)
    plain = generate(llm, PROMPT, SamplingParams(**GREEDY)).outputs[0].token_ids
    got = generate(llm, PROMPT, p).outputs[0].token_ids
    assert got == reference_greedy(llm.model, PROMPT, p)
    assert got != plain


def test_min_p_keeps_only_tokens_near_the_likeliest(llm):
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    gen = np.random.default_rng(0)
    from minipaged.sampling import distribution, sample_row

    kept = distribution(logits, SamplingParams(min_p=0.5))  # keeps p >= 0.5 * 0.5
    assert np.allclose(kept, [0.5 / 0.8, 0.3 / 0.8, 0, 0])
    draws = {sample_row(logits, SamplingParams(min_p=0.5), gen) for _ in range(300)}
    assert draws == {0, 1}


def test_min_tokens_keeps_the_end_away(llm):
    eos_first = SamplingParams(temperature=0, max_tokens=12, logit_bias={EOS: 100.0})
    out = generate(llm, PROMPT, eos_first).outputs[0]
    assert out.token_ids == [EOS] and out.finish_reason == "stop"
    out = generate(
        llm,
        PROMPT,
        SamplingParams(
            temperature=0, max_tokens=12, logit_bias={EOS: 100.0}, min_tokens=5
        ),
    ).outputs[0]
    assert (
        len(out.token_ids) == 6
        and EOS not in out.token_ids[:5]
        and out.token_ids[5] == EOS
    )
    assert out.finish_reason == "stop"
    stop = SamplingParams(
        temperature=0,
        max_tokens=12,
        ignore_eos=True,
        logit_bias={33: 100.0},
        stop_token_ids=[33],
        min_tokens=3,
    )
    out = generate(llm, PROMPT, stop).outputs[0]
    assert (
        out.token_ids[3] == 33
        and 33 not in out.token_ids[:3]
        and len(out.token_ids) == 4
    )


def test_min_tokens_delays_stop_strings(llm):
    base = generate(llm, PROMPT, SamplingParams(**GREEDY)).outputs[0]
    i, word = next(
        (i, w) for i, t in enumerate(base.token_ids) if (w := llm.tokenizer.decode([t]))
    )
    # the first token with text, early enough in the answer
    assert i + 2 < len(base.token_ids)
    early = generate(llm, PROMPT, SamplingParams(**GREEDY, stop=[word])).outputs[0]
    late = generate(
        llm, PROMPT, SamplingParams(**GREEDY, stop=[word], min_tokens=i + 2)
    ).outputs[0]
    assert (
        len(early.token_ids) == i + 1
        and early.finish_reason == "stop"
        and len(late.token_ids) > i + 2
    )
    assert late.token_ids[: i + 2] == base.token_ids[: i + 2]


# ---- logprobs ------------------------------------------------------------------------


def check_logprobs(out, num: int):
    assert len(out.logprobs) == len(out.token_ids)
    total = 0.0
    for token, step in zip(out.token_ids, out.logprobs):
        assert token in step and len(step) <= num + 1 and len(step) >= num
        values = [lp.logprob for lp in step.values()]
        assert all(v <= 0 for v in values) and np.exp(values).sum() <= 1 + 1e-9
        ranked = sorted(step.values(), key=lambda lp: lp.rank)
        assert [lp.logprob for lp in ranked] == sorted(values, reverse=True)
        total += step[token].logprob
    assert out.cumulative_logprob == pytest.approx(total)


def test_logprobs_are_the_models_own_distribution(llm):
    """vLLM's default logprobs_mode, raw_logprobs: log softmax of the model's logits,
    before temperature, penalties and the rest; greedy and sampled tokens alike."""
    for params in (
        SamplingParams(**GREEDY, logprobs=3),
        SamplingParams(
            temperature=0.7,
            top_k=5,
            seed=3,
            max_tokens=10,
            ignore_eos=True,
            logprobs=2,
            frequency_penalty=1.0,
        ),
    ):
        out = generate(llm, PROMPT, params).outputs[0]
        check_logprobs(out, params.logprobs)
        want = log_softmax(
            teacher_forced_logits(llm.model, PROMPT + out.token_ids)[
                len(PROMPT) - 1 : -1
            ]
        )
        for i, (token, step) in enumerate(zip(out.token_ids, out.logprobs)):
            assert step[token].logprob == pytest.approx(want[i, token], abs=1e-4)
            top = np.argsort(-want[i])[: params.logprobs]
            assert {t for t, lp in step.items() if lp.rank <= params.logprobs} == set(
                top.tolist()
            )
            assert step[token].decoded_token == llm.tokenizer.decode(
                [token], skip_special_tokens=False
            )
        if params.greedy:
            assert all(
                step[t].rank == 1 for t, step in zip(out.token_ids, out.logprobs)
            )


def test_all_logprobs_sum_to_one(llm):
    out = generate(
        llm, PROMPT, SamplingParams(temperature=1.0, seed=5, max_tokens=4, logprobs=-1)
    ).outputs[0]
    vocab = llm.model.config.vocab_size
    for token, step in zip(out.token_ids, out.logprobs):
        assert len(step) == vocab and token in step
        assert np.exp([lp.logprob for lp in step.values()]).sum() == pytest.approx(
            1.0, abs=1e-6
        )


def test_logprobs_do_not_change_the_tokens(llm):
    for seed in (0, 1, 2):
        sampled = dict(temperature=1.0, top_p=0.9, seed=seed, max_tokens=12, n=2)
        without = generate(llm, PROMPT, SamplingParams(**sampled))
        with_logprobs = generate(llm, PROMPT, SamplingParams(**sampled, logprobs=4))
        assert [c.token_ids for c in with_logprobs.outputs] == [
            c.token_ids for c in without.outputs
        ]
        assert all(
            c.logprobs is None and c.cumulative_logprob is None for c in without.outputs
        )
        assert all(len(c.logprobs) == len(c.token_ids) for c in with_logprobs.outputs)


@pytest.mark.parametrize(
    "engine_options",
    [
        {},
        {"enable_chunked_prefill": True, "max_num_batched_tokens": 8},
        {"enable_prefix_caching": False},
    ],
)
def test_prompt_logprobs_equal_a_teacher_forced_forward(llm, engine_options):
    prompt = [1, 5, 9, 10, 12, 5, 9, 14, 15, 16, 20, 21, 22, 5, 9, 10, 30]
    params = SamplingParams(**GREEDY, prompt_logprobs=2)
    want = log_softmax(teacher_forced_logits(llm.model, prompt))
    engine = llm.new_engine(**({"num_blocks": 128, "block_size": 4} | engine_options))
    # the second finds the first's blocks in the prefix cache, and must not use them
    for i in range(2):
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, params)
        while engine.has_unfinished_requests():
            outs = engine.step().finished
        got = outs[0].prompt_logprobs
        assert len(got) == len(prompt) and got[0] is None
        for p in range(1, len(prompt)):
            assert got[p][prompt[p]].logprob == pytest.approx(
                want[p - 1, prompt[p]], abs=1e-4
            )
            rank = int((want[p - 1] > want[p - 1, prompt[p]]).sum()) + 1
            assert len(got[p]) in (2, 3) and got[p][prompt[p]].rank == rank
        assert outs[0].num_cached_tokens == 0
        assert (
            outs[0].outputs[0].token_ids
            == generate(llm, prompt, SamplingParams(**GREEDY)).outputs[0].token_ids
        )


# ---- where the controls meet other ideas ---------------------------------------------


def test_speculation_leaves_adjusted_requests_to_the_sampler(llm):
    ngram = {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    p = SamplingParams(**GREEDY, frequency_penalty=1.5, logprobs=1)
    plain = generate(llm, PROMPT, p)
    speculated = generate(llm, PROMPT, p, speculative_config=ngram)
    assert (
        speculated.outputs[0].token_ids
        == plain.outputs[0].token_ids
        == reference_greedy(llm.model, PROMPT, p)
    )
    # speculated (no control): the logprobs of each emitted token
    greedy = SamplingParams(**GREEDY, logprobs=2)
    a, b = (
        generate(llm, PROMPT, greedy),
        generate(llm, PROMPT, greedy, speculative_config=ngram),
    )
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
        assert x.keys() == y.keys()
        assert all(x[t].logprob == pytest.approx(y[t].logprob, abs=1e-4) for t in x)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"presence_penalty": 2.5}, "presence_penalty must be in \\[-2, 2\\]"),
        ({"frequency_penalty": "1"}, "frequency_penalty must be in"),
        (
            {"repetition_penalty": 0},
            "repetition_penalty must be a number greater than zero",
        ),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p must be in \\[0, 1\\]"),
        ({"min_tokens": -1}, "min_tokens must be an integer >= 0"),
        (
            {"min_tokens": 20, "max_tokens": 10},
            "min_tokens must be at most max_tokens=10",
        ),
        ({"logit_bias": {"5": 1.0}}, "logit_bias keys must be token ids"),
        ({"logit_bias": {5: 101.0}}, "logit_bias\\[5\\] must be in \\[-100, 100\\]"),
        ({"logit_bias": [1, 2]}, "logit_bias must be a dict"),
        ({"logprobs": -2}, "logprobs must be an integer >= -1"),
        ({"prompt_logprobs": 1.5}, "prompt_logprobs must be an integer"),
        (
            {"beam_width": 2, "repetition_penalty": 1.2},
            "beam search ranks beams by the model's own log probabilities",
        ),
        (
            {"beam_width": 2, "logprobs": 1},
            "logprobs cannot be set with beam_width > 1",
        ),
    ],
)
def test_bad_controls_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**options)


def test_a_logit_bias_outside_the_vocabulary_is_refused(llm):
    vocab = llm.model.config.vocab_size
    with pytest.raises(ValueError, match=f"logit_bias key {vocab} is out"):
        llm.new_engine().add_request(
            "r", "hello", SamplingParams(logit_bias={vocab: 1.0})
        )
