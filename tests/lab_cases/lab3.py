"""Lab 3's cases: a file as a participant writes it from the hints, and the catalogue of
plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = """
from minipaged import paging


def block_hash(prev_hash, token_ids):
    return hash((prev_hash, tuple(token_ids)))


class PrefixCache(paging.PrefixCache):
    def lookup(self, prev_hash, token_ids):
        frame = self.frame_of.get(block_hash(prev_hash, token_ids))
        if frame is not None and self.key_of[frame] == (prev_hash, tuple(token_ids)):
            return frame
        return None

    def insert(self, frame, prev_hash, token_ids):
        h = block_hash(prev_hash, token_ids)
        if h not in self.frame_of and frame not in self.key_of:
            self.frame_of[h] = frame
            self.key_of[frame] = (prev_hash, tuple(token_ids))
        return h

    def park(self, frame):
        self.evictable[frame] = None

    def revive(self, frame):
        del self.evictable[frame]

    def evict(self):
        frame, _ = self.evictable.popitem(last=False)
        del self.frame_of[block_hash(*self.key_of.pop(frame))]
        return frame
"""

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that
# must catch it)
MISTAKES = [
    (
        "block_hash of a list, which Python cannot hash",
        "return hash((prev_hash, tuple(token_ids)))",
        "return hash((prev_hash, token_ids))",
        "block_hash gives one int per block, for a list or a tuple alike",
    ),
    (
        "block_hash of the tokens only, not chained to the block before",
        "return hash((prev_hash, tuple(token_ids)))",
        "return hash(tuple(token_ids))",
        "a block's hash chains every block before it",
    ),
    (
        "lookup trusts the hash and does not compare the tokens",
        "if frame is not None and self.key_of[frame] == (prev_hash, tuple(token_ids)):",
        "if frame is not None:",
        "lookup compares the tokens: a hash collision is a miss",
    ),
    (
        "insert overwrites a block cached already in another frame",
        "if h not in self.frame_of and frame not in self.key_of:",
        "if frame not in self.key_of:",
        "lookup finds what insert stored, and only that",
    ),
    (
        "insert overwrites what a cached frame holds",
        "if h not in self.frame_of and frame not in self.key_of:",
        "if h not in self.frame_of:",
        "lookup finds what insert stored, and only that",
    ),
    (
        "insert forgets to return the hash",
        (
            "            self.key_of[frame] = (prev_hash, tuple(token_ids))\n       "
            " return h\n"
        ),
        "            self.key_of[frame] = (prev_hash, tuple(token_ids))\n",
        "lookup finds what insert stored, and only that",
    ),
    (
        "park and revive swapped",
        (
            "    def park(self, frame):\n        self.evictable[frame] = None\n\n   "
            " def revive(self, frame):\n        del self.evictable[frame]\n"
        ),
        (
            "    def park(self, frame):\n        del self.evictable[frame]\n\n"
            "    def revive(self, frame):\n        self.evictable[frame] = None\n"
        ),
        "released blocks stay findable until evicted, least recently used first",
    ),
    (
        "evict takes the most recently used frame (MRU)",
        "self.evictable.popitem(last=False)",
        "self.evictable.popitem()",
        "released blocks stay findable until evicted, least recently used first",
    ),
    (
        "evict keeps key_of (does not pop it)",
        "block_hash(*self.key_of.pop(frame))",
        "block_hash(*self.key_of[frame])",
        "released blocks stay findable until evicted, least recently used first",
    ),
    (
        "evict forgets key_of but leaves the hash in frame_of",
        "        del self.frame_of[block_hash(*self.key_of.pop(frame))]\n",
        "        self.key_of.pop(frame)\n",
        "released blocks stay findable until evicted, least recently used first",
    ),
    (
        "evict leaves the frame in evictable",
        "frame, _ = self.evictable.popitem(last=False)",
        "frame = next(iter(self.evictable))",
        "released blocks stay findable until evicted, least recently used first",
    ),
    (
        "revive does nothing",
        "        del self.evictable[frame]\n",
        "        pass\n",
        "a hit revives a parked frame: it is not evicted while mapped",
    ),
    (
        "lookup hands its work to the engine's own (super())",
        "        frame = self.frame_of.get(block_hash(prev_hash, token_ids))\n",
        (
            "        return super().lookup(prev_hash, token_ids)\n        frame ="
            " self.frame_of.get(block_hash(prev_hash, token_ids))\n"
        ),
        "lookup finds what insert stored, and only that",
    ),
    (
        "block_hash is the engine's own, imported and called",
        "    return hash((prev_hash, tuple(token_ids)))\n",
        ("    return paging.block_hash(prev_hash, token_ids)\n"),
        "block_hash gives one int per block, for a list or a tuple alike",
    ),
]

# the line that opens a method body: the loop, crash and exit tests put a statement
# after it
BREAK_AT = "    def lookup(self, prev_hash, token_ids):\n"
