"""Lab 12, the drum (meeting 12): the properties that grade a participant's Drum (a
block kept in a free tier frame, found again by its key, not copied twice, the block
given up longest ago replaced, pinned frames kept, the copy back), scripts of the block
manager's calls played on theirs and on the engine's, then the model served with their
tier behind a pool too small for three conversations, beside the engine's own.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from unittest import mock

from minipaged.paging import manager, tier
from minipaged.paging.prefix_cache import block_hash
from minipaged.sampling import SamplingParams
from minipaged.tools.lab.engine_run import QUESTIONS, SYSTEM, run
from minipaged.tools.lab.grading import Failed, Property, in_one_line, time_limit
from minipaged.tools.viz import BarChart
from minipaged.tools.viz.pages import plural


def solution() -> dict:
    return {"Drum": tier.Drum}


# ---- scripts of the block manager's calls, played on theirs and on the engine's ------
# ("store", device frame, block): the pool evicts a frame holding the block; ("load",
# block, device frame): a prompt found the block here (the frame is looked up first);
# ("pin", [blocks]): a prompt is loading these; ("unpin",). A block is a small name (A,
# B, ...) for a key (prev_hash, token ids) of 4 tokens.


def key_of(name: str, prev: str | None = None) -> tuple:
    """The key of block `name` (4 tokens), chained to block `prev` when given."""
    tokens = tuple(ord(c) for c in (name * 4)[:4])
    return (None if prev is None else block_hash(*key_of(prev)), tokens)


def said(script: list[tuple], upto: int | None = None) -> str:
    words = []
    for event, *args in script[:upto]:
        if event == "store":
            words.append(f"store(frame {args[0]}, {args[1]})")
        elif event == "load":
            words.append(f"load({args[0]} into frame {args[1]})")
        elif event == "pin":
            words.append(f"pin {', '.join(args[0]) or 'nothing'}")
        else:
            words.append("unpin")
    return "; ".join(words)


def state(drum, names: list[str]) -> dict:
    """What the engine reads of a tier, with blocks by name: the frame of each block
    lookup finds, each frame's block, and the counts."""
    by_hash = {block_hash(*key_of(n)): n for n in names}
    return {
        "lookup": {n: drum.lookup(*key_of(n)) for n in names},
        "frames": [None if h is None else by_hash.get(h, "?") for h in drum.blocks()],
        "stores": drum.stores,
        "loads": drum.loads,
        "evictions": drum.evictions,
    }


def play(m, frames: int, script: list[tuple], given: str, why: str = "") -> None:
    """The script on their Drum and on the engine's; Failed at the first call after
    which the moves asked, the lookups, the frames or the counts differ."""
    names = sorted({step[2] for step in script if step[0] == "store"})
    theirs, ours = m.Drum(frames), tier.Drum(frames)
    for i, (event, *args) in enumerate(script):
        for drum in (theirs, ours):
            if event == "store":
                drum.store(args[0], key_of(args[1]))
            elif event == "load":
                drum.load(ours.lookup(*key_of(args[0])), args[1])
            elif event == "pin":
                drum.pinned = {ours.lookup(*key_of(n)) for n in args[0]}
            else:
                drum.pinned = set()
        done = f"after {said(script, i + 1)}"
        mine, engine = theirs.take_moves(), ours.take_moves()
        if mine != engine:
            raise Failed(
                given,
                f"{done}\nthe moves asked were {mine}, expected {engine}{why}",
            )
        mine, engine = state(theirs, names), state(ours, names)
        for part, label in [
            ("lookup", "lookup found"),
            ("frames", "the tier frames held"),
            ("stores", "stores counted"),
            ("loads", "loads counted"),
            ("evictions", "evictions counted"),
        ]:
            if mine[part] != engine[part]:
                raise Failed(
                    given,
                    f"{done}\n{label} {mine[part]}, expected {engine[part]}{why}",
                )


def kept_in_a_free_frame(m) -> None:
    play(
        m,
        3,
        [("store", 5, "A"), ("store", 2, "B"), ("store", 7, "C")],
        "a tier of 3 frames, three blocks stored",
        ": a block takes the first free tier frame, and one move copies it there",
    )


def found_by_its_key(m) -> None:
    given = "a tier of 3 frames holding A and B (B chained to A)"
    drum = m.Drum(3)
    a, b = key_of("A"), key_of("B", "A")
    drum.store(4, a)
    drum.store(6, b)
    asked = [
        (a[0], list(a[1]), 0, "A, its tokens as a list"),
        (b[0], b[1], 1, "B, chained to A"),
        (None, b[1], None, "B's tokens after no block (another block)"),
        (a[0], (9, 9, 9, 9), None, "a block never stored"),
    ]
    for prev, tokens, want, what in asked:
        got = drum.lookup(prev, tokens)
        if got != want:
            raise Failed(
                given,
                f"lookup of {what} gave {got!r}, expected {want!r}: a block is found"
                " by its previous block's hash and its tokens together",
            )
    # a hash collision: another block's hash points at A's frame
    other = (None, (9, 9, 9, 9))
    drum.frame_of[block_hash(*other)] = 0
    if drum.lookup(*other) is not None:
        raise Failed(
            given + ", and a collision: block (None, [9, 9, 9, 9])'s hash set to A's"
            " frame",
            f"lookup gave {drum.lookup(*other)!r}, expected None: the frame's stored"
            " key must be this very block",
        )


def not_copied_twice(m) -> None:
    play(
        m,
        2,
        [
            ("store", 5, "A"),
            ("store", 6, "B"),
            ("load", "A", 9),
            ("store", 9, "A"),
            ("store", 3, "C"),
        ],
        "a tier of 2 frames, A loaded back then given up again, then C",
        ": a block already here is not copied again; it becomes the most recently"
        " given up, so B (given up longer ago) makes room for C",
    )


def longest_ago_first(m) -> None:
    play(
        m,
        3,
        [
            ("store", 1, "A"),
            ("store", 2, "B"),
            ("store", 3, "C"),
            ("store", 4, "D"),
            ("store", 5, "E"),
            ("store", 6, "F"),
            ("store", 7, "G"),
        ],
        "a tier of 3 frames, seven blocks stored",
        ": when full, the block given up longest ago makes room, and is forgotten"
        " (lookup no longer finds it)",
    )


def pinned_frames_kept(m) -> None:
    play(
        m,
        2,
        [
            ("store", 1, "A"),
            ("store", 2, "B"),
            ("pin", ["A"]),
            ("store", 3, "C"),
            ("pin", ["A", "C"]),
            ("store", 4, "D"),
            ("unpin",),
            ("store", 5, "E"),
        ],
        "a tier of 2 frames, blocks pinned while a prompt loads them",
        ": a pinned frame is passed over; with every frame pinned, the block is"
        " forgotten (no move, nothing counted)",
    )


def loaded_back_in_place(m) -> None:
    play(
        m,
        2,
        [
            ("store", 5, "A"),
            ("store", 6, "B"),
            ("load", "A", 11),
            ("store", 7, "C"),
        ],
        "a tier of 2 frames, A loaded back, then C stored",
        ": load asks one copy back and keeps the block in its place (A stays the"
        " block given up longest ago, so C takes its frame)",
    )


def random_scripts(m) -> None:
    rng = random.Random(12)
    for case in range(30):
        frames, script, here = rng.randint(1, 4), [], []
        for _ in range(rng.randint(4, 20)):
            roll = rng.random()
            if roll < 0.55 or not here:
                name = rng.choice("ABCDEFGH")
                script.append(("store", rng.randint(0, 15), name))
                here.append(name)
            elif roll < 0.8:
                script.append(("load", rng.choice(here), rng.randint(0, 15)))
            elif roll < 0.92:
                script.append(("pin", sorted(set(rng.sample(here, 1)))))
            else:
                script.append(("unpin",))
        # a load only of a block the engine's tier still holds
        engine, kept = tier.Drum(frames), []
        for event, *args in script:
            if event == "load" and engine.lookup(*key_of(args[0])) is None:
                continue
            if event == "pin" and any(
                engine.lookup(*key_of(n)) is None for n in args[0]
            ):
                continue
            kept.append((event, *args))
            if event == "store":
                engine.store(args[0], key_of(args[1]))
            elif event == "pin":
                engine.pinned = {engine.lookup(*key_of(n)) for n in args[0]}
            elif event == "unpin":
                engine.pinned = set()
        play(
            m,
            frames,
            kept,
            f"random script {case + 1} of 30 (seeded), a tier of"
            f" {plural(frames, 'frame')}",
        )


KEPT = (
    "store keeps an evicted block in the first free tier frame, and asks one copy there"
)
FOUND = (
    "lookup finds a block by its previous block's hash and its tokens, and only that"
    " block"
)
ONCE = (
    "a block loaded back and given up again is not copied twice: its place is renewed"
)
LRU = "a full tier gives up the block the pool gave up longest ago, and forgets it"
PINNED = (
    "a pinned tier frame is never stored over; with every frame pinned, the block is"
    " forgotten"
)
LOADED = "load asks the copy back into the pool and keeps the block in its place"
RANDOM = "random scripts of stores, loads and pins leave the engine's tier"

PROPERTIES = [
    Property(KEPT, kept_in_a_free_frame, "a tier of 3 frames, three blocks stored"),
    Property(FOUND, found_by_its_key, "a tier of 3 frames holding A and B"),
    Property(ONCE, not_copied_twice, "a tier of 2 frames, A loaded and stored again"),
    Property(LRU, longest_ago_first, "a tier of 3 frames, seven blocks stored"),
    Property(PINNED, pinned_frames_kept, "a tier of 2 frames, pinned blocks"),
    Property(LOADED, loaded_back_in_place, "a tier of 2 frames, A loaded back"),
    Property(RANDOM, random_scripts, "random scripts on tiers of 1 to 4 frames"),
]


# ---- the run: three conversations in turn on a pool too small for all three ----------

ENGINE = dict(
    block_size=4,
    num_blocks=12,
    max_num_seqs=1,
    enable_prefix_caching=True,
    kv_offload_frames=24,
)
WORDS = SYSTEM.split()


def work() -> list[tuple[str, SamplingParams]]:
    """Three system prompts (the lab's words in three orders) in turn, three times, each
    with a question: the pool keeps one conversation's blocks, the tier the others'."""
    systems = [
        " ".join(WORDS),
        " ".join(reversed(WORDS)),
        " ".join(WORDS[1::2] + WORDS[::2]),
    ]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    return [
        (f"{systems[i % 3]} {QUESTIONS[i // 3 % len(QUESTIONS)]}", params)
        for i in range(9)
    ]


def served(llm, drum_class, **options) -> tuple:
    """The run, with `drum_class` as the tier (None: no tier): its Run and the tier's
    counts."""
    engine_options = dict(ENGINE, **options)
    if drum_class is None:
        engine_options["kv_offload_frames"] = 0
        return run(llm.new_engine(**engine_options), work()), None
    with mock.patch.object(manager, "Drum", drum_class):
        engine = llm.new_engine(**engine_options)
        done = run(engine, work())
    drum = engine.blocks.tier
    return done, (drum.stores, drum.loads, drum.evictions)


def serve_lab12(pieces, llm, pictures: Path) -> list[str]:
    """Their Drum and the engine's serve the same conversations: the same tokens, the
    same stores and loads; then the prompt tokens computed without a tier and with
    theirs."""
    try:
        with time_limit(300):
            theirs, their_counts = served(llm, pieces.Drum)
    except Exception as error:
        raise RuntimeError(
            f"the engine with your Drum failed: {in_one_line(error)}"
        ) from None
    built_in, counts = served(llm, tier.Drum)
    without, _ = served(llm, None)
    lines = []
    for i in range(len(work())):
        request_id, tokens = f"r{i}", built_in.tokens[f"r{i}"]
        if theirs.tokens.get(request_id) != tokens:
            raise RuntimeError(
                f"request {request_id}: your engine gave tokens"
                f" {theirs.tokens.get(request_id)}, the built-in one {tokens}"
            )
        lines.append(
            f"  {request_id} same {sum(map(len, tokens))} tokens as the built-in"
            f" engine: {json.dumps(theirs.texts[request_id][:48])}"
        )
    if their_counts != counts:
        raise RuntimeError(
            "your tier stored, loaded and evicted {} blocks, the engine's {}: the same"
            " calls must make the same copies".format(
                *["/".join(map(str, c)) for c in (their_counts, counts)]
            )
        )
    prompts = sum(len(llm.tokenizer.encode(p)) for p, _ in work())
    computed = {
        "no tier": prompts - without.cached_tokens,
        "your drum": prompts - theirs.cached_tokens,
    }
    stores, loads, evictions = their_counts
    lines.append(
        f"  your tier behind {ENGINE['num_blocks']} frames: {plural(stores, 'block')}"
        f" stored, {plural(loads, 'block')} loaded back,"
        f" {plural(evictions, 'block')} dropped, as the engine's"
    )
    lines.append(
        f"  prompt tokens computed: {computed['no tier']} without a tier,"
        f" {computed['your drum']} with your drum (of {prompts})"
    )
    chart = BarChart(
        f"prompt tokens computed, {len(work())} turns of 3 conversations on"
        f" {ENGINE['num_blocks']} frames",
        list(computed),
        {"computed": list(computed.values())},
        unit=" tokens",
        digits=0,
    )
    pictures.mkdir(parents=True, exist_ok=True)
    picture = pictures / "lab12_computed.svg"
    picture.write_text(chart.svg())
    return lines + ["", str(chart), f"picture: {picture}"]
