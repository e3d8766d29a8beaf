"""The plain defaults of the scheduler's seams: first come first served, admit what fits
now, preempt the newest. What the engine does when no idea of the series is asked for;
each is the rule the paper's vLLM follows (Kwon et al., SOSP 2023, section 4.5).
"""

from __future__ import annotations


class FCFS:
    """First come, first served: the front of the queue (requests preempted by recompute
    go
    back to the front, so they come first, in their order; then the oldest arrival)."""

    name = "fcfs"
    uses_priority = False

    def pick(self, waiting, now: int):
        return waiting[0]


class Greedy:
    """Admit while the prompt's frames fit now; running sequences take frames as they
    grow,
    and are preempted when there are none (the paper's all-or-nothing admission)."""

    name = "greedy"

    def growth(self, request, blocks, final_len: int) -> int:
        return 0


class Newest:
    """Preempt the most recently admitted (it has done least work, and came last: FCFS
    kept)."""

    name = "newest"

    def choose(self, candidates):
        return candidates[-1]
