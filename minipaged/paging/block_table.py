"""The page table of one sequence: logical block i of its tokens lives in frame `frames[i]`.

Demand paging (append_slot takes a frame only when the last one is full), fork (share every
frame) and copy-on-write, under the block manager that keeps one table per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.paging.allocator import BlockAllocator
from minipaged.paging.prefix_cache import block_hash

CowPair = tuple[int, int]  # (src frame, dst frame): copy src's K and V into dst


@dataclass(slots=True)
class BlockTable:
    """The page table of one sequence, over one pool (device, or host while swapped out)."""
    allocator: BlockAllocator                              # the pool its frames live in
    frames: list[int] = field(default_factory=list)        # logical block -> frame
    token_ids: list[int] = field(default_factory=list)     # the tokens whose K and V it holds
    block_hashes: list[int] = field(default_factory=list)  # one per full block, chained

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def slot(self, position: int) -> int:
        """Where token `position`'s K and V live: frame * block_size + offset."""
        block_size = self.allocator.block_size
        return self.frames[position // block_size] * block_size + position % block_size

    @property
    def last_frame_has_room(self) -> bool:
        """Does the next token go into the last frame (True) or into a new one (False)?"""
        return self.num_tokens % self.allocator.block_size != 0

    def append_slot(self, token_id: int) -> tuple[int, CowPair | None]:
        """Place the next token: its slot, and the copy-on-write pair when one was needed.
        Raises NoFreeFramesError, with nothing changed, when a frame is needed but none is free."""
        offset = self.num_tokens % self.allocator.block_size
        cow = None
        if offset == 0:  # demand paging: the last frame is full (or there is none)
            self.frames.append(self.allocator.allocate())
        elif self.last_frame_shared():
            cow = self._copy_on_write()
        self.token_ids.append(token_id)
        if offset == self.allocator.block_size - 1:
            self._name_full_block()
        return self.slot(self.num_tokens - 1), cow

    def append_cached_block(self, frame: int, token_ids: list[int]) -> None:
        """Map a full block that `frame` already holds (a prefix-cache hit): nothing to write."""
        block_size = self.allocator.block_size
        assert self.num_tokens % block_size == 0 and len(token_ids) == block_size, "not a whole block"
        self.allocator.incref(frame)
        self.frames.append(frame)
        self.token_ids.extend(token_ids)
        self._name_full_block()

    def fork(self) -> BlockTable:
        """A child table mapping the same frames (fork()): no K or V is copied now."""
        for frame in self.frames:
            self.allocator.incref(frame)
        return BlockTable(self.allocator, list(self.frames), list(self.token_ids), list(self.block_hashes))

    def free(self) -> None:
        """Release every frame. Tail first: the prefix cache then evicts a prompt's last
        blocks before its first ones, which more requests share."""
        for frame in reversed(self.frames):
            self.allocator.free(frame)
        self.frames.clear()

    def last_frame_shared(self) -> bool:
        return bool(self.frames) and self.allocator.ref_count(self.frames[-1]) > 1

    def _copy_on_write(self) -> CowPair:
        """A last frame shared with another table (ref count > 1) is replaced by a private copy
        before a token is written into it; the (src, dst) pair is for the KV cache to apply."""
        src = self.frames[-1]
        dst = self.allocator.allocate()  # may raise: nothing has changed yet
        self.allocator.free(src)
        self.frames[-1] = dst
        return src, dst

    def _name_full_block(self) -> None:
        """The last block just became full: hash it, and offer it to the prefix cache."""
        prev = self.block_hashes[-1] if self.block_hashes else None
        tokens = self.token_ids[-self.allocator.block_size:]
        cache = self.allocator.prefix_cache
        if cache is None:
            self.block_hashes.append(block_hash(prev, tokens))
        else:
            self.block_hashes.append(cache.insert(self.frames[-1], prev, tokens))
