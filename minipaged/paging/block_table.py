"""The page table of one sequence: logical block i of its tokens lives in frame
`frames[i]`.

Demand paging (append_slot takes a frame only when the last one is full), fork (share
every frame), copy-on-write, and rollback of guessed slots (speculative decoding), under
the block manager that keeps one table per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.paging.allocator import BlockAllocator
from minipaged.paging.prefix_cache import block_hash

CowPair = tuple[int, int]  # (src frame, dst frame): copy src's K and V into dst


@dataclass(slots=True)
class BlockTable:
    """The page table of one sequence, over one pool (device, or host while swapped
    out)."""

    allocator: BlockAllocator  # the pool its frames live in
    frames: list[int] = field(default_factory=list)  # logical block -> frame
    # the tokens whose K and V it holds
    token_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # one per full block, chained
    # slots after token_ids held for guessed tokens (speculative decoding)
    guesses: int = 0

    @property
    def num_tokens(self) -> int:
        """Slots in use: its tokens, and the guesses being checked this step."""
        return len(self.token_ids) + self.guesses

    def slot(self, position: int) -> int:
        """Where token `position`'s K and V live: frame * block_size + offset."""
        block_size = self.allocator.block_size
        return self.frames[position // block_size] * block_size + position % block_size

    @property
    def last_frame_has_room(self) -> bool:
        """Does the next token go into the last frame (True) or into a new one
        (False)?"""
        return self.num_tokens % self.allocator.block_size != 0

    def append_slot(self, token_id: int) -> tuple[int, CowPair | None]:
        """Place the next token: its slot, and the copy-on-write pair when one was
        needed. Raises NoFreeFramesError, with nothing changed, when a frame is needed
        but none is free.
        """
        assert not self.guesses, "settle_guesses() before appending tokens"
        cow = self._make_room()
        self.token_ids.append(token_id)
        self._name_full_blocks()
        return self.slot(self.num_tokens - 1), cow

    def append_guess_slot(self) -> tuple[int, CowPair | None]:
        """A slot for a guessed token (speculative decoding), like append_slot (a new
        frame on demand, a shared last frame copied first: a guess never writes where
        another table reads) but its block is not named for the prefix cache: the guess
        may be rejected.
        """
        cow = self._make_room()
        self.guesses += 1
        return self.slot(self.num_tokens - 1), cow

    def settle_guesses(self, accepted: list[int]) -> None:
        """The model checked the guesses: the first len(accepted) were right and hold
        these tokens; the other slots are rolled back. Blocks that are now full of
        accepted tokens are named for the prefix cache only now."""
        assert len(accepted) <= self.guesses, "more accepted tokens than guessed slots"
        self.truncate(len(self.token_ids) + len(accepted))
        self.guesses = 0
        self.token_ids.extend(accepted)
        self._name_full_blocks()

    def truncate(self, num_tokens: int) -> None:
        """Rollback: keep the first `num_tokens` slots and drop the rest (guesses first,
        then tokens); frames left empty go back to the allocator, blocks no longer full
        lose their name.
        """
        assert 0 <= num_tokens <= self.num_tokens, (
            f"cannot keep {num_tokens} of {self.num_tokens} slots"
        )
        block_size, cache = self.allocator.block_size, self.allocator.prefix_cache
        self.guesses = max(0, num_tokens - len(self.token_ids))
        del self.token_ids[num_tokens:]
        while len(self.frames) > -(-num_tokens // block_size):
            self.allocator.free(self.frames.pop())
        cut_short = (
            num_tokens % block_size
            and len(self.block_hashes) > num_tokens // block_size
        )
        if (
            cut_short
            and cache is not None
            and self.allocator.ref_count(self.frames[-1]) == 1
        ):
            # a named block cut short: its tail will be written again
            cache.forget(self.frames[-1])
        del self.block_hashes[num_tokens // block_size :]

    def _make_room(self) -> CowPair | None:
        """Before a slot is written: a new frame if the last is full (demand paging), or
        a private copy if the last is shared (copy-on-write)."""
        if self.num_tokens % self.allocator.block_size == 0:
            self.frames.append(self.allocator.allocate())
        elif self.last_frame_shared():
            return self._copy_on_write()
        return None

    def append_cached_block(self, frame: int, token_ids: list[int]) -> None:
        """Map a full block that `frame` already holds (a prefix-cache hit): nothing to
        write."""
        block_size = self.allocator.block_size
        assert self.num_tokens % block_size == 0 and len(token_ids) == block_size, (
            "not a whole block"
        )
        self.allocator.incref(frame)
        self.frames.append(frame)
        self.token_ids.extend(token_ids)
        self._name_full_blocks()

    def fork(self) -> BlockTable:
        """A child table mapping the same frames (fork()): no K or V is copied now."""
        for frame in self.frames:
            self.allocator.incref(frame)
        return BlockTable(
            self.allocator,
            list(self.frames),
            list(self.token_ids),
            list(self.block_hashes),
        )

    def free(self) -> None:
        """Release every frame. Tail first: the prefix cache then evicts a prompt's last
        blocks before its first ones, which more requests share."""
        for frame in reversed(self.frames):
            self.allocator.free(frame)
        self.frames.clear()

    def last_frame_shared(self) -> bool:
        return bool(self.frames) and self.allocator.ref_count(self.frames[-1]) > 1

    def _copy_on_write(self) -> CowPair:
        """A last frame shared with another table (ref count > 1) is replaced by a
        private copy before a token is written into it; the (src, dst) pair is for the
        KV cache to apply.
        """
        src = self.frames[-1]
        dst = self.allocator.allocate()  # may raise: nothing has changed yet
        self.allocator.free(src)
        self.frames[-1] = dst
        return src, dst

    def _name_full_blocks(self) -> None:
        """Blocks that just became full of tokens: hash them, and offer them to the
        prefix cache."""
        block_size, cache = self.allocator.block_size, self.allocator.prefix_cache
        while len(self.block_hashes) < len(self.token_ids) // block_size:
            i = len(self.block_hashes)
            prev = self.block_hashes[-1] if self.block_hashes else None
            tokens = self.token_ids[i * block_size : (i + 1) * block_size]
            self.block_hashes.append(
                block_hash(prev, tokens)
                if cache is None
                else cache.insert(self.frames[i], prev, tokens)
            )
