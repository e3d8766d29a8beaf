"""Page replacement for the prefix cache: each policy evicts as its paper says, Belady's
MIN is the exact optimum (a brute force over every eviction script agrees on small
traces), no policy beats it at any pool size, FIFO shows Belady's anomaly where LRU and
MIN cannot, and the
engine's greedy tokens are the same under every policy while its hits are not."""

from __future__ import annotations

import json
import random

import pytest

from minipaged import LLM, SamplingParams
from minipaged.engine import EngineConfig
from minipaged.paging import REPLACEMENT_POLICIES, PrefixCache
from minipaged.tools.bench import replacement as rp
from minipaged.tools.bench.workload import chat_trace

# ---- the policies, one by one, on a cache of four frames -----------------------------


def evictions(policy: str, hit: list[int] = ()) -> list[int]:
    """Frames 0..3 cached in that order and parked in the order 3, 2, 1, 0; the frames
    in `hit` are then taken by a sequence and parked again. The order the policy gives
    them up in.
    """
    cache = PrefixCache(policy)
    for frame in range(4):
        cache.insert(frame, None, [frame])
    for frame in (3, 2, 1, 0):
        cache.park(frame)
    for frame in hit:
        cache.revive(frame)
        cache.park(frame)
    return [cache.evict() for _ in range(4)]


def test_each_policy_gives_up_frames_in_its_own_order():
    assert evictions("lru") == [3, 2, 1, 0]  # parked first, used least recently
    assert evictions("lru", hit=[3]) == [2, 1, 0, 3]  # a hit makes it the most recent
    assert evictions("fifo") == [0, 1, 2, 3]  # entered first, however parked
    assert evictions("fifo", hit=[0]) == [0, 1, 2, 3]  # ...and however often hit
    assert evictions("clock") == [
        0,
        1,
        2,
        3,
    ]  # every bit set: one turn clears them, then FIFO
    cache = PrefixCache("clock")
    for frame in range(4):
        cache.insert(frame, None, [frame])
        cache.park(frame)
    assert cache.evict() == 0  # the hand cleared 0..3 and came back to 0
    cache.revive(1)
    cache.park(1)  # 1 referenced again: a second chance
    assert [cache.evict() for _ in range(3)] == [2, 3, 1]
    assert sorted(evictions("random")) == [0, 1, 2, 3]


def test_a_pinned_frame_is_never_given_up():
    for policy in REPLACEMENT_POLICIES:
        cache = PrefixCache(policy)
        for frame in range(3):
            cache.insert(frame, None, [frame])
            cache.park(frame)
        cache.revive(0)  # a sequence maps frame 0 again
        assert sorted(cache.evict() for _ in range(2)) == [1, 2], policy


def test_a_bad_policy_name_says_which_there_are(tiny):
    with pytest.raises(
        ValueError,
        match=(
            r"prefix_cache_policy must be one of \('lru', 'fifo', 'clock', 'random'\)"
            r" or a 'module:Class' path"
        ),
    ):
        EngineConfig(prefix_cache_policy="mru")
    with pytest.raises(ValueError, match="prefix_cache_policy must be one of"):
        LLM(str(tiny()), device="cpu", prefix_cache_policy="LRU")


# ---- MIN is the optimum, computed exactly --------------------------------------------


def test_min_matches_the_textbook_on_the_anomaly_string():
    """Belady, Nelson and Shedler's string: FIFO faults more with 4 frames than with 3;
    LRU and MIN (stack algorithms) fault less; MIN's 7 and 6 are the textbook's OPT."""
    faults = {
        p: [rp.classic_faults(rp.CLASSIC_ANOMALY, p, k) for k in (3, 4)]
        for p in ("fifo", "lru", "min")
    }
    assert faults == {"fifo": [9, 10], "lru": [10, 8], "min": [7, 6]}


def test_min_equals_the_brute_force_on_reference_strings():
    rng, wins = random.Random(0), 0
    for _ in range(25):
        pages = [rng.randint(1, 5) for _ in range(11)]
        for cached in (2, 3):
            trace = rp.page_trace(pages)
            best = rp.brute_force_best(trace, cached + 1, 2, concurrency=1)
            assert rp.replay(trace, cached + 1, 2, "min", 1).hits == best, (
                pages,
                cached,
            )
            wins += best > max(
                rp.replay(trace, cached + 1, 2, p, 1).hits for p in REPLACEMENT_POLICIES
            )
    # the search is worth something: often no online policy reaches the optimum
    assert wins >= 10


# (seed, requests in memory at once, frames) of small chat traces whose scripts are few
# enough to walk
SMALL = [
    (2, 2, 9),
    (2, 2, 12),
    (3, 2, 10),
    (4, 2, 12),
    (5, 2, 11),
    (5, 2, 12),
    (6, 2, 9),
    (6, 2, 11),
    (7, 2, 9),
    (7, 2, 10),
    (8, 1, 8),
    (8, 2, 11),
]


def test_min_equals_the_brute_force_on_small_chat_traces():
    wins = 0
    for seed, concurrency, frames in SMALL:
        trace = chat_trace(
            num_conversations=6,
            turns=2,
            num_system_prompts=3,
            system_len=8,
            question_mean=2,
            answer_mean=2,
            active=3,
            seed=seed,
        )
        best = rp.brute_force_best(trace, frames, 4, concurrency)
        assert rp.replay(trace, frames, 4, "min", concurrency).hits == best, (
            seed,
            concurrency,
            frames,
        )
        wins += best > rp.replay(trace, frames, 4, "lru", concurrency).hits
    # multi-block prefixes shared across turns: LRU is not optimal there either
    assert wins >= 4


def test_the_brute_force_refuses_a_trace_too_big_to_walk():
    trace = rp.small_chat_trace(0)
    with pytest.raises(ValueError, match="more than 50 eviction scripts"):
        rp.brute_force_best(trace, rp.min_pool(trace, 4, 1), 4, 1, max_runs=50)


def test_no_policy_beats_min_at_any_pool_size():
    trace = chat_trace(
        num_conversations=10,
        turns=3,
        num_system_prompts=3,
        system_len=32,
        question_mean=8,
        answer_mean=8,
        active=3,
        seed=1,
    )
    floor, top = rp.min_pool(trace, 8, 2), rp.no_eviction_pool(trace, 8, 2)
    pools = list(range(floor, top + 2, 3)) + [top]
    curves = rp.sweep(trace, pools, 8, 2)
    for i, frames in enumerate(pools):
        for name, curve in curves.items():
            assert curve["hits"][i] <= curves["min"]["hits"][i], (name, frames)
            assert curve["saved_tokens"][i] == 8 * curve["hits"][i]
    # at the floor, the future is worth frames
    assert curves["min"]["hits"][0] > curves["lru"]["hits"][0]
    # nothing evicted: all the same
    assert len({curve["hits"][-1] for curve in curves.values()}) == 1
    # more frames never cost MIN a hit
    assert all(a <= b for a, b in zip(curves["min"]["hits"], curves["min"]["hits"][1:]))


def test_the_no_eviction_pool_is_the_smallest_where_nothing_is_evicted():
    trace = rp.small_chat_trace(3)
    top = rp.no_eviction_pool(trace, 4, 2)
    for frames, evicted in ((top, False), (top - 1, True)):
        # always the first candidate; counts its decisions
        counter = rp.Scripted([], [set()] * len(trace))
        rp.replay(trace, frames, 4, counter, 2)
        assert bool(counter.made) == evicted, frames
    best = rp.replay(trace, top, 4, "min", 2).hits
    assert all(
        rp.replay(trace, top, 4, p, 2).hits == best for p in REPLACEMENT_POLICIES
    )


# ---- Belady's anomaly ----------------------------------------------------------------


def test_fifo_shows_beladys_anomaly_on_chat_traces_and_lru_and_min_do_not():
    found = rp.anomalies("fifo", 12)
    assert found, "no FIFO anomaly in 12 small chat traces"
    example = found[0]
    trace = rp.small_chat_trace(example["seed"])
    more, fewer = (
        rp.replay(trace, example["frames"] + d, 4, "fifo", 1).hits for d in (1, 0)
    )
    assert (more, fewer) == (
        example["hits_with_one_more"],
        example["hits"],
    ) and more < fewer
    # stack algorithms: never
    assert rp.anomalies("lru", 12) == [] and rp.anomalies("min", 12) == []


# ---- the real engine: same tokens under every policy, different hits -----------------


def serve_one_at_a_time(engine, prompts) -> list[list[int]]:
    """Each prompt run to its end before the next arrives (turns of a chat); greedy
    tokens."""
    outs = []
    for i, prompt in enumerate(prompts):
        engine.add_request(
            str(i),
            {"prompt_token_ids": prompt},
            SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
        )
        while engine.has_unfinished_requests():
            outs += [out.outputs[0].token_ids for out in engine.step().finished]
    assert engine.blocks.num_free_frames == engine.blocks.num_frames  # nothing leaked
    return outs


def test_every_policy_gives_the_engines_greedy_tokens_and_its_own_hits(tiny):
    llm = LLM(
        str(tiny()),
        device="cpu",
        num_blocks=8,
        block_size=4,
        prefix_cache_policy="fifo",
    )
    assert llm.engine.config.prefix_cache_policy == "fifo"
    vocab = llm.model.config.vocab_size
    trace = chat_trace(
        num_conversations=6,
        turns=2,
        num_system_prompts=3,
        system_len=8,
        question_mean=2,
        answer_mean=2,
        active=3,
        seed=1,
        vocab=vocab,
    )
    prompts = [turn.prompt for turn in trace]
    want = serve_one_at_a_time(
        llm.new_engine(num_blocks=8, block_size=4, enable_prefix_caching=False), prompts
    )
    hits = {}
    for policy in REPLACEMENT_POLICIES:
        engine = (
            llm.engine
            if policy == "fifo"
            else llm.new_engine(num_blocks=8, block_size=4, prefix_cache_policy=policy)
        )
        assert serve_one_at_a_time(engine, prompts) == want, policy
        hits[policy] = engine.blocks.prefix_cache_hits
    assert len(set(hits.values())) > 1 and min(hits.values()) > 0, hits
    assert hits["lru"] > hits["fifo"], hits


# ---- the benchmark -------------------------------------------------------------------


def test_the_benchmark_reports_every_policy_beside_min(capsys):
    from minipaged.tools.bench import cli

    cli.main(
        [
            "replacement",
            "--conversations",
            "8",
            "--turns",
            "3",
            "--points",
            "5",
            "--anomaly-seeds",
            "4",
            "--json",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    pools = result["pool_frames"]
    assert (
        pools[0] == result["floor_frames"] and pools[-1] == result["no_eviction_frames"]
    )
    assert pools == sorted(set(pools)) and len(pools) == 5
    assert sorted(result["policies"]) == ["clock", "fifo", "lru", "min", "random"]
    assert result["every_policy_at_or_below_min"] == {
        name: True for name in result["policies"]
    }
    for curve in result["policies"].values():
        assert all(0 <= rate <= 1 for rate in curve["hit_rate"])
        assert curve["hits"][-1] == result["policies"]["min"]["hits"][-1]
    assert result["belady_anomaly"]["fifo_faults_by_cached_pages"] == {"3": 9, "4": 10}
    assert result["belady_anomaly"]["traces_with_an_anomaly"]["lru"] == 0


def test_the_note_quotes_the_committed_measurement():
    """docs/09_replacement.md and the results' README quote replacement.json, not older
    numbers."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    result = json.loads(
        (
            root
            / "bench/results/2026-12-01-cpu-2core-numpy-replacement/replacement.json"
        ).read_text()
    )
    note = " ".join((root / "docs/09_replacement.md").read_text().split())
    assert all(result["every_policy_at_or_below_min"].values())
    curves, names = result["policies"], ["lru", "fifo", "clock", "random", "min"]
    floor_row = " | ".join(f"{100 * curves[n]['hit_rate'][0]:.1f}%" for n in names)
    assert f"| {result['floor_frames']} (floor) | {floor_row} |" in note
    assert (
        f"MIN {curves['min']['saved_tokens'][0]:,}, LRU"
        f" {curves['lru']['saved_tokens'][0]:,}" in note
    )
    assert f"to {result['no_eviction_frames']} frames" in note
    found = result["belady_anomaly"]["traces_with_an_anomaly"]
    assert (
        f"FIFO hit less in {found['fifo']} of them and CLOCK in {found['clock']}"
        in note
    )
    assert found["lru"] == found["min"] == 0
