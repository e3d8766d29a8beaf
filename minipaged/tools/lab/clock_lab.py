"""Lab 6, CLOCK page replacement for the prefix cache (meeting 9): the properties that
grade a participant's Clock (its ring, its second chance, its hand), a chat trace
replayed beside FIFO, LRU and MIN, then the model served with it next to the engine's
own CLOCK.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

from minipaged.paging import replacement
from minipaged.sampling import SamplingParams
from minipaged.tools.bench.replacement import replay
from minipaged.tools.bench.workload import chat_trace
from minipaged.tools.lab.engine_run import QUESTIONS, SYSTEM, run
from minipaged.tools.lab.grading import Failed, Property, in_one_line, time_limit
from minipaged.tools.viz import BarChart
from minipaged.tools.viz.pages import plural


def solution() -> dict:
    return {"Clock": replacement.Clock}


# ---- a script of the prefix cache's calls, played on a policy
# ---------------------------------- ("enter", f): a block's content entered frame f (in
# use); ("park", f): its last user let go; ("use", f): a hit took the parked frame f
# back (the policy is not told); ("leave", f): the cache forgot f; ("evict",): the cache
# needs a frame: victim(parked), and that frame leaves.


def play(policy, script: list[tuple], given: str, engine=None) -> list[int]:
    """The victims the policy chose along the script; Failed when one is not a parked
    frame, or (with `engine`, the reference's victims) the first that differs from the
    engine's.
    """
    parked, chosen = OrderedDict(), []
    for event, *frame in script:
        if event == "enter":
            policy.entered(frame[0], 1000 + frame[0])
        elif event == "park":
            parked[frame[0]] = None
            policy.parked(frame[0])
        elif event == "use":
            del parked[frame[0]]
        elif event == "leave":
            parked.pop(frame[0], None)
            policy.left(frame[0])
        else:
            victim = policy.victim(OrderedDict(parked))
            if (
                isinstance(victim, bool)
                or not isinstance(victim, int)
                or victim not in parked
            ):
                what = (
                    "a frame in use (not parked)"
                    if isinstance(victim, int) and not isinstance(victim, bool)
                    else "not a frame number"
                )
                raise Failed(
                    given,
                    f"eviction {len(chosen) + 1}: victim(parked) returned {victim!r},"
                    f" {what}; the parked frames were {list(parked)}: only a parked"
                    " frame may be chosen",
                )
            if engine is not None and victim != engine[len(chosen)]:
                raise Failed(
                    given,
                    f"the victims so far were {chosen}; eviction {len(chosen) + 1}"
                    f" chose frame {victim}, expected frame {engine[len(chosen)]}"
                    f" (parked: {list(parked)})",
                )
            chosen.append(victim)
            del parked[victim]
            policy.left(victim)
    return chosen


def against_engine(m, script: list[tuple], given: str, why: str) -> None:
    """Their victims along the script must be the engine's CLOCK's; `why` says what the
    script tries."""
    expected = play(replacement.Clock(), script, given)
    try:
        play(m.Clock(), script, given, engine=expected)
    except Failed as failed:
        raise Failed(failed.given, f"{failed.detail}\n{why}") from None


def _frames(frames) -> str:
    return ", ".join(map(str, frames))


ENTRY = [5, 2, 7, 0, 3, 6, 1, 4]


def ring_keeps_entry_order(m) -> None:
    script = (
        [("enter", f) for f in ENTRY]
        + [("park", f) for f in reversed(ENTRY)]
        + [("evict",)] * 8
    )
    given = (
        f"8 frames entered in the order {_frames(ENTRY)}, then parked in the reverse"
        " order; 8 evictions (each victim leaves)"
    )
    against_engine(
        m,
        script,
        given,
        "every bit is set at first, so the hand clears them all in one turn and then "
        "takes the frames in the order their contents entered (parking does not "
        "move a frame in the ring)",
    )


def referenced_frame_gets_a_second_chance(m) -> None:
    script = (
        [("enter", f) for f in range(6)]
        + [("park", f) for f in range(6)]
        + [("evict",)]
    )
    script += [("use", 1), ("park", 1), ("use", 3), ("park", 3)] + [("evict",)] * 5
    given = (
        "frames 0-5 entered and parked; one eviction (frame 0: the hand's turn cleared"
        " every bit); then frames 1 and 3 hit and parked again; 5 more evictions"
    )
    against_engine(
        m,
        script,
        given,
        "parking sets a frame's referenced bit; the hand clears a set bit and moves "
        "on, and takes the first parked frame whose bit is clear",
    )


def only_parked_frames_are_chosen(m) -> None:
    script = (
        [("enter", f) for f in range(8)]
        + [("park", f) for f in (2, 3, 5, 6)]
        + [("evict",)] * 3
    )
    script += [("park", 0)] + [("evict",)] * 2
    given = (
        "frames 0-7 entered, only 2, 3, 5 and 6 parked (0, 1, 4 and 7 in use); 3"
        " evictions; frame 0 parked; 2 more evictions"
    )
    against_engine(
        m,
        script,
        given,
        "a frame in use is pinned: the hand passes over it (it keeps its place in "
        "the ring) and chooses among the parked frames only",
    )


def left_removes_from_the_ring(m) -> None:
    script = (
        [("enter", f) for f in range(6)]
        + [("leave", 3)]
        + [("park", f) for f in (0, 1, 2, 4, 5)]
    )
    script += [("enter", 3), ("park", 3)] + [("evict",)] * 6
    given = (
        "frames 0-5 entered; frame 3 forgotten (left) while in use, then filled again"
        " with a new block (entered) after the others were parked; 6 evictions"
    )
    against_engine(
        m,
        script,
        given,
        "a frame that left the cache leaves the ring, so when it enters again it "
        "stands last, behind every frame that entered before it",
    )


# ---- the trace: hit rates beside FIFO, LRU and MIN -----------------------------------

BLOCK_SIZE, CONCURRENCY, POOLS = 4, 2, (28, 39, 50)


def trace():
    """36 requests of 12 conversations over 3 system prompts: FIFO < CLOCK < LRU at each
    pool."""
    return chat_trace(
        num_conversations=12,
        turns=3,
        num_system_prompts=3,
        system_len=16,
        question_mean=6,
        answer_mean=6,
        active=3,
        seed=2,
    )


class Guarded:
    """Their policy in the replay, its victims checked: a frame in use chosen is said
    plainly (the block manager would fail on it further on)."""

    def __init__(self, policy, given: str):
        self.policy, self.given, self.evictions = policy, given, 0

    def entered(self, frame: int, block: int) -> None:
        self.policy.entered(frame, block)

    def parked(self, frame: int) -> None:
        self.policy.parked(frame)

    def left(self, frame: int) -> None:
        self.policy.left(frame)

    def victim(self, parked) -> int:
        self.evictions += 1
        victim = self.policy.victim(OrderedDict(parked))
        if (
            isinstance(victim, bool)
            or not isinstance(victim, int)
            or victim not in parked
        ):
            raise Failed(
                self.given,
                f"eviction {self.evictions}: victim(parked) returned {victim!r}, which"
                f" is not one of the {plural(len(parked), 'parked frame')}: only a"
                " parked frame may be chosen",
            )
        return victim


def hits(policy, frames: int) -> tuple[int, int]:
    """(prompt blocks found, looked up) replaying the trace with `policy` on `frames`
    frames."""
    result = replay(trace(), frames, BLOCK_SIZE, policy, CONCURRENCY)
    return result.hits, result.lookups


def clock_hits_between_fifo_and_lru(m) -> None:
    for frames in POOLS:
        given = (
            "a chat trace of 36 requests over 3 system prompts (blocks of"
            f" {BLOCK_SIZE}, {CONCURRENCY} requests in memory at once) replayed on"
            f" {frames} frames"
        )
        others = {
            name: hits(name, frames)[0] for name in ("fifo", "clock", "lru", "min")
        }
        theirs, looked_up = hits(Guarded(m.Clock(), given), frames)
        if theirs != others["clock"]:
            side = (
                "more than MIN, the optimum: impossible for a real policy"
                if theirs > others["min"]
                else (
                    "no better than FIFO: is the referenced bit ever read?"
                    if theirs <= others["fifo"]
                    else (
                        "as many as LRU or more"
                        if theirs >= others["lru"]
                        else "between FIFO and LRU, but not CLOCK's count"
                    )
                )
            )
            raise Failed(
                given,
                f"your Clock found {theirs} of {looked_up} prompt blocks in the cache,"
                f" the engine's CLOCK {others['clock']} (FIFO {others['fifo']}, LRU"
                f" {others['lru']}, MIN {others['min']}): {side}",
            )


PROPERTIES = [
    Property(
        "the hand goes round the ring in the order the frames' contents entered",
        ring_keeps_entry_order,
        "8 frames entered in a shuffled order, parked in reverse, 8 evictions",
    ),
    Property(
        "a referenced frame gets a second chance: the hand clears its bit and moves on",
        referenced_frame_gets_a_second_chance,
        "6 frames, 2 of them hit again, 6 evictions",
    ),
    Property(
        "only parked frames are chosen: the hand passes over frames in use",
        only_parked_frames_are_chosen,
        "8 frames, 4 of them in use, 5 evictions",
    ),
    Property(
        "left(frame) takes the frame out of the ring: entering again, it stands last",
        left_removes_from_the_ring,
        "6 frames, one forgotten and filled again, 6 evictions",
    ),
    Property(
        "on a chat trace your CLOCK hits as often as the engine's: above FIFO, below"
        " LRU, never above MIN",
        clock_hits_between_fifo_and_lru,
        "a chat trace of 36 requests on 28, 39 and 50 frames",
    ),
]


# ---- the run: the model served with their Clock on a pool where the prefix cache must
# evict ---

ENGINE = dict(block_size=4, num_blocks=20, max_num_seqs=2, enable_prefix_caching=True)
WORDS = SYSTEM.split()


def work() -> list[tuple[str, SamplingParams]]:
    """Three system prompts (the lab's words in three orders) in turn, twice, each with
    a question:
    their blocks are cached, evicted when the pool runs short, and found again."""
    systems = [
        " ".join(WORDS),
        " ".join(reversed(WORDS)),
        " ".join(WORDS[1::2] + WORDS[::2]),
    ]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    return [
        (f"{systems[i % 3]} {QUESTIONS[i % len(QUESTIONS)]}", params) for i in range(6)
    ]


def serve_lab6(pieces, llm, pictures: Path) -> list[str]:
    """Their Clock and the engine's 'clock' serve the same requests: same tokens, same
    hits."""
    requests = work()
    try:
        with time_limit(300):
            theirs = run(
                llm.new_engine(**ENGINE, prefix_cache_policy=pieces.Clock()), requests
            )
    except Exception as error:
        raise RuntimeError(
            f"the engine with your Clock failed: {in_one_line(error)}"
        ) from None
    built_in = run(llm.new_engine(**ENGINE, prefix_cache_policy="clock"), requests)
    lru = run(llm.new_engine(**ENGINE, prefix_cache_policy="lru"), requests)
    lines = []
    for i in range(len(requests)):
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
    if theirs.cached_tokens != built_in.cached_tokens:
        raise RuntimeError(
            f"your Clock found {plural(theirs.cached_tokens, 'prompt token')} in the"
            f" prefix cache, the engine's CLOCK {built_in.cached_tokens}: the same"
            " calls must give the same victims"
        )
    lines.append(
        f"  prefix cache on {ENGINE['num_blocks']} frames:"
        f" {plural(theirs.cached_tokens, 'prompt token')} found with your Clock, as"
        f" with the engine's (LRU: {lru.cached_tokens})"
    )
    frames = POOLS[0]
    rates = {}
    for name, policy in [
        ("FIFO", "fifo"),
        ("your CLOCK", pieces.Clock()),
        ("LRU", "lru"),
        ("MIN", "min"),
    ]:
        found, looked_up = hits(policy, frames)
        rates[name] = 100 * found / looked_up
    chart = BarChart(
        f"prefix-cache hit rate on a chat trace of 36 requests, {frames} frames",
        list(rates),
        {"hit rate": list(rates.values())},
        unit="%",
    )
    pictures.mkdir(parents=True, exist_ok=True)
    picture = pictures / "lab6_hit_rate.svg"
    picture.write_text(chart.svg())
    return lines + ["", str(chart), f"picture: {picture}"]
