"""Lab 3: the prefix cache (an OS page cache for KV blocks). You write the hash chain that names
a full block by everything before it, and the cache's lookup, insert and release (park, revive,
evict); the engine's allocator and block manager call them.

Grade it (then it serves the model):  python -m minipaged.lab check 3 my_cache.py
Stuck? The next hint, one at a time:  python -m minipaged.lab hint 3
"""

from __future__ import annotations

from minipaged import paging


def block_hash(prev_hash: int | None, token_ids) -> int:
    """The name of a full block: its tokens (a list or a tuple of ints) chained to the name of
    the block before it (None for a sequence's first block). Two blocks get the same name only
    if their tokens and everything before them are the same, so equal K and V."""
    raise NotImplementedError("lab 3: write block_hash (stuck? python -m minipaged.lab hint 3)")


class PrefixCache(paging.PrefixCache):
    """block hash -> frame, for full blocks only. Its state, set up for you:

        self.frame_of   dict: block hash -> the frame holding that block
        self.key_of     dict: frame -> (prev_hash, tuple of token ids), what the frame holds
        self.evictable  OrderedDict of frames nobody maps (ref count 0), least recently used
                        first: their K and V are kept until the allocator needs the memory
    holds(frame), is_parked(frame) and forget(frame) are the engine's (forget uses block_hash).
    """

    def lookup(self, prev_hash: int | None, token_ids) -> int | None:
        """The frame holding this block (these tokens after the block named prev_hash), or None.
        Compare the tokens too, not only the hash: two different blocks may hash alike."""
        raise NotImplementedError("lab 3: write PrefixCache.lookup (stuck? python -m minipaged.lab hint 3)")

    def insert(self, frame: int, prev_hash: int | None, token_ids) -> int:
        """`frame` now holds this full block: remember it, and return the block's hash. When
        the block is cached already (another frame holds it), or `frame` is already cached,
        keep what is there and still return the hash."""
        raise NotImplementedError("lab 3: write PrefixCache.insert (stuck? python -m minipaged.lab hint 3)")

    def park(self, frame: int) -> None:
        """Release: `frame` lost its last user (the allocator calls this when its ref count falls
        to 0). Keep its block findable; it becomes the most recently used evictable frame."""
        raise NotImplementedError("lab 3: write PrefixCache.park (stuck? python -m minipaged.lab hint 3)")

    def revive(self, frame: int) -> None:
        """A lookup hit on a parked frame: someone maps it again, so it is no longer evictable."""
        raise NotImplementedError("lab 3: write PrefixCache.revive (stuck? python -m minipaged.lab hint 3)")

    def evict(self) -> int:
        """The allocator has no never-cached frame left: take the least recently used parked
        frame, forget the block it held (lookups miss it from now on), and return it."""
        raise NotImplementedError("lab 3: write PrefixCache.evict (stuck? python -m minipaged.lab hint 3)")
