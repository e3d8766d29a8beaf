"""Beam search: which beams extend, which fork, which die (the engine applies it to the pages).

After each forward pass the engine asks `step` what became of its beams (anything with
`cumulative_logprob` and `output_ids`), then appends to, fork()s or frees them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from minipaged.sampling import log_softmax, most_likely


@dataclass(slots=True)
class Candidate:
    parent: object  # the beam it continues
    token: int
    score: float    # cumulative log probability of the beam with this token


@dataclass(slots=True)
class BeamStep:
    """What one step of beam search decided, for the engine to apply."""
    extend: list[Candidate] = field(default_factory=list)  # a parent's best: appended in place
    fork: list[Candidate] = field(default_factory=list)    # a parent's others: new beams forked from it
    drop: list = field(default_factory=list)               # parents with no continuation kept
    done: list[Candidate] = field(default_factory=list)    # continuations that end the text


def step(rows: list[tuple[object, np.ndarray]], width: int, ends: Callable[[int], bool]) -> BeamStep:
    """One step over (beam, logits row) pairs; `ends(token)` says whether a token ends the text.

    Every live beam proposes its 2 * width most likely next tokens, scored by cumulative log
    probability; the best `width` that do not end the text become the new beams. A beam with one
    surviving continuation extends in place; a beam with several is fork()ed for the others
    (they share its frames, and copy-on-write copies its partial last block at the first write);
    a beam with none is dropped and its frames are freed. Continuations that end the text are
    kept as finished hypotheses, ranked by log probability per output token (`score`)."""
    candidates = []
    for beam, logits in rows:
        logprobs = log_softmax(logits[None])[0]                       # (vocab,) float64
        candidates += [Candidate(beam, int(t), beam.cumulative_logprob + float(logprobs[t]))
                       for t in most_likely(logprobs, 2 * width)]
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
