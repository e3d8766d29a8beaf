"""Lab 12: the drum (meeting 12, a slower tier behind memory). The prefix cache gives up a
cached block when the pool needs its frame; with a tier behind the pool, the block is copied
there instead of forgotten, and a prompt that finds it there gets it copied back, not computed
again. You write the tier's bookkeeping: where a block is kept, which one goes when it is full,
and the copies it asks for (docs/12_drum.md).

Grade it (then it serves the model):  python -m minipaged.lab check 12 my_drum.py
Hints, one step at a time:            python -m minipaged.lab hint 12
"""

from __future__ import annotations

from collections import OrderedDict, deque

from minipaged.paging.allocator import check_size
from minipaged.paging.prefix_cache import block_hash

# ("store", device frame, tier frame): copy a frame's K and V out to the tier, or
# ("load", tier frame, device frame): copy them back. The engine makes them in list order.
TierMove = tuple[str, int, int]


class Drum:
    """`num_frames` tier frames, each holding one full block. A block is named by its key,
    (prev_hash, token ids): the hash of the block before it and its own tokens, as the prefix
    cache names it (block_hash(*key) is its hash). When the tier is full, the block the pool
    gave up longest ago goes first. A full block never changes, so a block loaded back stays
    here too: when the pool gives it up again, nothing is copied. The engine copies K and V;
    the tier only decides, and appends its decisions to `moves`.

    Its state, set up for you:

        self.free_frames   a deque of the tier frames holding nothing, lowest first
        self.frame_of      block hash -> the tier frame holding that block
        self.key_of        an OrderedDict: tier frame -> its block's key (prev_hash, token ids
                           as a tuple), the block the pool gave up longest ago first
        self.moves         the copies decided, in order: ("store", device frame, tier frame)
                           copies a frame out, ("load", tier frame, device frame) copies back
        self.pinned        tier frames a prompt is loading now: never stored over
        self.stores, self.loads, self.evictions   counts (blocks copied in, copied back,
                           dropped to make room)
    """

    def __init__(self, num_frames: int):
        """An empty tier (written for you)."""
        self.num_frames = check_size("kv_offload_frames", num_frames, minimum=1)
        self.free_frames: deque[int] = deque(range(self.num_frames))
        self.frame_of: dict[int, int] = {}  # block hash -> tier frame
        self.key_of: OrderedDict[int, tuple] = OrderedDict()  # tier frame -> key, LRU first
        self.moves: list[TierMove] = []
        self.pinned: set[int] = set()
        self.stores = self.loads = self.evictions = 0

    @property
    def num_used(self) -> int:
        """Tier frames holding a block (written for you)."""
        return len(self.key_of)

    def lookup(self, prev_hash: int | None, token_ids) -> int | None:
        """The tier frame holding the block (prev_hash, token_ids), or None. The hash finds a
        frame; the key stored for it must then be this very block (a hash collision is a miss).
        token_ids may be a list or a tuple."""
        raise NotImplementedError("lab 12: write Drum.lookup (stuck? python -m minipaged.lab hint 12)")

    def store(self, frame: int, key: tuple) -> None:
        """The pool evicts device `frame`, holding the block `key` (prev_hash, token ids): keep
        a copy. A block already here (loaded back before) is not copied again: it only becomes
        the most recently given up. Else it takes the first free tier frame; with none free, the
        place of the block given up longest ago that is not pinned (that block is forgotten and
        counted in evictions); with every frame pinned, the block is forgotten, as it would be
        without a tier. A block kept appends ("store", frame, tier frame) and counts a store."""
        raise NotImplementedError("lab 12: write Drum.store (stuck? python -m minipaged.lab hint 12)")

    def load(self, tier_frame: int, frame: int) -> None:
        """A prompt found its block in `tier_frame`: append ("load", tier_frame, frame), the
        copy back into device `frame` (newly taken for it), and count a load. The block stays
        here, in its place: the pool gives it up again later, and store renews its place then."""
        raise NotImplementedError("lab 12: write Drum.load (stuck? python -m minipaged.lab hint 12)")

    def take_moves(self) -> list[TierMove]:
        """The copies decided since the last call, in order; the list starts again empty
        (written for you: the engine calls it before each step)."""
        moves, self.moves = self.moves, []
        return moves

    def blocks(self) -> list[int | None]:
        """Per tier frame, the hash of the block it holds (None: free), for pictures and checks
        (written for you)."""
        return [block_hash(*self.key_of[f]) if f in self.key_of else None for f in range(self.num_frames)]
