"""Lab 12's cases: a file as a participant writes it from the hints, and the catalogue
of plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = """
from collections import OrderedDict, deque

from minipaged.paging.allocator import check_size
from minipaged.paging.prefix_cache import block_hash


class Drum:
    def __init__(self, num_frames):
        self.num_frames = check_size("kv_offload_frames", num_frames, minimum=1)
        self.free_frames = deque(range(self.num_frames))
        self.frame_of = {}
        self.key_of = OrderedDict()
        self.moves = []
        self.pinned = set()
        self.stores = self.loads = self.evictions = 0

    @property
    def num_used(self):
        return len(self.key_of)

    def lookup(self, prev_hash, token_ids):
        frame = self.frame_of.get(block_hash(prev_hash, token_ids))
        if frame is not None and self.key_of[frame] == (prev_hash, tuple(token_ids)):
            return frame
        return None

    def store(self, frame, key):
        h = block_hash(*key)
        if h in self.frame_of:
            self.key_of.move_to_end(self.frame_of[h])
            return
        if self.free_frames:
            tier_frame = self.free_frames.popleft()
        else:
            tier_frame = next((f for f in self.key_of if f not in self.pinned), None)
            if tier_frame is None:
                return
            old = self.key_of.pop(tier_frame)
            del self.frame_of[block_hash(*old)]
            self.evictions += 1
        self.frame_of[h] = tier_frame
        self.key_of[tier_frame] = key
        self.moves.append(("store", frame, tier_frame))
        self.stores += 1

    def load(self, tier_frame, frame):
        self.moves.append(("load", tier_frame, frame))
        self.loads += 1

    def take_moves(self):
        moves, self.moves = self.moves, []
        return moves

    def blocks(self):
        return [
            block_hash(*self.key_of[f]) if f in self.key_of else None
            for f in range(self.num_frames)
        ]
"""

KEPT = (
    "store keeps an evicted block in the first free tier frame, and asks one copy there"
)
FOUND = (
    "lookup finds a block by its previous block's hash and its tokens, and only that"
    " block"
)
ONCE = (
    "a block loaded back and given up again is not copied twice: its place is renewed"
)
LRU = "a full tier gives up the block the pool gave up longest ago, and forgets it"
PINNED = (
    "a pinned tier frame is never stored over; with every frame pinned, the block is"
    " forgotten"
)
LOADED = "load asks the copy back into the pool and keeps the block in its place"
RANDOM = "random scripts of stores, loads and pins leave the engine's tier"

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that
# must catch it)
MISTAKES = [
    (
        "lookup trusts the hash: a collision is a hit",
        "if frame is not None and self.key_of[frame] == (prev_hash, tuple(token_ids)):",
        "if frame is not None:",
        FOUND,
    ),
    (
        "lookup compares a list of tokens with the stored tuple",
        "self.key_of[frame] == (prev_hash, tuple(token_ids))",
        "self.key_of[frame] == (prev_hash, token_ids)",
        FOUND,
    ),
    (
        "a block stored again is copied again",
        (
            "        if h in self.frame_of:\n"
            "            self.key_of.move_to_end(self.frame_of[h])\n"
            "            return\n"
        ),
        "",
        ONCE,
    ),
    (
        "a block stored again keeps its old place",
        "            self.key_of.move_to_end(self.frame_of[h])\n",
        "",
        ONCE,
    ),
    (
        "a full tier gives up its newest block",
        "next((f for f in self.key_of if f not in self.pinned), None)",
        "next((f for f in reversed(self.key_of) if f not in self.pinned), None)",
        LRU,
    ),
    (
        "the block given up is not forgotten by its hash",
        "            del self.frame_of[block_hash(*old)]\n",
        "",
        RANDOM,
    ),
    (
        "evictions not counted",
        "            self.evictions += 1\n",
        "",
        LRU,
    ),
    (
        "pinned frames stored over",
        "next((f for f in self.key_of if f not in self.pinned), None)",
        "next((f for f in self.key_of), None)",
        PINNED,
    ),
    (
        "every frame pinned: next() without a default raises",
        "next((f for f in self.key_of if f not in self.pinned), None)",
        "next(f for f in self.key_of if f not in self.pinned)",
        PINNED,
    ),
    (
        "load renews the block's place",
        '        self.moves.append(("load", tier_frame, frame))\n',
        (
            "        self.key_of.move_to_end(tier_frame)\n"
            '        self.moves.append(("load", tier_frame, frame))\n'
        ),
        LOADED,
    ),
    (
        "load's copy with its frames swapped",
        'self.moves.append(("load", tier_frame, frame))',
        'self.moves.append(("load", frame, tier_frame))',
        LOADED,
    ),
    (
        "store's copy with its frames swapped",
        'self.moves.append(("store", frame, tier_frame))',
        'self.moves.append(("store", tier_frame, frame))',
        KEPT,
    ),
    (
        "free tier frames taken from the end",
        "tier_frame = self.free_frames.popleft()",
        "tier_frame = self.free_frames.pop()",
        KEPT,
    ),
    (
        "stores not counted",
        "        self.stores += 1\n",
        "",
        KEPT,
    ),
    (
        "store hands its work to the engine's Drum.store",
        "        h = block_hash(*key)\n",
        (
            "        from minipaged.paging import tier\n"
            "        return tier.Drum.store(self, frame, key)\n"
            "        h = block_hash(*key)\n"
        ),
        KEPT,
    ),
]

# the line that opens a method body: the loop, crash and exit tests put a statement
# after it
BREAK_AT = "    def store(self, frame, key):\n"
