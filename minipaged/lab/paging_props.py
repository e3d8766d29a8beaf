"""The properties of labs 1-3 (demand paging; fork and copy-on-write; the prefix cache), each
tried on small inputs that a participant can redo by hand. `m` is their module (or the
engine's own pieces, for --solution): m.BlockAllocator, m.BlockTable, m.PrefixCache, m.block_hash.
"""

from __future__ import annotations

import random

import numpy as np

from minipaged import paging
from minipaged.lab.grading import Failed, Property, in_one_line
from minipaged.lab.plug import plugged
from minipaged.paging import NoFreeFramesError, cdiv


def _expect_error(call, kind, given: str, what: str) -> None:
    try:
        call()
    except kind:
        return
    raise Failed(given, f"expected {kind.__name__} ({what}), but nothing was raised")


def _filled(m, num_blocks: int, block_size: int, num_tokens: int, first_token: int = 100):
    allocator = m.BlockAllocator(num_blocks, block_size)
    table = m.BlockTable(allocator)
    for i in range(num_tokens):
        table.append_slot(first_token + i)
    return allocator, table


def _mapped(m, num_blocks: int, block_size: int, num_tokens: int):
    """A table holding num_tokens tokens, its frames allocated by hand (no append_slot: lab 2's
    properties then depend on lab 2's methods only)."""
    pool = m.BlockAllocator(num_blocks, block_size)
    tokens = [100 + i for i in range(num_tokens)]
    hashes, prev = [], None
    for start in range(0, num_tokens - block_size + 1, block_size):
        prev = paging.block_hash(prev, tokens[start:start + block_size])
        hashes.append(prev)
    frames = [pool.allocate() for _ in range(cdiv(num_tokens, block_size))]
    return pool, m.BlockTable(pool, frames, tokens, hashes)


# ---- lab 1: demand paging ------------------------------------------------------------------------

def allocate_hands_out_each_frame_once(m) -> None:
    pool = m.BlockAllocator(4, 2)
    given = "a pool of 4 frames, allocate() called 4 times"
    frames = [pool.allocate() for _ in range(4)]
    if sorted(frames) != [0, 1, 2, 3]:
        raise Failed(given, f"expected frames 0, 1, 2, 3 (in any order), got {frames}")
    if [pool.ref_count(f) for f in frames] != [1] * 4:
        raise Failed(given, f"each ref count should be 1, got {[pool.ref_count(f) for f in frames]}")
    if pool.num_free != 0 or pool.num_allocated != 4:
        raise Failed(given, f"expected num_free 0 and num_allocated 4, got {pool.num_free} and {pool.num_allocated}"
                     " (take frames from self.free_frames, count each in self.num_allocated)")


def allocate_on_a_full_pool_raises(m) -> None:
    pool = m.BlockAllocator(2, 2)
    pool.allocate(), pool.allocate()
    given = "a pool of 2 frames, both allocated, allocate() once more"
    _expect_error(pool.allocate, NoFreeFramesError, given, "the scheduler catches it and preempts")
    if pool.num_allocated != 2 or list(pool.ref_counts) != [1, 1]:
        raise Failed(given, "the failed allocate changed the pool: nothing may change when it raises")


def free_returns_the_frame(m) -> None:
    pool = m.BlockAllocator(2, 2)
    first, _ = pool.allocate(), pool.allocate()
    pool.free(first)
    given = f"a pool of 2 frames, both allocated, then free({first})"
    if pool.ref_count(first) != 0 or pool.num_free != 1 or pool.num_released != 1:
        raise Failed(given, f"expected ref count 0, num_free 1, num_released 1; got {pool.ref_count(first)}, "
                     f"{pool.num_free}, {pool.num_released}")
    again = pool.allocate()
    if again != first:
        raise Failed(given + ", then allocate()", f"the freed frame {first} should be handed out again, got {again}")
    pool.free(again)
    _expect_error(lambda: pool.free(again), ValueError, given + f", allocate() and free({again}) twice",
                  "a double free is a bug in the caller")


def slot_is_frame_times_block_size_plus_offset(m) -> None:
    pool = m.BlockAllocator(8, 4)
    table = m.BlockTable(pool, frames=[5, 2, 7], token_ids=list(range(10)))
    expected = {p: [5, 2, 7][p // 4] * 4 + p % 4 for p in (0, 3, 4, 5, 9)}
    got = {p: table.slot(p) for p in expected}
    if got != expected:
        raise Failed("block_size 4, a table mapping frames [5, 2, 7]",
                     f"slots of positions 0, 3, 4, 5, 9 should be {list(expected.values())}, got {list(got.values())}")


def append_takes_a_frame_only_when_the_last_is_full(m) -> None:
    pool = m.BlockAllocator(16, 4)  # room for a frame per token: a wrong append is seen, not starved
    table = m.BlockTable(pool)
    counts, slots = [], []
    for i in range(10):
        slot, cow = table.append_slot(100 + i)
        counts.append(len(table.frames))
        slots.append(slot)
        if cow is not None:
            raise Failed("block_size 4, 10 tokens appended to a new table", f"append {i} returned a copy {cow}; "
                         "nothing is shared here, so it should return (slot, None)")
    given = "block_size 4, 10 tokens appended to a new table"
    if counts != [1, 1, 1, 1, 2, 2, 2, 2, 3, 3]:
        raise Failed(given, f"frames mapped after each append should be 1 1 1 1 2 2 2 2 3 3, got "
                     f"{' '.join(map(str, counts))}")
    if pool.num_allocated != 3:
        raise Failed(given, f"3 frames should have been allocated, got {pool.num_allocated}")
    if table.token_ids != [100 + i for i in range(10)]:
        raise Failed(given, f"token_ids should be the 10 tokens in order, got {table.token_ids}")
    where = [table.slot(p) for p in range(10)]
    if slots != where:
        raise Failed(given, f"append_slot returned slots {slots}, but slot(position) says {where}")
    if len(table.block_hashes) != 2:
        raise Failed(given, f"2 blocks are full, so 2 should be named (call self._name_full_blocks() when a "
                     f"token fills its block); block_hashes has {len(table.block_hashes)}")


def append_on_a_full_pool_changes_nothing(m) -> None:
    pool, table = _filled(m, 1, 2, 2)
    given = "a pool of 1 frame of 2 slots, a table holding 2 tokens, one more append"
    _expect_error(lambda: table.append_slot(7), NoFreeFramesError, given, "no frame is free")
    if table.num_tokens != 2 or len(table.frames) != 1:
        raise Failed(given, f"the failed append changed the table: it holds {table.num_tokens} tokens "
                     f"in {len(table.frames)} frames, expected 2 in 1")


def table_free_releases_every_frame(m) -> None:
    pool, table = _filled(m, 4, 2, 5)
    table.free()
    given = "block_size 2, a table holding 5 tokens (3 frames), then free()"
    if table.frames or pool.num_free != 4 or int(pool.ref_counts.sum()) != 0:
        raise Failed(given, f"expected no frames left, 4 free and every ref count 0; got frames {table.frames}, "
                     f"{pool.num_free} free, ref counts {list(pool.ref_counts)}")


# ---- random mixes of new tables, appends, forks and frees: a toy KV cache checks every read ------

def _ops(rng: random.Random, length: int, fork: bool) -> list[tuple[str, int]]:
    kinds = ["new", "append", "append", "append", "free"] + ["fork"] * fork
    return [(rng.choice(kinds), rng.randrange(4)) for _ in range(length)]


def _replay(m, ops, num_blocks: int, block_size: int, done: list[str]) -> str | None:
    """Run the ops, saying each in `done`; after each, every table must read back its own
    tokens through its slots (a toy KV cache where the token id is the 'K and V'), and ref
    counts must match the tables. Returns what went wrong, or None."""
    pool = m.BlockAllocator(num_blocks, block_size)
    kv = np.full(num_blocks * block_size, -1)
    tables, token = [], 0
    for step, (kind, pick) in enumerate(ops):
        live = [t for t in tables if t is not None]
        if kind == "new" or not live:
            tables.append(m.BlockTable(pool))
            done.append(f"T{len(tables) - 1} = new table")
            continue
        table = live[pick % len(live)]
        name = f"T{tables.index(table)}"
        done.append({"fork": f"T{len(tables)} = {name}.fork()", "free": f"{name}.free()"}.get(kind, f"{name}.append"))
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
                kv[dst * block_size:(dst + 1) * block_size] = kv[src * block_size:(src + 1) * block_size]
            kv[slot] = token
        problem = _check_state(pool, [t for t in tables if t is not None], kv, num_blocks, block_size)
        if problem:
            return problem
    return None


def _check_state(pool, live, kv, num_blocks: int, block_size: int) -> str | None:
    mapped = np.zeros(num_blocks, dtype=int)
    for i, table in enumerate(live):
        if len(table.frames) != cdiv(table.num_tokens, block_size):
            return (f"a table holds {table.num_tokens} tokens in {len(table.frames)} frames; at {block_size} "
                    f"slots a frame that is {cdiv(table.num_tokens, block_size)}")
        for frame in set(table.frames):
            mapped[frame] += table.frames.count(frame)
        read = [int(kv[table.slot(p)]) for p in range(table.num_tokens)]
        if read != table.token_ids:
            return (f"a table reads tokens {read} through its slots but holds {table.token_ids}: another "
                    "table wrote into a frame it shares (copy-on-write) or a frame was reused while mapped")
    if list(mapped) != [int(r) for r in pool.ref_counts]:
        return f"ref counts {list(pool.ref_counts)}, but the tables map the frames {list(mapped)} times"
    free = sorted(pool.free_frames)
    if free != [f for f in range(num_blocks) if mapped[f] == 0]:
        return f"the free list holds {free}, but the unmapped frames are {[f for f in range(num_blocks) if not mapped[f]]}"
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


def random_mixes(fork: bool):
    def check(m) -> None:
        worst = None
        for seed in range(40):
            ops = _ops(random.Random(seed), 30, fork)
            done: list[str] = []
            try:
                problem = _replay(m, ops, 6, 2, done)  # stops at the first step that goes wrong
            except NotImplementedError:
                raise
            except Exception as error:
                problem = f"your code raised {in_one_line(error)}"
            if problem and (worst is None or len(done) < len(worst[0])):
                worst = (done, problem)
        if worst:
            raise Failed(f"a pool of 6 frames of 2 slots, these steps: {_describe(worst[0])}", worst[1])
    return check


# ---- lab 2: fork and copy-on-write ---------------------------------------------------------------

def fork_shares_every_frame(m) -> None:
    pool, parent = _mapped(m, 8, 4, 6)
    free_before = pool.num_free
    child = parent.fork()
    given = "block_size 4, a table of 6 tokens (2 frames), then fork()"
    if not isinstance(child, paging.BlockTable) or child is parent:
        raise Failed(given, f"fork() should return a new BlockTable, got {child!r}")
    if child.frames != parent.frames or child.token_ids != parent.token_ids:
        raise Failed(given, f"the child should map the parent's frames {parent.frames} and hold its tokens; "
                     f"it maps {child.frames}")
    if pool.num_free != free_before:
        raise Failed(given, f"fork took {free_before - pool.num_free} frames: it should share, not copy")
    if [pool.ref_count(f) for f in parent.frames] != [2, 2]:
        raise Failed(given, f"each shared frame should have ref count 2, got {[pool.ref_count(f) for f in parent.frames]}")


def the_child_has_its_own_lists(m) -> None:
    _, parent = _mapped(m, 8, 4, 6)
    child = parent.fork()
    given = "block_size 4, a table of 6 tokens, fork(), then one append to the child"
    child.append_slot(1)
    if parent.num_tokens != 6 or len(parent.frames) != 2:
        raise Failed(given, f"the parent changed (it holds {parent.num_tokens} tokens in {len(parent.frames)} "
                     "frames): give the child copies of the lists")
    if child.frames is parent.frames or child.token_ids is parent.token_ids or child.block_hashes is parent.block_hashes:
        raise Failed(given, "the child and the parent share a list object: give the child copies")


def free_keeps_shared_frames_for_the_other_table(m) -> None:
    pool, parent = _mapped(m, 4, 4, 6)
    child = parent.fork()
    child.free()
    given = "block_size 4, a table of 6 tokens (2 frames), fork(), then the child's free()"
    refs = [pool.ref_count(f) for f in parent.frames]
    if refs != [1, 1] or any(f in pool.free_frames for f in parent.frames):
        raise Failed(given, f"the parent still maps its frames: their ref counts should be 1 and they may "
                     f"not be free; got ref counts {refs}, free list {list(pool.free_frames)}")
    free = pool.num_free
    _expect_error(lambda: pool.incref(next(iter(pool.free_frames))), ValueError, given + ", then incref of a free frame",
                  "nobody can share a frame nobody maps")
    if pool.num_free != free:
        raise Failed(given, "incref of a free frame changed the pool")


def last_frame_shared_says_who_shares(m) -> None:
    pool, parent = _mapped(m, 8, 4, 3)
    given = "block_size 4, a table of 3 tokens"
    if parent.last_frame_shared() or m.BlockTable(pool).last_frame_shared():
        raise Failed(given, "last_frame_shared() should be False before any fork (and for an empty table)")
    child = parent.fork()
    if not (parent.last_frame_shared() and child.last_frame_shared()):
        raise Failed(given + ", then fork()", "last_frame_shared() should be True for both tables")


def writing_into_a_shared_frame_copies_it(m) -> None:
    pool, parent = _mapped(m, 8, 4, 3)
    child = parent.fork()
    shared = parent.frames[-1]
    slot, cow = child.append_slot(9)
    given = f"block_size 4, a table of 3 tokens in frame {shared}, fork(), then one append to the child"
    if cow is None or cow[0] != shared or cow[1] == shared:
        raise Failed(given, f"append_slot should return (slot, ({shared}, new frame)) so the KV cache copies "
                     f"the frame before the write; it returned copy {cow}")
    if child.frames != [cow[1]] or parent.frames != [shared]:
        raise Failed(given, f"the child should map the copy {cow[1]} and the parent keep {shared}; "
                     f"child {child.frames}, parent {parent.frames}")
    if (pool.ref_count(shared), pool.ref_count(cow[1])) != (1, 1):
        raise Failed(given, f"ref counts of {shared} and {cow[1]} should be 1 and 1, got "
                     f"{pool.ref_count(shared)} and {pool.ref_count(cow[1])}")
    if slot != cow[1] * 4 + 3:
        raise Failed(given, f"the token goes to slot {cow[1] * 4 + 3} (offset 3 of the copy), got {slot}")
    if parent.append_slot(10)[1] is not None:
        raise Failed(given + ", then one append to the parent", "the parent's frame is no longer shared: no copy")


def a_full_shared_frame_is_not_copied(m) -> None:
    pool, parent = _mapped(m, 8, 4, 4)
    child = parent.fork()
    _, cow = child.append_slot(9)
    given = "block_size 4, a table of 4 tokens (its frame is full), fork(), then one append to the child"
    if cow is not None or len(child.frames) != 2 or pool.ref_count(parent.frames[0]) != 2:
        raise Failed(given, f"the token starts a new block: a new frame, no copy, the full frame still shared; "
                     f"got copy {cow}, child frames {child.frames}")


def a_copy_without_a_free_frame_changes_nothing(m) -> None:
    pool, parent = _mapped(m, 1, 4, 3)
    child = parent.fork()
    given = "a pool of 1 frame, a table of 3 tokens, fork(), then one append to the child"
    _expect_error(lambda: child.append_slot(9), NoFreeFramesError, given, "the copy needs a frame")
    if child.frames != parent.frames or pool.ref_count(parent.frames[0]) != 2 or child.num_tokens != 3:
        raise Failed(given, f"the failed copy changed something: child frames {child.frames}, ref count "
                     f"{pool.ref_count(parent.frames[0])} (expected still shared, 2)")


# ---- lab 3: the prefix cache ---------------------------------------------------------------------

def hash_is_a_pure_function_of_its_inputs(m) -> None:
    given = "block_hash(None, [1, 2]) and block_hash(None, (1, 2)), twice"
    a, b, c = m.block_hash(None, [1, 2]), m.block_hash(None, (1, 2)), m.block_hash(None, [1, 2])
    if not isinstance(a, int) or not a == b == c:
        raise Failed(given, f"expected one int for a list and a tuple alike, every time; got {a!r}, {b!r}, {c!r}")
    if m.block_hash(None, [1, 2]) == m.block_hash(None, [2, 1]):
        raise Failed("block_hash(None, [1, 2]) and block_hash(None, [2, 1])", "different blocks got one name")


def hash_chains_every_block_before(m) -> None:
    h = m.block_hash
    first_a, first_b = h(None, [1, 2]), h(None, [3, 4])
    given = "the block [5, 6] after [1, 2], after [3, 4], and first"
    names = {h(first_a, [5, 6]), h(first_b, [5, 6]), h(None, [5, 6])}
    if len(names) != 3:
        raise Failed(given, "the three got fewer than three names: a block's name must depend on the "
                     "name of the block before it (prev_hash), or a prompt could hit another's K and V")


def lookup_finds_what_insert_stored(m) -> None:
    cache = m.PrefixCache()
    first = cache.insert(3, None, [1, 2])
    given = "insert(3, None, [1, 2]), then insert(5, <its hash>, [3, 4])"
    if first != m.block_hash(None, [1, 2]):
        raise Failed(given, f"insert should return block_hash(None, [1, 2]), got {first!r}")
    cache.insert(5, first, [3, 4])
    found = [cache.lookup(None, [1, 2]), cache.lookup(first, [3, 4]), cache.lookup(None, [1, 3]),
             cache.lookup(None, [3, 4])]
    if found != [3, 5, None, None]:
        raise Failed(given, f"lookups of [1, 2], then [3, 4] after it, [1, 3] and [3, 4] first should give "
                     f"3, 5, None, None; got {', '.join(map(str, found))}")
    if cache.insert(7, None, [1, 2]) != first or cache.lookup(None, [1, 2]) != 3:
        raise Failed(given + ", then insert(7, None, [1, 2])", "the first copy (frame 3) stays the cached one")


def lookup_compares_the_tokens(m) -> None:
    cache = m.PrefixCache()
    cache.insert(3, None, [1, 2])
    cache.frame_of[m.block_hash(None, [9, 9])] = 3  # as if [9, 9] hashed like [1, 2]
    given = "frame 3 holds [1, 2], and [9, 9] has the same hash (a collision)"
    if cache.lookup(None, [9, 9]) is not None:
        raise Failed(given, "lookup(None, [9, 9]) should be None: frame 3 does not hold [9, 9] "
                     "(compare key_of[frame] with (prev_hash, tuple(token_ids)))")


def _cached_pool(m, num_blocks: int, block_size: int = 2):
    return paging.BlockAllocator(num_blocks, block_size, enable_prefix_caching=True)  # (plugged: their cache)


def released_blocks_stay_findable_until_evicted_lru_first(m) -> None:
    with plugged(3, m):
        pool = _cached_pool(m, 4)
        table = paging.BlockTable(pool)
        for token in (1, 2, 3, 4):
            table.append_slot(token)
        first, second = table.frames
        table.free()  # last block first: `second` is parked before `first`
        given = (f"a pool of 4 frames of 2 slots, a table of tokens [1, 2, 3, 4] in frames {first}, {second}, "
                 "freed")
        cache, h = pool.prefix_cache, m.block_hash(None, [1, 2])
        if pool.num_free != 4 or cache.lookup(None, [1, 2]) != first or cache.lookup(h, [3, 4]) != second:
            raise Failed(given, f"both frames are free yet still findable (parked): num_free should be 4 and the "
                         f"lookups give {first} and {second}; got {pool.num_free}, {cache.lookup(None, [1, 2])}, "
                         f"{cache.lookup(h, [3, 4])}")
        got = [pool.allocate() for _ in range(3)]
        if got[2] != second or cache.lookup(h, [3, 4]) is not None or cache.lookup(None, [1, 2]) != first:
            raise Failed(given + ", then 3 allocates", f"the two never-cached frames first, then the least "
                         f"recently parked ({second}), whose block is forgotten; got frames {got}, and lookups "
                         f"{cache.lookup(None, [1, 2])}, {cache.lookup(h, [3, 4])}")


def a_hit_revives_a_parked_frame(m) -> None:
    with plugged(3, m):
        pool = _cached_pool(m, 3)
        table = paging.BlockTable(pool)
        table.append_slot(1), table.append_slot(2)
        frame = table.frames[0]
        table.free()
        again = paging.BlockTable(pool)
        again.append_cached_block(frame, [1, 2])
        given = f"a pool of 3 frames, block [1, 2] in frame {frame} freed, then mapped again by a hit"
        got = [pool.allocate(), pool.allocate()]
        if frame in got:
            raise Failed(given + ", then 2 allocates", f"allocate handed out frame {frame}, which a table maps: "
                         "revive() must take it out of the evictable frames")
        _expect_error(pool.allocate, NoFreeFramesError, given + ", then a third allocate", "every frame is mapped")


def the_manager_finds_a_prompt_again(m) -> None:
    prompt = list(range(10, 20))
    with plugged(3, m):
        manager = paging.BlockManager(8, 4, enable_prefix_caching=True)
        manager.allocate("a", prompt)
        manager.free("a")
        hits = [manager.allocate("b", prompt), manager.allocate("c", [99] + prompt[1:]),
                manager.allocate("d", prompt[:4] + [77] * 6)]
    given = ("block_size 4, prompt a = 10..19 computed and freed; then b = the same, c = a with its first token "
             "changed, d = a's first 4 tokens and 6 others")
    if hits != [8, 0, 4]:
        raise Failed(given, f"cached tokens found should be 8, 0, 4 (whole blocks, and a block is found only "
                     f"after the same blocks); got {hits[0]}, {hits[1]}, {hits[2]}")


LAB1 = [
    Property("allocate hands out each free frame once, with ref count 1", allocate_hands_out_each_frame_once,
             "a pool of 4 frames, allocate() called 4 times"),
    Property("allocate on a full pool raises NoFreeFramesError and changes nothing", allocate_on_a_full_pool_raises,
             "a pool of 2 frames, allocate() called 3 times"),
    Property("free gives a frame back to the pool (and a double free is an error)", free_returns_the_frame,
             "a pool of 2 frames, both allocated, one freed, allocated again, freed twice"),
    Property("slot(position) is frame * block_size + offset", slot_is_frame_times_block_size_plus_offset,
             "block_size 4, a table mapping frames [5, 2, 7]"),
    Property("append_slot takes a new frame only when the last one is full",
             append_takes_a_frame_only_when_the_last_is_full, "block_size 4, 10 tokens appended to a new table"),
    Property("append_slot without a free frame raises and changes nothing", append_on_a_full_pool_changes_nothing,
             "a pool of 1 frame of 2 slots, 3 tokens appended"),
    Property("a table's free releases every frame", table_free_releases_every_frame,
             "block_size 2, 5 tokens appended to a new table, then free()"),
    Property("every table reads back its own tokens, after any mix of new tables, appends and frees",
             random_mixes(fork=False), "random mixes of new tables, appends and frees (seeded)"),
]
LAB2 = [
    Property("fork shares every frame: same frames, ref counts + 1, nothing allocated", fork_shares_every_frame,
             "block_size 4, a table of 6 tokens (2 frames), then fork()"),
    Property("the child gets its own lists", the_child_has_its_own_lists,
             "block_size 4, a table of 6 tokens, fork(), then one append to the child"),
    Property("free keeps a shared frame for the tables that still map it", free_keeps_shared_frames_for_the_other_table,
             "block_size 4, a table of 6 tokens, fork(), then the child's free()"),
    Property("last_frame_shared is True exactly when another table maps the last frame",
             last_frame_shared_says_who_shares, "block_size 4, a table of 3 tokens, before and after fork()"),
    Property("writing into a shared last frame copies it first (copy-on-write)", writing_into_a_shared_frame_copies_it,
             "block_size 4, a table of 3 tokens, fork(), then one append to the child"),
    Property("a full shared frame is not copied: the next token takes a new frame", a_full_shared_frame_is_not_copied,
             "block_size 4, a table of 4 tokens, fork(), then one append to the child"),
    Property("a copy without a free frame raises and changes nothing", a_copy_without_a_free_frame_changes_nothing,
             "a pool of 1 frame, a table of 3 tokens, fork(), then one append to the child"),
    Property("every table reads back its own tokens, after any mix of forks, appends and frees",
             random_mixes(fork=True), "random mixes of new tables, forks, appends and frees (seeded)"),
]
LAB3 = [
    Property("block_hash gives one int per block, for a list or a tuple alike", hash_is_a_pure_function_of_its_inputs,
             "block_hash(None, [1, 2]) and block_hash(None, (1, 2))"),
    Property("a block's hash chains every block before it", hash_chains_every_block_before,
             "the block [5, 6] after [1, 2], after [3, 4], and first"),
    Property("lookup finds what insert stored, and only that", lookup_finds_what_insert_stored,
             "insert(3, None, [1, 2]), insert(5, <its hash>, [3, 4]), then lookups"),
    Property("lookup compares the tokens: a hash collision is a miss", lookup_compares_the_tokens,
             "frame 3 holds [1, 2], and [9, 9] has the same hash (a collision)"),
    Property("released blocks stay findable until evicted, least recently used first",
             released_blocks_stay_findable_until_evicted_lru_first,
             "a pool of 4 frames of 2 slots, a table of tokens [1, 2, 3, 4] freed, then 3 allocates"),
    Property("a hit revives a parked frame: it is not evicted while mapped", a_hit_revives_a_parked_frame,
             "a pool of 3 frames, block [1, 2] freed, mapped again by a hit, then 3 allocates"),
    Property("the block manager finds a computed prompt's blocks again", the_manager_finds_a_prompt_again,
             "block_size 4, a prompt of 10 tokens computed and freed, then three prompts like it"),
]
