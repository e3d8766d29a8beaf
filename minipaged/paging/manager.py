"""The block manager: what the scheduler talks to (vLLM v0's BlockSpaceManager, kept
small).

One BlockTable per sequence over a device pool of frames and a host pool (swap space).
Each call is all-or-nothing (NoFreeFramesError, nothing changed: preempt and retry).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from minipaged.paging.allocator import (
    DEFAULT_BLOCK_SIZE,
    BlockAllocator,
    NoFreeFramesError,
    cdiv,
    check_size,
)
from minipaged.paging.block_table import BlockTable, CowPair
from minipaged.paging.prefix_cache import block_hash
from minipaged.paging.tier import Drum, TierMove

SeqId = Hashable


@dataclass(slots=True)
class MemoryMoves:
    """The frame copies one step needs before its forward pass (KVCache.apply makes
    them, in this order): swap_out first, since swap_in and copy-on-write may reuse the
    device frames it leaves; then the tier's stores and loads in the order they were
    decided (an evicted frame is read before a load or a swap-in writes it, a tier frame
    is read before a store reuses it);
    then swap_in; then the copies, whose source may have just come back in."""

    # (device frame, host frame)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    tier: list[TierMove] = field(default_factory=list)  # ("store"/"load", src, dst)
    # (host frame, device frame)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    copies: list[CowPair] = field(default_factory=list)  # copy-on-write (src, dst)


@dataclass(slots=True)
class MemoryUsage:
    """Where the KV slots are. allocated = token + internal_waste + reserved_unused."""

    total_slots: int  # the whole pool
    # slots in frames some sequence maps (shared frames count once)
    allocated_slots: int
    token_slots: int  # of those, slots holding a real token's K and V
    internal_waste: int  # the unfilled tails of sequences' last blocks
    # reserved up front for tokens that are not there (static baseline)
    reserved_unused: int
    shared_frames: int  # frames mapped by more than one sequence (ref count > 1)

    @property
    def utilization(self) -> float:
        """Real token slots / allocated slots (0 when nothing is allocated)."""
        return self.token_slots / self.allocated_slots if self.allocated_slots else 0.0


@dataclass(slots=True)
class FrameState:
    """One device frame, as pictures and dashboards show it (a copy: changing it changes
    nothing)."""

    frame: int
    owners: list[SeqId]  # the sequences that map it; its ref count is len(owners)
    # a prefix-cache block nobody maps: free, yet findable until reused
    cached: bool = False
    # in a sequence's chunk, not written yet (the contiguous baseline)
    reserved: bool = False

    @property
    def free(self) -> bool:
        return not (self.owners or self.cached or self.reserved)


@dataclass(slots=True)
class TableView:
    """One sequence's page table (a copy): logical block i lives in frames[i]."""

    seq_id: SeqId
    frames: list[int]  # device frames, or host frames while swapped out
    num_tokens: int
    swapped: bool  # out in the host pool (preempted by swap)
    ref_counts: list[int]  # per frame, in the pool the table lives in: > 1 is shared
    # of num_tokens, the last slots held for guessed tokens (speculative decoding)
    guesses: int = 0


class BlockManager:
    """Page tables for all sequences. Frames are ints; a token's slot is frame *
    block_size + offset."""

    can_fork = True  # may sequences share frames (fork, copy-on-write)?
    # vLLM's prefix_cache_queries / prefix_cache_hits: prompt tokens looked up, and
    # found, each time a sequence is allocated with the prefix cache on (a recomputed
    # one counts again)
    prefix_cache_queries = prefix_cache_hits = 0
    # with a tier (add_tier): prompt tokens the pool did not hold, and of those, tokens
    # loaded from the tier
    tier: Drum | None = None
    tier_queries = tier_hits = 0

    def __init__(
        self,
        num_blocks: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        num_host_blocks: int = 0,
        enable_prefix_caching: bool = True,
        prefix_cache_policy="lru",
    ):
        self.device = BlockAllocator(
            num_blocks, block_size, enable_prefix_caching, prefix_cache_policy
        )
        self.host = BlockAllocator(num_host_blocks, block_size)
        self.block_size = self.device.block_size
        self.tables: dict[SeqId, BlockTable] = {}

    @property
    def num_frames(self) -> int:
        """Frames in the device pool (the KV cache)."""
        return self.device.num_blocks

    @property
    def num_host_frames(self) -> int:
        """Frames in the host pool (swap space; 0 for managers that never swap)."""
        return self.host.num_blocks

    @property
    def num_free_frames(self) -> int:
        """Device frames a new token or sequence could take (evictable cached frames
        included)."""
        return self.device.num_free

    def take_policy_errors(self) -> list[tuple[object, str]]:
        """(policy, what was wrong) for each failed answer of the prefix cache's
        replacement policy since the last call (its LRU frame was taken instead)."""
        cache = getattr(self.device, "prefix_cache", None)
        if cache is None:
            return []
        errors = cache.errors
        cache.errors = []
        return errors

    @property
    def frames_taken(self) -> int:
        """Device frames handed out so far (a step's difference is what it took)."""
        return self.device.num_allocated

    @property
    def frames_released(self) -> int:
        """Device frames whose ref count fell to 0 so far."""
        return self.device.num_released

    def has(self, seq_id: SeqId) -> bool:
        """Does this sequence hold a block table (on the device or swapped out)?"""
        return seq_id in self.tables

    def frames_for(self, num_tokens: int) -> int:
        """Frames that hold `num_tokens` tokens: ceil(num_tokens / block_size)."""
        return cdiv(num_tokens, self.block_size)

    def frames_to_admit(self, num_tokens: int, final_len: int) -> int:
        """Frames a sequence of `num_tokens` takes when admitted, growing to at most
        `final_len`: paging takes the prompt's frames now and the rest on demand."""
        return self.frames_for(num_tokens)

    def can_reserve(self, num_frames: int) -> bool:
        """Could `num_frames` free frames be taken as one piece? Paging: any frames will
        do (a contiguous allocator answers otherwise, and counts its refusals)."""
        return num_frames <= self.num_free_frames

    def can_allocate(self, num_tokens: int) -> bool:
        """Would a prompt of `num_tokens` fit now, even with no prefix-cache hit?"""
        check_size("num_tokens", num_tokens, minimum=0)
        return self.frames_for(num_tokens) <= self.num_free_frames

    def allocate(
        self,
        seq_id: SeqId,
        token_ids: Sequence[int],
        final_len: int = 0,
        read_cache: bool = True,
    ) -> int:
        """Map a new sequence's prompt, reusing the frames of its longest cached prefix
        (`final_len`, the longest it may grow, is for allocators that reserve up front).
        Returns how many leading tokens are cache hits (whole blocks, and always fewer
        than len(token_ids): the model must compute the last token to get its logits).
        Compute the K and V of the rest: slots(seq_id, hits, len(token_ids)) gives where
        they go. read_cache False: no hits (the model must compute every token: prompt
        logprobs).
        """
        if seq_id in self.tables:
            raise ValueError(
                f"sequence {seq_id!r} already exists: free() it first or use a new id"
            )
        token_ids = list(token_ids)
        if not token_ids:
            raise ValueError(
                f"sequence {seq_id!r} has no tokens: a prompt needs at least one"
            )
        # (pool frame, None) or (None, tier frame)
        found = self._cached_prefix(token_ids) if read_cache else []
        hits = [frame for frame, _ in found if frame is not None]
        # leave the free count
        revived = sum(self.device.ref_counts[frame] == 0 for frame in hits)
        needed = self.frames_for(len(token_ids)) - len(hits)
        if needed + revived > self.num_free_frames:
            raise NoFreeFramesError(
                f"sequence {seq_id!r} needs {needed} new frames "
                f"but {self.num_free_frames - revived} are free"
            )
        table, loads = BlockTable(self.device), [t for _, t in found if t is not None]
        # pinned first, so allocating cannot evict them (nor store over a load)
        self._pin(hits, loads)
        for i, (frame, tier_frame) in enumerate(found):
            block = token_ids[i * self.block_size : (i + 1) * self.block_size]
            if frame is not None:
                table.append_cached_block(frame, block)
            else:
                self._load_block(table, tier_frame, block)
        self._unpin(hits)
        for token_id in token_ids[len(found) * self.block_size :]:
            table.append_slot(token_id)
        self.tables[seq_id] = table
        if self.device.prefix_cache is not None:
            self.prefix_cache_queries += len(token_ids)
            self.prefix_cache_hits += len(hits) * self.block_size
        if self.tier is not None:
            self.tier_queries += len(token_ids) - len(hits) * self.block_size
            self.tier_hits += len(loads) * self.block_size
        return len(found) * self.block_size

    def can_append_slots(self, *seq_ids: SeqId) -> bool:
        """Would one more token for each of these sequences fit now (appended in this
        order)?"""
        return (
            self._append_cost([self._device_table(s) for s in seq_ids])
            <= self.num_free_frames
        )

    def append_slot(self, seq_id: SeqId, token_id: int) -> tuple[int, CowPair | None]:
        """Place one new token: returns its slot, and the (src, dst) copy-on-write pair
        when its block was shared; apply the pair (KVCache.apply) before writing the
        token's K and V.
        """
        return self._device_table(seq_id).append_slot(token_id)

    # ---- speculative decoding: slots for guesses, then rollback of the wrong ones ----
    def append_guess_slots(self, seq_id: SeqId, n: int) -> tuple[int, list[CowPair]]:
        """Take slots for up to `n` guessed tokens after the sequence's tokens, while
        frames are free (a guess never preempts anyone): how many it took, and the
        copy-on-write pairs to apply first. Their blocks are not offered to the prefix
        cache; settle_guesses() ends them.
        """
        table, cows = self._device_table(seq_id), []
        for taken in range(n):
            try:
                _, cow = table.append_guess_slot()
            except NoFreeFramesError:
                return taken, cows
            cows += [cow] if cow else []
        return n, cows

    def settle_guesses(self, seq_id: SeqId, accepted: Sequence[int]) -> None:
        """The first len(accepted) guessed slots hold these accepted tokens; the rest
        are rolled back (frames left empty are freed). Full blocks of accepted tokens
        are named only now.
        """
        self._device_table(seq_id).settle_guesses(list(accepted))

    def rollback(self, seq_id: SeqId, num_tokens: int) -> None:
        """Keep the sequence's first `num_tokens` slots and drop the rest: frames left
        empty are freed, and a cached block cut short is forgotten (its tail will be
        written again).
        """
        table = self._device_table(seq_id)
        if not 0 <= num_tokens <= table.num_tokens:
            raise ValueError(
                f"sequence {seq_id!r} holds {table.num_tokens} slots; cannot keep"
                f" {num_tokens}"
            )
        table.truncate(num_tokens)

    def num_guesses(self, seq_id: SeqId) -> int:
        """Slots held for guessed tokens not settled yet (0 between steps)."""
        return self._table(seq_id).guesses

    def fork(self, parent_id: SeqId, child_id: SeqId) -> None:
        """A child sequence sharing all of the parent's frames (parallel sampling,
        beams)."""
        if child_id in self.tables:
            raise ValueError(
                f"cannot fork into {child_id!r}: that sequence already exists"
            )
        self.tables[child_id] = self._table(parent_id).fork()

    def free(self, seq_id: SeqId, num_computed: int | None = None) -> None:
        """The sequence finished or is preempted by recompute: release its frames. Give
        `num_computed` when fewer of its tokens have K and V than it maps (a prompt
        aborted between chunks): the prefix cache then forgets the blocks that were
        never written.
        """
        table = self._table(seq_id)
        cache = table.allocator.prefix_cache
        if cache is not None and num_computed is not None:
            for frame in table.frames[num_computed // self.block_size :]:
                cache.forget(frame)
        table.free()
        del self.tables[seq_id]

    def swap_out(self, *seq_ids: SeqId) -> list[tuple[int, int]]:
        """Move these sequences to the host pool (preemption by swap). Returns
        (device_frame, host_frame) pairs for KVCache.swap_out, to apply before the next
        forward step. Pass all sequences of a group at once: a frame they share then
        moves once and stays shared.
        """
        return self._move(seq_ids, self.device, self.host)

    def can_swap_out(self, *seq_ids: SeqId) -> bool:
        """Would the host pool hold these sequences' frames (shared ones once)?"""
        return len(self._distinct_frames(seq_ids)) <= self.host.num_free

    def can_swap_in(self, *seq_ids: SeqId) -> bool:
        """Would these swapped-out sequences fit back, with room for one more token
        each?"""
        more = self._append_cost([self._table(s) for s in seq_ids])
        return len(self._distinct_frames(seq_ids)) + more <= self.num_free_frames

    def swap_in(self, *seq_ids: SeqId) -> list[tuple[int, int]]:
        """Bring swapped-out sequences back: returns (host_frame, device_frame) pairs
        for KVCache.swap_in."""
        return self._move(seq_ids, self.host, self.device)

    def is_swapped(self, seq_id: SeqId) -> bool:
        return self._table(seq_id).allocator is self.host

    def block_table(self, seq_id: SeqId) -> list[int]:
        """The frames of a sequence on the device, in logical order."""
        return list(self._device_table(seq_id).frames)

    def num_tokens(self, seq_id: SeqId) -> int:
        """Tokens the sequence's table holds (its K and V written, or slots given for
        them)."""
        return self._table(seq_id).num_tokens

    def slots(self, seq_id: SeqId, start: int, end: int) -> list[int]:
        """The KV slots (frame * block_size + offset) of the sequence's tokens
        start..end-1."""
        table = self._device_table(seq_id)
        if not 0 <= start <= end <= table.num_tokens:
            raise ValueError(
                f"sequence {seq_id!r} holds {table.num_tokens} tokens; it has no "
                f"slots for tokens {start}..{end - 1}"
            )
        return [table.slot(p) for p in range(start, end)]

    def frame_owners(self) -> dict[int, list[SeqId]]:
        """Device frame -> the sequences that map it (for pictures and checks)."""
        owners: dict[int, list[SeqId]] = {}
        for seq_id, table in self.tables.items():
            if table.allocator is self.device:
                for frame in table.frames:
                    owners.setdefault(frame, []).append(seq_id)
        return owners

    def usage(self) -> MemoryUsage:
        """Accounting of the device pool. Every block but a sequence's last is full, so
        the waste is the tails of last blocks (a shared last frame counted once)."""
        tails = {
            t.frames[-1]: len(t.frames) * self.block_size - t.num_tokens
            for t in self.tables.values()
            if t.allocator is self.device and t.frames
        }
        allocated = (self.device.num_blocks - self.device.num_free) * self.block_size
        waste = sum(tails.values())
        return MemoryUsage(
            total_slots=self.device.num_blocks * self.block_size,
            allocated_slots=allocated,
            token_slots=allocated - waste,
            internal_waste=waste,
            reserved_unused=0,
            shared_frames=int(np.count_nonzero(self.device.ref_counts > 1)),
        )

    def cached_frames(self, token_ids: Sequence[int]) -> list[int]:
        """Frames of the prefix cache holding the longest run of full blocks that starts
        `token_ids`, in logical order: the page table a sequence of these tokens would
        get for free, even after every sequence that wrote those frames was freed. Looks
        only: no ref count and no LRU position changes."""
        return [frame for frame, _ in self._cached_blocks(list(token_ids), None)]

    def _cached_blocks(
        self, token_ids: list[int], tier: Drum | None
    ) -> list[tuple[int | None, int | None]]:
        """The longest run of full blocks starting `token_ids` that the pool or `tier`
        holds: per block (pool frame, None), or (None, tier frame) when only the tier
        has it. Looks only.
        """
        cache, found, prev = self.device.prefix_cache, [], None
        if cache is None:
            return found
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            block = token_ids[start : start + self.block_size]
            frame = cache.lookup(prev, block)
            tier_frame = (
                tier.lookup(prev, block) if frame is None and tier is not None else None
            )
            if frame is None and tier_frame is None:
                break
            found.append((frame, tier_frame))
            prev = block_hash(prev, block)
        return found

    def _cached_prefix(
        self, token_ids: list[int]
    ) -> list[tuple[int | None, int | None]]:
        """_cached_blocks() of the pool and the tier within the prompt's first len - 1
        tokens (the last token is always computed: the model needs its logits)."""
        return self._cached_blocks(token_ids[:-1], self.tier)

    def reset_prefix_cache(self) -> int:
        """Drop every cached block no sequence maps (vLLM's POST /reset_prefix_cache,
        SGLang's /flush_cache) and return how many: their frames go back to the free
        list. Blocks that sequences map stay cached, where vLLM refuses a reset while
        blocks are in use and SGLang flushes only when idle; the tier keeps its blocks.
        """
        cache = self.device.prefix_cache
        if cache is None:
            return 0
        frames = cache.drop_parked()
        self.device.free_frames.extend(frames)
        return len(frames)

    def add_cache_listener(self, listener) -> None:
        """Tell `listener` each prefix-cache event, of the pool and of the tier behind
        it: stored(block, parent, token_ids, medium=POOL), removed(block, medium=POOL),
        cleared() (see PrefixCache.listeners)."""
        cache = self.device.prefix_cache
        if cache is None:
            raise ValueError(
                "KV cache events come from the prefix cache: turn on"
                " enable_prefix_caching (and use the paged block manager)"
            )
        cache.listeners.append(listener)

    # ---- the tier behind the pool (the drum) -----------------------------------------
    def add_tier(self, num_frames: int) -> None:
        """Put a tier of `num_frames` frames behind the prefix cache: a block the pool
        evicts is copied there, and a prompt that finds it there gets it copied back,
        not recomputed. KVCache needs as many tier frames (its num_tier_blocks)."""
        if self.device.prefix_cache is None:
            raise ValueError(
                "a tier keeps the prefix cache's evicted blocks: it needs"
                " enable_prefix_caching=True"
            )
        self.tier = self.device.prefix_cache.tier = Drum(num_frames)
        # one list: a listener added before or after hears the tier too
        self.tier.listeners = self.device.prefix_cache.listeners

    @property
    def num_tier_frames(self) -> int:
        """Frames in the tier behind the pool (0 without one)."""
        return self.tier.num_frames if self.tier is not None else 0

    def take_tier_moves(self) -> list[TierMove]:
        """The tier's stores and loads decided since the last call, in order, for the
        next step's MemoryMoves.tier (none without a tier)."""
        return self.tier.take_moves() if self.tier is not None else []

    def _load_block(self, table: BlockTable, tier_frame: int, block: list[int]) -> None:
        """Map a block found in the tier: a new frame (taken at its first token, named
        at its
        last, as a computed block is), its K and V to be loaded from `tier_frame`."""
        for token_id in block:
            table.append_slot(token_id)
        self.tier.load(tier_frame, table.frames[-1])

    def _pin(self, frames: list[int], tier_frames: list[int]) -> None:
        """Hold a prompt's hits while its new frames are taken: pool frames by one more
        reference, tier frames against being stored over before they are loaded."""
        for frame in frames:
            self.device.incref(frame)
        if self.tier is not None:
            self.tier.pinned = set(tier_frames)

    def _unpin(self, frames: list[int]) -> None:
        for frame in frames:
            self.device.free(frame)
        if self.tier is not None:
            self.tier.pinned = set()

    def _move(
        self, seq_ids, src: BlockAllocator, dst: BlockAllocator
    ) -> list[tuple[int, int]]:
        """Copy-by-bookkeeping of whole tables from one pool to the other; returns (src,
        dst) frames."""
        tables = [self._table(s) for s in dict.fromkeys(seq_ids)]
        where = "device" if src is self.device else "host"
        if any(t.allocator is not src for t in tables):
            raise ValueError(
                f"sequences {list(seq_ids)} are not all in the {where} pool: "
                "swap_out() takes sequences on the device, swap_in() swapped-out ones"
            )
        needed = len(self._distinct_frames(seq_ids))
        if needed > dst.num_free:
            raise NoFreeFramesError(
                f"swapping {list(seq_ids)} needs {needed} frames; "
                f"the other pool has {dst.num_free} free"
            )
        moved: dict[int, int] = {}
        for table in tables:
            for i, frame in enumerate(table.frames):
                if frame in moved:
                    dst.incref(moved[frame])
                else:
                    moved[frame] = dst.allocate()
                src.free(frame)
                table.frames[i] = moved[frame]
            table.allocator = dst
        return list(moved.items())

    def _append_cost(self, tables: list[BlockTable]) -> int:
        """Frames that one more token in each table takes, appended in order: a new
        frame for each table whose last frame is full, and a copy for each writer of a
        shared partial last frame, except the last writer when no table outside the
        group maps it (it then owns the frame alone and writes in place)."""
        if len(tables) == 1:  # the common case, without the Counter
            return int(
                not tables[0].last_frame_has_room or tables[0].last_frame_shared()
            )
        new = sum(not t.last_frame_has_room for t in tables)
        writers = Counter(
            (t.allocator, t.frames[-1]) for t in tables if t.last_frame_has_room
        )
        copies = sum(
            n - (pool.ref_count(frame) == n) for (pool, frame), n in writers.items()
        )
        return new + copies

    def _distinct_frames(self, seq_ids) -> set[int]:
        return {frame for s in seq_ids for frame in self._table(s).frames}

    def _table(self, seq_id: SeqId) -> BlockTable:
        if seq_id not in self.tables:
            raise ValueError(
                f"unknown sequence {seq_id!r}: it was never allocated, or it was freed"
            )
        return self.tables[seq_id]

    def _device_table(self, seq_id: SeqId) -> BlockTable:
        table = self._table(seq_id)
        if table.allocator is not self.device:
            raise ValueError(
                f"sequence {seq_id!r} is swapped out to host memory: swap_in() it first"
            )
        return table

    # ---- views: copies of the state for pictures, dashboards and notebooks -----------
    # Code outside paging/ reads the manager through these and the
    # public methods above, never through its tables or pools.

    def seq_ids(self) -> list[SeqId]:
        """The sequences that hold a block table (on the device or swapped out), oldest
        first."""
        return list(self.tables)

    def frame_states(self) -> list[FrameState]:
        """Every device frame, in order: who maps it, and whether the prefix cache keeps
        it."""
        owners, cache = self.frame_owners(), self.device.prefix_cache
        return [
            FrameState(
                frame,
                owners.get(frame, []),
                cached=cache is not None and cache.is_parked(frame),
            )
            for frame in range(self.num_frames)
        ]

    def held_frame_states(self) -> list[FrameState]:
        """frame_states() of the frames that are not free (mapped, or kept by the prefix
        cache), in order: its cost grows with the frames in use, not with the pool, so a
        dashboard can ask after every step of a pool of a hundred thousand frames."""
        owners, cache = self.frame_owners(), self.device.prefix_cache
        parked = set(cache.evictable) if cache is not None else set()
        return [
            FrameState(frame, owners.get(frame, []), cached=frame in parked)
            for frame in sorted(owners.keys() | parked)
        ]

    def unshared_frames(self) -> int:
        """Frames the sequences would hold with private copies, none shared: what fork()
        and the prefix cache save is this minus the frames in use."""
        return sum(len(table.frames) for table in self.tables.values())

    def table_view(self, seq_id: SeqId) -> TableView:
        """The page table of one sequence, with each frame's ref count."""
        table = self._table(seq_id)
        return TableView(
            seq_id,
            list(table.frames),
            table.num_tokens,
            swapped=self.is_swapped(seq_id),
            ref_counts=[table.allocator.ref_count(frame) for frame in table.frames],
            guesses=table.guesses,
        )
