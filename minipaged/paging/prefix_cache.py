"""The prefix cache (an OS page cache for KV blocks): full blocks are found again by content.

When the block manager places a new prompt, it maps the frames of the prompt's longest cached
prefix instead of computing them again. When the pool runs dry, a replacement policy (LRU,
FIFO, CLOCK, random) picks which parked frame to give up, as an OS picks a page to evict.
"""

from __future__ import annotations

import random
from collections import OrderedDict


def block_hash(prev_hash: int | None, token_ids) -> int:
    """The name of a full block: its tokens chained to everything before it. The hash runs over
    (previous block's hash, this block's token ids), so equal hashes mean equal prefixes up to
    that block, and equal prefixes mean equal K and V."""
    return hash((prev_hash, tuple(token_ids)))


# ---- replacement policies: which parked frame leaves when the pool needs one -----------------
# Page replacement is as old as paging: Belady (1966, "A study of replacement algorithms for a
# virtual-storage computer") measured RAND, FIFO and the Atlas "learning program" against MIN,
# the optimum that knows the future (minipaged.bench.replacement computes it); Corbató (1968)
# gave Multics CLOCK. Here a frame mapped by a running sequence is pinned (in use); only
# parked frames (ref count 0) can be chosen. Each policy hears when a block's content enters a
# frame, when the frame is parked, and when it leaves the cache; `victim` chooses among
# `parked`, the cache's parked frames in the order they were parked (least recently used first).

class LRU:
    """Least recently used first. A parked frame was last used when its last user let go, so
    the parked frames in parking order are already the LRU list (vLLM's block pool keeps its
    free blocks in this order too, and frees a request's blocks tail first, as minipaged does)."""
    name = "lru"

    def entered(self, frame: int, block: int) -> None: pass
    def parked(self, frame: int) -> None: pass
    def left(self, frame: int) -> None: pass

    def victim(self, parked: OrderedDict) -> int:
        return next(iter(parked))


class FIFO:
    """First in, first out: the frame whose content entered the cache first leaves first, however
    often it was hit since. Cheap, blind to use, and prone to Belady's anomaly (more frames, more
    misses)."""
    name = "fifo"

    def __init__(self):
        self.line: dict[int, None] = {}  # cached frames, oldest content first

    def entered(self, frame: int, block: int) -> None:
        self.line[frame] = None

    def parked(self, frame: int) -> None: pass

    def left(self, frame: int) -> None:
        del self.line[frame]

    def victim(self, parked: OrderedDict) -> int:
        return next(frame for frame in self.line if frame in parked)  # pinned frames are passed over


class Clock:
    """CLOCK, or second chance (Corbató 1968): the cached frames stand in a ring in the order
    their content entered, each with a referenced bit, set while a sequence reads the frame
    (so set when it is parked). The hand clears set bits as it passes and stops at the first
    parked frame whose bit is clear: LRU's effect at FIFO's cost, no list reordered per hit."""
    name = "clock"

    def __init__(self):
        self.ring: OrderedDict[int, bool] = OrderedDict()  # frame -> referenced; the hand at the front

    def entered(self, frame: int, block: int) -> None:
        self.ring[frame] = True

    def parked(self, frame: int) -> None:
        self.ring[frame] = True  # read by attention until now (keeps its place in the ring)

    def left(self, frame: int) -> None:
        del self.ring[frame]

    def victim(self, parked: OrderedDict) -> int:
        while True:  # two turns at most: the first clears every bit
            frame, referenced = next(iter(self.ring.items()))
            if frame in parked and not referenced:
                return frame
            self.ring.move_to_end(frame)  # the hand moves on past it
            self.ring[frame] = False


class Random:
    """A parked frame chosen at random (Belady's RAND): the baseline a policy must beat."""
    name = "random"

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def entered(self, frame: int, block: int) -> None: pass
    def parked(self, frame: int) -> None: pass
    def left(self, frame: int) -> None: pass

    def victim(self, parked: OrderedDict) -> int:
        return self.rng.choice(list(parked))


REPLACEMENT_POLICIES = {p.name: p for p in (LRU, FIFO, Clock, Random)}


def make_policy(policy="lru"):
    """A replacement policy by name (`prefix_cache_policy`), or one given as an object."""
    if not isinstance(policy, str):
        return policy
    if policy not in REPLACEMENT_POLICIES:
        raise ValueError(f"prefix_cache_policy must be one of {sorted(REPLACEMENT_POLICIES)}, got {policy!r}")
    return REPLACEMENT_POLICIES[policy]()


class PrefixCache:
    """block hash -> frame, for full blocks only. Frames nobody maps any more (ref count 0)
    wait in `evictable`, in the order they were parked, until the allocator needs their memory;
    `policy` picks which of them goes first."""

    def __init__(self, policy="lru"):
        self.frame_of: dict[int, int] = {}                # block hash -> frame
        self.key_of: dict[int, tuple] = {}                # frame -> (prev_hash, token ids)
        self.evictable: OrderedDict[int, None] = OrderedDict()  # frames with ref count 0, LRU first
        self.policy = make_policy(policy)
        self.tier = None  # a Drum (paging.tier) keeping evicted blocks, or None: they are forgotten

    def lookup(self, prev_hash: int | None, token_ids) -> int | None:
        """The frame holding this block, or None. The token ids are compared too, so a hash
        collision between two different blocks is a miss, not wrong K and V."""
        frame = self.frame_of.get(block_hash(prev_hash, token_ids))
        return frame if frame is not None and self.key_of[frame] == (prev_hash, tuple(token_ids)) else None

    def insert(self, frame: int, prev_hash: int | None, token_ids) -> int:
        """Remember that `frame` holds this full block; returns the block's hash. When another
        frame already holds the same block, that one stays the cached copy."""
        h = block_hash(prev_hash, token_ids)
        if h not in self.frame_of and frame not in self.key_of:
            self.frame_of[h] = frame
            self.key_of[frame] = (prev_hash, tuple(token_ids))
            self.policy.entered(frame, h)
        return h

    def holds(self, frame: int) -> bool:
        return frame in self.key_of

    def park(self, frame: int) -> None:
        """`frame` lost its last user: keep its content; the most recently parked goes last."""
        self.evictable[frame] = None
        self.policy.parked(frame)

    def is_parked(self, frame: int) -> bool:
        return frame in self.evictable

    def revive(self, frame: int) -> None:
        """A hit on a parked frame takes it out of the evictable frames."""
        del self.evictable[frame]

    def forget(self, frame: int) -> None:
        """`frame` does not hold what its name says (its K and V were never computed)."""
        key = self.key_of.pop(frame, None)
        if key is not None:
            del self.frame_of[block_hash(*key)]
            self.evictable.pop(frame, None)
            self.policy.left(frame)

    def evict(self) -> int:
        """Forget the parked frame the policy chooses (LRU: the least recently used) and
        return it for reuse; with a tier behind the cache, its block is copied there first."""
        frame = self.policy.victim(self.evictable)
        del self.evictable[frame]
        key = self.key_of.pop(frame)
        del self.frame_of[block_hash(*key)]
        self.policy.left(frame)
        if self.tier is not None:
            self.tier.store(frame, key)
        return frame
