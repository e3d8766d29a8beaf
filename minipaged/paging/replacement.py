"""Page replacement for the prefix cache: which parked frame leaves when the pool needs
one.

LRU (the default), FIFO, CLOCK and random, each told when a block enters a frame, when
the frame is parked (its last user let go) and when it leaves; `victim` chooses among
the parked frames. A policy of one's own is any object with these four methods
(`prefix_cache_policy=`).
"""

from __future__ import annotations

import random
from collections import OrderedDict

# Page replacement is as old as paging: Belady (1966, "A study of replacement algorithms
# for a virtual-storage computer") measured RAND, FIFO and the Atlas "learning program"
# against MIN, the optimum that knows the future (minipaged.tools.bench.replacement
# computes it); Corbató (1968) gave Multics CLOCK. Here a frame mapped by a running
# sequence is pinned (in use); only parked frames (ref count 0) can be chosen. Each
# policy hears when a block's content enters a frame, when the frame is parked, and when
# it leaves the cache; `victim` chooses among `parked`, the cache's parked frames in the
# order they were parked (least recently used first).


class LRU:
    """Least recently used first. A parked frame was last used when its last user let
    go, so the parked frames in parking order are already the LRU list (vLLM's block
    pool keeps its free blocks in this order too, and frees a request's blocks tail
    first, as minipaged does).
    """

    name = "lru"

    def entered(self, frame: int, block: int) -> None:
        pass

    def parked(self, frame: int) -> None:
        pass

    def left(self, frame: int) -> None:
        pass

    def victim(self, parked: OrderedDict) -> int:
        return next(iter(parked))


class FIFO:
    """First in, first out: the frame whose content entered the cache first leaves
    first, however often it was hit since. Cheap, blind to use, and prone to Belady's
    anomaly (more frames, more misses)."""

    name = "fifo"

    def __init__(self):
        self.line: dict[int, None] = {}  # cached frames, oldest content first

    def entered(self, frame: int, block: int) -> None:
        self.line[frame] = None

    def parked(self, frame: int) -> None:
        pass

    def left(self, frame: int) -> None:
        del self.line[frame]

    def victim(self, parked: OrderedDict) -> int:
        # pinned frames are passed over
        return next(frame for frame in self.line if frame in parked)


class Clock:
    """CLOCK, or second chance (Corbató 1968): the cached frames stand in a ring in the
    order their content entered, each with a referenced bit, set while a sequence reads
    the frame (so set when it is parked). The hand clears set bits as it passes and
    stops at the first parked frame whose bit is clear: LRU's effect at FIFO's cost, no
    list reordered per hit.
    """

    name = "clock"

    def __init__(self):
        # frame -> referenced; the hand at the front
        self.ring: OrderedDict[int, bool] = OrderedDict()

    def entered(self, frame: int, block: int) -> None:
        self.ring[frame] = True

    def parked(self, frame: int) -> None:
        # read by attention until now (keeps its place in the ring)
        self.ring[frame] = True

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
    """A parked frame chosen at random (Belady's RAND): the baseline a policy must
    beat."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def entered(self, frame: int, block: int) -> None:
        pass

    def parked(self, frame: int) -> None:
        pass

    def left(self, frame: int) -> None:
        pass

    def victim(self, parked: OrderedDict) -> int:
        return self.rng.choice(list(parked))


REPLACEMENT_POLICIES = {p.name: p for p in (LRU, FIFO, Clock, Random)}


def make_policy(policy="lru"):
    """A replacement policy by name (`prefix_cache_policy`), or one given as an
    object."""
    if not isinstance(policy, str):
        return policy
    if policy not in REPLACEMENT_POLICIES:
        raise ValueError(
            f"prefix_cache_policy must be one of {sorted(REPLACEMENT_POLICIES)}, got"
            f" {policy!r}"
        )
    return REPLACEMENT_POLICIES[policy]()
