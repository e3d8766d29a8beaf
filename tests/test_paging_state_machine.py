"""Random interleavings of every paging operation, checked after each step against a
shadow copy.

Hypothesis adds sequences (some sharing a prefix with earlier ones, to hit the prefix
cache), appends tokens, forks, frees and swaps, in a pool small enough to run out often.
The KV cache stores each token's id as K and a fingerprint of its whole prefix as V,
since a real K and V depend on every earlier token: a frame reused for the wrong prefix
reads back wrong.
"""

from collections import Counter

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minipaged.attention import reference
from minipaged.paging import (
    BlockManager,
    KVCache,
    MemoryMoves,
    NoFreeFramesError,
    block_hash,
)

BLOCK, FRAMES, HOST_FRAMES, LAYERS = 4, 14, 8, 2
tokens = st.integers(0, 3)  # a tiny vocabulary, so prompts often share blocks


def fingerprint(prefix: list[int]) -> float:
    return float(hash(tuple(prefix)) % (1 << 20))


class PagingMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.manager = BlockManager(FRAMES, BLOCK, num_host_blocks=HOST_FRAMES)
        self.kv = KVCache(
            LAYERS,
            FRAMES,
            num_kv_heads=1,
            head_dim=1,
            block_size=BLOCK,
            num_host_blocks=HOST_FRAMES,
            dtype="float64",
            device="cpu",
        )
        self.shadow: dict[int, list[int]] = {}  # seq id -> every token it holds
        self.seen: list[list[int]] = []  # prompts and sequences, to share prefixes with
        self.next_id = 0

    # ---- helpers ---------------------------------------------------------------------

    def on_device(self) -> list[int]:
        return [s for s in self.shadow if not self.manager.is_swapped(s)]

    def swapped(self) -> list[int]:
        return [s for s in self.shadow if self.manager.is_swapped(s)]

    def snapshot(self):
        """Everything an all-or-nothing call must leave as it was when it fails."""
        m = self.manager
        cache = m.device.prefix_cache
        return (
            m.device.ref_counts.tolist(),
            list(m.device.free_frames),
            list(cache.evictable),
            dict(cache.frame_of),
            m.host.ref_counts.tolist(),
            list(m.host.free_frames),
            {
                s: (t.allocator is m.host, list(t.frames), list(t.token_ids))
                for s, t in m.tables.items()
            },
        )

    def write(self, seq_id: int, slots, start: int) -> None:
        """As the model would: store K and V of tokens start.. of seq_id at `slots`."""
        seq = self.shadow[seq_id]
        for slot in slots:
            assert self.manager.device.ref_count(int(slot) // BLOCK) == 1, (
                "a shared frame written in place"
            )
        k = np.array(seq[start:], dtype=np.float64).reshape(-1, 1, 1)  # (n, 1, 1)
        v = np.array(
            [fingerprint(seq[: p + 1]) for p in range(start, len(seq))]
        ).reshape(-1, 1, 1)
        for layer in range(LAYERS):
            reference.write_kv(
                k, v, self.kv.k[layer], self.kv.v[layer], np.asarray(slots)
            )

    def add(self, prompt: list[int]) -> None:
        seq_id, before = self.next_id, self.snapshot()
        self.next_id += 1
        try:
            cached = self.manager.allocate(seq_id, prompt)
        except NoFreeFramesError:
            assert self.snapshot() == before
            return
        assert cached % BLOCK == 0 and 0 <= cached < len(prompt)
        self.shadow[seq_id] = list(prompt)
        self.seen.append(list(prompt))
        self.write(seq_id, self.manager.slots(seq_id, cached, len(prompt)), cached)

    # ---- rules -----------------------------------------------------------------------

    @rule(prompt=st.lists(tokens, min_size=1, max_size=14))
    def add_sequence(self, prompt):
        self.add(prompt)

    @precondition(lambda self: self.seen)
    @rule(data=st.data(), suffix=st.lists(tokens, max_size=6))
    def add_sequence_sharing_a_prefix(self, data, suffix):
        base = data.draw(st.sampled_from(self.seen + list(self.shadow.values())))
        cut = data.draw(st.integers(1, len(base)))
        self.add(base[:cut] + suffix)

    @precondition(lambda self: self.on_device())
    @rule(data=st.data(), token=tokens)
    def append_token(self, data, token):
        seq_id, before = data.draw(st.sampled_from(self.on_device())), self.snapshot()
        try:
            slot, cow = self.manager.append_slot(seq_id, token)
        except NoFreeFramesError:
            assert self.snapshot() == before
            return
        if cow is not None:
            assert cow[0] != cow[1] and self.manager.device.ref_count(cow[1]) == 1
            self.kv.apply(MemoryMoves(copies=[cow]), reference.copy_blocks)
        self.shadow[seq_id].append(token)
        self.write(seq_id, [slot], len(self.shadow[seq_id]) - 1)

    @precondition(lambda self: self.shadow)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(list(self.shadow)))
        self.manager.fork(parent, self.next_id)
        self.shadow[self.next_id] = list(self.shadow[parent])
        self.next_id += 1

    @precondition(lambda self: self.shadow)
    @rule(data=st.data())
    def free(self, data):
        seq_id = data.draw(st.sampled_from(list(self.shadow)))
        self.manager.free(seq_id)
        del self.shadow[seq_id]

    @precondition(lambda self: self.on_device())
    @rule(data=st.data())
    def swap_out(self, data):
        self.swap(data, self.on_device(), self.manager.swap_out, self.kv.swap_out)

    @precondition(lambda self: self.swapped())
    @rule(data=st.data())
    def swap_in(self, data):
        self.swap(data, self.swapped(), self.manager.swap_in, self.kv.swap_in)

    def swap(self, data, candidates: list[int], move, copy) -> None:
        """Move a group of sequences (siblings may share frames) and copy their K and
        V."""
        group = data.draw(
            st.lists(st.sampled_from(candidates), min_size=1, max_size=3, unique=True)
        )
        before = self.snapshot()
        try:
            copy(move(*group))
        except NoFreeFramesError:
            assert self.snapshot() == before

    # ---- invariants, after every step ------------------------------------------------

    @invariant()
    def every_frame_is_free_or_owned_once(self):
        for pool in (self.manager.device, self.manager.host):
            mapped = Counter(
                f
                for t in self.manager.tables.values()
                if t.allocator is pool
                for f in t.frames
            )
            free = list(pool.free_frames) + list(
                pool.prefix_cache.evictable if pool.prefix_cache else []
            )
            assert len(free) == len(set(free)), "a frame is twice in the free lists"
            assert not set(free) & set(mapped), "a mapped frame is also free"
            assert (
                len(free) + len(mapped)
                == pool.num_blocks
                == pool.num_free + len(mapped)
            ), "a frame leaked"
            assert all(
                pool.ref_counts[f] == mapped[f] for f in range(pool.num_blocks)
            ), "a ref count differs from the number of tables holding the frame"

    @invariant()
    def contents_read_back_through_the_tables(self):
        for seq_id, seq in self.shadow.items():
            table = self.manager.tables[seq_id]
            assert table.token_ids == seq
            store = self.kv.host if self.manager.is_swapped(seq_id) else self.kv.data
            flat = store.reshape(2, LAYERS, -1)  # (K/V, layers, slots)
            slots = [table.slot(p) for p in range(len(seq))]
            for layer in range(LAYERS):
                assert flat[0, layer, slots].tolist() == seq
                assert flat[1, layer, slots].tolist() == [
                    fingerprint(seq[: p + 1]) for p in range(len(seq))
                ]

    @invariant()
    def cached_frames_hold_their_blocks(self):
        cache = self.manager.device.prefix_cache
        for h, frame in cache.frame_of.items():
            prev, block = cache.key_of[frame]
            assert block_hash(prev, block) == h
            assert self.kv.k[:, frame, :, 0, 0].tolist() == [list(block)] * LAYERS
        assert all(
            self.manager.device.ref_counts[f] == 0 and f in cache.key_of
            for f in cache.evictable
        )

    @invariant()
    def the_held_frames_view_is_the_full_view_without_its_free_frames(self):
        assert self.manager.held_frame_states() == [
            s for s in self.manager.frame_states() if not s.free
        ]


PagingMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None
)
TestPaging = PagingMachine.TestCase
