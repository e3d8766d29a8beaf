"""Shortest job first, and aging: which waiting request goes next when short and long
ones mix.

SJF minimises the mean wait (Smith 1956; Schrage's shortest remaining processing time,
1968) but can starve a long job; aging (Corbató's multilevel feedback, 1962; every Unix
      scheduler
since) forgives a waiting job a little of its size per step, so its turn comes.
"""

from __future__ import annotations


def job_size(request) -> int:
    """What is known of a job before it runs: prompt + max_tokens tokens."""
    return len(request.prompt_token_ids) + request.params.max_tokens


class SJF:
    """The smallest job first, ties to the oldest. Requests preempted by recompute come
    first, in their order: they were admitted once and hold generated tokens."""

    name = "sjf"
    uses_priority = False
    rate = 0.0  # job-size tokens forgiven per step waited (SJF: none)

    def pick(self, waiting, now: int):
        # (preempted ones are at the front)
        if any(s.output_ids for s in waiting[0].seqs):
            return waiting[0]
        # min keeps the first of equals
        return min(waiting, key=lambda r: job_size(r) - self.rate * (now - r.arrival))


class Aging(SJF):
    """SJF after forgiving `aging_rate` tokens per step waited. It bounds starvation: a
    job of S tokens waits only for requests that arrived fewer than (S - 1) / aging_rate
    steps after it (and those before it)."""

    name = "aging"

    def __init__(self, aging_rate: float = 8.0):
        if (
            isinstance(aging_rate, bool)
            or not isinstance(aging_rate, (int, float))
            or not aging_rate > 0
        ):
            raise ValueError(
                "aging_rate must be a number > 0 (tokens per step waited), got"
                f" {aging_rate!r}"
            )
        self.rate = float(aging_rate)
