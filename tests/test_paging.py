"""Paging, one idea at a time: frames, demand paging, fork + copy-on-write, the prefix
cache, swap, KV storage, the static baseline, accounting and the memory benchmark."""

import json

import numpy as np
import pytest

from minipaged.paging import (
    BlockAllocator,
    BlockManager,
    ContiguousBlockManager,
    KVCache,
    MemoryMoves,
    NoFreeFramesError,
    PrefixCache,
    StaticBlockManager,
    bytes_per_frame,
    num_blocks_for_memory,
)
from minipaged.paging import prefix_cache as prefix_cache_module
from minipaged.tools.bench import cli as bench_cli


def state(manager: BlockManager):
    """What a failed all-or-nothing call must leave unchanged."""
    return (
        manager.device.ref_counts.tolist(),
        list(manager.device.free_frames),
        (
            list(manager.device.prefix_cache.evictable)
            if manager.device.prefix_cache
            else None
        ),
        {s: list(t.frames) for s, t in manager.tables.items()},
    )


# ---- frames --------------------------------------------------------------------------


def test_allocator_hands_out_each_frame_once_then_runs_out():
    allocator = BlockAllocator(3)
    frames = [allocator.allocate() for _ in range(3)]
    assert sorted(frames) == [0, 1, 2] and allocator.num_free == 0
    with pytest.raises(NoFreeFramesError, match="all 3 frames are in use"):
        allocator.allocate()
    allocator.free(frames[1])
    assert allocator.allocate() == frames[1]


def test_ref_counts_and_double_free():
    allocator = BlockAllocator(2)
    frame = allocator.allocate()
    allocator.incref(frame)
    allocator.free(frame)
    # still mapped once
    assert allocator.ref_count(frame) == 1 and allocator.num_free == 1
    allocator.free(frame)
    assert allocator.num_free == 2
    with pytest.raises(ValueError, match="double free of frame 0"):
        allocator.free(frame)
    with pytest.raises(ValueError, match="frame 1 is free"):
        allocator.incref(1)
    with pytest.raises(ValueError, match="frame 7 does not exist"):
        allocator.free(7)


# ---- demand paging and slots ---------------------------------------------------------


def test_a_frame_is_taken_only_when_the_last_one_is_full():
    manager = BlockManager(num_blocks=8, block_size=4)
    assert manager.allocate("s", [1, 2, 3]) == 0
    first = manager.block_table("s")
    assert len(first) == 1
    slot, cow = manager.append_slot("s", 4)  # fills block 0: no new frame
    assert (slot, cow) == (first[0] * 4 + 3, None) and manager.block_table("s") == first
    slot, _ = manager.append_slot("s", 5)  # block 1 starts: a new frame
    frames = manager.block_table("s")
    assert len(frames) == 2 and slot == frames[1] * 4
    assert manager.num_free_frames == 6


def test_step_inputs_pad_block_tables_and_map_new_tokens_to_slots():
    from minipaged.runner import step_inputs

    manager = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    manager.allocate("a", range(6))  # frames 0, 1
    manager.allocate("b", range(3))  # frame 2
    # frame 3: a padding row, computed but written nowhere
    manager.allocate("c", range(2))
    step = step_inputs(
        manager,
        ["a", "b", "c"],
        [6, 1, 1],
        writes=[True, True, False],
        token_ids=[list(range(6)), [2], [1]],
    )
    assert step.block_tables.dtype == np.int32 and step.block_tables.tolist() == [
        [0, 1],
        [2, -1],
        [3, -1],
    ]
    assert step.slot_mapping.tolist() == [0, 1, 2, 3, 4, 5, 10, -1]
    assert step.context_lens.tolist() == [6, 3, 2] and step.positions.tolist() == [
        0,
        1,
        2,
        3,
        4,
        5,
        2,
        1,
    ]
    assert step.token_ids == [0, 1, 2, 3, 4, 5, 2, 1] and step.query_lens == [6, 1, 1]
    assert manager.slots("a", 4, 6) == [4, 5]  # a prompt chunk: tokens 4 and 5 only
    with pytest.raises(
        ValueError, match="holds 3 tokens; it has no slots for tokens 0..3"
    ):
        manager.slots("b", 0, 4)


# ---- fork and copy-on-write ----------------------------------------------------------


def test_fork_shares_frames_and_the_first_write_copies_the_shared_block():
    manager = BlockManager(num_blocks=8, block_size=4)
    manager.allocate("parent", [1, 2, 3, 4, 5])  # frames: one full, one with 1 token
    manager.fork("parent", "child")
    shared = manager.block_table("parent")
    assert manager.block_table("child") == shared
    assert [manager.device.ref_count(f) for f in shared] == [2, 2]
    slot, cow = manager.append_slot("child", 6)
    assert cow == (shared[1], manager.block_table("child")[1]) and cow[1] not in shared
    assert slot == cow[1] * 4 + 1
    slot, cow = manager.append_slot("parent", 7)  # now the only owner: writes in place
    assert cow is None and slot == shared[1] * 4 + 1
    assert manager.device.ref_count(shared[0]) == 2  # the full block stays shared


def test_forking_4_samples_of_a_500_token_prompt_copies_only_the_partial_block():
    manager = BlockManager(num_blocks=200, block_size=16)
    manager.allocate("s0", range(500))  # 31 full blocks + 4 tokens = 32 frames
    assert manager.num_free_frames == 200 - 32
    for i in (1, 2, 3):
        manager.fork("s0", f"s{i}")
    assert manager.num_free_frames == 200 - 32  # forking copies nothing
    cows = [manager.append_slot(f"s{i}", 7)[1] for i in range(4)]
    assert sum(c is not None for c in cows) == 3  # the last writer keeps the original
    assert manager.num_free_frames == 200 - 32 - 3
    for _ in range(12):  # 4 + 13 = 17 tokens: block 31 overflows once
        for i in range(4):
            manager.append_slot(f"s{i}", 7)
    assert manager.num_free_frames == 200 - 32 - 3 - 4  # one new frame per sample
    usage = manager.usage()
    assert usage.shared_frames == 31
    # shared prompt blocks counted once
    assert usage.token_slots == 31 * 16 + 4 * (16 + 1)


# ---- prefix cache --------------------------------------------------------------------


def test_a_request_reuses_the_frames_of_its_longest_cached_prefix():
    manager = BlockManager(num_blocks=16, block_size=4)
    assert manager.allocate("a", range(10)) == 0
    # two full blocks in common
    assert manager.allocate("b", [*range(8), 99, 98, 97]) == 8
    assert manager.block_table("b")[:2] == manager.block_table("a")[:2]
    # first block differs: the chain breaks
    assert manager.allocate("c", [5, *range(1, 10)]) == 0
    assert manager.allocate("d", range(12)) == 8  # block 2 of "a" was never full
    assert manager.device.ref_count(manager.block_table("a")[0]) == 3


def test_a_fully_cached_prompt_still_computes_its_last_token():
    manager = BlockManager(num_blocks=16, block_size=4)
    manager.allocate("a", range(8))
    # not 8: the model needs the last token's logits
    assert manager.allocate("b", range(8)) == 4
    assert manager.block_table("b")[0] == manager.block_table("a")[0]
    assert manager.block_table("b")[1] != manager.block_table("a")[1]


def test_freed_cached_frames_stay_reusable_until_their_memory_is_needed():
    manager = BlockManager(num_blocks=4, block_size=4)
    manager.allocate("a", range(9))  # 3 frames; two full blocks get cached
    frames = manager.block_table("a")
    manager.free("a")
    assert manager.num_free_frames == 4  # cached frames count as free
    assert manager.allocate("b", range(9)) == 8  # ... and are found again
    assert manager.block_table("b")[:2] == frames[:2]
    manager.free("b")
    manager.allocate("c", [7] * 16)  # needs all 4 frames: the cache is evicted
    manager.free("c")
    assert manager.allocate("d", range(9)) == 0


def test_eviction_takes_the_least_recently_used_cached_frame_first():
    manager = BlockManager(num_blocks=5, block_size=2)
    manager.allocate("old", [1, 2, 3])  # caches block [1, 2]
    manager.allocate("new", [5, 6, 7])  # caches block [5, 6]
    manager.free("old")
    manager.free("new")
    manager.allocate("big", range(7))  # 4 frames: 3 never-cached, then the LRU one
    manager.free("big")
    assert manager.allocate("x", [5, 6, 0]) == 2
    assert manager.allocate("y", [1, 2, 0]) == 0


def test_hash_collisions_are_misses_because_token_ids_are_compared(monkeypatch):
    # every block collides
    monkeypatch.setattr(prefix_cache_module, "block_hash", lambda prev, tokens: 42)
    cache = PrefixCache()
    cache.insert(frame=3, prev_hash=None, token_ids=[1, 2])
    assert cache.lookup(None, [1, 2]) == 3
    assert cache.lookup(None, [2, 1]) is None
    assert cache.lookup(7, [1, 2]) is None


# ---- running out: all or nothing -----------------------------------------------------


def test_running_out_raises_a_catchable_error_and_changes_nothing():
    manager = BlockManager(num_blocks=3, block_size=4, num_host_blocks=1)
    manager.allocate("a", range(4))
    manager.fork("a", "b")
    manager.allocate("c", range(20, 27))
    before = state(manager)
    assert not manager.can_allocate(5)
    with pytest.raises(NoFreeFramesError, match="needs 2 new frames but 0 are free"):
        manager.allocate("d", range(30, 35))
    assert not manager.can_append_slots("a")
    with pytest.raises(NoFreeFramesError):
        manager.append_slot("a", 1)
    with pytest.raises(
        NoFreeFramesError, match="needs 2 frames; the other pool has 1 free"
    ):
        manager.swap_out("c")
    assert state(manager) == before and "d" not in manager.tables


# ---- swap ----------------------------------------------------------------------------


def test_swap_out_and_in_moves_frames_and_their_contents():
    manager = BlockManager(num_blocks=6, block_size=4, num_host_blocks=6)
    kv = KVCache(
        num_layers=2,
        num_blocks=6,
        num_kv_heads=1,
        head_dim=2,
        block_size=4,
        num_host_blocks=6,
        device="cpu",
    )
    manager.allocate("a", range(6))
    manager.fork("a", "b")
    kv.data[:] = np.random.default_rng(0).standard_normal(kv.data.shape)
    # (2, layers, 2, block, heads, dim)
    before = kv.data[:, :, manager.block_table("a")].copy()
    pairs = manager.swap_out("a", "b")
    assert len(pairs) == 2  # shared frames move once
    kv.swap_out(pairs)
    assert manager.is_swapped("a") and manager.num_free_frames == 6
    assert manager.host.ref_count(manager.tables["a"].frames[0]) == 2
    kv.data[:] = 0  # someone else used the frames
    kv.swap_in(manager.swap_in("a", "b"))
    np.testing.assert_array_equal(kv.data[:, :, manager.block_table("a")], before)
    assert (
        manager.block_table("b") == manager.block_table("a")
        and manager.host.num_free == 6
    )


def test_a_swapped_out_sequence_must_come_back_before_it_grows():
    manager = BlockManager(num_blocks=4, block_size=4, num_host_blocks=4)
    manager.allocate("a", range(3))
    manager.swap_out("a")
    with pytest.raises(
        ValueError, match="'a' is swapped out to host memory: swap_in\\(\\) it first"
    ):
        manager.append_slot("a", 1)
    with pytest.raises(ValueError, match="not all in the device pool"):
        manager.swap_out("a")


# ---- KV storage ----------------------------------------------------------------------


def test_kv_cache_shapes_writes_and_copy_on_write_pairs():
    from minipaged.attention import reference

    kv = KVCache(
        num_layers=3,
        num_blocks=5,
        num_kv_heads=2,
        head_dim=4,
        block_size=4,
        dtype="float32",
        device="cpu",
    )
    assert kv.k.shape == kv.v.shape == (3, 5, 4, 2, 4) and kv.dtype == np.float32
    k = np.arange(16, dtype=np.float32).reshape(2, 2, 4)  # (tokens, kv_heads, head_dim)
    # slots 5, 6: frame 1, offsets 1, 2
    reference.write_kv(k, -k, kv.k[1], kv.v[1], np.array([5, 6]))
    np.testing.assert_array_equal(kv.k[1, 1, 1:3], k)
    # sources read before any write
    kv.apply(MemoryMoves(copies=[(1, 3), (3, 4)]), reference.copy_blocks)
    np.testing.assert_array_equal(kv.v[1, 3], kv.v[1, 1])
    assert not kv.data[:, :, 4].any()
    assert not kv.k[0].any() and not kv.k[2].any()


@pytest.mark.gpu
def test_kv_cache_on_the_gpu_moves_k_and_v_like_numpy():
    from minipaged.attention import get_attention
    from minipaged.backend import to_numpy

    caches = [
        KVCache(
            num_layers=2,
            num_blocks=6,
            num_kv_heads=2,
            head_dim=4,
            block_size=4,
            num_host_blocks=3,
            dtype="float16",
            device=device,
        )
        for device in ("cpu", "cuda")
    ]
    start = (
        np.random.default_rng(0)
        .standard_normal(caches[0].data.shape)
        .astype(np.float16)
    )
    new = np.ones((3, 2, 4), dtype=np.float16)  # (tokens, kv_heads, head_dim)
    for kv in caches:
        kv.data[:] = kv.xp.asarray(start)
        slots = kv.xp.asarray(np.array([0, 9, 23], dtype=np.int32))
        get_attention(kv.device).write_kv(
            kv.xp.asarray(new), kv.xp.asarray(-new), kv.k[1], kv.v[1], slots
        )
        moves = MemoryMoves(
            swap_out=[(5, 0), (1, 2)], swap_in=[(2, 3)], copies=[(0, 5), (2, 4)]
        )
        kv.apply(moves, get_attention(kv.device).copy_blocks)
    np.testing.assert_array_equal(to_numpy(caches[1].data), caches[0].data)
    np.testing.assert_array_equal(caches[1].host, caches[0].host)


def test_sizing_from_a_memory_budget():
    # SmolLM2-135M in fp16: 2 x 30 layers x 16 slots x 3 kv heads x 64 dims x 2 bytes
    assert bytes_per_frame(30, 3, 64, 16, "float16") == 368_640
    assert num_blocks_for_memory(2**30, 30, 3, 64, 16, "float16") == 2912
    kv = KVCache.for_memory(
        10 * bytes_per_frame(2, 1, 8, 4, "float32") + 5,
        num_layers=2,
        num_kv_heads=1,
        head_dim=8,
        block_size=4,
        dtype="float32",
        device="cpu",
    )
    assert kv.num_blocks == 10 and kv.data.nbytes == 10 * bytes_per_frame(
        2, 1, 8, 4, "float32"
    )
    with pytest.raises(
        ValueError, match="holds no frame: one frame needs 368,640 bytes"
    ):
        num_blocks_for_memory(1000, 30, 3, 64, 16, "float16")


# ---- the static baseline and accounting ----------------------------------------------


def test_accounting_paged_vs_static_for_the_same_sequences():
    paged = BlockManager(num_blocks=64, block_size=16)
    static = StaticBlockManager(num_slots=4 * 256, max_model_len=256)
    for manager in (paged, static):
        manager.allocate("a", range(100, 140))  # 40 tokens
        manager.allocate("b", range(200, 210))  # 10 tokens
    p, s = paged.usage(), static.usage()
    assert (p.allocated_slots, p.token_slots, p.internal_waste, p.reserved_unused) == (
        64,
        50,
        14,
        0,
    )
    assert (s.allocated_slots, s.token_slots, s.internal_waste, s.reserved_unused) == (
        512,
        50,
        0,
        462,
    )
    assert p.utilization == 50 / 64 and s.utilization == 50 / 512
    assert (
        static.block_table("a") != static.block_table("b")
        and static.num_free_frames == 2
    )


def test_the_static_baseline_cannot_grow_past_its_reservation():
    static = StaticBlockManager(num_slots=100, max_model_len=8)
    static.allocate("a", range(7))
    static.append_slot("a", 7)
    with pytest.raises(
        ValueError, match="9 tokens does not fit the 8 slots reserved per request"
    ):
        static.append_slot("a", 8)


def test_memory_benchmark_paging_uses_over_96_percent_static_far_less(capsys):
    assert bench_cli.main(["memory", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["workload"]["requests"] == 1000
    assert result["paged"]["utilization"] >= 0.96
    assert 0.1 < result["static"]["utilization"] < 0.4
    assert result["paged"]["mean"]["token_slots"] == pytest.approx(
        result["static"]["mean"]["token_slots"]
    )


# ---- views: what pictures and dashboards read ----------------------------------------


def owners_by_frame(manager) -> list:
    return [(s.frame, s.owners, s.cached, s.reserved) for s in manager.frame_states()]


def test_views_show_who_maps_a_forked_frame_and_its_ref_count():
    manager = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    manager.allocate("a", range(6))  # frames 0, 1
    manager.fork("a", "b")
    manager.append_slot("b", 6)  # copy-on-write: b's block 1 -> frame 2
    assert owners_by_frame(manager) == [
        (0, ["a", "b"], False, False),
        (1, ["a"], False, False),
        (2, ["b"], False, False),
        (3, [], False, False),
    ]
    assert [s.free for s in manager.frame_states()] == [False, False, False, True]
    view = manager.table_view("b")
    assert (view.seq_id, view.frames, view.num_tokens, view.swapped) == (
        "b",
        [0, 2],
        7,
        False,
    )
    assert view.ref_counts == [2, 1]  # frame 0 shared with a
    assert manager.seq_ids() == ["a", "b"]
    view.frames.append(3)  # a copy: the manager does not change
    assert manager.block_table("b") == [0, 2]


def test_a_freed_full_block_stays_cached_only_with_prefix_caching():
    for caching in (False, True):
        manager = BlockManager(
            num_blocks=4, block_size=4, enable_prefix_caching=caching
        )
        manager.allocate("a", range(9))  # frames 0, 1 full, 2 holds 1 token
        manager.free("a")
        assert [s.cached for s in manager.frame_states()] == [
            caching,
            caching,
            False,
            False,
        ]
        assert (
            all(s.free != s.cached for s in manager.frame_states())
            and manager.seq_ids() == []
        )
    # (caching on) a hit on frame 0 takes it out of the cache
    manager.allocate("c", [0, 1, 2, 3, 99])
    assert owners_by_frame(manager)[:2] == [
        (0, ["c"], False, False),
        (1, [], True, False),
    ]
    assert manager.held_frame_states() == [
        s for s in manager.frame_states() if not s.free
    ]
    assert [s.frame for s in manager.held_frame_states()] == [
        0,
        1,
        3,
    ]  # c took a free frame for 99


def test_a_swapped_out_table_lists_host_frames_and_their_ref_counts():
    manager = BlockManager(num_blocks=4, block_size=4, num_host_blocks=4)
    manager.allocate("a", range(6))
    manager.fork("a", "b")
    manager.swap_out("a", "b")
    view = manager.table_view("a")
    assert view.swapped and view.ref_counts == [2, 2] and view.num_tokens == 6
    # host frames, shared there too
    assert view.frames == manager.table_view("b").frames
    assert all(
        s.owners == [] for s in manager.frame_states()
    ) and manager.seq_ids() == ["a", "b"]
    manager.swap_in("a", "b")
    first = manager.block_table("a")[0]
    assert not manager.table_view("a").swapped and manager.frame_states()[
        first
    ].owners == ["a", "b"]


def test_the_baselines_views_show_their_reservations():
    contiguous = ContiguousBlockManager(
        num_blocks=8, block_size=1, reservation="oracle"
    )
    # a chunk of frames 0-5, three of them written
    contiguous.allocate("a", [5, 6, 7], final_len=6)
    assert [(s.owners, s.reserved) for s in contiguous.frame_states()] == [
        (["a"], False)
    ] * 3 + [([], True)] * 3 + [([], False)] * 2
    # the chunk; 6 and 7 free
    assert contiguous.held_frame_states() == contiguous.frame_states()[:6]
    assert contiguous.table_view("a").frames == [0, 1, 2] and contiguous.table_view(
        "a"
    ).ref_counts == [1, 1, 1]
    static = StaticBlockManager(num_slots=3 * 8, max_model_len=8)
    static.allocate("a", range(3))
    assert owners_by_frame(static) == [
        (0, ["a"], False, False),
        (1, [], False, False),
        (2, [], False, False),
    ]
    assert static.table_view("a").num_tokens == 3


# ---- bad input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: BlockAllocator(-1), "num_blocks must be a whole number >= 0, got -1"),
        (
            lambda: BlockManager(8, block_size=0),
            "block_size must be a whole number >= 1, got 0",
        ),
        (
            lambda: StaticBlockManager(100, max_model_len=-5),
            "max_model_len must be a whole number >= 1",
        ),
        (
            lambda: KVCache(2, -3, 1, 8, device="cpu"),
            "num_blocks must be a whole number >= 0, got -3",
        ),
        (
            lambda: num_blocks_for_memory(-1, 2, 1, 8),
            "kv_cache_memory must be a whole number >= 0",
        ),
        (
            lambda: BlockManager(8).can_allocate(-2),
            "num_tokens must be a whole number >= 0",
        ),
    ],
)
def test_negative_sizes_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_unknown_and_freed_sequences_are_refused_with_a_reason():
    manager = BlockManager(num_blocks=8, block_size=4)
    manager.allocate("a", [1, 2])
    with pytest.raises(ValueError, match="'a' already exists"):
        manager.allocate("a", [3])
    with pytest.raises(ValueError, match="has no tokens"):
        manager.allocate("e", [])
    with pytest.raises(ValueError, match="cannot fork into 'a'"):
        manager.fork("a", "a")
    manager.free("a")
    for call in (
        lambda: manager.append_slot("a", 3),
        lambda: manager.free("a"),
        lambda: manager.block_table("zz"),
        lambda: manager.fork("zz", "b"),
    ):
        with pytest.raises(
            ValueError, match="unknown sequence .*never allocated, or it was freed"
        ):
            call()
