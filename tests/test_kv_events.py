"""The page table, published: the prefix cache's block events (vLLM's KV-cache events).

The events equal the prefix cache's own state: replaying them (stored, removed, cleared)
rebuilds exactly the set of cached block hashes, after every step of a random engine run
with evictions, preemptions, aborts and resets, and through a real ZMQ subscriber that
decodes vLLM's msgpack shape. The hashes in the events are the ones a router computes
from the token ids alone, and a reset drops what no sequence maps.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

from minipaged.paging import BlockManager, block_hash


class Recorder:
    """A listener that keeps the events in order, as plain tuples."""

    def __init__(self):
        self.events: list[tuple] = []

    def stored(self, block, parent, token_ids):
        self.events.append(("stored", block, parent, tuple(token_ids)))

    def removed(self, block):
        self.events.append(("removed", block))

    def cleared(self):
        self.events.append(("cleared",))


def replay(events, names=None) -> set[int]:
    """The set of cached block hashes that a directory builds from the events alone."""
    names = set() if names is None else names
    for event in events:
        if event[0] == "stored":
            assert event[1] not in names, f"block {event[1]} stored twice"
            names.add(event[1])
        elif event[0] == "removed":
            assert event[1] in names, f"block {event[1]} removed but never stored"
            names.discard(event[1])
        else:
            names.clear()
    return names


def cached_names(manager: BlockManager) -> set[int]:
    """The prefix cache's own names (what the pool holds, mapped or parked)."""
    return set(manager.device.prefix_cache.frame_of)


def router_hashes(token_ids, block_size: int) -> list[int]:
    """The block names a router computes from a prompt's token ids, written here from
    the rule alone (prefix_cache.block_hash's docstring): sha256 of the parent's name
    (8 bytes big-endian, none for the first block) and the token ids (4 bytes
    little-endian each); the name is the digest's last 8 bytes, big-endian."""
    names, parent = [], b""
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[start : start + block_size]
        digest = hashlib.sha256(parent + struct.pack(f"<{block_size}I", *block))
        name = int.from_bytes(digest.digest()[-8:], "big")
        names.append(name)
        parent = name.to_bytes(8, "big")
    return names


# ---- the block manager: reset, and the names --------------------------------------


def test_reset_drops_the_parked_blocks_and_keeps_the_mapped_ones():
    manager = BlockManager(num_blocks=8, block_size=2)
    recorder = Recorder()
    manager.add_cache_listener(recorder)
    manager.allocate("a", [1, 2, 3, 4, 5])
    manager.allocate("b", [1, 2, 9, 9, 9])  # shares block [1, 2] with a
    manager.free("a")  # [3, 4] is parked; [1, 2] is still mapped by b
    parked = router_hashes([1, 2, 3, 4], 2)[1]
    assert manager.reset_prefix_cache() == 1
    assert recorder.events[-1] == ("removed", parked)
    assert manager.cached_frames([1, 2, 3, 4, 0]) == manager.block_table("b")[:1]
    assert manager.num_free_frames == 5
    assert cached_names(manager) == replay(recorder.events)
    manager.free("b")
    assert manager.reset_prefix_cache() == 2
    assert recorder.events[-1] == ("cleared",)
    assert manager.num_free_frames == 8 and not cached_names(manager)
    # every frame can be taken again, and nothing is found any more
    assert manager.allocate("c", list(range(16))) == 0


def test_a_reset_with_nothing_cached_says_cleared_and_returns_zero():
    manager = BlockManager(num_blocks=4, block_size=2)
    recorder = Recorder()
    manager.add_cache_listener(recorder)
    assert manager.reset_prefix_cache() == 0
    assert recorder.events == [("cleared",)]
    no_cache = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=False)
    assert no_cache.reset_prefix_cache() == 0
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        no_cache.add_cache_listener(Recorder())


def test_the_names_in_the_events_are_the_ones_a_router_computes_from_token_ids():
    rng = np.random.default_rng(0)
    manager = BlockManager(num_blocks=64, block_size=4)
    recorder = Recorder()
    manager.add_cache_listener(recorder)
    prompt = [int(t) for t in rng.integers(0, 150_000, size=37)]
    manager.allocate("a", prompt)
    stored = [e for e in recorder.events if e[0] == "stored"]
    assert [e[1] for e in stored] == router_hashes(prompt, 4)
    assert [e[2] for e in stored] == [None] + router_hashes(prompt, 4)[:-1]
    assert [list(e[3]) for e in stored] == [prompt[i : i + 4] for i in range(0, 36, 4)]
    # the same rule in another process gives the same name (no per-process seed)
    assert block_hash(None, [1, 2, 3, 4]) == router_hashes([1, 2, 3, 4], 4)[0]
    assert all(0 <= name < 2**64 for name in router_hashes(prompt, 4))
