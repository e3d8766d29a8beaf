"""Contiguous KV memory, as before paging (Orca's baselines): each sequence reserves one
chunk of consecutive slots up front, placed first-fit in one flat array of slots. A
block manager the scheduler (in the simulator and the memory benchmark) uses in place of
the paged one.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from minipaged.paging.allocator import BlockAllocator, NoFreeFramesError, check_size
from minipaged.paging.block_table import BlockTable
from minipaged.paging.manager import BlockManager, FrameState, MemoryUsage, SeqId

RESERVATIONS = ("max", "pow2", "oracle")


class ChunkAllocator:
    """Frames 0..num_blocks-1 handed out as chunks of consecutive frames, first fit. A
    frame of a chunk is reserved until its sequence writes into it; then it is mapped
    (ref count 1).
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = check_size("num_blocks", num_blocks, minimum=0)
        self.block_size = check_size("block_size", block_size)
        # (start, length)
        self.gaps: list[tuple[int, int]] = (
            [(0, self.num_blocks)] if self.num_blocks else []
        )
        self.ref_counts = np.zeros(self.num_blocks, dtype=np.int32)  # (num_blocks,)
        self.prefix_cache = None
        self.num_free = self.num_blocks  # frames in no chunk
        self.num_reserved = 0  # frames in chunks, not written yet
        self.num_allocated = self.num_released = 0

    def largest_gap(self) -> int:
        return max((length for _, length in self.gaps), default=0)

    def reserve(self, num_frames: int) -> int:
        """The first frame of a new chunk, from the first gap that holds it."""
        for i, (start, length) in enumerate(self.gaps):
            if length >= num_frames:
                self.gaps[i : i + 1] = (
                    [(start + num_frames, length - num_frames)]
                    if length > num_frames
                    else []
                )
                self.num_free -= num_frames
                self.num_reserved += num_frames
                return start
        raise NoFreeFramesError(
            f"no gap of {num_frames} frames: the largest is {self.largest_gap()} "
            f"({self.num_free} frames free in all)"
        )

    def release(self, start: int, num_frames: int) -> None:
        """A chunk goes back, merged with the gaps beside it."""
        i = bisect.bisect(self.gaps, (start,))
        end = start + num_frames
        if i < len(self.gaps) and self.gaps[i][0] == end:
            end += self.gaps.pop(i)[1]
        if i > 0 and sum(self.gaps[i - 1]) == start:
            start = self.gaps.pop(i - 1)[0]
            i -= 1
        self.gaps.insert(i, (start, end - start))
        self.num_free += num_frames

    def map(self, frame: int) -> int:
        """A reserved frame receives its first token."""
        self.ref_counts[frame] = 1
        self.num_reserved -= 1
        self.num_allocated += 1
        return frame

    def unmap(self, frame: int) -> None:
        self.ref_counts[frame] = 0
        self.num_reserved += 1
        self.num_released += 1

    def ref_count(self, frame: int) -> int:
        return int(self.ref_counts[frame])


@dataclass(slots=True)
class ChunkTable(BlockTable):
    """A block table over one chunk: frame i of the sequence is frame start + i."""

    start: int = 0  # first frame of the chunk
    size: int = 0  # frames in the chunk
    final_len: int = 0  # tokens the sequence may grow to (what the chunk was sized for)

    def append_slot(self, token_id: int):
        # the next frame of its own chunk
        if self.num_tokens % self.allocator.block_size == 0:
            if len(self.frames) == self.size:
                raise NoFreeFramesError(f"the chunk of {self.size} frames is full")
            self.frames.append(self.allocator.map(self.start + len(self.frames)))
        self.token_ids.append(token_id)
        return self.slot(self.num_tokens - 1), None

    def fork(self):
        raise ValueError(
            "a contiguous allocator has no fork(): parallel samples and beams need "
            "shared frames, use allocator='paged'"
        )

    def free(self) -> None:
        for frame in self.frames:
            self.allocator.unmap(frame)
        self.frames.clear()
        self.allocator.num_reserved -= self.size
        self.allocator.release(self.start, self.size)


class ContiguousBlockManager(BlockManager):
    """One chunk per sequence, sized by `reservation` (max / pow2 / oracle), first fit.

    How much a chunk holds is the allocator's guess of the sequence's final length:
    `max` reserves max_model_len, `pow2` the next power of two of the real final length,
    `oracle` exactly the real final length (prompt + max_tokens, capped by
    max_model_len). Slots kept for tokens still to come are `reserved_unused`; slots
    past the final length are internal fragmentation. A request whose chunk fits in no
    single gap although enough slots are free in total is refused: external
    fragmentation, counted in `refusals`. A chunk is a block table whose frames are
    consecutive, so the paged attention kernels read it unchanged; `block_size`
    1 is slot-exact."""

    can_fork = False

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 1,
        reservation: str = "oracle",
        max_model_len: int = 2048,
    ):
        if reservation not in RESERVATIONS:
            raise ValueError(
                f"reservation must be one of {RESERVATIONS}, got {reservation!r}"
            )
        self.device = ChunkAllocator(num_blocks, block_size)
        # no swap: a reserved chunk never grows
        self.host = BlockAllocator(0, block_size)
        self.block_size, self.tables = self.device.block_size, {}
        self.reservation, self.max_model_len = (
            reservation,
            check_size("max_model_len", max_model_len),
        )
        self.refusals = 0  # admissions refused while enough frames were free in total

    def reserve_len(self, final_len: int) -> int:
        """Slots reserved for a sequence that will end at `final_len` tokens."""
        if self.reservation == "max":
            return self.max_model_len
        if self.reservation == "pow2":
            return min(
                1 << (final_len - 1).bit_length(), max(self.max_model_len, final_len)
            )
        return final_len

    def frames_to_admit(self, num_tokens: int, final_len: int) -> int:
        return self.frames_for(self.reserve_len(max(num_tokens, final_len)))

    def can_reserve(self, num_frames: int) -> bool:
        if num_frames <= self.device.largest_gap():
            return True
        # free in all, not in one piece
        self.refusals += num_frames <= self.device.num_free
        return False

    def allocate(
        self,
        seq_id: SeqId,
        token_ids: Sequence[int],
        final_len: int = 0,
        read_cache: bool = True,
    ) -> int:
        """Reserve the chunk (final_len 0: as long as max_model_len) and write the
        prompt's slots into it. No prefix cache (read_cache changes nothing): returns 0
        cached tokens.
        """
        if seq_id in self.tables:
            raise ValueError(
                f"sequence {seq_id!r} already exists: free() it first or use a new id"
            )
        if not token_ids:
            raise ValueError(
                f"sequence {seq_id!r} has no tokens: a prompt needs at least one"
            )
        final_len = max(final_len or self.max_model_len, len(token_ids))
        size = self.frames_to_admit(len(token_ids), final_len)
        table = ChunkTable(
            self.device, start=self.device.reserve(size), size=size, final_len=final_len
        )
        for token_id in token_ids:
            table.append_slot(token_id)
        self.tables[seq_id] = table
        return 0

    def can_append_slots(self, *seq_ids: SeqId) -> bool:
        tables = [self._device_table(s) for s in seq_ids]
        return all(t.last_frame_has_room or len(t.frames) < t.size for t in tables)

    def fork(self, parent_id: SeqId, child_id: SeqId) -> None:
        self._table(parent_id).fork()

    def usage(self) -> MemoryUsage:
        """Chunks hold tokens, slots reserved for tokens still to come (up to
        final_len), and
        internal fragmentation (past final_len, and the rounding up to whole frames)."""
        tables = list(self.tables.values())
        tokens = sum(t.num_tokens for t in tables)
        allocated = sum(t.size for t in tables) * self.block_size
        reserved = sum(t.final_len for t in tables) - tokens
        return MemoryUsage(
            total_slots=self.device.num_blocks * self.block_size,
            allocated_slots=allocated,
            token_slots=tokens,
            internal_waste=allocated - tokens - reserved,
            reserved_unused=reserved,
            shared_frames=0,
        )

    def _reserved_frames(self):
        """The frames of each chunk that no token has reached yet."""
        for table in self.tables.values():
            yield from range(table.start + len(table.frames), table.start + table.size)

    def frame_states(self) -> list[FrameState]:
        """BlockManager's, with the reserved frames marked."""
        states = super().frame_states()
        for frame in self._reserved_frames():
            states[frame].reserved = True
        return states

    def held_frame_states(self) -> list[FrameState]:
        """BlockManager's, with the reserved frames among them."""
        states = {state.frame: state for state in super().held_frame_states()}
        for frame in self._reserved_frames():
            states.setdefault(frame, FrameState(frame, [])).reserved = True
        return [states[frame] for frame in sorted(states)]
