"""Lab 10: fair queuing. You write the waiting order that shares the server among its clients:
the least served client first, each client's service counted in tokens, and a client that comes
back lifted so that it cannot save up idle time (meeting 14, docs/14_fair_queuing.md).

Grade it (then it serves the model):  python -m minipaged.lab check 10 my_fair.py
Hints, one step at a time:            python -m minipaged.lab hint 10
"""

from __future__ import annotations

from minipaged.policies.fair import MostServed
from minipaged.sequence import Status


class Fair:
    """The waiting request of the least served client first (ties in queue order: of one client,
    its oldest). A client's counter grows by `prompt_weight` per prompt token computed for it
    (a recompute's too: the server did the work) and `output_weight` per token it decoded. A
    client that comes back after being idle starts at the least counter of the clients still
    active, so it cannot bank the service it did not ask for. Work conserving: it only orders,
    so one client alone is served at once and as fast as alone."""
    name = "fair"
    uses_priority = False  # it does not read request.priority

    def __init__(self, prompt_weight: float = 1.0, output_weight: float = 2.0):
        """The weights by row kind, and two tables, all empty at first (written for you)."""
        self.weights = {"prefill": float(prompt_weight), "decode": float(output_weight)}
        self.counters: dict[str, float] = {}            # client -> weighted tokens served
        self.unfinished: dict[str, set] = {}            # client -> its requests seen and not finished

    def pick(self, waiting, now: int):
        """One of `waiting` (do not remove it: the scheduler does). First call self.arrive(r) for
        every r in `waiting` (it gives a new client its counter); then return the request whose
        client (`r.client`, a string) has the least `self.counters[r.client]`, the first in
        `waiting` of equals (queue order: the oldest first). `now` is the step count (unused)."""
        raise NotImplementedError("lab 10: write Fair.pick (stuck? python -m minipaged.lab hint 10)")

    def served(self, request, num_tokens: int, kind: str) -> None:
        """The scheduler ran `num_tokens` of `request` this step ("prefill" or "decode"). First
        call self.arrive(request); then add the tokens, weighted by their kind (self.weights),
        to the counter of the request's client."""
        raise NotImplementedError("lab 10: write Fair.served (stuck? python -m minipaged.lab hint 10)")

    def lift(self, client: str) -> None:
        """A client with nothing unfinished asks again: its counter becomes at least the least
        counter of the clients active now (VTC's rule), so idle time is not saved up. A client
        is active when its set in self.unfinished is not empty; a client never seen has no
        counter yet (0); with nobody active, it keeps what it has."""
        raise NotImplementedError("lab 10: write Fair.lift (stuck? python -m minipaged.lab hint 10)")

    def arrive(self, request) -> None:
        """Count a request in (once): finished requests leave `unfinished`, and a client that
        had none unfinished is lifted before its request counts (written for you)."""
        if request in self.unfinished.get(request.client, ()):
            return
        for requests in self.unfinished.values():
            requests.difference_update([r for r in requests if r.status is Status.FINISHED])
        if not self.unfinished.get(request.client):
            self.lift(request.client)
        self.unfinished.setdefault(request.client, set()).add(request)

    def victim(self):
        """Under memory pressure, preempt a request of the most served client (written for you)."""
        return MostServed(self)
