"""Lab 3's cases: a file as a participant writes it from the hints, and the catalogue of
plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = '''
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
'''

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that must catch it)
MISTAKES = [
    ('FILL', 'return hash((prev_hash, tuple(token_ids)))', 'return hash(tuple(token_ids))', "a block's hash chains every block before it"),
    ('FILL', 'self.evictable.popitem(last=False)', 'self.evictable.popitem()', 'released blocks stay findable until evicted, least recently used first'),
    ('FILL', '        del self.evictable[frame]\n', '        pass\n', 'a hit revives a parked frame: it is not evicted while mapped'),
]

# the line that opens a method body: the loop, crash and exit tests put a statement after it
BREAK_AT = '    def lookup(self, prev_hash, token_ids):\n'
