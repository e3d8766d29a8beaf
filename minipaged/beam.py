"""Beam search: which beams extend, which fork, which die, applied to the pages by
`apply`.

After each forward pass the engine asks `step` what became of its beams (anything with
`cumulative_logprob` and `output_ids`); the scheduler then `apply`s it: appends,
fork()s, frees.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from minipaged.outputs import CompletionOutput
from minipaged.sampling import log_softmax, most_likely


@dataclass(slots=True)
class Candidate:
    parent: object  # the beam it continues
    token: int
    score: float  # cumulative log probability of the beam with this token


@dataclass(slots=True)
class Hypothesis:
    """A finished beam: its tokens and score (its sequence's frames are gone or
    going)."""

    token_ids: list[int]
    prompt_len: int
    cumulative_logprob: float
    finish_reason: str = "stop"

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]


@dataclass(slots=True)
class BeamStep:
    """What one step of beam search decided, for the engine to apply."""

    # a parent's best: appended in place
    extend: list[Candidate] = field(default_factory=list)
    # a parent's others: new beams forked from it
    fork: list[Candidate] = field(default_factory=list)
    drop: list = field(default_factory=list)  # parents with no continuation kept
    # continuations that end the text
    done: list[Candidate] = field(default_factory=list)


def step(
    rows: list[tuple[object, np.ndarray]], width: int, ends: Callable[[int], bool]
) -> BeamStep:
    """One step over (beam, logits row) pairs; `ends(token)` says whether a token ends
    the text.

    Every live beam proposes its 2 * width most likely next tokens, scored by cumulative
    log probability; the best `width` that do not end the text become the new beams. A
    beam with one surviving continuation extends in place; a beam with several is
    fork()ed for the others (they share its frames, and copy-on-write copies its partial
    last block at the first write); a beam with none is dropped and its frames are
    freed. Continuations that end the text are kept as finished hypotheses, ranked by
    log probability per output token (`score`).
    """
    candidates = []
    for beam, logits in rows:
        logprobs = log_softmax(logits[None])[0]  # (vocab,) float64
        candidates += [
            Candidate(beam, int(t), beam.cumulative_logprob + float(logprobs[t]))
            for t in most_likely(logprobs, 2 * width)
        ]
    candidates.sort(key=lambda c: -c.score)
    kept, result = [], BeamStep()
    for c in candidates:
        if len(kept) == width:
            break
        (result.done if ends(c.token) else kept).append(c)
    for beam, _ in rows:
        mine = [c for c in kept if c.parent is beam]
        if mine:
            result.extend.append(mine[0])
            result.fork += mine[1:]
        else:
            result.drop.append(beam)
    return result


def score(beam) -> float:
    """Cumulative log probability per generated token (length penalty 1)."""
    return beam.cumulative_logprob / max(len(beam.output_ids), 1)


def is_over(live: list, done: list, width: int, max_output_len: int) -> bool:
    """The search ends when the beams reach the length limit, or when `width` finished
    hypotheses all score at least as well as the best live beam."""
    if not live or len(live[0].output_ids) >= max_output_len:
        return True
    best_done = sorted((score(b) for b in done), reverse=True)[:width]
    return len(best_done) == width and max(score(b) for b in live) <= best_done[-1]


def best(beams: list, n: int) -> list:
    """The n best beams, best first."""
    return sorted(beams, key=score, reverse=True)[:n]


def apply(request, step: BeamStep, pages, max_model_len: int) -> None:
    """Apply one step to a request's beams through `pages` (the scheduler: fork_seq,
    free_seq, finish_seq): finished continuations become hypotheses, dropped beams free
    their frames,
    the others fork from their parent (before it appends) or extend it in place."""
    p = request.params
    request.done_beams += [
        Hypothesis(c.parent.token_ids + [c.token], c.parent.prompt_len, c.score)
        for c in step.done
    ]
    for seq in step.drop:
        seq.finish_reason = "pruned"
        pages.free_seq(seq)
    live = []
    for c in step.fork + step.extend:  # children fork before their parent appends
        seq = pages.fork_seq(c.parent) if c in step.fork else c.parent
        seq.token_ids.append(c.token)
        seq.cumulative_logprob = c.score
        live.append(seq)
    request.seqs = live
    for i, seq in enumerate(live):
        seq.index = i
    max_output_len = min(p.max_tokens, max_model_len - len(request.prompt_token_ids))
    if is_over(live, request.done_beams, p.beam_width, max_output_len):
        for seq in live:
            at_limit = len(seq.output_ids) >= max_output_len
            pages.finish_seq(request, seq, "length" if at_limit else "pruned")
            if at_limit:
                request.done_beams.append(seq)


def outputs(request, decode) -> list[CompletionOutput]:
    """The n best hypotheses of a finished search, best first (aborted: its live beams
    count too)."""
    aborted = [s for s in request.seqs if s.finish_reason == "abort"]
    return [
        CompletionOutput(
            i, decode(s.output_ids), s.output_ids, s.finish_reason, s.cumulative_logprob
        )
        for i, s in enumerate(best(request.done_beams + aborted, request.params.n))
    ]
