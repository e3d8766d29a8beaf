"""The prefix cache (an OS page cache for KV blocks): full blocks are found again by
content.

When the block manager places a new prompt, it maps the frames of the prompt's longest
cached prefix instead of computing them again. When the pool runs dry, a replacement
policy (paging/replacement.py) picks which parked frame to give up, as an OS picks a
page to evict.
"""

from __future__ import annotations

from collections import OrderedDict

from minipaged.paging.replacement import make_policy


def block_hash(prev_hash: int | None, token_ids) -> int:
    """The name of a full block: its tokens chained to everything before it. The hash
    runs over (previous block's hash, this block's token ids), so equal hashes mean
    equal prefixes up to that block, and equal prefixes mean equal K and V."""
    return hash((prev_hash, tuple(token_ids)))


class PrefixCache:
    """block hash -> frame, for full blocks only. Frames nobody maps any more (ref count
    0) wait in `evictable`, in the order they were parked, until the allocator needs
       their memory;
    `policy` picks which of them goes first."""

    def __init__(self, policy="lru"):
        self.frame_of: dict[int, int] = {}  # block hash -> frame
        self.key_of: dict[int, tuple] = {}  # frame -> (prev_hash, token ids)
        # frames with ref count 0, LRU first
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.policy = make_policy(policy)
        # a Drum (paging.tier) keeping evicted blocks, or None: they are forgotten
        self.tier = None

    def lookup(self, prev_hash: int | None, token_ids) -> int | None:
        """The frame holding this block, or None. The token ids are compared too, so a
        hash collision between two different blocks is a miss, not wrong K and V."""
        frame = self.frame_of.get(block_hash(prev_hash, token_ids))
        return (
            frame
            if frame is not None and self.key_of[frame] == (prev_hash, tuple(token_ids))
            else None
        )

    def insert(self, frame: int, prev_hash: int | None, token_ids) -> int:
        """Remember that `frame` holds this full block; returns the block's hash. When
        another frame already holds the same block, that one stays the cached copy."""
        h = block_hash(prev_hash, token_ids)
        if h not in self.frame_of and frame not in self.key_of:
            self.frame_of[h] = frame
            self.key_of[frame] = (prev_hash, tuple(token_ids))
            self.policy.entered(frame, h)
        return h

    def holds(self, frame: int) -> bool:
        return frame in self.key_of

    def park(self, frame: int) -> None:
        """`frame` lost its last user: keep its content; the most recently parked goes
        last."""
        self.evictable[frame] = None
        self.policy.parked(frame)

    def is_parked(self, frame: int) -> bool:
        return frame in self.evictable

    def revive(self, frame: int) -> None:
        """A hit on a parked frame takes it out of the evictable frames."""
        del self.evictable[frame]

    def forget(self, frame: int) -> None:
        """`frame` does not hold what its name says (its K and V were never
        computed)."""
        key = self.key_of.pop(frame, None)
        if key is not None:
            del self.frame_of[block_hash(*key)]
            self.evictable.pop(frame, None)
            self.policy.left(frame)

    def evict(self) -> int:
        """Forget the parked frame the policy chooses (LRU: the least recently used) and
        return it for reuse; with a tier behind the cache, its block is copied there
        first.
        """
        frame = self.policy.victim(self.evictable)
        del self.evictable[frame]
        key = self.key_of.pop(frame)
        del self.frame_of[block_hash(*key)]
        self.policy.left(frame)
        if self.tier is not None:
            self.tier.store(frame, key)
        return frame
