"""The prefix cache (an OS page cache for KV blocks): full blocks are found again by
content.

When the block manager places a new prompt, it maps the frames of the prompt's longest
cached prefix instead of computing them again. When the pool runs dry, a replacement
policy (paging/replacement.py) picks which parked frame to give up, as an OS picks a
page to evict. Listeners hear each block named, dropped and the cache emptied.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from types import MappingProxyType

import numpy as np

from minipaged.paging.replacement import make_policy

# where a block is, in vLLM's KV events: the pool, on any device (a tier names its own,
# the Drum's medium)
POOL = "GPU"


def block_hash(prev_hash: int | None, token_ids) -> int:
    """The name of a full block: its tokens chained to everything before it. The hash
    runs over (previous block's hash, this block's token ids), so equal hashes mean
    equal prefixes up to that block, and equal prefixes mean equal K and V.

    Python's hash() of the pair would do in one process; sha256 gives every process
    the same name, so a router can compute it from token ids: sha256 of the previous
    name (8 bytes, big-endian; nothing for a first block) then each token id (4 bytes,
    little-endian), and the name is the digest's last 8 bytes read big-endian (vLLM's
    int form of a block hash).
    """
    tokens = tuple(token_ids)
    data = struct.pack(f"<{len(tokens)}I", *tokens)
    if prev_hash is not None:
        data = prev_hash.to_bytes(8, "big") + data
    return int.from_bytes(hashlib.sha256(data).digest()[-8:], "big")


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
        # (policy, what was wrong): its failed answers, the LRU frame taken instead
        self.errors: list[tuple[object, str]] = []
        # a Drum (paging.tier) keeping evicted blocks, or None: they are forgotten
        self.tier = None
        # told stored(block, parent, token_ids) when a block is named, removed(block)
        # when it is dropped, cleared() when nothing stays cached in the pool or the
        # tier: vLLM's KV events (tools/serve/kv_events.py publishes them to a router).
        # The tier tells the same listeners, adding medium= its name (POOL if not told)
        self.listeners: list = []

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
            self._tell("entered", frame, h)
            self._announce("stored", h, prev_hash, tuple(token_ids))
        return h

    def holds(self, frame: int) -> bool:
        return frame in self.key_of

    def park(self, frame: int) -> None:
        """`frame` lost its last user: keep its content; the most recently parked goes
        last."""
        self.evictable[frame] = None
        self._tell("parked", frame)

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
            h = block_hash(*key)
            del self.frame_of[h]
            self.evictable.pop(frame, None)
            self._tell("left", frame)
            self._announce("removed", h)

    def evict(self) -> int:
        """Forget the parked frame the policy chooses (LRU: the least recently used) and
        return it for reuse; with a tier behind the cache, its block is copied there
        first.
        """
        frame = self._victim()
        del self.evictable[frame]
        key = self.key_of.pop(frame)
        h = block_hash(*key)
        del self.frame_of[h]
        self._tell("left", frame)
        self._announce("removed", h)  # from the pool, even when the tier keeps a copy
        if self.tier is not None:
            self.tier.store(frame, key)
        return frame

    def drop_parked(self) -> list[int]:
        """Forget the block of every parked frame (a reset) and return those frames,
        free now. Blocks that sequences map stay cached, and the tier keeps its own:
        listeners hear removed() for each block dropped, or cleared() when no block
        stays, in the pool or the tier."""
        frames = list(self.evictable)
        dropped = []
        for frame in frames:
            h = block_hash(*self.key_of.pop(frame))
            del self.frame_of[h]
            self._tell("left", frame)
            dropped.append(h)
        self.evictable.clear()
        if not self.frame_of and not (self.tier is not None and self.tier.num_used):
            self._announce("cleared")
            return frames
        for h in dropped:
            self._announce("removed", h)
        return frames

    # ---- the replacement policy is a participant's code: its answers are checked ----
    def _victim(self) -> int:
        """The policy's choice among the parked frames, which it sees read-only; when
        it fails, or names a frame that is not parked, the least recently used one
        (the failure is kept in `errors`)."""
        try:
            frame = self.policy.victim(MappingProxyType(self.evictable))
        except Exception as error:
            what = f"victim() raised {type(error).__name__}: {error}"
            self.errors.append((self.policy, what))
            return next(iter(self.evictable))
        is_frame = isinstance(frame, (int, np.integer)) and not isinstance(frame, bool)
        if not is_frame or frame not in self.evictable:
            shown = repr(frame)[:60]
            what = (
                f"victim() returned {shown}, not one of the parked frames it was given"
            )
            self.errors.append((self.policy, what))
            return next(iter(self.evictable))
        return int(frame)

    def _announce(self, event: str, *args) -> None:
        """Tell each listener what happened to a block (stored, removed, cleared)."""
        for listener in self.listeners:
            getattr(listener, event)(*args)

    def _tell(self, method: str, *args) -> None:
        """Tell the policy what happened to a frame (what it raises is kept)."""
        try:
            getattr(self.policy, method)(*args)
        except Exception as error:
            what = f"{method}() raised {type(error).__name__}: {error}"
            self.errors.append((self.policy, what))
