"""Lab 2's cases: a file as a participant writes it from the hints, and the catalogue of
plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = """
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
        return BlockTable(self.allocator, list(self.frames), \
list(self.token_ids), list(self.block_hashes))

    def last_frame_shared(self):
        return bool(self.frames) and self.allocator.ref_count(self.frames[-1]) > 1

    def _copy_on_write(self):
        src = self.frames[-1]
        dst = self.allocator.allocate()
        self.allocator.free(src)
        self.frames[-1] = dst
        return src, dst
"""

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that
# must catch it)
MISTAKES = [
    (
        "incref shares a free frame without a word",
        (
            "        if self.ref_counts[frame] == 0:\n            raise"
            ' ValueError("free frame")\n'
        ),
        "",
        "incref adds a user to a mapped frame (and sharing a free frame is an error)",
    ),
    (
        "free sets the ref count to 0 at once",
        "        self.ref_counts[frame] -= 1\n",
        "        self.ref_counts[frame] = 0\n",
        "free gives a shared frame back only when its last user frees it",
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
        "fork copies: a new frame for each of the parent's",
        (
            "            self.allocator.incref(frame)\n        return"
            " BlockTable(self.allocator, list(self.frames),"
        ),
        (
            "            pass\n        return BlockTable(self.allocator,"
            " [self.allocator.allocate() for _ in self.frames],"
        ),
        "fork shares every frame: same frames, ref counts + 1, nothing allocated",
    ),
    (
        "fork shares the frames but forgets the ref counts",
        "            self.allocator.incref(frame)\n",
        "            pass\n",
        "fork shares every frame: same frames, ref counts + 1, nothing allocated",
    ),
    (
        "fork hands the child the parent's own lists",
        (
            "BlockTable(self.allocator, list(self.frames), list(self.token_ids),"
            " list(self.block_hashes))"
        ),
        "BlockTable(self.allocator, self.frames, self.token_ids, self.block_hashes)",
        "the child gets its own lists",
    ),
    (
        "last_frame_shared looks at the first frame",
        "self.allocator.ref_count(self.frames[-1]) > 1",
        "self.allocator.ref_count(self.frames[0]) > 1",
        "last_frame_shared is True exactly when another table maps the last frame",
    ),
    (
        "last_frame_shared is never True",
        "self.allocator.ref_count(self.frames[-1]) > 1",
        "False",
        "last_frame_shared is True exactly when another table maps the last frame",
    ),
    (
        "last_frame_shared counts the table itself as a sharer",
        "self.allocator.ref_count(self.frames[-1]) > 1",
        "self.allocator.ref_count(self.frames[-1]) >= 1",
        "last_frame_shared is True exactly when another table maps the last frame",
    ),
    (
        "_copy_on_write keeps its reference to the shared frame",
        "        self.allocator.free(src)\n",
        "",
        "writing into a shared last frame copies it first (copy-on-write)",
    ),
    (
        "_copy_on_write returns (dst, src)",
        "        return src, dst\n",
        "        return dst, src\n",
        "writing into a shared last frame copies it first (copy-on-write)",
    ),
    (
        "_copy_on_write adds the copy instead of replacing the shared frame",
        "        self.frames[-1] = dst\n",
        "        self.frames.append(dst)\n",
        "writing into a shared last frame copies it first (copy-on-write)",
    ),
    (
        "_copy_on_write frees the shared frame before it allocates the copy",
        "        dst = self.allocator.allocate()\n        self.allocator.free(src)\n",
        "        self.allocator.free(src)\n        dst = self.allocator.allocate()\n",
        "a copy without a free frame raises and changes nothing",
    ),
    (
        "fork hands its work to the engine's own (super())",
        "        for frame in self.frames:\n            self.allocator.incref(frame)\n",
        (
            "        return super().fork()\n"
            "        for frame in self.frames:\n"
            "            self.allocator.incref(frame)\n"
        ),
        "fork shares every frame: same frames, ref counts + 1, nothing allocated",
    ),
]

# the line that opens a method body: the loop, crash and exit tests put a statement
# after it
BREAK_AT = "    def incref(self, frame):\n"
