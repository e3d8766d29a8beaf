"""Priorities: each request says how urgent it is (vLLM's `priority=`: lower runs
first).

The oldest scheduling rule of all (priority dispatching in the OS/360 and THE systems,
1960s); vLLM's `--scheduling-policy priority` orders its waiting queue by it and, under
memory pressure, preempts the least urgent running request first.
"""

from __future__ import annotations


class Priority:
    """The smallest `priority` first; ties in queue order (preempted requests first,
    then the oldest)."""

    name = "priority"
    uses_priority = True

    def pick(self, waiting, now: int):
        return min(waiting, key=lambda r: r.priority)  # min keeps the first of equals

    @staticmethod
    def victim():
        return LeastUrgent()


class LeastUrgent:
    """Preempt the least urgent (the largest priority value); of equals, the latest
    admitted."""

    name = "least-urgent"

    def choose(self, candidates):
        # max keeps the first of equals
        return max(reversed(candidates), key=lambda r: r.priority)
