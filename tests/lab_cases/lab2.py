"""Lab 2's cases: a file as a participant writes it from the hints, and the catalogue of
plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = '''
from minipaged import paging


class BlockAllocator(paging.BlockAllocator):
    def incref(self, frame):
        if self.ref_counts[frame] == 0:
            raise ValueError("free frame")
        self.ref_counts[frame] += 1

    def free(self, frame):
        if self.ref_counts[frame] == 0:
            raise ValueError("double free")
        self.ref_counts[frame] -= 1
        if self.ref_counts[frame] == 0:
            self.num_released += 1
            self.free_frames.append(frame)


class BlockTable(paging.BlockTable):
    def fork(self):
        for frame in self.frames:
            self.allocator.incref(frame)
        return BlockTable(self.allocator, list(self.frames), list(self.token_ids), list(self.block_hashes))

    def last_frame_shared(self):
        return bool(self.frames) and self.allocator.ref_count(self.frames[-1]) > 1

    def _copy_on_write(self):
        src = self.frames[-1]
        dst = self.allocator.allocate()
        self.allocator.free(src)
        self.frames[-1] = dst
        return src, dst
'''

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that must catch it)
MISTAKES = [
    ('FILL', '            self.allocator.incref(frame)\n        return BlockTable(self.allocator, list(self.frames),', '            pass\n        return BlockTable(self.allocator, [self.allocator.allocate() for _ in self.frames],', 'fork shares every frame: same frames, ref counts + 1, nothing allocated'),
    ('FILL', '        self.ref_counts[frame] -= 1\n', '        self.ref_counts[frame] = 0\n', 'free keeps a shared frame for the tables that still map it'),
    ('FILL', 'self.allocator.ref_count(self.frames[-1]) > 1', 'False', 'writing into a shared last frame copies it first (copy-on-write)'),
]

# the line that opens a method body: the loop, crash and exit tests put a statement after it
BREAK_AT = '    def incref(self, frame):\n'
