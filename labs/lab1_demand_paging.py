"""Lab 1: demand paging. You write the frame allocator's allocate and free, and the page table's
slot, append_slot and free; the engine's own classes give you everything else.

Grade it (then it serves the model):  python -m minipaged.lab check 1 my_paging.py
Stuck? The next hint, one at a time:  python -m minipaged.lab hint 1
"""

from __future__ import annotations

from minipaged import paging
from minipaged.paging import CowPair, NoFreeFramesError  # noqa: F401 (you will need them)


class BlockAllocator(paging.BlockAllocator):
    """Frames 0..num_blocks-1 of block_size token slots each. Its state, set up for you:

        self.free_frames   a deque of the frames nobody maps (all of them at first)
        self.ref_counts    a NumPy array: how many page tables map each frame
        self.num_allocated frames handed out so far (count each allocate)
        self.num_released  frames whose ref count fell to 0 so far (count each)
        self.prefix_cache  None in labs 1 and 2 (lab 3 is the prefix cache)
    """

    def allocate(self) -> int:
        """A frame with ref count 1, taken from the free list. When no frame is free, raise
        NoFreeFramesError (the scheduler catches it and preempts someone) and change nothing."""
        raise NotImplementedError("lab 1: write BlockAllocator.allocate (stuck? python -m minipaged.lab hint 1)")

    def free(self, frame: int) -> None:
        """One page table fewer maps `frame`: its ref count goes down by one, and at 0 the frame
        goes back to the free list. Freeing a frame whose ref count is already 0 is a bug in the
        caller: raise ValueError."""
        raise NotImplementedError("lab 1: write BlockAllocator.free (stuck? python -m minipaged.lab hint 1)")


class BlockTable(paging.BlockTable):
    """The page table of one sequence. Its state (a dataclass: BlockTable(allocator) is empty):

        self.allocator     the BlockAllocator its frames come from (block_size is on it)
        self.frames        logical block i of the sequence lives in frame self.frames[i]
        self.token_ids     the tokens whose K and V it holds; self.num_tokens is their count
    """

    def slot(self, position: int) -> int:
        """Where token `position` (0, 1, ...) of the sequence lives in the KV cache:
        frame * block_size + offset, the frame of its logical block, the offset inside it."""
        raise NotImplementedError("lab 1: write BlockTable.slot (stuck? python -m minipaged.lab hint 1)")

    def append_slot(self, token_id: int) -> tuple[int, CowPair | None]:
        """Place the next token: return (its slot, None). Demand paging: take a new frame only
        when the token starts a new logical block (the last frame is full, or there is none).
        If allocate raises NoFreeFramesError, let it through with nothing changed.
        Two calls the engine needs, already written for you (the check tries both):
        - when the token goes into a last frame that another table shares (a fork, lab 2:
          `self.last_frame_shared()`), first `cow = self._copy_on_write()`, and return
          (slot, cow) instead of (slot, None); a full shared frame is never copied;
        - when the token fills its block, call `self._name_full_blocks()` (lab 3 hashes it).
        (The engine's own append_slot puts the first part in a helper, _make_room, which its
        speculative decoding shares; here you write it all in append_slot.)"""
        raise NotImplementedError("lab 1: write BlockTable.append_slot (stuck? python -m minipaged.lab hint 1)")

    def free(self) -> None:
        """Release every frame of the table (the sequence finished, or was preempted), last
        block first, and leave the table empty of frames."""
        raise NotImplementedError("lab 1: write BlockTable.free (stuck? python -m minipaged.lab hint 1)")
