"""The properties of lab 4, the continuous batcher: the participant's Scheduler decides over
the engine's block manager, with no model (as the simulator runs it): each sampled token is a
dummy, so a case is a few prompts and a pool of frames, small enough to redo on paper.
"""

from __future__ import annotations

import random

from minipaged.lab.grading import Failed, Property
from minipaged.paging import BlockManager, NoFreeFramesError
from minipaged.sampling import SamplingParams
from minipaged.scheduler import SchedulerConfig
from minipaged.sequence import Request, Sequence


class Case:
    """A scheduler of the participant's class over `frames` frames of 4 slots, and its requests."""

    def __init__(self, m, frames: int, prompts: list[int], max_tokens: int = 4, n: list[int] | None = None,
                 **config):
        self.blocks = BlockManager(frames, 4, enable_prefix_caching=False)
        config = dict(dict(max_model_len=64, watermark=0.0), **config)
        self.scheduler = m.Scheduler(SchedulerConfig(**config), self.blocks)
        self.requests, seq_id = [], 0
        for i, length in enumerate(prompts):
            prompt = [10 + i] * length
            samples = (n or [1] * len(prompts))[i]
            seqs = [Sequence(seq_id + k, list(prompt), length, index=k) for k in range(samples)]
            seq_id += samples
            params = SamplingParams(n=samples, max_tokens=max_tokens, ignore_eos=True, seed=0)
            self.requests.append(Request(f"r{i}", None, prompt, params, seqs))
            self.scheduler.add(self.requests[-1])
        self.given = (f"{frames} frames of 4 slots, prompts of {', '.join(map(str, prompts))} tokens"
                      + "".join(f", {k} {v}" for k, v in config.items() if k != "max_model_len"
                                and not (k == "watermark" and v == 0))
                      + (f", n = {n}" if n else ""))

    def schedule(self):
        try:
            return self.scheduler.schedule()
        except NoFreeFramesError as error:
            raise Failed(self.given, f"a step took frames that were not free (the block manager said: {error}): "
                         "check the frames fit before admitting or appending") from None

    def step(self):
        """One schedule() and its update() with a dummy token per sampler; the batch."""
        batch = self.schedule()
        self.scheduler.update(batch, {seq: 1 for s in batch.scheduled for seq in s.samplers})
        return batch


def _names(batch, kind: str) -> list[str]:
    return list(dict.fromkeys(s.request.request_id for s in batch.scheduled if s.kind == kind))


def _expect_admitted(case: Case, expected: list[str], why: str) -> None:
    got = _names(case.step(), "prefill")
    if got != expected:
        raise Failed(case.given, f"the first step should admit {', '.join(expected)} ({why}); it admitted "
                     f"{', '.join(got) or 'nobody'}")


def first_come_first_served(m) -> None:
    _expect_admitted(Case(m, 5, [8, 8, 8, 4]), ["r0", "r1"],
                     "r2 needs 2 frames and 1 is left; r3 may not overtake it")


def never_past_the_free_frames(m) -> None:
    _expect_admitted(Case(m, 6, [12, 12, 12]), ["r0", "r1"], "3 frames each, 6 frames in all")


def keeps_the_watermark(m) -> None:
    _expect_admitted(Case(m, 10, [16, 20], watermark=0.2), ["r0"],
                     "r1's 5 frames would leave 1 free, under the watermark of 2")


def an_idle_engine_admits_what_fits(m) -> None:
    _expect_admitted(Case(m, 4, [16], watermark=0.3), ["r0"],
                     "it needs all 4 frames; nothing runs, so the watermark does not hold it back")


def at_most_max_num_seqs(m) -> None:
    _expect_admitted(Case(m, 16, [4, 4, 4], n=[2, 1, 1], max_num_seqs=3), ["r0", "r1"],
                     "r0 runs 2 samples, r1 one more makes 3")


def at_most_max_num_batched_tokens(m) -> None:
    _expect_admitted(Case(m, 16, [6, 6, 6], max_model_len=16, max_num_batched_tokens=16), ["r0", "r1"],
                     "12 prompt tokens, and 6 more would make 18")


def every_running_request_decodes(m) -> None:
    case = Case(m, 16, [4, 5, 6], n=[1, 2, 1])
    case.step()
    batch = case.schedule()
    rows = [(s.request.request_id, s.seq.index, s.kind, s.num_new_tokens) for s in batch.scheduled]
    expected = [("r0", 0, "decode", 1), ("r1", 0, "decode", 1), ("r1", 1, "decode", 1), ("r2", 0, "decode", 1)]
    if sorted(rows) != expected:
        raise Failed(case.given + ", two steps", f"the second step should decode one token of each sequence, "
                     f"{expected}; it scheduled {rows}")
    for s in batch.scheduled:
        if case.blocks.num_tokens(s.seq.seq_id) != len(s.seq.token_ids):
            raise Failed(case.given + ", two steps", f"{s.request.request_id} sample {s.seq.index} has no slot for "
                         "its next token (call self._schedule_decode(request, batch))")


def preempts_the_newest_when_frames_run_out(m) -> None:
    case = Case(m, 2, [4, 4])
    case.step()
    batch = case.step()
    r0, r1 = case.requests
    given = case.given + ": both admitted, then both need a new frame and none is free"
    if batch.preempted != [("r1", "recompute")] or _names(batch, "decode") != ["r0"]:
        raise Failed(given, f"the newest (r1) should be preempted so that r0 decodes; preempted "
                     f"{batch.preempted}, decoded {_names(batch, 'decode')}")
    if case.scheduler.waiting[0] is not r1 or case.scheduler.running != [r0] or case.blocks.has(r1.seqs[0].seq_id):
        raise Failed(given, "r1 should be back at the front of waiting without frames, r0 alone in running")


def whole_workloads_finish(m) -> None:
    for seed in range(12):
        rng = random.Random(seed)
        size = rng.randrange(2, 7)  # each request fits 12 frames alone: 2 x (14 + 9) tokens at most
        prompts = [rng.randrange(1, 15) for _ in range(size)]
        n = [rng.choice([1, 1, 2]) for _ in range(size)]
        case = Case(m, 12, prompts, max_tokens=rng.randrange(1, 10), n=n, max_num_seqs=4)
        for step in range(300):
            if not case.scheduler.has_unfinished():
                break
            batch = case.step()
            seqs = [s.seq for s in batch.scheduled]
            if not seqs:
                raise Failed(case.given, f"step {step} scheduled nobody, with requests still waiting (the "
                             "engine would stop here): an idle engine must admit")
            if len(set(map(id, seqs))) != len(seqs) or len(seqs) > 4:
                raise Failed(case.given, f"step {step} scheduled {len(seqs)} sequences (some twice?); "
                             "max_num_seqs is 4")
        short = [(r.request_id, s.index) for r in case.requests for s in r.seqs
                 if len(s.output_ids) != r.params.max_tokens]
        if case.scheduler.has_unfinished() or short:
            raise Failed(case.given, f"after 300 steps, not every sequence has its {r.params.max_tokens} tokens: "
                         f"{short or 'requests left unfinished'}")
        if case.blocks.num_free_frames != 12:
            raise Failed(case.given, f"every request finished, yet {12 - case.blocks.num_free_frames} frames "
                         "are still taken")


LAB4 = [
    Property("waiting requests are admitted first come, first served, while their frames fit", first_come_first_served,
             "5 frames of 4 slots, prompts of 8, 8, 8, 4 tokens"),
    Property("admission never takes more frames than are free", never_past_the_free_frames,
             "6 frames of 4 slots, prompts of 12, 12, 12 tokens"),
    Property("admission leaves the watermark free for running sequences to grow", keeps_the_watermark,
             "10 frames of 4 slots, prompts of 16, 20 tokens, watermark 0.2"),
    Property("an idle engine admits a request that needs every frame", an_idle_engine_admits_what_fits,
             "4 frames of 4 slots, a prompt of 16 tokens, watermark 0.3"),
    Property("at most max_num_seqs sequences run at once", at_most_max_num_seqs,
             "16 frames of 4 slots, prompts of 4, 4, 4 tokens, n = [2, 1, 1], max_num_seqs 3"),
    Property("a step computes at most max_num_batched_tokens tokens", at_most_max_num_batched_tokens,
             "16 frames of 4 slots, prompts of 6, 6, 6 tokens, max_num_batched_tokens 16"),
    Property("every running sequence gets a slot for its next token each step", every_running_request_decodes,
             "16 frames of 4 slots, prompts of 4, 5, 6 tokens, n = [1, 2, 1], two steps"),
    Property("when frames run out, the newest request is preempted and the older ones run",
             preempts_the_newest_when_frames_run_out, "2 frames of 4 slots, prompts of 4, 4 tokens, two steps"),
    Property("random workloads run to the end: every sequence gets its tokens, no frame is lost",
             whole_workloads_finish, "random workloads of 2 to 6 requests on 12 frames of 4 slots (seeded)"),
]
