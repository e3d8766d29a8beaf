"""Lab 2: fork and copy-on-write. You write reference counting (incref, free), the page table's
fork, and the copy of a shared last frame before a token is written into it.

Grade it (then it serves the model):  python -m minipaged.lab check 2 my_fork.py
Stuck? The next hint, one at a time:  python -m minipaged.lab hint 2
"""

from __future__ import annotations

from minipaged import paging
from minipaged.paging import CowPair  # noqa: F401 (you will need it)


class BlockAllocator(paging.BlockAllocator):
    """Frames with reference counts. Its state, set up for you (allocate is the engine's):

        self.free_frames   a deque of the frames nobody maps
        self.ref_counts    a NumPy array: how many page tables map each frame
        self.num_released  frames whose ref count fell to 0 so far (count each)
        self.prefix_cache  None in labs 1 and 2 (lab 3 is the prefix cache)
    """

    def incref(self, frame: int) -> None:
        """One more page table maps `frame` (a fork). Sharing a free frame (ref count 0) is a
        bug in the caller: raise ValueError."""
        raise NotImplementedError("lab 2: write BlockAllocator.incref (stuck? python -m minipaged.lab hint 2)")

    def free(self, frame: int) -> None:
        """One page table fewer maps `frame`: its ref count goes down by one, and only at 0 does
        the frame go back to the free list, since other tables may still map it. A frame whose
        ref count is already 0: raise ValueError."""
        raise NotImplementedError("lab 2: write BlockAllocator.free (stuck? python -m minipaged.lab hint 2)")


class BlockTable(paging.BlockTable):
    """The page table of one sequence. Its state (a dataclass; append_slot, slot and free are
    the engine's, and append_slot calls your last_frame_shared and _copy_on_write):

        self.allocator     the BlockAllocator its frames come from
        self.frames        logical block i lives in frame self.frames[i]
        self.token_ids     the tokens whose K and V it holds
        self.block_hashes  one name per full block (lab 3): a child starts with the same
    """

    def fork(self) -> BlockTable:
        """A child table that maps the same frames as this one (fork()): every frame's ref count
        goes up by one, and no frame is allocated or copied now. The child gets its own lists
        (appending to one table must not change the other)."""
        raise NotImplementedError("lab 2: write BlockTable.fork (stuck? python -m minipaged.lab hint 2)")

    def last_frame_shared(self) -> bool:
        """Does another table map this table's last frame too (ref count > 1)? False when the
        table has no frame."""
        raise NotImplementedError("lab 2: write BlockTable.last_frame_shared (stuck? python -m minipaged.lab hint 2)")

    def _copy_on_write(self) -> CowPair:
        """The last frame is shared and a token is about to be written into it: give this table
        a private copy. Allocate the copy first (if that raises NoFreeFramesError, nothing has
        changed), drop this table's reference to the shared frame, map the copy in its place,
        and return (src, dst): the KV cache copies src's K and V into dst before the write."""
        raise NotImplementedError("lab 2: write BlockTable._copy_on_write (stuck? python -m minipaged.lab hint 2)")
