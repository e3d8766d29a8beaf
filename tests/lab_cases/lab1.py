"""Lab 1's cases: a file as a participant writes it from the hints, and the catalogue of
plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = """
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
"""

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that
# must catch it)
MISTAKES = [
    (
        "allocate forgets to count itself in num_allocated",
        "        self.num_allocated += 1\n",
        "",
        "allocate hands out each free frame once, with ref count 1",
    ),
    (
        "allocate pops an empty free list instead of raising NoFreeFramesError",
        (
            '        if not self.free_frames:\n            raise NoFreeFramesError("no'
            ' free frame")\n'
        ),
        "",
        "allocate on a full pool raises NoFreeFramesError and changes nothing",
    ),
    (
        "allocate counts the frame before it checks there is one",
        (
            '        if not self.free_frames:\n            raise NoFreeFramesError("no'
            ' free frame")\n        frame = self.free_frames.popleft()\n       '
            " self.ref_counts[frame] = 1\n        self.num_allocated += 1\n"
        ),
        (
            "        self.num_allocated += 1\n        if not self.free_frames:\n       "
            '     raise NoFreeFramesError("no free frame")\n        frame ='
            " self.free_frames.popleft()\n        self.ref_counts[frame] = 1\n"
        ),
        "allocate on a full pool raises NoFreeFramesError and changes nothing",
    ),
    (
        "free never gives the frame back to the free list",
        "            self.free_frames.append(frame)\n",
        "            pass\n",
        "free gives a frame back to the pool (and a double free is an error)",
    ),
    (
        "free without the double-free check",
        (
            "        if self.ref_counts[frame] == 0:\n            raise"
            ' ValueError("double free")\n'
        ),
        "",
        "free gives a frame back to the pool (and a double free is an error)",
    ),
    (
        "free gives the frame back on every decrement, while others still map it",
        (
            "        if self.ref_counts[frame] == 0:\n            self.num_released +="
            " 1\n            self.free_frames.append(frame)\n"
        ),
        (
            "        self.free_frames.append(frame)\n        if self.ref_counts[frame]"
            " == 0:\n            self.num_released += 1\n"
        ),
        "free gives a shared frame back only when its last user frees it",
    ),
    (
        "free sets the ref count to 0 at once",
        "        self.ref_counts[frame] -= 1\n",
        "        self.ref_counts[frame] = 0\n",
        "free gives a shared frame back only when its last user frees it",
    ),
    (
        "slot forgets to multiply the frame by block_size",
        "return self.frames[position // size] * size + position % size",
        "return self.frames[position // size] + position % size",
        "slot(position) is frame * block_size + offset",
    ),
    (
        "a new frame for every token",
        "if offset == 0:",
        "if True:",
        "append_slot takes a new frame only when the last one is full",
    ),
    (
        "the offset taken after the token is appended (off by one)",
        "        offset, cow = self.num_tokens % size, None\n",
        (
            "        self.token_ids.append(token_id)\n        offset, cow ="
            " self.num_tokens % size, None\n"
        ),
        "append_slot takes a new frame only when the last one is full",
    ),
    (
        "the full block named one token late",
        "if offset == size - 1:",
        "if offset == 0:",
        "append_slot takes a new frame only when the last one is full",
    ),
    (
        "append_slot without the copy-on-write call",
        (
            "        elif self.last_frame_shared():\n            cow ="
            " self._copy_on_write()\n"
        ),
        "",
        (
            "append_slot copies a shared last frame before writing into it (fork, then"
            " append)"
        ),
    ),
    (
        (
            "a shared last frame copied even when it is full (the copy tested before"
            " the new frame)"
        ),
        (
            "        if offset == 0:\n           "
            " self.frames.append(self.allocator.allocate())\n        elif"
            " self.last_frame_shared():"
        ),
        (
            "        if self.last_frame_shared():\n            cow ="
            " self._copy_on_write()\n        if offset == 0:\n           "
            " self.frames.append(self.allocator.allocate())\n        elif False:"
        ),
        (
            "append_slot copies a shared last frame before writing into it (fork, then"
            " append)"
        ),
    ),
    (
        "the table's free releases the first block first",
        "for frame in reversed(self.frames):",
        "for frame in self.frames:",
        "a table's free releases every frame, last block first",
    ),
    (
        "the table's free leaves its frames listed",
        "        self.frames.clear()\n",
        "",
        "a table's free releases every frame, last block first",
    ),
    (
        "allocate hands its work to the engine's own (super())",
        "        if not self.free_frames:\n",
        "        return super().allocate()\n        if not self.free_frames:\n",
        "allocate hands out each free frame once, with ref count 1",
    ),
    (
        "append_slot hands its work to the engine's own (super())",
        "        size = self.allocator.block_size\n        offset, cow =",
        (
            "        return super().append_slot(token_id)\n        size ="
            " self.allocator.block_size\n        offset, cow ="
        ),
        "append_slot takes a new frame only when the last one is full",
    ),
]

# the line that opens a method body: the loop, crash and exit tests put a statement
# after it
BREAK_AT = "    def allocate(self):\n"
