"""Lab 9, speculative decoding: the participant's ngram_propose and BlockTable.truncate
(the rollback of rejected guesses), their properties on small token lists and page
tables, and the engine run with speculation (their pieces plugged) beside the built-in
engine without it.
"""

from __future__ import annotations

import random
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

from minipaged import paging
from minipaged.paging import BlockAllocator, block_table, manager
from minipaged.sampling import SamplingParams
from minipaged.speculative import ngram
from minipaged.tools.lab.engine_run import QUESTIONS, SYSTEM
from minipaged.tools.lab.grading import Failed, Property, in_one_line, time_limit
from minipaged.tools.viz import LineChart, PageTableView
from minipaged.tools.viz.pages import plural

BLOCK = 4  # slots per frame in every case


def solution() -> dict:
    return {"ngram_propose": ngram.ngram_propose, "BlockTable": paging.BlockTable}


# ---- the n-gram proposer -------------------------------------------------------------


def expect_guess(
    m, token_ids: list[int], k: int, min_n: int, max_n: int, why: str
) -> None:
    expected = ngram.ngram_propose(list(token_ids), k, min_n, max_n)
    got = m.ngram_propose(list(token_ids), k, min_n, max_n)
    if got != expected:
        raise Failed(
            f"ngram_propose({token_ids}, k={k}, min_n={min_n}, max_n={max_n})",
            f"it should return {expected} ({why}); it returned {got!r}",
        )


def the_latest_earlier_occurrence(m) -> None:
    expect_guess(
        m,
        [1, 2, 3, 9, 9, 5, 1, 2, 3, 8, 8, 5, 1, 2, 3],
        2,
        3,
        3,
        "[1, 2, 3] ends the sequence and came twice before: the later one was followed"
        " by 8, 8",
    )
    expect_guess(
        m,
        [4, 6, 4, 7, 4, 6, 4, 5, 4, 6, 4],
        3,
        3,
        3,
        "[4, 6, 4] came at 0 and 4 (and at the end, itself: not an earlier occurrence)",
    )
    expect_guess(
        m,
        [6, 6, 6, 6, 6],
        3,
        2,
        2,
        "the latest [6, 6] that has a token after it starts at 2",
    )


def the_longest_n_first(m) -> None:
    expect_guess(
        m,
        [2, 3, 4, 10, 11, 8, 3, 4, 12, 13, 2, 3, 4],
        2,
        2,
        3,
        "n = 3 is tried first: [2, 3, 4] came at 0, before the later [3, 4] at 6",
    )
    expect_guess(
        m,
        [1, 2, 3, 10, 5, 2, 3, 11, 6, 3, 12, 1, 2, 3],
        3,
        1,
        4,
        "n = 4 finds nothing; n = 3 finds [1, 2, 3] at 0, before the later [2, 3] and"
        " [3] are tried",
    )


def at_most_k(m) -> None:
    expect_guess(
        m,
        [1, 2, 3, 4, 5, 6, 7, 8, 1, 2],
        3,
        2,
        2,
        "k = 3 tokens follow [1, 2]; 6 more are there",
    )
    expect_guess(m, [1, 2, 9, 1, 2], 4, 2, 2, "only 1 token follows the earlier [1, 2]")
    expect_guess(
        m,
        [3, 4, 3, 4, 3, 4],
        5,
        2,
        2,
        "the latest earlier [3, 4] starts at 2: 2 tokens follow it",
    )


def none_found(m) -> None:
    expect_guess(
        m,
        [1, 2, 3, 4, 5, 3],
        4,
        2,
        3,
        "[5, 3] and [4, 5, 3] never came before; n = 1 is below min_n",
    )
    expect_guess(m, [7], 4, 1, 3, "one token has nothing earlier")
    expect_guess(m, [1, 2, 3, 4], 2, 1, 5, "no token repeats")


# ---- the rollback: BlockTable.truncate -----------------------------------------------


def filled(cls, allocator, tokens: int, guesses: int = 0):
    """A table of `cls` holding `tokens` tokens (100, 101, ...) and `guesses` guessed
    slots, built by the engine's own append_slot and append_guess_slot."""
    table = cls(allocator)
    for i in range(tokens):
        table.append_slot(100 + i)
    for _ in range(guesses):
        table.append_guess_slot()
    return table


def state(table) -> dict:
    return {
        "frames": list(table.frames),
        "token_ids": list(table.token_ids),
        "guesses": table.guesses,
        "num_tokens": table.num_tokens,
        "block_hashes": list(table.block_hashes),
    }


def table_said(tokens: int, guesses: int, frames: int = 16) -> str:
    return (
        f"a table of {plural(tokens, 'token')} and {plural(guesses, 'guessed slot')} "
        f"({frames} frames of {BLOCK} slots)"
    )


def truncated(m, tokens: int, guesses: int, keep: int):
    allocator = BlockAllocator(16, BLOCK)
    table = filled(m.BlockTable, allocator, tokens, guesses)
    before = list(table.frames)
    table.truncate(keep)
    return allocator, table, before


def frees_only_the_emptied_frames(m) -> None:
    for tokens, guesses, keep in [
        (10, 5, 9),
        (10, 5, 8),
        (10, 5, 15),
        (12, 6, 13),
        (9, 0, 1),
    ]:
        allocator, table, before = truncated(m, tokens, guesses, keep)
        need = -(-keep // BLOCK)
        given = f"{table_said(tokens, guesses)} in frames {before}, truncate({keep})"
        if table.frames != before[:need]:
            raise Failed(
                given,
                f"{keep} slots fill {plural(need, 'frame')}, so the table should keep"
                f" frames {before[:need]}; it keeps {table.frames}",
            )
        freed = [f for f in before[need:] if allocator.ref_count(f) != 0]
        if freed or allocator.num_free != 16 - need:
            raise Failed(
                given,
                f"frames {before[need:]} hold only dropped slots and should be free"
                f" again ({16 - need} of 16 free); {allocator.num_free} are free",
            )


def keeps_shared_frames(m) -> None:
    allocator = BlockAllocator(16, BLOCK)
    parent = filled(m.BlockTable, allocator, 10)
    child = parent.fork()
    frames = list(parent.frames)
    parent.truncate(3)
    given = (
        f"{table_said(10, 0)} in frames {frames}, forked, then the parent's truncate(3)"
    )
    counts = [int(allocator.ref_count(f)) for f in frames]
    if counts != [2, 1, 1] or child.frames != frames or allocator.num_free != 13:
        raise Failed(
            given,
            "the child still maps all 3 frames: their ref counts should be [2, 1, 1]"
            f" (13 frames free); they are {counts} ({allocator.num_free} free). Give a"
            " frame back with self.allocator.free(frame): it counts the other tables",
        )


def restores_the_count(m) -> None:
    for tokens, guesses, keep in [(10, 5, 12), (10, 5, 7), (10, 5, 10), (10, 5, 0)]:
        _, table, _ = truncated(m, tokens, guesses, keep)
        kept_tokens, kept_guesses = min(keep, tokens), max(0, keep - tokens)
        expected = {
            "token_ids": [100 + i for i in range(kept_tokens)],
            "guesses": kept_guesses,
            "num_tokens": keep,
        }
        got = {
            "token_ids": list(table.token_ids),
            "guesses": table.guesses,
            "num_tokens": table.num_tokens,
        }
        if got != expected:
            raise Failed(
                f"{table_said(tokens, guesses)}, truncate({keep})",
                f"it should keep {plural(kept_tokens, 'token')} and"
                f" {plural(kept_guesses, 'guessed slot')} (num_tokens {keep}):"
                f" {expected}; it left {got}",
            )


def reads_back_and_grows_again(m) -> None:
    for tokens, guesses, keep, more in [(10, 5, 9, 6), (12, 2, 8, 5), (10, 5, 6, 9)]:
        allocator = BlockAllocator(16, BLOCK)
        table = filled(m.BlockTable, allocator, tokens, guesses)
        slots = [table.slot(i) for i in range(keep)]
        table.truncate(keep)
        given = (
            f"{table_said(tokens, guesses)}, truncate({keep}), then"
            f" {plural(more, 'new token')} appended"
        )
        if [table.slot(i) for i in range(keep)] != slots:
            raise Failed(
                given,
                f"the kept slots should read back where they were, {slots}; after"
                f" truncate they are {[table.slot(i) for i in range(keep)]}",
            )
        for i in range(more):
            table.append_slot(200 + i)
        fresh = paging.BlockTable(BlockAllocator(16, BLOCK))
        for token in table.token_ids:
            fresh.append_slot(token)
        if len(table.frames) != len(fresh.frames) or allocator.num_free != 16 - len(
            fresh.frames
        ):
            raise Failed(
                given,
                f"{plural(keep + more, 'token')} need"
                f" {plural(len(fresh.frames), 'frame')}; the table maps"
                f" {len(table.frames)}, and {16 - allocator.num_free} are taken",
            )
        if table.block_hashes != fresh.block_hashes:
            stale = sum(a != b for a, b in zip(table.block_hashes, fresh.block_hashes))
            raise Failed(
                given,
                "the table should name its"
                f" {plural(len(fresh.block_hashes), 'full block')} by the tokens they"
                " hold now: a block cut short by truncate loses its name (del"
                f" self.block_hashes[...]); it has {len(table.block_hashes)} names,"
                f" {stale} of them stale",
            )


def speculation_steps_match_the_engine(m) -> None:
    """Random steps of guesses, some accepted (settle_guesses calls truncate), side by
    side."""
    for seed in range(8):
        rng = random.Random(seed)
        mine, ours = BlockAllocator(24, BLOCK), BlockAllocator(24, BLOCK)
        prompt = rng.randrange(1, 12)
        tables = [
            filled(m.BlockTable, mine, prompt),
            filled(paging.BlockTable, ours, prompt),
        ]
        done = [f"a prompt of {prompt} tokens"]
        for _ in range(12):
            guesses = rng.randrange(0, 6)
            accepted = [
                300 + rng.randrange(50) for _ in range(rng.randrange(0, guesses + 1))
            ]
            for table in tables:
                for _ in range(guesses):
                    table.append_guess_slot()
                table.settle_guesses(list(accepted))
                table.append_slot(7)
            done.append(f"{guesses} guessed, {len(accepted)} kept")
            if state(tables[0]) != state(tables[1]) or mine.num_free != ours.num_free:
                raise Failed(
                    f"{table_said(prompt, 0, 24)}, then steps of guesses (seed {seed}):"
                    f" {'; '.join(done)}",
                    f"after the last step the table should be {state(tables[1])} with"
                    f" {ours.num_free} frames free; yours is {state(tables[0])} with"
                    f" {mine.num_free} free",
                )


SPECULATION = [
    Property(
        "ngram_propose guesses what followed the latest earlier occurrence of the last"
        " n tokens",
        the_latest_earlier_occurrence,
        "ngram_propose on token lists with repeats",
    ),
    Property(
        "ngram_propose tries the longest n first, from max_n down to min_n",
        the_longest_n_first,
        "ngram_propose with min_n < max_n",
    ),
    Property(
        "ngram_propose returns at most k tokens (fewer where the sequence ends)",
        at_most_k,
        "ngram_propose with tokens after the match",
    ),
    Property(
        "ngram_propose returns [] when no n from max_n down to min_n occurred before",
        none_found,
        "ngram_propose on lists without a match",
    ),
    Property(
        "truncate frees the frames that hold only dropped slots, and keeps a frame"
        " still partly used",
        frees_only_the_emptied_frames,
        table_said(10, 5) + ", truncate(9)",
    ),
    Property(
        "truncate gives a shared frame back only for this table (another still"
        " maps it)",
        keeps_shared_frames,
        table_said(10, 0) + ", forked, then truncate(3)",
    ),
    Property(
        "truncate keeps num_tokens slots: the tokens first, then the guesses",
        restores_the_count,
        table_said(10, 5) + ", truncate(12)",
    ),
    Property(
        "a table rolled back reads back its tokens and grows again from there",
        reads_back_and_grows_again,
        table_said(10, 5) + ", truncate(9), then appends",
    ),
    Property(
        "random steps of guesses, kept and rolled back, leave the engine's table",
        speculation_steps_match_the_engine,
        "random speculation steps on 24 frames of 4 slots (seeded)",
    ),
]


# ---- the engine run: speculation with the participant's pieces -----------------------

ENGINE = dict(num_blocks=48, block_size=4, max_num_seqs=4, enable_prefix_caching=False)
SPECULATIVE = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}
MAX_TOKENS = 32


def plugged(pieces) -> ExitStack:
    """The engine's BlockTable and ngram_propose bound to the participant's (as plug.py
    does for
    labs 1-5): the manager builds tables by that name, fork() in block_table.py too."""
    stack = ExitStack()
    for module, name in [
        (manager, "BlockTable"),
        (block_table, "BlockTable"),
        (ngram, "ngram_propose"),
    ]:
        stack.enter_context(mock.patch.object(module, name, getattr(pieces, name)))
    return stack


def serve(engine) -> dict:
    """Greedy requests to their end: tokens per request, guesses and accepted guesses
    per step."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for i, question in enumerate(QUESTIONS):
        engine.add_request(f"r{i}", f"{SYSTEM} {question}", params)
    tokens, guessed, accepted = {}, [], []
    while engine.has_unfinished_requests():
        if len(guessed) > 1000:
            raise RuntimeError("the engine had not finished after 1000 steps")
        report = engine.step()
        guessed.append(report.guessed)
        accepted.append(report.accepted)
        for output in report.finished:
            tokens[output.request_id] = list(output.outputs[0].token_ids)
    return {"tokens": tokens, "guessed": guessed, "accepted": accepted}


def run(pieces, llm, pictures: Path) -> list[str]:
    """The participant's proposer and rollback serving with speculation; the built-in
    engine with speculation and without: the same greedy tokens, the same guesses as the
    built-in.
    """
    try:
        with plugged(pieces), time_limit(120):
            mine = serve(llm.new_engine(**ENGINE, speculative_config=dict(SPECULATIVE)))
    except Exception as error:
        raise RuntimeError(
            f"the engine with your code failed: {in_one_line(error)}"
        ) from None
    plain = serve(llm.new_engine(**ENGINE))
    built_in = serve(llm.new_engine(**ENGINE, speculative_config=dict(SPECULATIVE)))
    for request_id, tokens in plain["tokens"].items():
        if mine["tokens"].get(request_id) != tokens:
            raise RuntimeError(
                f"request {request_id} (greedy): with your speculation the engine gave"
                f" tokens {mine['tokens'].get(request_id)}, without speculation"
                f" {tokens}"
            )
    counts = {
        name: (sum(r["guessed"]), sum(r["accepted"]))
        for name, r in [("mine", mine), ("built-in", built_in)]
    }
    if counts["mine"] != counts["built-in"]:
        raise RuntimeError(
            f"your proposer's guesses: {counts['mine'][0]} proposed,"
            f" {counts['mine'][1]} accepted; the built-in one's {counts['built-in'][0]}"
            f" and {counts['built-in'][1]}: the same rule should guess the same"
        )
    proposed, kept = counts["mine"]
    lines = [
        (
            f"  {len(QUESTIONS)} greedy requests of {MAX_TOKENS} tokens: the same"
            " tokens as the engine without speculation"
        ),
        (
            f"  guesses: {proposed} proposed, {kept} accepted"
            f" ({kept / max(proposed, 1):.0%}); {plural(proposed - kept, 'slot')}"
            " rolled back by your truncate"
        ),
        (
            f"  steps: {len(mine['guessed'])} with speculation, {len(plain['guessed'])}"
            " without"
        ),
    ]
    pictures.mkdir(parents=True, exist_ok=True)
    picture = pictures / "lab9_speculation.svg"
    steps = list(range(1, len(mine["guessed"]) + 1))
    chart = LineChart(
        f"guesses per step, ngram k={SPECULATIVE['num_speculative_tokens']} (your"
        " proposer and rollback)",
        steps,
        {"proposed": mine["guessed"], "accepted": mine["accepted"]},
        x_label="step",
        y_label="guessed tokens",
        digits=0,
    )
    picture.write_text(chart.svg())
    try:
        with time_limit(30):
            tables = rollback_pictures(pieces, pictures)
    except Exception as error:
        raise RuntimeError(
            f"your page table failed while drawn: {in_one_line(error)}"
        ) from None
    return lines + [f"picture: {picture}", ""] + tables


def rollback_pictures(pieces, pictures: Path) -> list[str]:
    """One sequence's page table (your BlockTable) with 5 guessed slots, and after the
    model kept 1 of them: the text forms, and one picture of each."""
    with plugged(pieces):
        blocks = paging.BlockManager(8, BLOCK, enable_prefix_caching=False)
        blocks.allocate("s", list(range(100, 110)))
        blocks.append_guess_slots("s", 5)
        before = PageTableView(blocks, ["s"])
        lines = ["10 tokens and 5 guessed slots, in your page table:", str(before)]
        (pictures / "lab9_rollback_before.svg").write_text(before.svg())
        blocks.settle_guesses("s", [110])
        after = PageTableView(blocks, ["s"])
        (pictures / "lab9_rollback_after.svg").write_text(after.svg())
    return lines + [
        "the model kept 1 guess; your truncate rolled back the other 4:",
        str(after),
        f"picture: {pictures / 'lab9_rollback_before.svg'}",
        f"picture: {pictures / 'lab9_rollback_after.svg'}",
    ]
