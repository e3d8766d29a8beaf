"""The drum (a tier behind the KV pool): evicted prefix-cache blocks are stored there,
found again by a later prompt and loaded back, their K and V exact; the tier's own
replacement; nothing leaks; the copies' order within a step; and the engine's tokens
equal with and without it, with
more tokens cached, beside swap preemption and chunked prefill."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged import SamplingParams
from minipaged.paging import (
    BlockManager,
    KVCache,
    MemoryMoves,
    NoFreeFramesError,
    block_hash,
)
from minipaged.paging.kv_cache import tier_runs
from minipaged.tools.bench.drum import replay
from minipaged.tools.bench.workload import chat_trace

SHAPE = dict(
    num_layers=2,
    num_kv_heads=1,
    head_dim=3,
    block_size=4,
    dtype="float32",
    device="cpu",
)


def content(h: int) -> np.ndarray:
    """The K and V a full block with hash h would get from the model: (2, layers, block,
    kvh, hd)."""
    return (
        np.random.default_rng(h % 2**32)
        .standard_normal((2, 2, 4, 1, 3))
        .astype(np.float32)
    )


def hashes(token_ids, block_size: int = 4) -> list[int]:
    out, prev = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        prev = block_hash(prev, token_ids[start : start + block_size])
        out.append(prev)
    return out


class Pool:
    """A block manager with a tier and its KVCache, driven as the engine drives them: a
    step's allocations, then its moves applied, then its computed blocks written (the
    forward).
    """

    def __init__(self, num_blocks: int, num_tier: int):
        self.manager = BlockManager(num_blocks, block_size=4)
        self.manager.add_tier(num_tier)
        self.kv = KVCache(num_blocks=num_blocks, num_tier_blocks=num_tier, **SHAPE)
        self.prompts: dict[str, list[int]] = {}

    def step(self, prompts: dict[str, list[int]], frees=()) -> dict[str, int]:
        for seq_id in frees:
            self.manager.free(seq_id)
            del self.prompts[seq_id]
        cached = {}
        for seq_id, prompt in prompts.items():
            try:
                cached[seq_id] = self.manager.allocate(seq_id, prompt)
            except NoFreeFramesError:  # does not fit now: it is not admitted
                pass
        prompts = {s: p for s, p in prompts.items() if s in cached}
        self.kv.apply(
            MemoryMoves(tier=self.manager.take_tier_moves()), copy_blocks=None
        )
        # the forward writes the blocks that were not cached
        for (
            seq_id,
            prompt,
        ) in prompts.items():
            frames = self.manager.block_table(seq_id)
            for i, h in enumerate(
                hashes(prompt)[cached[seq_id] // 4 :], start=cached[seq_id] // 4
            ):
                self.kv.data[:, :, frames[i]] = content(h)
        self.prompts.update(prompts)
        return cached

    def check(self) -> None:
        """Every full block a sequence maps, and every block the tier holds, has its own
        K and V."""
        for seq_id, prompt in self.prompts.items():
            for frame, h in zip(self.manager.block_table(seq_id), hashes(prompt)):
                np.testing.assert_array_equal(self.kv.data[:, :, frame], content(h))
        for tier_frame, h in enumerate(self.manager.tier.blocks()):
            if h is not None:
                np.testing.assert_array_equal(
                    self.kv.tier[:, :, tier_frame], content(h)
                )


# ---- paging: store, hit, load, replacement, no leak ----------------------------------


def test_an_evicted_block_is_stored_in_the_tier_and_loaded_back_on_a_hit():
    pool = Pool(num_blocks=3, num_tier=4)
    assert pool.step({"a": [1, 2, 3, 4, 5, 6, 7, 8, 9]}) == {"a": 0}
    pool.step({}, frees=["a"])  # a's two full blocks are parked
    pool.step({"b": list(range(20, 29))})  # b needs all three frames: both evicted
    assert (pool.manager.tier.stores, pool.manager.tier_hits) == (2, 0)
    pool.step({}, frees=["b"])
    moves_before = pool.manager.tier.loads
    # both blocks from the tier
    assert pool.step({"c": [1, 2, 3, 4, 5, 6, 7, 8, 99]}) == {"c": 8}
    assert pool.manager.tier.loads - moves_before == 2 and pool.manager.tier_hits == 8
    assert pool.manager.prefix_cache_hits == 0  # the pool itself had none of them
    pool.check()


def test_without_a_tier_the_same_eviction_forgets_the_block():
    manager = BlockManager(3, block_size=4)
    manager.allocate("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    manager.free("a")
    manager.allocate("b", list(range(20, 29)))
    manager.free("b")
    assert manager.allocate("c", [1, 2, 3, 4, 5, 6, 7, 8, 99]) == 0
    assert manager.take_tier_moves() == [] and manager.num_tier_frames == 0


def test_a_prompt_takes_pool_hits_and_tier_hits_in_one_page_table():
    pool = Pool(num_blocks=4, num_tier=4)
    prompt = list(range(1, 14))  # three full blocks and one token
    pool.step({"a": prompt})
    pool.step({}, frees=["a"])  # parked tail first: block 2, 1, then 0
    pool.step({"b": [50, 51, 52, 53, 54]})  # two frames: the free one, then block 2's
    pool.step({}, frees=["b"])
    # blocks 0, 1 only
    assert pool.manager.cached_frames(prompt) == pool.manager.cached_frames(prompt[:8])
    # blocks 0, 1 from the pool, 2 from the tier
    assert pool.step({"c": prompt}) == {"c": 12}
    assert pool.manager.tier_hits == 4 and pool.manager.prefix_cache_hits == 8
    pool.check()


def test_the_tier_gives_up_the_block_the_pool_gave_up_longest_ago():
    pool = Pool(num_blocks=2, num_tier=2)
    for i, first in enumerate((10, 20, 30, 40)):  # each prompt evicts the one before it
        pool.step(
            {f"s{i}": list(range(first, first + 5))}, frees=[f"s{i - 1}"] if i else []
        )
    tier = pool.manager.tier
    assert (tier.stores, tier.evictions, tier.num_used) == (3, 1, 2)
    # the second is still there
    assert pool.step({"y": list(range(20, 25))}, frees=["s3"]) == {"y": 4}
    # the first is gone
    assert pool.step({"x": list(range(10, 15))}, frees=["y"]) == {"x": 0}
    pool.check()


def test_a_block_loaded_back_and_evicted_again_is_not_copied_twice():
    pool = Pool(num_blocks=2, num_tier=4)
    pool.step({"a": list(range(10, 15))})
    # a and b take turns, evicting each other
    for i, first in enumerate((20, 10, 20, 10)):
        pool.step(
            {f"s{i}": list(range(first, first + 5))},
            frees=["a" if i == 0 else f"s{i - 1}"],
        )
    assert pool.manager.tier.stores == 2 and pool.manager.tier.loads == 3
    pool.check()


def test_a_tier_frame_being_loaded_is_not_stored_over_in_the_same_allocation():
    """One tier frame: the block loaded from it needs a device frame, which evicts
    another block; that block cannot take the tier frame before it is read, so it is
    forgotten.
    """
    pool = Pool(num_blocks=2, num_tier=1)
    pool.step({"a": list(range(10, 15))})  # block A and a partial block
    # blocks B0, B1: A goes to the tier
    pool.step({"b": list(range(20, 28))}, frees=["a"])
    pool.step({}, frees=["b"])  # B1, B0 parked, in that order; none free
    # A loaded: its frame was B1's
    assert pool.step({"d": [10, 11, 12, 13, 99]}) == {"d": 4}
    assert pool.manager.tier.stores == 2  # B1 was forgotten, B0 (evicted for the
    # partial block) took A's tier frame
    assert pool.manager.cached_frames(range(20, 28)) == []
    assert pool.manager.tier.lookup(None, [20, 21, 22, 23]) == 0
    pool.check()  # ...after A was read from it


@settings(max_examples=100, deadline=None)
@given(
    num_blocks=st.integers(4, 10),
    num_tier=st.integers(1, 8),
    steps=st.lists(
        st.tuples(
            st.integers(0, 3),
            st.lists(st.tuples(st.integers(0, 3), st.integers(4, 14)), max_size=3),
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_k_and_v_round_trip_exactly_and_every_frame_comes_back(
    num_blocks, num_tier, steps
):
    """Random steps (free the oldest few sequences, then admit a few prompts over four
    shared prefixes): after each, every mapped block and every tier block holds its own
    K and V; at
    the end every pool frame is free and every tier frame is free or holds one block."""
    prefixes = [list(range(100 * p, 100 * p + 14)) for p in range(4)]
    pool, count = Pool(num_blocks, num_tier), 0
    for num_frees, prompts in steps:
        new = {
            f"s{count + i}": prefixes[p][:n] + [1000 + count + i]
            for i, (p, n) in enumerate(prompts)
        }
        count += len(prompts)
        pool.step(new, frees=list(pool.prompts)[:num_frees])
        pool.check()
    pool.step({}, frees=list(pool.prompts))
    tier = pool.manager.tier
    assert pool.manager.num_free_frames == num_blocks and not pool.manager.seq_ids()
    assert sorted([*tier.key_of, *tier.free_frames]) == list(range(num_tier))
    assert len(tier.frame_of) == tier.num_used and not tier.pinned and not tier.moves
    assert pool.manager.tier_hits <= pool.manager.tier_queries
    assert pool.manager.tier_hits == 4 * tier.loads


def test_moves_apply_in_order_a_frame_written_twice_in_a_step():
    kv = KVCache(num_blocks=2, num_tier_blocks=2, **SHAPE)
    kv.data[:, :, 0], kv.data[:, :, 1] = content(1), content(2)
    moves = [("store", 0, 0), ("load", 0, 1), ("store", 1, 0), ("store", 0, 1)]
    assert tier_runs(moves) == [
        ("store", [0], [0]),
        ("load", [0], [1]),
        ("store", [1, 0], [0, 1]),
    ]
    kv.apply(MemoryMoves(tier=moves), copy_blocks=None)
    # loaded before frame 0 was stored over
    np.testing.assert_array_equal(kv.data[:, :, 1], content(1))
    # frame 1 held block 1 by then
    np.testing.assert_array_equal(kv.tier[:, :, 0], content(1))
    assert tier_runs([("store", 3, 0), ("store", 4, 0)]) == [
        ("store", [3], [0]),
        ("store", [4], [0]),
    ]


@pytest.mark.gpu
def test_tier_moves_on_the_gpu_copy_like_numpy():
    from minipaged.backend import to_numpy

    shape = SHAPE | {"dtype": "float16"}
    caches = [
        KVCache(num_blocks=3, num_tier_blocks=2, **(shape | {"device": device}))
        for device in ("cpu", "cuda")
    ]
    start = (
        np.random.default_rng(0)
        .standard_normal(caches[0].data.shape)
        .astype(np.float16)
    )
    moves = [
        ("store", 0, 0),
        ("store", 2, 1),
        ("load", 0, 1),
        ("store", 1, 0),
        ("load", 0, 2),
    ]
    for kv in caches:
        kv.data[:] = kv.xp.asarray(start)
        kv.apply(MemoryMoves(tier=moves), copy_blocks=None)
    np.testing.assert_array_equal(to_numpy(caches[1].data), caches[0].data)
    np.testing.assert_array_equal(caches[1].tier, caches[0].tier)


def test_the_tier_in_a_file_through_memmap(tmp_path):
    path = tmp_path / "drum.bin"
    kv = KVCache(num_blocks=2, num_tier_blocks=3, tier_path=path, **SHAPE)
    kv.data[:, :, 1] = content(7)
    kv.apply(MemoryMoves(tier=[("store", 1, 2)]), copy_blocks=None)
    kv.tier.flush()
    on_disk = np.memmap(path, dtype=np.float32, mode="r", shape=kv.tier.shape)
    np.testing.assert_array_equal(on_disk[:, :, 2], content(7))
    with pytest.raises(ValueError, match="needs kv_offload_frames > 0"):
        KVCache(num_blocks=2, num_tier_blocks=0, tier_path=path, **SHAPE)


def test_a_tier_needs_the_prefix_cache():
    with pytest.raises(ValueError, match="needs enable_prefix_caching=True"):
        BlockManager(4, 4, enable_prefix_caching=False).add_tier(2)
    with pytest.raises(
        ValueError, match="kv_offload_frames must be a whole number >= 1"
    ):
        BlockManager(4, 4).add_tier(0)


# ---- the engine ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from checkpoints import write_checkpoint

    from minipaged import LLM

    return LLM(
        str(
            write_checkpoint(
                tmp_path_factory.mktemp("drum"), layers=2, max_positions=256
            )
        ),
        device="cpu",
        num_blocks=64,
        block_size=4,
    )


TRACE = chat_trace(
    num_conversations=6,
    turns=3,
    num_system_prompts=2,
    system_len=24,
    question_mean=8,
    answer_mean=8,
    active=3,
    vocab=60,
    seed=1,
)
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def serve(engine, trace=TRACE, group: int = 2):
    """The trace's prompts in groups of `group` at a time, each group run to its end:
    per
    request its tokens and cached tokens, and whether any step preempted (by swap)."""
    outputs, swapped = {}, 0
    for start in range(0, len(trace), group):
        for i, turn in enumerate(trace[start : start + group], start=start):
            engine.add_request(f"r{i}", {"prompt_token_ids": turn.prompt}, GREEDY)
        while engine.has_unfinished_requests():
            report = engine.step()
            swapped += report.swapped_out
            outputs.update(
                {
                    o.request_id: (o.outputs[0].token_ids, o.num_cached_tokens)
                    for o in report.finished
                }
            )
    return outputs, swapped


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"preemption_mode": "swap", "swap_space": 32},
        {"enable_chunked_prefill": True, "max_num_batched_tokens": 16},
    ],
    ids=["plain", "swap", "chunked"],
)
def test_tokens_are_the_same_with_the_tier_and_more_of_them_are_cached(llm, options):
    alone, _ = serve(
        llm.new_engine(num_blocks=256, block_size=4, enable_prefix_caching=False)
    )
    without, _ = serve(llm.new_engine(num_blocks=24, block_size=4, **options))
    engine = llm.new_engine(
        num_blocks=24, block_size=4, kv_offload_frames=64, **options
    )
    with_tier, swapped = serve(engine)
    for request_id, (tokens, _) in alone.items():
        assert with_tier[request_id][0] == tokens == without[request_id][0], request_id
    cached = sum(c for _, c in with_tier.values())
    assert cached > sum(c for _, c in without.values())
    assert engine.blocks.tier_hits > 0 and engine.blocks.tier.stores > 0
    assert engine.blocks.num_free_frames == 24 and not engine.blocks.take_tier_moves()
    if options.get("preemption_mode") == "swap":
        assert swapped > 0  # the tier met swap preemption, not only the prefix cache


def test_the_benchmark_replay_without_a_model_caches_what_the_engine_caches(llm):
    """bench drum's replay (its figure, the notebook's sweep) is the engine's
    bookkeeping: per turn, the same cached tokens, from the pool and from the tier, as
    the engine one at a time.
    """
    for tier in (0, 64):
        engine = llm.new_engine(num_blocks=24, block_size=4, kv_offload_frames=tier)
        outputs, _ = serve(engine, group=1)
        rows = replay(TRACE, 24, tier, block_size=4, max_tokens=GREEDY.max_tokens)
        assert [outputs[f"r{i}"][1] for i in range(len(TRACE))] == [
            r["pool"] + r["tier"] for r in rows
        ]
        assert sum(r["tier"] for r in rows) == engine.blocks.tier_hits and (
            tier == 0
        ) == (engine.blocks.tier_hits == 0)


def test_the_engine_tier_in_a_file(llm, tmp_path):
    engine = llm.new_engine(
        num_blocks=24,
        block_size=4,
        kv_offload_frames=16,
        kv_offload_path=str(tmp_path / "d"),
    )
    assert (
        serve(engine)[0]
        == serve(llm.new_engine(num_blocks=24, block_size=4, kv_offload_frames=16))[0]
    )
    assert (
        tmp_path / "d"
    ).stat().st_size == engine.kv.tier.nbytes and engine.blocks.tier_hits > 0


@pytest.mark.parametrize(
    "options, message",
    [
        ({"kv_offload_frames": -1}, "kv_offload_frames must be a whole number >= 0"),
        ({"kv_offload_frames": 1.5}, "kv_offload_frames must be a whole number"),
        (
            {"kv_offload_frames": 8, "enable_prefix_caching": False},
            "needs enable_prefix_caching=True",
        ),
        (
            {"kv_offload_frames": 8, "allocator": "contiguous-max"},
            "needs allocator='paged' and scheduler='continuous'",
        ),
        (
            {"kv_offload_frames": 8, "scheduler": "static"},
            "needs allocator='paged' and scheduler='continuous'",
        ),
        ({"kv_offload_path": "/tmp/x"}, "kv_offload_path needs kv_offload_frames > 0"),
        (
            {"kv_offload_frames": 8, "kv_offload_path": 3},
            "kv_offload_path must be a file path or None",
        ),
    ],
)
def test_bad_tier_options_are_refused_at_the_door(llm, options, message):
    with pytest.raises(ValueError, match=message):
        llm.new_engine(**options)


def test_the_note_and_the_results_quote_the_committed_measurement():
    """docs/12_drum.md and the results README quote bench drum's committed JSON (the one
    its figure draws): each configuration's TTFT medians and token counts, and the
    tier's hit rate.
    """
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    folder = root / "bench" / "results" / "2026-12-01-cpu-2core-numpy-drum"
    result = json.loads((folder / "drum.json").read_text())
    for text in (
        (root / "docs" / "12_drum.md").read_text(),
        (folder / "README.md").read_text(),
    ):
        for row in result["configs"].values():
            for key in (
                "ttft_first_p50_ms",
                "ttft_returning_p50_ms",
                "ttft_returning_p90_ms",
            ):
                assert f"{row[key]:,.0f} ms" in text, key
            assert f"| {row['computed_tokens']:,} | {row['cached_tokens']:,} |" in text
        tier = result["configs"]["pool + tier"]["tier"]
        assert (
            f"{100 * tier['hit_rate']:.0f}% ({tier['tier_hits']:,} of"
            f" {tier['tier_queries']:,}" in text
        )
