"""The properties of lab 4, the continuous batcher: the participant's Scheduler decides
over the engine's block manager, with no model (as the simulator runs it): each sampled
token is a dummy, so a case is a few prompts and a pool of frames, small enough to redo
on paper.
"""

from __future__ import annotations

import random
import traceback

from minipaged.paging import BlockManager, NoFreeFramesError
from minipaged.sampling import SamplingParams
from minipaged.scheduler import SchedulerConfig
from minipaged.sequence import Request, Sequence
from minipaged.tools.lab.grading import Failed, Property
from minipaged.tools.viz.pages import plural


class Case:
    """A scheduler of the participant's class over `frames` frames of 4 slots, and its
    requests."""

    def __init__(
        self,
        m,
        frames: int,
        prompts: list[int],
        max_tokens: int = 4,
        n: list[int] | None = None,
        **config,
    ):
        self.blocks = BlockManager(frames, 4, enable_prefix_caching=False)
        config = dict(dict(max_model_len=64, watermark=0.0), **config)
        self.scheduler = m.Scheduler(SchedulerConfig(**config), self.blocks)
        self.requests, seq_id = [], 0
        for i, length in enumerate(prompts):
            prompt = [10 + i] * length
            samples = (n or [1] * len(prompts))[i]
            seqs = [
                Sequence(seq_id + k, list(prompt), length, index=k)
                for k in range(samples)
            ]
            seq_id += samples
            params = SamplingParams(
                n=samples, max_tokens=max_tokens, ignore_eos=True, seed=0
            )
            self.requests.append(Request(f"r{i}", None, prompt, params, seqs))
            self.scheduler.add(self.requests[-1])
        self.given = (
            f"{frames} frames of 4 slots, prompts of {', '.join(map(str, prompts))}"
            " tokens"
            + "".join(
                f", {k} {v}"
                for k, v in config.items()
                if k != "max_model_len" and not (k == "watermark" and v == 0)
            )
            + (f", n = {n}" if n else "")
        )

    def schedule(self):
        try:
            return self.scheduler.schedule()
        except NoFreeFramesError as error:
            steps = [
                f.name
                for f in traceback.extract_tb(error.__traceback__)
                if f.name in ("_reserve_decode_slots", "_admit")
            ]
            who, fix = (
                (
                    f"{steps[-1]}(batch)",
                    (
                        "check again that they fit after each preemption"
                        if steps[-1] == "_reserve_decode_slots"
                        else "check that they fit before admitting"
                    ),
                )
                if steps
                else ("a step", "check the frames fit before admitting or appending")
            )
            raise Failed(
                self.given,
                f"{who} took frames that were not free (the block manager said:"
                f" {error}): {fix}",
            ) from None

    def step(self):
        """One schedule() and its update() with a dummy token per sampler; the batch."""
        batch = self.schedule()
        self.scheduler.update(
            batch, {seq: 1 for s in batch.scheduled for seq in s.samplers}
        )
        return batch


def _names(batch, kind: str) -> list[str]:
    return list(
        dict.fromkeys(s.request.request_id for s in batch.scheduled if s.kind == kind)
    )


def _expect_admitted(case: Case, expected: list[str], why: str) -> None:
    got = _names(case.step(), "prefill")
    if got != expected:
        raise Failed(
            case.given,
            f"the first step's _admit(batch) should admit {', '.join(expected)}"
            f" ({why}); it admitted {', '.join(got) or 'nobody'}",
        )


def first_come_first_served(m) -> None:
    _expect_admitted(
        Case(m, 5, [8, 8, 8, 4]),
        ["r0", "r1"],
        "r2 needs 2 frames and 1 is left; r3 may not overtake it",
    )


def never_past_the_free_frames(m) -> None:
    _expect_admitted(
        Case(m, 6, [12, 12, 12]), ["r0", "r1"], "3 frames each, 6 frames in all"
    )


def keeps_the_watermark(m) -> None:
    _expect_admitted(
        Case(m, 10, [16, 20], watermark=0.2),
        ["r0"],
        "r1's 5 frames would leave 1 free, under the watermark of 2",
    )


def an_idle_engine_admits_what_fits(m) -> None:
    _expect_admitted(
        Case(m, 4, [16], watermark=0.3),
        ["r0"],
        "it needs all 4 frames; nothing runs, so the watermark does not hold it back",
    )


def at_most_max_num_seqs(m) -> None:
    _expect_admitted(
        Case(m, 16, [4, 4, 4], n=[2, 1, 1], max_num_seqs=3),
        ["r0", "r1"],
        "r0 runs 2 samples, r1 one more makes 3",
    )


def at_most_max_num_batched_tokens(m) -> None:
    _expect_admitted(
        Case(m, 16, [6, 6, 6], max_model_len=16, max_num_batched_tokens=16),
        ["r0", "r1"],
        "12 prompt tokens, and 6 more would make 18",
    )


def _rows(batch) -> list[tuple]:
    return [
        (s.request.request_id, s.seq.index, s.kind, s.num_new_tokens)
        for s in batch.scheduled
    ]


def _say_rows(rows: list[tuple]) -> str:
    """'r0 decode 1 token, r1.0 decode 1 token': a sample's index where the request has
    several."""
    several = {r for r, index, _, _ in rows if index > 0}
    return (
        ", ".join(
            f"{r}{f'.{index}' if r in several or index else ''} {kind}"
            f" {plural(n, 'token')}"
            for r, index, kind, n in rows
        )
        or "nothing"
    )


def _ids(requests) -> str:
    return ", ".join(r.request_id for r in requests) or "nobody"


def every_running_request_decodes(m) -> None:
    case = Case(m, 16, [4, 5, 6], n=[1, 2, 1])
    case.step()
    expected = [
        ("r0", 0, "decode", 1),
        ("r1", 0, "decode", 1),
        ("r1", 1, "decode", 1),
        ("r2", 0, "decode", 1),
    ]
    for step in (2, 3):
        given = case.given + f", {['', '', 'two', 'three'][step]} steps"
        batch = case.schedule()
        rows = _rows(batch)
        if sorted(rows) != expected:
            raise Failed(
                given,
                f"step {step}'s _reserve_decode_slots(batch) should decode one token of"
                f" each sequence, {_say_rows(expected)}; it scheduled"
                f" {_say_rows(rows)}",
            )
        for s in batch.scheduled:
            if case.blocks.num_tokens(s.seq.seq_id) != len(s.seq.token_ids):
                raise Failed(
                    given,
                    f"{s.request.request_id} sample {s.seq.index} has no slot for its"
                    " next token (call self._schedule_decode(request, batch))",
                )
        if case.scheduler.running != case.requests:
            raise Failed(
                given,
                f"after step {step}'s _reserve_decode_slots(batch), self.running should"
                f" be r0, r1, r2, each once; it is {_ids(case.scheduler.running)}"
                " (self._schedule_decode(request, batch) appends the request to"
                " self.running itself)",
            )
        case.scheduler.update(
            batch, {seq: 1 for s in batch.scheduled for seq in s.samplers}
        )


def _expect_preempted(
    m,
    frames: int,
    prompts: list[int],
    n: list[int] | None,
    victims: list[str],
    why: str,
) -> None:
    """All requests admitted in one step (oldest r0), then the second step runs out of
    frames."""
    case = Case(m, frames, prompts, n=n)
    case.given = given = case.given + ", two steps"
    first = case.step()
    if _names(first, "prefill") != [r.request_id for r in case.requests]:
        raise Failed(
            given,
            f"the first step should admit all {len(case.requests)} requests (their"
            f" prompts take all {frames} frames); it admitted"
            f" {', '.join(_names(first, 'prefill')) or 'nobody'}",
        )
    batch = case.schedule()
    preempted = [request_id for request_id, _ in batch.preempted]
    running = [r.request_id for r in case.requests if r.request_id not in victims]
    decoded = _names(batch, "decode")
    if preempted != victims or decoded != running:
        raise Failed(
            given,
            f"in the second step {why}: _reserve_decode_slots(batch) should preempt"
            f" {', '.join(victims)}, in that order (the newest first), and decode"
            f" {', '.join(running)}; it preempted {', '.join(preempted) or 'nobody'}"
            f" and decoded {', '.join(decoded) or 'nobody'}",
        )
    waiting = [r.request_id for r in case.scheduler.waiting]
    if (
        waiting != victims[::-1]
        or [r.request_id for r in case.scheduler.running] != running
    ):
        raise Failed(
            given,
            f"after the second step, waiting should be {', '.join(victims[::-1])} (each"
            " preempted request goes back to its front) and running"
            f" {', '.join(running)}; waiting is {', '.join(waiting) or 'empty'},"
            f" running {_ids(case.scheduler.running)}",
        )
    held = [
        r.request_id
        for r in case.requests
        if r.request_id in victims and any(case.blocks.has(s.seq_id) for s in r.seqs)
    ]
    if held:
        raise Failed(
            given,
            f"preempted {', '.join(held)} still {'holds' if len(held) == 1 else 'hold'}"
            " frames (self._preempt(request, batch) frees them)",
        )


def preempts_the_newest_when_frames_run_out(m) -> None:
    # r0 and r1 fill their frames and need a new one each; r2, r3 (2 tokens) have room
    # left
    _expect_preempted(
        m,
        4,
        [4, 4, 2, 2],
        None,
        ["r3", "r2"],
        "r0 and r1 each need a new frame and none is free",
    )
    # r0's 2 samples need a frame each: only preempting both r3 and r2 makes room
    _expect_preempted(
        m,
        4,
        [4, 2, 2, 2],
        [2, 1, 1, 1],
        ["r3", "r2"],
        "r0's 2 samples each need a new frame and none is free",
    )


def whole_workloads_finish(m) -> None:
    for seed in range(12):
        rng = random.Random(seed)
        # each request fits 12 frames alone: 2 x (14 + 9) tokens at most
        size = rng.randrange(2, 7)
        prompts = [rng.randrange(1, 15) for _ in range(size)]
        n = [rng.choice([1, 1, 2]) for _ in range(size)]
        max_tokens = rng.randrange(1, 10)
        case = Case(m, 12, prompts, max_tokens=max_tokens, n=n, max_num_seqs=4)
        for step in range(300):
            if not case.scheduler.has_unfinished():
                break
            batch = case.step()
            seqs = [s.seq for s in batch.scheduled]
            if not seqs:
                raise Failed(
                    case.given,
                    f"step {step} scheduled nobody, with requests still waiting (the "
                    "engine would stop here): an idle engine must admit",
                )
            if len(set(map(id, seqs))) != len(seqs) or len(seqs) > 4:
                raise Failed(
                    case.given,
                    f"step {step} scheduled {len(seqs)} sequences (some twice?); "
                    "max_num_seqs is 4",
                )
        short = [
            (r.request_id, s.index)
            for r in case.requests
            for s in r.seqs
            if len(s.output_ids) != r.params.max_tokens
        ]
        if case.scheduler.has_unfinished() or short:
            raise Failed(
                case.given,
                f"after 300 steps, not every sequence has its {max_tokens}"
                f" tokens: {short or 'requests left unfinished'}",
            )
        if case.blocks.num_free_frames != 12:
            raise Failed(
                case.given,
                f"every request finished, yet {12 - case.blocks.num_free_frames} frames"
                " are still taken",
            )


LAB4 = [
    Property(
        "waiting requests are admitted first come, first served, while their"
        " frames fit",
        first_come_first_served,
        "5 frames of 4 slots, prompts of 8, 8, 8, 4 tokens",
    ),
    Property(
        "admission never takes more frames than are free",
        never_past_the_free_frames,
        "6 frames of 4 slots, prompts of 12, 12, 12 tokens",
    ),
    Property(
        "admission leaves the watermark free for running sequences to grow",
        keeps_the_watermark,
        "10 frames of 4 slots, prompts of 16, 20 tokens, watermark 0.2",
    ),
    Property(
        "an idle engine admits a request that needs every frame",
        an_idle_engine_admits_what_fits,
        "4 frames of 4 slots, a prompt of 16 tokens, watermark 0.3",
    ),
    Property(
        "at most max_num_seqs sequences run at once",
        at_most_max_num_seqs,
        "16 frames of 4 slots, prompts of 4, 4, 4 tokens, n = [2, 1, 1],"
        " max_num_seqs 3",
    ),
    Property(
        "a step computes at most max_num_batched_tokens tokens",
        at_most_max_num_batched_tokens,
        "16 frames of 4 slots, prompts of 6, 6, 6 tokens, max_num_batched_tokens 16",
    ),
    Property(
        "every running sequence gets a slot for its next token each step",
        every_running_request_decodes,
        "16 frames of 4 slots, prompts of 4, 5, 6 tokens, n = [1, 2, 1], three steps",
    ),
    Property(
        "when frames run out, the newest requests are preempted, newest first, and the"
        " older ones run",
        preempts_the_newest_when_frames_run_out,
        "4 frames of 4 slots, prompts of 4, 4, 2, 2 tokens, two steps",
    ),
    Property(
        "random workloads run to the end: every sequence gets its tokens, no frame is"
        " lost",
        whole_workloads_finish,
        "random workloads of 2 to 6 requests on 12 frames of 4 slots (seeded)",
    ),
]
