"""The continuous batcher under pressure: whatever it does, every request gets the
oracle's tokens.

Greedy tokens of each request, run through a KV pool so small that requests are
preempted (recompute or swap), share prefixes, get aborted or fork into samples and
beams, must equal `greedy_generate` run alone on a contiguous cache. And every frame
comes back at the end.
"""

import numpy as np
import pytest

from minipaged import LLM, SamplingParams
from minipaged.model.oracle import ContiguousKVCache, greedy_generate


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from checkpoints import write_checkpoint

    return write_checkpoint(
        tmp_path_factory.mktemp("tiny"),
        hidden=64,
        heads=4,
        kv_heads=2,
        max_positions=256,
    )


def make_llm(folder, **options):
    return LLM(str(folder), device="cpu", **options)


def workload(num, seed, shared_prefix=0):
    """Prompts of 1-60 tokens (optionally starting with one shared prefix) and 1-40 new
    tokens."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(5, 60, shared_prefix).tolist()
    prompts = [
        prefix + rng.integers(5, 60, rng.integers(1, 60)).tolist() for _ in range(num)
    ]
    return prompts, rng.integers(1, 40, num).tolist()


def run(llm, prompts, max_tokens, abort=()):
    """Drive engine.step() by hand; returns outputs by request id and every
    StepReport."""
    engine = llm.engine
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens)):
        engine.add_request(
            str(i),
            {"prompt_token_ids": prompt},
            SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
        )
    outputs, reports = {}, []
    while engine.has_unfinished_requests():
        reports.append(engine.step())
        outputs |= {o.request_id: o for o in reports[-1].finished}
        if len(reports) == 5:
            for request_id in abort:
                outputs[request_id] = engine.abort_request(request_id)
    return outputs, reports


def assert_all_frames_back(llm):
    blocks = llm.engine.blocks
    assert not blocks.tables, "sequences left in the block manager"
    assert blocks.num_free_frames == blocks.device.num_blocks
    assert not blocks.device.ref_counts.any()
    assert blocks.host.num_free == blocks.host.num_blocks


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_equivalence_under_preemption(folder, mode):
    llm = make_llm(
        folder,
        num_blocks=24,
        block_size=8,
        preemption_mode=mode,
        max_num_seqs=16,
        enable_prefix_caching=False,
    )
    prompts, max_tokens = workload(60, seed=1)
    outputs, reports = run(llm, prompts, max_tokens)
    preempted = [m for r in reports for _, m in r.preempted]
    assert preempted and set(preempted) == {mode}, "the pool was meant to be too small"
    if mode == "swap":
        assert (
            sum(r.swapped_out for r in reports) > 0
            and sum(r.swapped_in for r in reports) > 0
        )
    for i, prompt in enumerate(prompts):
        assert outputs[str(i)].outputs[0].token_ids == greedy_generate(
            llm.model, prompt, max_tokens[i]
        ), i
    assert_all_frames_back(llm)


def test_equivalence_with_prefix_caching_and_shared_prefixes(folder):
    llm = make_llm(folder, num_blocks=40, block_size=8, max_num_seqs=8)
    prompts, max_tokens = workload(50, seed=2, shared_prefix=20)
    outputs, reports = run(llm, prompts, max_tokens)
    # most requests reuse 2 blocks
    assert sum(r.cached_tokens for r in reports) >= 40 * 16
    assert sum(1 for r in reports if r.preempted) > 0
    for i, prompt in enumerate(prompts):
        assert outputs[str(i)].outputs[0].token_ids == greedy_generate(
            llm.model, prompt, max_tokens[i]
        ), i
    assert max(o.num_cached_tokens for o in outputs.values()) >= 16


def test_equivalence_after_aborts(folder):
    llm = make_llm(folder, num_blocks=30, block_size=8, max_num_seqs=12)
    prompts, max_tokens = workload(50, seed=3)
    aborted = {"3", "17", "42", "0"}
    outputs, _ = run(llm, prompts, [n + 10 for n in max_tokens], abort=aborted)
    for i, prompt in enumerate(prompts):
        tokens = outputs[str(i)].outputs[0].token_ids
        expected = greedy_generate(llm.model, prompt, max_tokens[i] + 10)
        if str(i) in aborted:
            assert (
                outputs[str(i)].outputs[0].finish_reason == "abort"
                and expected[: len(tokens)] == tokens
            )
        else:
            assert tokens == expected, i
    assert_all_frames_back(llm)


def test_static_batching_gives_the_same_tokens(folder):
    llm = make_llm(
        folder, scheduler="static", num_blocks=64, block_size=16, max_model_len=128
    )
    prompts, max_tokens = workload(12, seed=4)
    outputs, reports = run(llm, prompts, max_tokens)
    assert llm.engine.blocks.device.num_blocks == 8  # 1,024 slots / 128 reserved each
    assert max(len(r.ran) + r.padding for r in reports) == 8
    assert sum(r.padding for r in reports) > 0  # finished members ride along as padding
    for i, prompt in enumerate(prompts):
        assert outputs[str(i)].outputs[0].token_ids == greedy_generate(
            llm.model, prompt, max_tokens[i]
        )
    assert_all_frames_back(llm)


def test_continuous_batching_lets_new_requests_join_at_once(folder):
    llm = make_llm(folder, max_num_seqs=4)
    prompts, _ = workload(6, seed=5)
    _, reports = run(llm, prompts, [30, 2, 2, 2, 2, 2])
    joined = [
        r.step for r in reports if any(kind == "prefill" for _, _, kind, _ in r.ran)
    ]
    # requests 4 and 5 join as soon as seats free up
    assert joined[0] == 0 and joined[1] <= 3
    assert all(len(r.ran) <= 4 for r in reports)


def test_soak_2000_requests_return_every_frame(folder):
    llm = make_llm(folder, num_blocks=48, block_size=4, max_num_seqs=32)
    rng = np.random.default_rng(7)
    engine = llm.engine
    for i in range(2000):
        prompt = rng.integers(3, 60, rng.integers(1, 20)).tolist()
        params = SamplingParams(
            temperature=float(rng.choice([0, 0.8])),
            max_tokens=int(rng.integers(1, 8)),
            n=int(rng.choice([1, 1, 1, 2])),
            seed=i,
        )
        engine.add_request(f"soak-{i}", {"prompt_token_ids": prompt}, params)
    finished = 0
    while engine.has_unfinished_requests():
        report = engine.step()
        finished += len(report.finished)
        if report.step % 97 == 0 and engine.requests:  # abort a few along the way
            engine.abort_request(next(iter(engine.requests)))
            finished += 1
    assert finished == 2000
    assert_all_frames_back(llm)


# ---- sharing: parallel samples and beams ---------------------------------------------


def peak_frames(llm, prompt, params_list):
    engine = llm.engine
    for i, params in enumerate(params_list):
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, params)
    peak, outputs = 0, []
    while engine.has_unfinished_requests():
        report = engine.step()
        outputs += report.finished
        peak = max(
            peak, engine.blocks.device.num_blocks - engine.blocks.num_free_frames
        )
    return peak, outputs


def test_parallel_samples_share_the_prompt_frames(folder):
    prompt = list(range(3, 53))  # 50 tokens: 3 full blocks of 16 and a partial one
    params = SamplingParams(
        n=4, temperature=1.0, seed=0, max_tokens=20, ignore_eos=True
    )
    shared, outs = peak_frames(
        make_llm(folder, enable_prefix_caching=False), prompt, [params]
    )
    alone = SamplingParams(temperature=1.0, seed=0, max_tokens=20, ignore_eos=True)
    separate, _ = peak_frames(
        make_llm(folder, enable_prefix_caching=False), prompt, [alone] * 4
    )
    # 50 + 19 cached tokens = 5 frames a sequence. Shared: the 3 full prompt frames
    # once, then per sample its own partial block (3 copy-on-write copies + the
    # original) and 1 new frame
    assert shared == 3 + 4 * 2 and separate == 4 * 5
    assert len({tuple(c.token_ids) for c in outs[0].outputs}) == 4


def test_beam_search_scores_are_the_models_log_probabilities(folder):
    llm = make_llm(folder, block_size=4)
    prompt = [1, 8, 9, 10, 11, 30]
    out = llm.generate(
        [{"prompt_token_ids": prompt}],
        SamplingParams(beam_width=4, n=4, max_tokens=8, ignore_eos=True),
        use_tqdm=False,
    )[0]
    assert len(out.outputs) == 4 and len({tuple(c.token_ids) for c in out.outputs}) == 4
    model = llm.model
    # recompute each beam's log probability with the oracle
    for completion in out.outputs:
        expected = sum(logp_of(model, prompt, completion.token_ids))
        assert completion.cumulative_logprob == pytest.approx(expected, abs=1e-3)
    scores = [c.cumulative_logprob / len(c.token_ids) for c in out.outputs]
    assert scores == sorted(scores, reverse=True)
    assert_all_frames_back(llm)


def logp_of(model, prompt, completion):
    """Log probability of each completion token, from one contiguous-cache pass."""
    tokens = prompt + completion
    cache = ContiguousKVCache(model.config, 1, len(tokens), np, model.dtype)
    logits = model.forward(tokens, cache.begin_step([0], [len(tokens)]), cache).astype(
        np.float64
    )
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return [logp[len(prompt) - 1 + i, t] for i, t in enumerate(completion)]


# ---- bad input: that request only ----------------------------------------------------


def test_bad_requests_are_refused_and_the_rest_finish(folder):
    llm = make_llm(folder, max_model_len=64)
    engine = llm.engine
    good = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    engine.add_request("ok-1", {"prompt_token_ids": [1, 5, 9]}, good)
    cases = [
        (
            "long",
            {"prompt_token_ids": [5] * 64},
            good,
            "prompt has 64 tokens; this model's max_model_len is 64",
        ),
        ("empty", "", good, "prompt is empty"),
        ("vocab", {"prompt_token_ids": [1, 99999]}, good, "out of vocabulary"),
        (
            "ok-1",
            {"prompt_token_ids": [1]},
            good,
            "request id 'ok-1' is already in use",
        ),
        (
            "params",
            {"prompt_token_ids": [1]},
            {"max_tokens": 3},
            "params must be SamplingParams",
        ),
    ]
    for request_id, prompt, params, said in cases:
        with pytest.raises(ValueError, match=said):
            engine.add_request(request_id, prompt, params)
    for bad, said in [
        (dict(max_tokens=0), "max_tokens"),
        (dict(temperature=-0.5), "temperature"),
        (dict(top_p=1.5), "top_p"),
    ]:
        with pytest.raises(ValueError, match=said):
            SamplingParams(**bad)
    with pytest.raises(KeyError, match="no request 'nope'"):
        engine.abort_request("nope")
    engine.add_request("ok-2", {"prompt_token_ids": [1, 20]}, good)
    outputs = {}
    while engine.has_unfinished_requests():
        outputs |= {o.request_id: o for o in engine.step().finished}
    assert set(outputs) == {"ok-1", "ok-2"}
    assert outputs["ok-1"].outputs[0].token_ids == greedy_generate(
        llm.model, [1, 5, 9], 6
    )
    assert outputs["ok-2"].outputs[0].token_ids == greedy_generate(
        llm.model, [1, 20], 6
    )


def test_a_request_that_can_never_fit_is_rejected(folder):
    llm = make_llm(folder, num_blocks=4, block_size=4)
    assert llm.max_model_len == 16  # capped by what the pool holds
    with pytest.raises(ValueError, match="needs 8 frames .* 2 sequences.* pool has 4"):
        llm.engine.add_request(
            "big", {"prompt_token_ids": [1] * 10}, SamplingParams(max_tokens=8, n=2)
        )
    llm.engine.add_request(
        "fits", {"prompt_token_ids": [1] * 10}, SamplingParams(max_tokens=8)
    )


def test_step_report_prints_what_happened(folder):
    llm = make_llm(folder, num_blocks=16, block_size=4)
    llm.engine.add_request(
        "a",
        {"prompt_token_ids": list(range(3, 13))},
        SamplingParams(max_tokens=3, n=2, seed=0, ignore_eos=True),
    )
    first = llm.engine.step()
    assert first.ran == [("a", 0, "prefill", 10)] and first.frames_taken == 3
    assert "1 prefill + 0 decode (10 tokens" in str(first)
    second = llm.engine.step()
    assert second.copies == 1 and [kind for *_, kind, _ in second.ran] == [
        "decode",
        "decode",
    ]


def test_beams_share_frames_and_dropped_beams_free_theirs(folder):
    llm = make_llm(folder, block_size=4, enable_prefix_caching=False)
    engine, blocks = llm.engine, llm.engine.blocks
    engine.add_request(
        "beam",
        {"prompt_token_ids": list(range(3, 33))},
        SamplingParams(beam_width=4, max_tokens=12, ignore_eos=True),
    )
    shared = private = 0
    while engine.has_unfinished_requests():
        engine.step()
        used = blocks.device.num_blocks - blocks.num_free_frames
        assert (
            used == len(set().union(*(t.frames for t in blocks.tables.values())))
            if blocks.tables
            else used == 0
        )
        assert len(blocks.tables) <= 4  # dropped beams left the block manager
        shared += used
        private += sum(len(t.frames) for t in blocks.tables.values())
    assert shared < 0.5 * private  # the 30-token prompt is held once, not 4 times
    assert_all_frames_back(llm)


def test_a_one_token_prompt_is_reported_as_a_prefill(folder):
    llm = make_llm(folder)
    llm.engine.add_request(
        "one", {"prompt_token_ids": [7]}, SamplingParams(max_tokens=2, ignore_eos=True)
    )
    assert llm.engine.step().ran == [("one", 0, "prefill", 1)]
    assert llm.engine.step().ran == [("one", 0, "decode", 1)]
