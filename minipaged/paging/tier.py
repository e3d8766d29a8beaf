"""The drum: a slower tier behind the KV pool, where the prefix cache's evicted blocks
wait.

Atlas (Kilburn et al. 1962) showed programs one store of core and drum. Here a block the
pool evicts is copied to a tier frame (host memory or a file), not forgotten; a prompt
that finds it here gets a new frame and its K and V copied back before the forward
(vLLM's KV offloading).
"""

from __future__ import annotations

from collections import OrderedDict, deque

from minipaged.paging.allocator import check_size
from minipaged.paging.prefix_cache import block_hash

# ("store", device frame, tier frame): copy a frame's K and V out to the tier, or
# ("load", tier frame, device frame): copy them back. KVCache.apply makes them in list
# order.
TierMove = tuple[str, int, int]


class Drum:
    """`num_frames` tier frames, each holding one full block: its name here, its K and V
    in KVCache.tier. When full, the block the pool gave up longest ago goes first (LRU
    of the pool's evictions). A full block never changes, so a block loaded back stays
    here too (as a clean page stays on the drum): when the pool gives it up again,
    nothing is copied. The copies decided wait in `moves`, in order, until the engine
    takes them for the next step's MemoryMoves."""

    medium = "CPU"  # vLLM's name for where offloaded blocks wait (its KV events)

    def __init__(self, num_frames: int):
        self.num_frames = check_size("kv_offload_frames", num_frames, minimum=1)
        self.free_frames: deque[int] = deque(range(self.num_frames))
        self.frame_of: dict[int, int] = {}  # block hash -> tier frame
        # tier frame -> (prev_hash, token ids), LRU first
        self.key_of: OrderedDict[int, tuple] = OrderedDict()
        self.moves: list[TierMove] = []
        self.pinned: set[int] = set()  # tier frames a prompt is loading: kept
        # blocks copied in, copied back, dropped
        self.stores = self.loads = self.evictions = 0
        # the prefix cache's listeners (BlockManager.add_tier shares its list), told
        # stored(..., medium=) and removed(..., medium=) of the blocks here
        self.listeners: list = []

    @property
    def num_used(self) -> int:
        """Tier frames holding a block."""
        return len(self.key_of)

    def lookup(self, prev_hash: int | None, token_ids) -> int | None:
        """The tier frame holding this block, or None (the token ids are compared too,
        as in PrefixCache.lookup)."""
        frame = self.frame_of.get(block_hash(prev_hash, token_ids))
        return (
            frame
            if frame is not None and self.key_of[frame] == (prev_hash, tuple(token_ids))
            else None
        )

    def store(self, frame: int, key: tuple) -> None:
        """The pool evicts device `frame`, which holds the block `key` (prev_hash, token
        ids): keep a copy in a free tier frame, or in the least recently used one's
        place (one not
        pinned; when all are, the block is forgotten as it would be without a tier)."""
        h = block_hash(*key)
        # already here (loaded back before): the copy is still good
        if h in self.frame_of:
            self.key_of.move_to_end(self.frame_of[h])
            return
        if self.free_frames:
            tier_frame = self.free_frames.popleft()
        else:
            tier_frame = next((f for f in self.key_of if f not in self.pinned), None)
            if tier_frame is None:
                return
            dropped = block_hash(*self.key_of.pop(tier_frame))
            del self.frame_of[dropped]
            self.evictions += 1
            self._announce("removed", dropped, medium=self.medium)
        self.frame_of[h], self.key_of[tier_frame] = tier_frame, key
        self.moves.append(("store", frame, tier_frame))
        self.stores += 1
        self._announce("stored", h, key[0], key[1], medium=self.medium)

    def load(self, tier_frame: int, frame: int) -> None:
        """A prompt hit this tier frame: copy its K and V into device `frame`, newly
        taken for the block. The block stays here too, in its place: it is back in the
        pool now, and its place is renewed when the pool gives it up again."""
        self.moves.append(("load", tier_frame, frame))
        self.loads += 1

    def _announce(self, event: str, *args, medium: str) -> None:
        for listener in self.listeners:
            getattr(listener, event)(*args, medium=medium)

    def take_moves(self) -> list[TierMove]:
        """The copies decided since the last call, in order; the list starts again
        empty."""
        moves, self.moves = self.moves, []
        return moves

    def blocks(self) -> list[int | None]:
        """Per tier frame, the hash of the block it holds (None: free), for pictures and
        checks."""
        return [
            block_hash(*self.key_of[f]) if f in self.key_of else None
            for f in range(self.num_frames)
        ]
