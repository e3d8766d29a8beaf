"""Lab 7: shortest job first with aging. You write the waiting order: which waiting request the
scheduler tries to admit next, the smallest job first, aged so that no long job starves
(meeting 11, docs/11_scheduling.md).

Grade it (then it serves the model):  python -m minipaged.lab check 7 my_aging.py
Hints, one step at a time:            python -m minipaged.lab hint 7
"""

from __future__ import annotations


def job_size(request) -> int:
    """What is known of a job before it runs: prompt + max_tokens tokens.
    (`request.prompt_token_ids` is the prompt, `request.params.max_tokens` the most tokens it
    may generate.)"""
    raise NotImplementedError("lab 7: write job_size (stuck? python -m minipaged.lab hint 7)")


class Aging:
    """SJF after forgiving `aging_rate` tokens per step waited. It bounds starvation: a job of S
    tokens waits only for requests that arrived fewer than (S - 1) / aging_rate steps after it
    (and those before it). The scheduler builds it once and asks `pick` at each admission."""
    name = "aging"
    uses_priority = False  # it does not read request.priority

    def __init__(self, aging_rate: float = 8.0):
        """Checks the rate and keeps it as self.rate (written for you)."""
        if isinstance(aging_rate, bool) or not isinstance(aging_rate, (int, float)) or not aging_rate > 0:
            raise ValueError(f"aging_rate must be a number > 0 (tokens per step waited), got {aging_rate!r}")
        self.rate = float(aging_rate)

    def pick(self, waiting, now: int):
        """One of `waiting` (do not remove it: the scheduler does): the smallest job after aging,
        job_size(r) - self.rate * (now - r.arrival), ties to the oldest. `waiting` is in queue
        order: requests preempted by recompute at the front (they hold generated tokens: a
        sequence's `output_ids` is not empty), then arrivals oldest first; a preempted request
        comes first, in that order, whatever its size. `now` is the scheduler's step count,
        `r.arrival` the step request r arrived; each request's sequences are `r.seqs`."""
        raise NotImplementedError("lab 7: write Aging.pick (stuck? python -m minipaged.lab hint 7)")
