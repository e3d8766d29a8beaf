"""The properties of labs 1-3 (demand paging; fork and copy-on-write; the prefix cache),
each tried on small inputs that a participant can redo by hand, large enough that the
right rule and its likely neighbours differ. `m` is their module (or the engine's own
pieces, for --solution): m.BlockAllocator, m.BlockTable, m.PrefixCache, m.block_hash.
"""

from __future__ import annotations

import random

import numpy as np

from minipaged import paging
from minipaged.paging import NoFreeFramesError, cdiv
from minipaged.tools.lab.grading import Failed, Property, in_one_line
from minipaged.tools.lab.plug import plugged
from minipaged.tools.viz.pages import plural


def _ints(values) -> list:
    """Plain ints for a message (never np.int32(0)); None stays None."""
    return [None if v is None else int(v) for v in values]


def _cow(cow):
    """A copy-on-write pair as plain ints, for a message."""
    return (
        None
        if cow is None
        else tuple(_ints(cow))
        if isinstance(cow, (tuple, list))
        else cow
    )


def _spaced(values) -> str:
    return " ".join(map(str, values))


def _expect_error(call, kind, given: str, what: str) -> None:
    try:
        call()
    except kind:
        return
    except (
        NotImplementedError,
        TimeoutError,
    ):  # not written yet, or a loop: the grader says so
        raise
    except Exception as error:
        raise Failed(
            given, f"expected {kind.__name__} ({what}), got {in_one_line(error)}"
        ) from None
    raise Failed(given, f"expected {kind.__name__} ({what}), but nothing was raised")


def _filled(
    m, num_blocks: int, block_size: int, num_tokens: int, first_token: int = 100
):
    allocator = m.BlockAllocator(num_blocks, block_size)
    table = m.BlockTable(allocator)
    for i in range(num_tokens):
        table.append_slot(first_token + i)
    return allocator, table


def _mapped(m, num_blocks: int, block_size: int, num_tokens: int):
    """A table holding num_tokens tokens, its frames allocated by hand (no append_slot:
    lab 2's properties then depend on lab 2's methods only)."""
    pool = m.BlockAllocator(num_blocks, block_size)
    tokens = [100 + i for i in range(num_tokens)]
    hashes, prev = [], None
    for start in range(0, num_tokens - block_size + 1, block_size):
        prev = paging.block_hash(prev, tokens[start : start + block_size])
        hashes.append(prev)
    frames = [pool.allocate() for _ in range(cdiv(num_tokens, block_size))]
    return pool, m.BlockTable(pool, frames, tokens, hashes)


# ---- lab 1: demand paging ------------------------------------------------------------


def allocate_hands_out_each_frame_once(m) -> None:
    pool = m.BlockAllocator(4, 2)
    given = "a pool of 4 frames, allocate() called 4 times"
    frames = _ints(pool.allocate() for _ in range(4))
    if sorted(frames) != [0, 1, 2, 3]:
        raise Failed(given, f"expected frames 0, 1, 2, 3 (in any order), got {frames}")
    refs = _ints(pool.ref_count(f) for f in frames)
    if refs != [1] * 4:
        raise Failed(given, f"each ref count should be 1, got {refs}")
    if pool.num_free != 0:
        raise Failed(
            given,
            f"num_free should be 0, got {pool.num_free}: take each frame out of"
            " self.free_frames",
        )
    if pool.num_allocated != 4:
        raise Failed(
            given,
            "num_allocated should be 4 after 4 allocates, got"
            f" {int(pool.num_allocated)}: count each allocate in self.num_allocated"
            " (the engine reports it every step)",
        )


def allocate_on_a_full_pool_raises(m) -> None:
    pool = m.BlockAllocator(2, 2)
    pool.allocate(), pool.allocate()
    given = "a pool of 2 frames, both allocated, allocate() once more"
    before = (int(pool.num_allocated), _ints(pool.ref_counts), _ints(pool.free_frames))
    _expect_error(
        pool.allocate, NoFreeFramesError, given, "the scheduler catches it and preempts"
    )
    after = (int(pool.num_allocated), _ints(pool.ref_counts), _ints(pool.free_frames))
    changed = [
        f"{name} went from {old} to {new}"
        for name, old, new in zip(
            ("num_allocated", "ref counts", "the free list"), before, after
        )
        if old != new
    ]
    if changed:
        raise Failed(
            given,
            f"the failed allocate changed the pool ({'; '.join(changed)}): check for a"
            " free frame before changing anything",
        )


def free_returns_the_frame(m) -> None:
    pool = m.BlockAllocator(2, 2)
    first, _ = pool.allocate(), pool.allocate()
    first = int(first)
    pool.free(first)
    given = f"a pool of 2 frames, both allocated, then free({first})"
    got = (pool.ref_count(first), pool.num_free, int(pool.num_released))
    if got != (0, 1, 1):
        raise Failed(
            given,
            f"expected ref count 0, num_free 1, num_released 1; got {got[0]}, {got[1]},"
            f" {got[2]}",
        )
    again = pool.allocate()
    if again != first:
        raise Failed(
            given + ", then allocate()",
            f"the freed frame {first} should be handed out again, got {again}",
        )
    pool.free(again)
    _expect_error(
        lambda: pool.free(again),
        ValueError,
        given + f", allocate() and free({first}) twice",
        "a double free is a bug in the caller",
    )


def free_of_a_shared_frame_waits_for_its_last_user(m) -> None:
    pool = m.BlockAllocator(3, 2)
    frame = int(pool.allocate())
    pool.incref(frame)  # lab 1: the engine's incref; lab 2: theirs
    given = (
        f"a pool of 3 frames, frame {frame} allocated and shared (incref: ref count 2),"
        f" then free({frame})"
    )
    pool.free(frame)
    if (
        pool.ref_count(frame) != 1
        or frame in pool.free_frames
        or pool.num_free != 2
        or pool.num_released != 0
    ):
        raise Failed(
            given,
            f"another table still maps frame {frame}: expected ref count 1, the frame"
            " not in the free list, num_free 2, num_released 0; got ref count"
            f" {pool.ref_count(frame)}, free list {_ints(pool.free_frames)}, num_free"
            f" {pool.num_free}, num_released {int(pool.num_released)} (only a free that"
            " brings the count to 0 gives the frame back)",
        )
    pool.free(frame)
    given += " twice"
    if (
        pool.ref_count(frame) != 0
        or list(pool.free_frames).count(frame) != 1
        or pool.num_released != 1
    ):
        raise Failed(
            given,
            f"the last user freed frame {frame}: expected ref count 0, the frame once"
            f" in the free list, num_released 1; got ref count {pool.ref_count(frame)},"
            f" free list {_ints(pool.free_frames)}, num_released"
            f" {int(pool.num_released)}",
        )


def slot_is_frame_times_block_size_plus_offset(m) -> None:
    pool = m.BlockAllocator(8, 4)
    table = m.BlockTable(pool, frames=[5, 2, 7], token_ids=list(range(10)))
    expected = {p: [5, 2, 7][p // 4] * 4 + p % 4 for p in (0, 3, 4, 5, 9)}
    got = {p: table.slot(p) for p in expected}
    if got != expected:
        raise Failed(
            "block_size 4, a table mapping frames [5, 2, 7]",
            "slot(0), slot(3), slot(4), slot(5), slot(9) should be"
            f" {list(expected.values())}, got {_ints(got.values())}",
        )


def append_takes_a_frame_only_when_the_last_is_full(m) -> None:
    # room for a frame per token: a wrong append is seen, not starved
    pool = m.BlockAllocator(16, 4)
    table = m.BlockTable(pool)
    given = "block_size 4, 10 tokens appended to a new table"
    counts, named, slots = [], [], []
    for i in range(10):
        try:
            slot, cow = table.append_slot(100 + i)
        except (
            IndexError
        ) as error:  # their slot() asked for a frame their append did not take
            raise Failed(
                given,
                f"append_slot({100 + i}) (position {i}, logical block {i // 4}) raised"
                f" {in_one_line(error)}; the table maps"
                f" {plural(len(table.frames), 'frame')} after it, position {i} needs"
                f" {i // 4 + 1}: take the new frame when the token's offset is 0,"
                " before the token is appended",
            ) from None
        counts.append(len(table.frames))
        named.append(len(table.block_hashes))
        slots.append(slot)
        if cow is not None:
            raise Failed(
                given,
                f"append_slot({100 + i}) returned a copy {_cow(cow)}; nothing is shared"
                " here, so it should return (slot, None)",
            )
    if counts != [1, 1, 1, 1, 2, 2, 2, 2, 3, 3]:
        raise Failed(
            given,
            "frames mapped after each append_slot(token) should be 1 1 1 1 2 2 2 2 3"
            f" 3, got {_spaced(counts)}",
        )
    if pool.num_allocated != 3:
        raise Failed(
            given, f"3 frames should have been allocated, got {int(pool.num_allocated)}"
        )
    if table.token_ids != [100 + i for i in range(10)]:
        raise Failed(
            given,
            "token_ids should be the 10 tokens 100..109 in order, got"
            f" {_ints(table.token_ids)}",
        )
    where = [table.slot(p) for p in range(10)]
    if _ints(slots) != _ints(where):
        raise Failed(
            given,
            f"append_slot returned slots {_ints(slots)}, but slot(position) says"
            f" {_ints(where)}",
        )
    if named != [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]:
        raise Failed(
            given,
            "blocks named after each append_slot(token) should be 0 0 0 1 1 1 1 2 2 2"
            " (call self._name_full_blocks() when the token fills its block, at offset"
            f" 3), got {_spaced(named)}",
        )


def append_copies_a_shared_last_frame(m) -> None:
    # the engine's fork builds the child by the name BlockTable: theirs
    with plugged(1, m):
        pool, parent = _filled(m, 8, 4, 3)
        shared = int(parent.frames[-1])
        child = parent.fork()
        given = (
            f"block_size 4, a table of 3 tokens in frame {shared}, fork(), then one"
            " append to the child"
        )
        slot, cow = child.append_slot(9)
        if cow is None or int(cow[0]) != shared or int(cow[1]) == shared:
            raise Failed(
                given,
                f"frame {shared} is shared (ref count 2), so append_slot(9) should"
                f" return (slot, ({shared}, new frame)) from cow ="
                f" self._copy_on_write(); it returned copy {_cow(cow)}",
            )
        copy = int(cow[1])
        if _ints(child.frames) != [copy] or _ints(parent.frames) != [shared]:
            raise Failed(
                given,
                f"the child should map the copy {copy} and the parent keep {shared};"
                f" child {_ints(child.frames)}, parent {_ints(parent.frames)}",
            )
        if slot != copy * 4 + 3:
            raise Failed(
                given,
                f"the token goes to slot {copy * 4 + 3} (offset 3 of the copy), got"
                f" {slot}",
            )
        if parent.append_slot(10)[1] is not None:
            raise Failed(
                given + ", then one append to the parent",
                f"frame {shared} is the parent's alone now: no copy",
            )
        _, full = _filled(m, 8, 4, 4)
        other = full.fork()
        _, cow = other.append_slot(9)
        given = (
            "block_size 4, a table of 4 tokens (its frame is full), fork(), then one"
            " append to the child"
        )
        if cow is not None or len(other.frames) != 2:
            raise Failed(
                given,
                "the token starts a new block: append_slot(9) takes a new frame and"
                " copies nothing (nothing is written into the full frame); got copy"
                f" {_cow(cow)}, child frames {_ints(other.frames)}",
            )


def append_on_a_full_pool_changes_nothing(m) -> None:
    pool, table = _filled(m, 1, 2, 2)
    given = "a pool of 1 frame of 2 slots, a table holding 2 tokens, one more append"
    _expect_error(
        lambda: table.append_slot(7), NoFreeFramesError, given, "no frame is free"
    )
    if table.num_tokens != 2 or len(table.frames) != 1:
        raise Failed(
            given,
            "the failed append changed the table: it holds"
            f" {plural(table.num_tokens, 'token')} in"
            f" {plural(len(table.frames), 'frame')}, expected 2 tokens in 1 frame",
        )
    with plugged(1, m):
        pool, parent = _filled(m, 1, 2, 1)
        child = parent.fork()
        given = (
            "a pool of 1 frame of 2 slots, a table holding 1 token, fork(), then one"
            " append to the child"
        )
        _expect_error(
            lambda: child.append_slot(7),
            NoFreeFramesError,
            given,
            "the copy needs a frame",
        )
        if child.num_tokens != 1 or _ints(child.frames) != _ints(parent.frames):
            raise Failed(
                given,
                "the failed copy changed the child: it holds"
                f" {plural(child.num_tokens, 'token')} in frames {_ints(child.frames)},"
                f" expected 1 token in {_ints(parent.frames)} (call _copy_on_write"
                " before appending the token)",
            )


def table_free_releases_every_frame(m) -> None:
    released = []

    class Pool(m.BlockAllocator):  # theirs, noting the order of the frees
        def free(self, frame):
            released.append(int(frame))
            super().free(frame)

    pool = Pool(4, 2)
    table = m.BlockTable(pool)
    for i in range(5):
        table.append_slot(100 + i)
    frames = _ints(table.frames)
    table.free()
    given = f"block_size 2, a table holding 5 tokens in frames {frames}, then free()"
    if table.frames or pool.num_free != 4 or int(pool.ref_counts.sum()) != 0:
        raise Failed(
            given,
            "expected no frames left, 4 free and every ref count 0; got frames"
            f" {_ints(table.frames)}, {pool.num_free} free, ref counts"
            f" {_ints(pool.ref_counts)}",
        )
    if released != frames[::-1]:
        raise Failed(
            given,
            f"the frames should be freed last block first, {frames[::-1]} (the prefix"
            " cache then keeps a prompt's first blocks longest); they were freed"
            f" {released}",
        )


# ---- random mixes of new tables, appends, forks and frees: a toy KV cache checks every
# read ------


def _ops(rng: random.Random, length: int, fork: bool) -> list[tuple[str, int]]:
    kinds = ["new", "append", "append", "append", "free"] + ["fork"] * fork
    return [(rng.choice(kinds), rng.randrange(4)) for _ in range(length)]


def _replay(m, ops, num_blocks: int, block_size: int, done: list[str]) -> str | None:
    """Run the ops, saying each in `done`; after each, every table must read back its
    own tokens through its slots (a toy KV cache where the token id is the 'K and V'),
    and ref counts must match the tables. Returns what went wrong, or None."""
    pool = m.BlockAllocator(num_blocks, block_size)
    kv = np.full(num_blocks * block_size, -1)
    tables, token = [], 0
    for kind, pick in ops:
        live = [t for t in tables if t is not None]
        if kind == "new" or not live:
            tables.append(m.BlockTable(pool))
            done.append(f"T{len(tables) - 1} = new table")
            continue
        table = live[pick % len(live)]
        name = f"T{tables.index(table)}"
        done.append(
            {"fork": f"T{len(tables)} = {name}.fork()", "free": f"{name}.free()"}.get(
                kind, f"{name}.append"
            )
        )
        if kind == "fork":
            tables.append(table.fork())
        elif kind == "free":
            table.free()
            tables[tables.index(table)] = None
        else:
            before = (list(table.frames), table.num_tokens)
            token += 1
            try:
                slot, cow = table.append_slot(token)
            except NoFreeFramesError:
                if (list(table.frames), table.num_tokens) != before:
                    return "an append that raised NoFreeFramesError changed the table"
                continue
            if cow is not None:
                src, dst = cow
                kv[dst * block_size : (dst + 1) * block_size] = kv[
                    src * block_size : (src + 1) * block_size
                ]
            kv[slot] = token
        problem = _check_state(
            pool, [t for t in tables if t is not None], kv, num_blocks, block_size
        )
        if problem:
            return problem
    return None


def _check_state(pool, live, kv, num_blocks: int, block_size: int) -> str | None:
    mapped = np.zeros(num_blocks, dtype=int)
    for table in live:
        if len(table.frames) != cdiv(table.num_tokens, block_size):
            return (
                f"a table holds {plural(table.num_tokens, 'token')} in"
                f" {plural(len(table.frames), 'frame')}; at {block_size} slots a frame"
                f" that is {cdiv(table.num_tokens, block_size)}"
            )
        for frame in set(table.frames):
            mapped[frame] += table.frames.count(frame)
        read = [int(kv[table.slot(p)]) for p in range(table.num_tokens)]
        if read != _ints(table.token_ids):
            return (
                f"a table reads tokens {read} through its slots but holds"
                f" {_ints(table.token_ids)}: another table wrote into a frame it shares"
                " (copy-on-write) or a frame was reused while mapped"
            )
    if _ints(mapped) != _ints(pool.ref_counts):
        return (
            f"ref counts {_ints(pool.ref_counts)}, but the tables map the frames"
            f" {_ints(mapped)} times"
        )
    free = sorted(_ints(pool.free_frames))
    unmapped = [f for f in range(num_blocks) if mapped[f] == 0]
    if free != unmapped:
        return f"the free list holds {free}, but the unmapped frames are {unmapped}"
    return None


def _describe(done: list[str]) -> str:
    """'T0 = new table; T0.append x3; ...': runs of one op said once."""
    said = []
    for step in done:
        if said and said[-1][0] == step:
            said[-1][1] += 1
        else:
            said.append([step, 1])
    return "; ".join(step + (f" x{n}" if n > 1 else "") for step, n in said)


def random_mixes(lab: int, fork: bool):
    def check(m) -> None:
        worst = None
        with plugged(lab, m):  # a forked child is their BlockTable too
            for seed in range(40):
                ops = _ops(random.Random(seed), 30, fork)
                done: list[str] = []
                try:
                    # stops at the first step that goes wrong
                    problem = _replay(m, ops, 6, 2, done)
                except (NotImplementedError, TimeoutError):
                    raise
                except Exception as error:
                    problem = f"your code raised {in_one_line(error)}"
                if problem and (worst is None or len(done) < len(worst[0])):
                    worst = (done, problem)
        if worst:
            raise Failed(
                f"a pool of 6 frames of 2 slots, these steps: {_describe(worst[0])}",
                worst[1],
            )

    return check


# ---- lab 2: fork and copy-on-write ---------------------------------------------------


def incref_of_a_free_frame_is_an_error(m) -> None:
    pool = m.BlockAllocator(3, 2)
    frame = int(pool.allocate())
    pool.incref(frame)
    given = f"a pool of 3 frames, frame {frame} allocated, then incref({frame})"
    if pool.ref_count(frame) != 2:
        raise Failed(
            given,
            f"two tables map frame {frame} now: its ref count should be 2, got"
            f" {pool.ref_count(frame)}",
        )
    free = int(next(iter(pool.free_frames)))
    _expect_error(
        lambda: pool.incref(free),
        ValueError,
        f"a pool of 3 frames, then incref({free}) of a free frame",
        "nobody can share a frame nobody maps",
    )
    if pool.ref_count(free) != 0 or pool.num_free != 2:
        raise Failed(
            f"a pool of 3 frames, then incref({free}) of a free frame",
            "the failed incref changed the pool",
        )


def fork_shares_every_frame(m) -> None:
    pool, parent = _mapped(m, 8, 4, 6)
    free_before = pool.num_free
    child = parent.fork()
    given = "block_size 4, a table of 6 tokens (2 frames), then fork()"
    if not isinstance(child, paging.BlockTable) or child is parent:
        raise Failed(given, f"fork() should return a new BlockTable, got {child!r}")
    if (
        _ints(child.frames) != _ints(parent.frames)
        or child.token_ids != parent.token_ids
    ):
        raise Failed(
            given,
            f"the child should map the parent's frames {_ints(parent.frames)} and hold"
            f" its tokens; it maps {_ints(child.frames)}",
        )
    if pool.num_free != free_before:
        raise Failed(
            given,
            f"fork took {plural(free_before - pool.num_free, 'frame')}: it should"
            " share, not copy",
        )
    refs = _ints(pool.ref_count(f) for f in parent.frames)
    if refs != [2, 2]:
        raise Failed(
            given,
            f"each shared frame should have ref count 2 (incref each), got {refs}",
        )


def the_child_has_its_own_lists(m) -> None:
    _, parent = _mapped(m, 8, 4, 6)
    child = parent.fork()
    given = "block_size 4, a table of 6 tokens, fork(), then one append to the child"
    child.append_slot(1)
    if parent.num_tokens != 6 or len(parent.frames) != 2:
        raise Failed(
            given,
            f"the parent changed (it holds {plural(parent.num_tokens, 'token')} in"
            f" {plural(len(parent.frames), 'frame')}): give the child copies of the"
            " lists",
        )
    if any(
        getattr(child, name) is getattr(parent, name)
        for name in ("frames", "token_ids", "block_hashes")
    ):
        raise Failed(
            given, "the child and the parent share a list object: give the child copies"
        )


def free_keeps_shared_frames_for_the_other_table(m) -> None:
    pool, parent = _mapped(m, 4, 4, 6)
    child = parent.fork()
    child.free()
    given = (
        "block_size 4, a table of 6 tokens (2 frames), forked, then the child's free()"
    )
    refs = _ints(pool.ref_count(f) for f in parent.frames)
    if refs != [1, 1] or any(f in pool.free_frames for f in parent.frames):
        raise Failed(
            given,
            "the parent still maps its frames: their ref counts should be 1 and they"
            f" may not be free; got ref counts {refs}, free list"
            f" {_ints(pool.free_frames)}",
        )


def last_frame_shared_says_who_shares(m) -> None:
    pool, parent = _mapped(m, 8, 4, 3)
    given = "block_size 4, a table of 3 tokens"
    if parent.last_frame_shared() or m.BlockTable(pool).last_frame_shared():
        raise Failed(
            given,
            "last_frame_shared() should be False before any fork (and for an empty"
            " table)",
        )
    child = parent.fork()
    if not (parent.last_frame_shared() and child.last_frame_shared()):
        raise Failed(
            given + ", then forked",
            "last_frame_shared() should be True for both tables",
        )
    pool, table = _mapped(m, 8, 4, 6)
    first, last = _ints(table.frames)
    pool.incref(first)
    prefix = m.BlockTable(pool, [first], table.token_ids[:4], table.block_hashes[:1])
    given = (
        f"block_size 4, a table of 6 tokens in frames [{first}, {last}], and a second"
        f" table mapping frame {first} only (ref counts 2 and 1)"
    )
    if table.last_frame_shared():
        raise Failed(
            given,
            "the first table's last_frame_shared() should be False: its last frame"
            f" {last} is its own (only frame {first} is shared; look at"
            " self.frames[-1]); True would copy the frame at every token",
        )
    if not prefix.last_frame_shared():
        raise Failed(
            given,
            "the second table's last_frame_shared() should be True: its last frame"
            f" {first} is shared",
        )


def writing_into_a_shared_frame_copies_it(m) -> None:
    pool, parent = _mapped(m, 8, 4, 3)
    child = parent.fork()
    shared = int(parent.frames[-1])
    slot, cow = child.append_slot(9)
    given = (
        f"block_size 4, a table of 3 tokens in frame {shared}, forked, then one append"
        " to the child"
    )
    if cow is None or int(cow[0]) != shared or int(cow[1]) == shared:
        raise Failed(
            given,
            f"append_slot should return (slot, ({shared}, new frame)) from"
            " self._copy_on_write(), so the KV cache copies the frame before the"
            f" write; it returned copy {_cow(cow)} (src first)",
        )
    copy = int(cow[1])
    if _ints(child.frames) != [copy] or _ints(parent.frames) != [shared]:
        raise Failed(
            given,
            f"the child should map the copy {copy} in place of {shared}"
            " (self._copy_on_write() replaces the last frame) and the parent keep"
            f" {shared}; child {_ints(child.frames)}, parent {_ints(parent.frames)}",
        )
    if (pool.ref_count(shared), pool.ref_count(copy)) != (1, 1):
        raise Failed(
            given,
            f"ref counts of {shared} and {copy} should be 1 and 1 (the child no longer"
            f" maps {shared}: self._copy_on_write() frees it), got"
            f" {pool.ref_count(shared)} and {pool.ref_count(copy)}",
        )
    if slot != copy * 4 + 3:
        raise Failed(
            given,
            f"the token goes to slot {copy * 4 + 3} (offset 3 of the copy), got {slot}",
        )
    if parent.append_slot(10)[1] is not None:
        raise Failed(
            given + ", then one append to the parent",
            "the parent's frame is no longer shared: no copy",
        )


def a_full_shared_frame_is_not_copied(m) -> None:
    pool, parent = _mapped(m, 8, 4, 4)
    child = parent.fork()
    _, cow = child.append_slot(9)
    given = (
        "block_size 4, a table of 4 tokens (its frame is full), forked, then one append"
        " to the child"
    )
    if (
        cow is not None
        or len(child.frames) != 2
        or pool.ref_count(parent.frames[0]) != 2
    ):
        raise Failed(
            given,
            "the token starts a new block: a new frame, no copy (no"
            " self._copy_on_write()), the full frame still shared; got copy"
            f" {_cow(cow)}, child frames {_ints(child.frames)}",
        )


def a_copy_without_a_free_frame_changes_nothing(m) -> None:
    pool, parent = _mapped(m, 1, 4, 3)
    child = parent.fork()
    given = (
        "a pool of 1 frame, a table of 3 tokens, forked, then one append to the child"
    )
    _expect_error(
        lambda: child.append_slot(9), NoFreeFramesError, given, "the copy needs a frame"
    )
    if (
        _ints(child.frames) != _ints(parent.frames)
        or pool.ref_count(parent.frames[0]) != 2
        or child.num_tokens != 3
    ):
        raise Failed(
            given,
            f"the failed copy changed something: child frames {_ints(child.frames)},"
            f" ref count {pool.ref_count(parent.frames[0])} (expected still shared, 2):"
            " self._copy_on_write() allocates the copy first",
        )


# ---- lab 3: the prefix cache ---------------------------------------------------------


def hash_is_a_pure_function_of_its_inputs(m) -> None:
    given = "block_hash(None, [1, 2]) and block_hash(None, (1, 2)), twice"
    a, b, c = (
        m.block_hash(None, [1, 2]),
        m.block_hash(None, (1, 2)),
        m.block_hash(None, [1, 2]),
    )
    if not isinstance(a, int) or not a == b == c:
        raise Failed(
            given,
            f"expected one int for a list and a tuple alike, every time; got {a!r},"
            f" {b!r}, {c!r}",
        )
    if m.block_hash(None, [1, 2]) == m.block_hash(None, [2, 1]):
        raise Failed(
            "block_hash(None, [1, 2]) and block_hash(None, [2, 1])",
            "different blocks got one name",
        )


def hash_chains_every_block_before(m) -> None:
    h = m.block_hash
    first_a, first_b = h(None, [1, 2]), h(None, [3, 4])
    given = "the block [5, 6] after [1, 2], after [3, 4], and first"
    names = {h(first_a, [5, 6]), h(first_b, [5, 6]), h(None, [5, 6])}
    if len(names) != 3:
        raise Failed(
            given,
            "the three got fewer than three names: a block's name must depend on the"
            " name of the block before it (prev_hash), or a prompt could hit another's"
            " K and V",
        )


def _lookups(cache, asked: list[tuple[str, tuple, object]]) -> list[str]:
    """'lookup(None, [1, 3]) gave 3, expected None' for each lookup that is wrong."""
    wrong = []
    for said, args, expected in asked:
        got = cache.lookup(*args)
        got = got if got is None else int(got)
        if got != expected:
            wrong.append(f"{said} gave {got}, expected {expected}")
    return wrong


def lookup_finds_what_insert_stored(m) -> None:
    cache = m.PrefixCache()
    first = cache.insert(3, None, [1, 2])
    given = "insert(3, None, [1, 2]), then insert(5, <its hash>, [3, 4])"
    if first != m.block_hash(None, [1, 2]):
        raise Failed(
            given, f"insert should return block_hash(None, [1, 2]), got {first!r}"
        )
    cache.insert(5, first, [3, 4])
    wrong = _lookups(
        cache,
        [
            ("lookup(None, [1, 2])", (None, [1, 2]), 3),
            ("lookup(<hash of [1, 2]>, [3, 4])", (first, [3, 4]), 5),
            ("lookup(None, [1, 3])", (None, [1, 3]), None),
            ("lookup(None, [3, 4]) (first, not after [1, 2])", (None, [3, 4]), None),
        ],
    )
    if wrong:
        raise Failed(given, "; ".join(wrong))
    given += ", then insert(7, None, [1, 2]) (the same block in another frame)"
    again = cache.insert(7, None, [1, 2])
    wrong = _lookups(cache, [("lookup(None, [1, 2])", (None, [1, 2]), 3)])
    if again != first or wrong:
        raise Failed(
            given,
            "the first copy (frame 3) stays the cached one, and insert still returns"
            f" the hash; {'; '.join(wrong) or 'insert returned ' + repr(again)}",
        )
    given = (
        "insert(3, None, [1, 2]), then insert(3, None, [8, 8]) (frame 3 is cached"
        " already)"
    )
    cache = m.PrefixCache()
    cache.insert(3, None, [1, 2])
    cache.insert(3, None, [8, 8])
    wrong = _lookups(
        cache,
        [
            ("lookup(None, [1, 2])", (None, [1, 2]), 3),
            ("lookup(None, [8, 8])", (None, [8, 8]), None),
        ],
    )
    if wrong:
        raise Failed(given, f"frame 3 keeps the block it holds; {'; '.join(wrong)}")


def lookup_compares_the_tokens(m) -> None:
    cache = m.PrefixCache()
    cache.insert(3, None, [1, 2])
    cache.frame_of[m.block_hash(None, [9, 9])] = 3  # as if [9, 9] hashed like [1, 2]
    given = "frame 3 holds [1, 2], and [9, 9] has the same hash (a collision)"
    got = cache.lookup(None, [9, 9])
    if got is not None:
        raise Failed(
            given,
            "lookup(None, [9, 9]) should be None: frame 3 does not hold [9, 9]"
            " (compare key_of[frame] with (prev_hash, tuple(token_ids))); it gave"
            f" {int(got)}",
        )


def _cached_pool(m, num_blocks: int, block_size: int = 2):
    # (plugged: their cache)
    return paging.BlockAllocator(num_blocks, block_size, enable_prefix_caching=True)


def _evicted_is_forgotten(cache, frame: int, block: str) -> str | None:
    """What evict left behind of `frame`'s old block, or None."""
    if frame in cache.key_of:
        return (
            f"key_of still holds frame {frame} (evict must pop it, or the frame can"
            " never cache a new block)"
        )
    if frame in cache.frame_of.values():
        return (
            f"frame_of still maps the hash of {block} to frame {frame} (evict must"
            " delete it)"
        )
    if frame in cache.evictable:
        return f"frame {frame} is still in evictable (evict must take it out)"
    return None


def released_blocks_stay_findable_until_evicted_lru_first(m) -> None:
    with plugged(3, m):
        pool = _cached_pool(m, 4)
        table = paging.BlockTable(pool)
        for token in (1, 2, 3, 4):
            table.append_slot(token)
        first, second = _ints(table.frames)
        try:
            table.free()  # last block first: `second` is parked before `first`
        except (NotImplementedError, TimeoutError):
            raise
        except Exception as error:
            raise Failed(
                "a pool of 4 frames of 2 slots, a table of tokens [1, 2, 3, 4] in"
                f" frames {first}, {second}",
                "freeing the table (the allocator calls park(frame) for each frame)"
                f" raised {in_one_line(error)}",
            ) from None
        given = (
            "a pool of 4 frames of 2 slots, a table of tokens [1, 2, 3, 4] in frames"
            f" {first}, {second}, freed"
        )
        cache, h = pool.prefix_cache, m.block_hash(None, [1, 2])
        asked = [
            ("lookup(None, [1, 2])", (None, [1, 2]), first),
            ("lookup(<hash of [1, 2]>, [3, 4])", (h, [3, 4]), second),
        ]
        wrong = _lookups(cache, asked)
        if pool.num_free != 4 or wrong:
            raise Failed(
                given,
                "both frames are free yet still findable (parked): num_free should be"
                f" 4, got {pool.num_free}{'; ' if wrong else ''}{'; '.join(wrong)}",
            )
        got = _ints(pool.allocate() for _ in range(3))
        given += ", then 3 allocates"
        if got[2] != second:
            raise Failed(
                given,
                "the two never-cached frames first, then evict() gives the least"
                f" recently parked, {second} (the tail block, freed first); got frames"
                f" {got}",
            )
        left = _evicted_is_forgotten(cache, second, "[3, 4]")
        if left:
            raise Failed(given, f"evict() gave frame {second}, but {left}")
        asked[1] = (asked[1][0], asked[1][1], None)
        wrong = _lookups(cache, asked)
        if wrong or pool.num_free != 1:
            raise Failed(
                given,
                f"[3, 4] is forgotten, [1, 2] still cached and frame {first} the one"
                f" free frame; {'; '.join(wrong) or f'num_free is {pool.num_free}'}",
            )


def an_evicted_frame_caches_its_new_block(m) -> None:
    with plugged(3, m):
        pool = _cached_pool(m, 2)
        old = paging.BlockTable(pool)
        old.append_slot(1), old.append_slot(2)
        reused = int(old.frames[0])
        old.free()
        new = paging.BlockTable(pool)
        for token in (5, 6, 7, 8):
            new.append_slot(token)
        given = (
            f"a pool of 2 frames of 2 slots: [1, 2] in frame {reused}, freed; then a"
            f" table of [5, 6, 7, 8] (its second block evicts frame {reused} and is"
            " written there)"
        )
        cache, h = pool.prefix_cache, m.block_hash(None, [5, 6])
        wrong = _lookups(
            cache,
            [
                ("lookup(None, [1, 2])", (None, [1, 2]), None),
                ("lookup(None, [5, 6])", (None, [5, 6]), int(new.frames[0])),
                ("lookup(<hash of [5, 6]>, [7, 8])", (h, [7, 8]), reused),
            ],
        )
        if wrong:
            raise Failed(
                given,
                f"{'; '.join(wrong)} (evict must forget all it knew of the frame, so"
                " that its new block is cached)",
            )
        new.free()
        given += ", freed, then 2 allocates"
        got = _ints(pool.allocate() for _ in range(2))
        if sorted(got) != [0, 1] or cache.evictable or cache.key_of or cache.frame_of:
            raise Failed(
                given,
                f"both parked frames are evicted and forgotten; got frames {got},"
                f" key_of {dict(cache.key_of)}, frame_of {dict(cache.frame_of)},"
                f" evictable {_ints(cache.evictable)}",
            )


def a_hit_revives_a_parked_frame(m) -> None:
    with plugged(3, m):
        pool = _cached_pool(m, 3)
        table = paging.BlockTable(pool)
        table.append_slot(1), table.append_slot(2)
        frame = int(table.frames[0])
        table.free()
        again = paging.BlockTable(pool)
        again.append_cached_block(frame, [1, 2])
        given = (
            f"a pool of 3 frames, block [1, 2] in frame {frame} freed, then mapped"
            " again by a hit"
        )
        got = _ints([pool.allocate(), pool.allocate()])
        if frame in got:
            raise Failed(
                given + ", then 2 allocates",
                f"allocate handed out frame {frame}, which a table maps: "
                "revive() must take it out of the evictable frames",
            )
        try:
            third = pool.allocate()
        except NoFreeFramesError:
            return
        raise Failed(
            given + ", then 3 allocates",
            "every frame is mapped, so the third should raise NoFreeFramesError; it"
            f" handed out frame {int(third)}, which a table maps: revive() must take it"
            " out of the evictable frames",
        )


def the_manager_finds_a_prompt_again(m) -> None:
    prompt = list(range(10, 20))
    with plugged(3, m):
        manager = paging.BlockManager(8, 4, enable_prefix_caching=True)
        manager.allocate("a", prompt)
        manager.free("a")
        hits = _ints(
            [
                manager.allocate("b", prompt),
                manager.allocate("c", [99] + prompt[1:]),
                manager.allocate("d", prompt[:4] + [77] * 6),
            ]
        )
    given = (
        "block_size 4, prompt a = 10..19 computed and freed; then b = the same, c = a"
        " with its first token changed, d = a's first 4 tokens and 6 others"
    )
    if hits != [8, 0, 4]:
        raise Failed(
            given,
            "cached tokens found should be 8, 0, 4 (whole blocks, and a block is found"
            f" only after the same blocks); got {hits[0]}, {hits[1]}, {hits[2]}",
        )


LAB1 = [
    Property(
        "allocate hands out each free frame once, with ref count 1",
        allocate_hands_out_each_frame_once,
        "a pool of 4 frames, allocate() called 4 times",
    ),
    Property(
        "allocate on a full pool raises NoFreeFramesError and changes nothing",
        allocate_on_a_full_pool_raises,
        "a pool of 2 frames, allocate() called 3 times",
    ),
    Property(
        "free gives a frame back to the pool (and a double free is an error)",
        free_returns_the_frame,
        "a pool of 2 frames, both allocated, one freed, allocated again, freed twice",
    ),
    Property(
        "free gives a shared frame back only when its last user frees it",
        free_of_a_shared_frame_waits_for_its_last_user,
        "a pool of 3 frames, one allocated, shared, freed twice",
    ),
    Property(
        "slot(position) is frame * block_size + offset",
        slot_is_frame_times_block_size_plus_offset,
        "block_size 4, a table mapping frames [5, 2, 7]",
    ),
    Property(
        "append_slot takes a new frame only when the last one is full",
        append_takes_a_frame_only_when_the_last_is_full,
        "block_size 4, 10 tokens appended to a new table",
    ),
    Property(
        "append_slot copies a shared last frame before writing into it (fork, then"
        " append)",
        append_copies_a_shared_last_frame,
        "block_size 4, a table of 3 tokens, fork(), then appends",
    ),
    Property(
        "append_slot without a free frame raises and changes nothing",
        append_on_a_full_pool_changes_nothing,
        "a pool of 1 frame of 2 slots, 3 tokens appended; then a fork whose copy finds"
        " no frame",
    ),
    Property(
        "a table's free releases every frame, last block first",
        table_free_releases_every_frame,
        "block_size 2, 5 tokens appended to a new table, then free()",
    ),
    Property(
        "every table reads back its own tokens, after any mix of new tables, forks,"
        " appends and frees",
        random_mixes(1, fork=True),
        "random mixes of new tables, forks, appends and frees (seeded)",
    ),
]
LAB2 = [
    Property(
        "incref adds a user to a mapped frame (and sharing a free frame is an error)",
        incref_of_a_free_frame_is_an_error,
        "a pool of 3 frames, one allocated, incref of it and of a free one",
    ),
    Property(
        "free gives a shared frame back only when its last user frees it",
        free_of_a_shared_frame_waits_for_its_last_user,
        "a pool of 3 frames, one allocated, shared, freed twice",
    ),
    Property(
        "fork shares every frame: same frames, ref counts + 1, nothing allocated",
        fork_shares_every_frame,
        "block_size 4, a table of 6 tokens (2 frames), then fork()",
    ),
    Property(
        "the child gets its own lists",
        the_child_has_its_own_lists,
        "block_size 4, a table of 6 tokens, fork(), then one append to the child",
    ),
    Property(
        "free keeps a shared frame for the tables that still map it",
        free_keeps_shared_frames_for_the_other_table,
        "block_size 4, a table of 6 tokens, fork(), then the child's free()",
    ),
    Property(
        "last_frame_shared is True exactly when another table maps the last frame",
        last_frame_shared_says_who_shares,
        "block_size 4, tables before and after fork(), and a table whose first frame"
        " only is shared",
    ),
    Property(
        "writing into a shared last frame copies it first (copy-on-write)",
        writing_into_a_shared_frame_copies_it,
        "block_size 4, a table of 3 tokens, fork(), then one append to the child",
    ),
    Property(
        "a full shared frame is not copied: the next token takes a new frame",
        a_full_shared_frame_is_not_copied,
        "block_size 4, a table of 4 tokens, fork(), then one append to the child",
    ),
    Property(
        "a copy without a free frame raises and changes nothing",
        a_copy_without_a_free_frame_changes_nothing,
        "a pool of 1 frame, a table of 3 tokens, fork(), then one append to the child",
    ),
    Property(
        "every table reads back its own tokens, after any mix of forks, appends and"
        " frees",
        random_mixes(2, fork=True),
        "random mixes of new tables, forks, appends and frees (seeded)",
    ),
]
LAB3 = [
    Property(
        "block_hash gives one int per block, for a list or a tuple alike",
        hash_is_a_pure_function_of_its_inputs,
        "block_hash(None, [1, 2]) and block_hash(None, (1, 2))",
    ),
    Property(
        "a block's hash chains every block before it",
        hash_chains_every_block_before,
        "the block [5, 6] after [1, 2], after [3, 4], and first",
    ),
    Property(
        "lookup finds what insert stored, and only that",
        lookup_finds_what_insert_stored,
        "insert(3, None, [1, 2]), insert(5, <its hash>, [3, 4]), then lookups",
    ),
    Property(
        "lookup compares the tokens: a hash collision is a miss",
        lookup_compares_the_tokens,
        "frame 3 holds [1, 2], and [9, 9] has the same hash (a collision)",
    ),
    Property(
        "released blocks stay findable until evicted, least recently used first",
        released_blocks_stay_findable_until_evicted_lru_first,
        "a pool of 4 frames of 2 slots, a table of tokens [1, 2, 3, 4] freed, then 3"
        " allocates",
    ),
    Property(
        "an evicted frame forgets its old block and caches its new one",
        an_evicted_frame_caches_its_new_block,
        "a pool of 2 frames of 2 slots, [1, 2] freed, then [5, 6, 7, 8] written, freed,"
        " and 2 allocates",
    ),
    Property(
        "a hit revives a parked frame: it is not evicted while mapped",
        a_hit_revives_a_parked_frame,
        "a pool of 3 frames, block [1, 2] freed, mapped again by a hit, then 3"
        " allocates",
    ),
    Property(
        "the block manager finds a computed prompt's blocks again",
        the_manager_finds_a_prompt_again,
        "block_size 4, a prompt of 10 tokens computed and freed, then three prompts"
        " like it",
    ),
]
