"""Lab 1's cases: a file as a participant writes it from the hints, and the catalogue of
plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = '''
from minipaged import paging
from minipaged.paging import NoFreeFramesError


class BlockAllocator(paging.BlockAllocator):
    def allocate(self):
        if not self.free_frames:
            raise NoFreeFramesError("no free frame")
        frame = self.free_frames.popleft()
        self.ref_counts[frame] = 1
        self.num_allocated += 1
        return frame

    def free(self, frame):
        if self.ref_counts[frame] == 0:
            raise ValueError("double free")
        self.ref_counts[frame] -= 1
        if self.ref_counts[frame] == 0:
            self.num_released += 1
            self.free_frames.append(frame)


class BlockTable(paging.BlockTable):
    def slot(self, position):
        size = self.allocator.block_size
        return self.frames[position // size] * size + position % size

    def append_slot(self, token_id):
        size = self.allocator.block_size
        offset, cow = self.num_tokens % size, None
        if offset == 0:
            self.frames.append(self.allocator.allocate())
        elif self.last_frame_shared():
            cow = self._copy_on_write()
        self.token_ids.append(token_id)
        if offset == size - 1:
            self._name_full_blocks()
        return self.slot(self.num_tokens - 1), cow

    def free(self):
        for frame in reversed(self.frames):
            self.allocator.free(frame)
        self.frames.clear()
'''

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that must catch it)
MISTAKES = [
    ('FILL', 'if offset == 0:', 'if True:', 'append_slot takes a new frame only when the last one is full'),
    ('FILL', '            self.free_frames.append(frame)\n', '            pass\n', 'free gives a frame back to the pool (and a double free is an error)'),
    ('FILL', 'return self.frames[position // size] * size + position % size', 'return self.frames[position // size] + position % size', 'slot(position) is frame * block_size + offset'),
]

# the line that opens a method body: the loop, crash and exit tests put a statement after it
BREAK_AT = '    def allocate(self):\n'
