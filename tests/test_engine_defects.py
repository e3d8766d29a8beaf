"""Regression tests for the 13 defects of issue 10, each where two features meet.

Every test here failed on the engine before the fix (the defect's number is in its
name). A tiny random checkpoint; greedy tokens are compared with the oracle run alone.
"""

import numpy as np
import pytest

from minipaged import LLM, SamplingParams
from minipaged.model.oracle import greedy_generate

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


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


@pytest.fixture(scope="module")
def llm(folder):
    return LLM(str(folder), device="cpu")


def drain(engine, limit=2000):
    """Step until idle; outputs by request id."""
    outputs = {}
    for _ in range(limit):
        if not engine.has_unfinished_requests():
            return outputs
        outputs |= {o.request_id: o for o in engine.step().finished}
    raise AssertionError(f"still busy after {limit} steps")


def assert_idle_and_empty(engine):
    blocks = engine.blocks
    assert not blocks.tables and not engine.requests
    assert (
        blocks.num_free_frames == blocks.num_frames
        and not blocks.device.ref_counts.any()
    )


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("seed", range(6))
def test_1_samples_sharing_a_partial_frame_fit_the_smallest_pool(llm, mode, seed):
    """Two samples share the prompt's last (partial) frame: the last writer needs no
    copy."""
    engine = llm.new_engine(num_blocks=2, block_size=16, preemption_mode=mode)
    params = SamplingParams(n=2, max_tokens=3, ignore_eos=True, seed=seed)
    engine.add_request("r", {"prompt_token_ids": [1, 5 + seed]}, params)
    out = drain(engine)["r"]
    assert [len(c.token_ids) for c in out.outputs] == [3, 3]
    assert_idle_and_empty(engine)


def test_1_the_block_manager_counts_one_copy_fewer_than_the_sharers():
    from minipaged.paging import BlockManager

    blocks = BlockManager(num_blocks=3, block_size=4)
    blocks.allocate("a", [1, 2])
    blocks.fork("a", "b")
    blocks.fork("a", "c")
    assert blocks.num_free_frames == 2
    # two copies; "c" then writes in place
    assert blocks.can_append_slots("a", "b", "c")
    assert blocks.can_append_slots("a", "b")  # "c" still maps the frame: two copies
    blocks.allocate("d", [7])
    assert not blocks.can_append_slots("a", "b", "c")  # 1 free frame, 2 copies needed


def test_2_static_batching_applies_copy_on_write(llm):
    prompt = {"prompt_token_ids": [1, 5, 9, 12]}
    static = llm.new_engine(
        scheduler="static", max_model_len=32, num_blocks=16, block_size=16
    )
    static.add_request(
        "n3", prompt, SamplingParams(n=3, temperature=0, max_tokens=10, ignore_eos=True)
    )
    out = drain(static)["n3"]
    expected = greedy_generate(llm.model, prompt["prompt_token_ids"], 10)
    assert [c.token_ids for c in out.outputs] == [expected] * 3


def test_2_beams_are_the_same_under_static_and_continuous(llm):
    params = SamplingParams(beam_width=3, n=3, max_tokens=6, ignore_eos=True)
    outs = []
    for options in (dict(scheduler="static", max_model_len=32, num_blocks=16), dict()):
        engine = llm.new_engine(block_size=16, **options)
        engine.add_request("b", {"prompt_token_ids": [1, 5, 9]}, params)
        outs.append(
            [
                (c.token_ids, round(c.cumulative_logprob, 4))
                for c in drain(engine)["b"].outputs
            ]
        )
    assert outs[0] == outs[1]


def test_3_static_batching_reserves_every_sample_up_front(llm):
    """Regions of 32 slots, 4 of them: n=2 + n=2 + n=1 must not all start together."""
    engine = llm.new_engine(
        scheduler="static", max_model_len=32, num_blocks=8, block_size=16
    )
    assert engine.blocks.num_frames == 4
    prompts = {"a": [1, 5], "b": [1, 6], "c": [1, 7]}
    for request_id, n in (("a", 2), ("b", 2), ("c", 1)):
        engine.add_request(
            request_id,
            {"prompt_token_ids": prompts[request_id]},
            SamplingParams(n=n, temperature=0, max_tokens=6, ignore_eos=True),
        )
    outputs = drain(engine)
    for request_id, prompt in prompts.items():
        expected = greedy_generate(llm.model, prompt, 6)
        assert all(c.token_ids == expected for c in outputs[request_id].outputs)
    assert_idle_and_empty(engine)


def test_4_static_abort_of_a_waiting_request(llm):
    engine = llm.new_engine(
        scheduler="static", max_model_len=32, num_blocks=2, block_size=16
    )
    for i in range(3):
        engine.add_request(str(i), {"prompt_token_ids": [1, 5 + i]}, GREEDY)
    engine.step()  # "0" runs; "1", "2" wait (one region)
    aborted = engine.abort_request("2")
    assert (
        aborted.outputs[0].finish_reason == "abort"
        and aborted.outputs[0].token_ids == []
    )
    outputs = drain(engine)
    assert sorted(outputs) == ["0", "1"]
    assert outputs["1"].outputs[0].token_ids == greedy_generate(llm.model, [1, 6], 8)
    assert_idle_and_empty(engine)


def test_5_beam_search_stops_at_max_model_len(folder):
    llm = LLM(str(folder), device="cpu", max_model_len=20)
    out = llm.generate(
        [{"prompt_token_ids": [1, 5, 9, 12, 14]}],
        SamplingParams(beam_width=2, max_tokens=100, ignore_eos=True),
        use_tqdm=False,
    )[0]
    assert out.outputs and all(len(c.token_ids) == 15 for c in out.outputs)
    assert {c.finish_reason for c in out.outputs} == {"length"}


def test_6_generate_collects_only_its_own_requests(llm):
    engine = llm.engine
    engine.add_request("mine", {"prompt_token_ids": [1, 5]}, GREEDY)
    # a user may pick any id
    engine.add_request("generate-0", {"prompt_token_ids": [1, 6]}, GREEDY)
    outs = llm.generate(
        [{"prompt_token_ids": [1, 7]}, {"prompt_token_ids": [1, 8]}],
        GREEDY,
        use_tqdm=False,
    )
    assert [o.outputs[0].token_ids for o in outs] == [
        greedy_generate(llm.model, [1, t], 8) for t in (7, 8)
    ]
    mine = (
        llm.unclaimed.pop("mine") if "mine" in llm.unclaimed else drain(engine)["mine"]
    )
    assert mine.outputs[0].token_ids == greedy_generate(llm.model, [1, 5], 8)
    drain(engine)
    llm.unclaimed.clear()


def test_6_an_abandoned_stream_and_an_interrupted_generate_leave_the_llm_usable(
    llm, monkeypatch
):
    stream = llm.stream({"prompt_token_ids": [1, 5, 9]}, GREEDY)
    first = next(stream)  # never closed
    real_step, calls = llm.engine.step, []

    def interrupted_step():
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_step()

    monkeypatch.setattr(llm.engine, "step", interrupted_step)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["a b c", "d e"], GREEDY, use_tqdm=False)
    monkeypatch.undo()
    # generate took its requests back
    assert [r.split("-")[0] for r in llm.engine.requests] == ["stream"]
    out = llm.generate([{"prompt_token_ids": [1, 7]}], GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == greedy_generate(llm.model, [1, 7], 8)
    rest = "".join(stream)  # the abandoned stream still completes
    full = (
        llm.generate([{"prompt_token_ids": [1, 5, 9]}], GREEDY, use_tqdm=False)[0]
        .outputs[0]
        .text
    )
    assert first + rest == full
    assert not llm.engine.requests and not llm.unclaimed


@pytest.mark.parametrize(
    "field, value", [("stop_token_ids", 5), ("top_k", 2.5), ("beam_width", 2.5)]
)
def test_7_a_field_changed_after_construction_is_refused_at_add_request(
    llm, field, value
):
    params = SamplingParams(temperature=0, max_tokens=4)
    setattr(params, field, value)  # dataclasses do not check assignments
    outs = llm.generate(
        [{"prompt_token_ids": [1, 5]}, {"prompt_token_ids": [1, 6]}],
        [params, GREEDY],
        use_tqdm=False,
    )
    assert outs[0].outputs[0].finish_reason == "rejected" and field in outs[0].error
    assert outs[1].outputs[0].token_ids == greedy_generate(llm.model, [1, 6], 8)
    assert not llm.engine.requests
    assert (
        llm.generate([{"prompt_token_ids": [1, 6]}], GREEDY, use_tqdm=False)[0].error
        is None
    )


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(stop_token_ids=5), "stop_token_ids"),
        (dict(top_k=2.5), "top_k"),
        (dict(beam_width=2.5), "beam_width"),
        (dict(n=2.5), "n"),
        (dict(seed=1.5), "seed"),
        (dict(n="2"), "n"),
        (dict(max_tokens=2.5), "max_tokens"),
        (dict(beam_width=2, temperature=0.8), "temperature"),
    ],
)
def test_7_8_9_sampling_params_check_types(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_8_none_means_no_stop_strings_or_ids():
    params = SamplingParams(stop=None, stop_token_ids=None)
    assert params.stop == [] and params.stop_token_ids == []


@pytest.mark.parametrize(
    "prompt, said",
    [
        ({"prompt_token_ids": [1, None, 5]}, "integers only"),
        ({"prompt_token_ids": [1, [2], 5]}, "integers only"),
        ({"prompt_token_ids": [1, float("inf")]}, "integers only"),
        ({"prompt_token_ids": None}, "list of integers"),
        ({"prompt_token_ids": 5}, "list of integers"),
        ("a \ud800 b", "not valid text"),
        ({"prompt_token_ids": [1, 1.7, 5]}, "integers only"),
        ({"prompt_token_ids": ["1", "5"]}, "integers only"),
        ({"prompt_token_ids": "123"}, "list of integers"),
        ({"prompt_token_ids": [1, True]}, "integers only"),
    ],
)
def test_8_9_bad_prompts_are_rejected_and_do_not_orphan_the_others(llm, prompt, said):
    outs = llm.generate(
        [{"prompt_token_ids": [1, 5]}, prompt, {"prompt_token_ids": [1, 6]}],
        GREEDY,
        use_tqdm=False,
    )
    assert outs[1].outputs[0].finish_reason == "rejected" and said in outs[1].error
    assert "prompt" in outs[1].error
    for out, last in ((outs[0], 5), (outs[2], 6)):
        assert out.outputs[0].token_ids == greedy_generate(llm.model, [1, last], 8)
    assert not llm.engine.requests and not llm.engine.blocks.tables


def test_9_numpy_integer_ids_are_welcome(llm):
    out = llm.generate(
        [{"prompt_token_ids": np.array([1, 5], dtype=np.int64)}], GREEDY, use_tqdm=False
    )[0]
    assert out.error is None and out.outputs[0].token_ids == greedy_generate(
        llm.model, [1, 5], 8
    )


@pytest.mark.parametrize(
    "options, said",
    [
        (dict(block_size=0), "block_size"),
        (dict(num_blocks=-1), "num_blocks"),
        (dict(max_num_seqs=1.5), "max_num_seqs"),
        (dict(block_size=None), "block_size"),
        (dict(scheduler="orca"), "scheduler"),
    ],
)
def test_10_bad_engine_options_are_value_errors(folder, options, said):
    with pytest.raises(ValueError, match=said):
        LLM(str(folder), device="cpu", **options)


def stop_spanning_two_pieces(llm, prompt):
    """A stop string that starts inside one streamed piece and ends in the next."""
    pieces = list(llm.stream(prompt, GREEDY))
    text = "".join(pieces)
    for k in range(1, len(pieces) - 1):
        stop = pieces[k].lstrip() + pieces[k + 1][:2]
        start = sum(map(len, pieces[:k])) + len(pieces[k]) - len(pieces[k].lstrip())
        if pieces[k].strip() and text.find(stop) == start:
            return stop, text[:start]
    pytest.skip("no piece boundary to put a stop string across")


def test_11_streamed_text_never_includes_what_a_stop_string_removes(llm):
    prompt = {"prompt_token_ids": [1, 5, 9]}
    stop, expected = stop_spanning_two_pieces(llm, prompt)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, stop=[stop])
    streamed = "".join(llm.stream(prompt, params))
    final = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    assert final.finish_reason == "stop" and final.text == expected
    assert streamed == final.text == llm.last_output.outputs[0].text


def test_12_beam_search_streams_its_best_text_and_aborts_with_its_beams(llm):
    params = SamplingParams(beam_width=3, max_tokens=6, ignore_eos=True)
    prompt = {"prompt_token_ids": [1, 5, 9]}
    streamed = "".join(llm.stream(prompt, params))
    assert (
        streamed
        and streamed
        == llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].text
    )
    engine = llm.new_engine()
    engine.add_request(
        "b", prompt, SamplingParams(beam_width=3, n=2, max_tokens=6, ignore_eos=True)
    )
    engine.step(), engine.step()
    out = engine.abort_request("b")
    assert len(out.outputs) == 2 and {c.finish_reason for c in out.outputs} == {"abort"}
    assert all(len(c.token_ids) == 2 for c in out.outputs)
    assert_idle_and_empty(engine)


def test_13_cached_tokens_count_prompt_hits_only(llm):
    """Preempted by recompute, a request finds its own generated tokens cached when it
    comes back; those are not prompt tokens served from the prefix cache."""
    engine = llm.new_engine(num_blocks=12, block_size=4, max_num_seqs=8)
    rng = np.random.default_rng(0)
    prompts = {str(i): [1] + rng.integers(5, 60, 2).tolist() for i in range(8)}
    for request_id, prompt in prompts.items():
        engine.add_request(
            request_id,
            {"prompt_token_ids": prompt},
            SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
        )
    outputs, preempted = {}, 0
    while engine.has_unfinished_requests():
        report = engine.step()
        preempted += len(report.preempted)
        outputs |= {o.request_id: o for o in report.finished}
    assert preempted > 0
    # 3-token prompts: no whole block
    assert [o.num_cached_tokens for o in outputs.values()] == [0] * 8


# ---- issue 18: defects found where strangers poke ------------------------------------


def test_18_4_beams_count_their_width_against_max_num_seqs(folder):
    """A beam request is admitted as one sequence and forks to beam_width: it must count
    as beam_width, or a step runs more than max_num_seqs rows and a swapped request can
    never come back (the engine stalled with 'could not schedule any request')."""
    small = LLM(
        str(folder),
        device="cpu",
        block_size=4,
        num_blocks=16,
        max_num_seqs=2,
        preemption_mode="swap",
    )
    beams = SamplingParams(beam_width=4, max_tokens=8)
    outs = small.generate(
        [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8, 9]}],
        beams,
        use_tqdm=False,
    )
    assert all(
        "beam_width=4" in o.error and "max_num_seqs is 2" in o.error for o in outs
    )
    engine = LLM(
        str(folder),
        device="cpu",
        block_size=4,
        num_blocks=12,
        max_num_seqs=4,
        preemption_mode="swap",
    ).engine
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14, 15]]
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, beams)
    most = 0
    for _ in range(500):
        if not engine.has_unfinished_requests():
            break
        report = engine.step()
        most = max(most, len(report.ran))
    # one request of four beams at a time
    assert not engine.has_unfinished_requests() and most == 4
    assert_idle_and_empty(engine)


def test_18_5_stop_strings_are_bounded_and_checked_near_the_new_text(llm):
    from minipaged.sampling import MAX_STOP_LEN, MAX_STOP_STRINGS

    with pytest.raises(ValueError, match=f"at most {MAX_STOP_STRINGS} strings"):
        SamplingParams(stop=[f"s{i}" for i in range(MAX_STOP_STRINGS + 1)])
    with pytest.raises(ValueError, match=f"of at most {MAX_STOP_LEN} characters"):
        SamplingParams(stop=["x" * (MAX_STOP_LEN + 1)])
    free = (
        llm.generate([{"prompt_token_ids": [5, 6, 7]}], GREEDY, use_tqdm=False)[0]
        .outputs[0]
        .text
    )
    # a stop string met halfway through the answer
    stop = free[len(free) // 2 : len(free) // 2 + 2]
    assert stop.strip(), free
    stops = [f"never{i}" for i in range(MAX_STOP_STRINGS - 1)] + [stop]
    out = llm.generate(
        [{"prompt_token_ids": [5, 6, 7]}],
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, stop=stops),
        use_tqdm=False,
    )[0].outputs[0]
    assert out.finish_reason == "stop" and out.text == free[: free.index(stop)]


def test_18_6_a_tiny_temperature_is_greedy(llm):
    prompt = [{"prompt_token_ids": [5, 6, 7, 8]}]
    greedy = llm.generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    for temperature in (1e-40, 1e-12, 5e-6):
        params = SamplingParams(
            temperature=temperature, max_tokens=8, ignore_eos=True, seed=1
        )
        with np.errstate(all="raise"):  # no overflow on the way
            assert (
                llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
                == greedy
            )
