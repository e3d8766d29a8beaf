"""The frame allocator: a fixed pool of `num_blocks` frames, a free list and ref counts.

A frame is one physical KV block (`block_size` token slots); the block tables take
theirs here, under the block manager, and a frame shared by several tables has a ref
count over 1.
"""

from __future__ import annotations

from collections import deque

import numpy as np

# paging's users import cdiv from here too
from minipaged.backend import cdiv  # noqa: F401
from minipaged.paging.prefix_cache import PrefixCache

DEFAULT_BLOCK_SIZE = 16


class NoFreeFramesError(RuntimeError):
    """The pool has too few free frames. Nothing was changed: the scheduler should wait,
    preempt a sequence (swap out or recompute) and retry."""


def check_size(name: str, value: int, minimum: int = 1) -> int:
    """`value` as an int, or a ValueError that says which size was wrong."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or int(value) != value
        or value < minimum
    ):
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return int(value)


class BlockAllocator:
    """Hands out frames 0..num_blocks-1 and counts how many block tables map each one.
    With prefix caching on, a frame whose ref count falls to 0 stays findable by content
    until its memory is needed."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        enable_prefix_caching: bool = False,
        prefix_cache_policy="lru",
    ):
        self.num_blocks = check_size("num_blocks", num_blocks, minimum=0)
        self.block_size = check_size("block_size", block_size)
        self.free_frames: deque[int] = deque(range(self.num_blocks))
        self.ref_counts = np.zeros(self.num_blocks, dtype=np.int32)  # (num_blocks,)
        self.prefix_cache = (
            PrefixCache(prefix_cache_policy) if enable_prefix_caching else None
        )
        self.num_allocated = 0  # frames handed out so far (for per-step reports)
        self.num_released = 0  # frames whose ref count fell to 0 so far

    @property
    def num_free(self) -> int:
        """Frames that allocate() can hand out: the free list plus evictable cached
        frames."""
        return len(self.free_frames) + (
            len(self.prefix_cache.evictable) if self.prefix_cache else 0
        )

    def allocate(self) -> int:
        """A frame with ref count 1: a never-cached free one first, else a parked cached
        one the cache's replacement policy gives up (LRU by default), else
        NoFreeFramesError.
        """
        if self.free_frames:
            frame = self.free_frames.popleft()
        elif self.prefix_cache and self.prefix_cache.evictable:
            frame = self.prefix_cache.evict()
        else:
            raise NoFreeFramesError(
                f"all {self.num_blocks} frames are in use: "
                "free or preempt a sequence, then retry"
            )
        self.ref_counts[frame] = 1
        self.num_allocated += 1
        return frame

    def incref(self, frame: int) -> None:
        """One more block table maps `frame` (fork, or a prefix-cache hit, which may
        take a cached frame nobody mapped out of the LRU)."""
        self._check_frame(frame)
        if self.ref_counts[frame] == 0:
            if not (self.prefix_cache and self.prefix_cache.is_parked(frame)):
                raise ValueError(
                    f"frame {frame} is free, so nobody can share it: allocate() a frame"
                    " instead"
                )
            self.prefix_cache.revive(frame)
        self.ref_counts[frame] += 1

    def free(self, frame: int) -> None:
        """One block table fewer maps `frame`; at 0 it goes back to the pool (or to the
        LRU of the prefix cache, when the cache knows its content)."""
        self._check_frame(frame)
        if self.ref_counts[frame] == 0:
            raise ValueError(
                f"double free of frame {frame}: its ref count is already 0; "
                "a block table freed it twice or it was never allocated"
            )
        self.ref_counts[frame] -= 1
        if self.ref_counts[frame] == 0:
            self.num_released += 1
            if self.prefix_cache and self.prefix_cache.holds(frame):
                self.prefix_cache.park(frame)
            else:
                self.free_frames.append(frame)

    def ref_count(self, frame: int) -> int:
        self._check_frame(frame)
        return int(self.ref_counts[frame])

    def _check_frame(self, frame: int) -> None:
        if not 0 <= frame < self.num_blocks:
            raise ValueError(
                f"frame {frame} does not exist: this pool has frames"
                f" 0..{self.num_blocks - 1}"
            )
