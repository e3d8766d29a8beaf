"""Fair queuing: each client gets its share of the server by the order it is served in,
not by refusals.

Nagle's fair queuing (1987) and Demers, Keshav and Shenker's (SIGCOMM 1989) serve the
flow that has had the least service; Sheng et al.'s Virtual Token Counter ("Fairness in
Serving Large Language Models", OSDI 2024) counts each client's served tokens, prompt
and output weighted.
"""

from __future__ import annotations

from minipaged.sequence import Status

# VTC's weights: an output token costs a decode step, a prompt token a share of one
PROMPT_WEIGHT, OUTPUT_WEIGHT = (
    1.0,
    2.0,
)


class Fair:
    """The waiting request of the least served client first (ties in queue order: of one
    client, its oldest). A client's counter grows by `prompt_weight` per prompt token
    computed for it (a recompute's too: the server did the work) and `output_weight` per
    token it decoded. Only active clients (a request waiting or running) have a counter:
    an idle client's is forgotten, and when it comes back it starts at the least counter
    of the clients active then, as a new one does, so it neither banks the service it
    did not ask for nor pays again for what it had before its pause. Work conserving: it
    only orders, so one client alone is served at once and as fast as alone.

    The state is the active clients and their unfinished requests, however many clients
    were ever seen: a pick walks those and the waiting queue, a new client's arrival the
    active clients' counters once.
    """

    name = "fair"
    uses_priority = False

    def __init__(
        self, prompt_weight: float = PROMPT_WEIGHT, output_weight: float = OUTPUT_WEIGHT
    ):
        for label, weight in (
            ("prompt_weight", prompt_weight),
            ("output_weight", output_weight),
        ):
            if (
                isinstance(weight, bool)
                or not isinstance(weight, (int, float))
                or not weight >= 0
            ):
                raise ValueError(
                    f"{label} must be a number >= 0 (service per token), got {weight!r}"
                )
        self.weights = {"prefill": float(prompt_weight), "decode": float(output_weight)}
        # active client -> weighted tokens served (an idle client's is forgotten)
        self.counters: dict[str, float] = {}
        # active client -> its requests seen and not finished
        self.unfinished: dict[str, set] = {}

    def pick(self, waiting, now: int):
        self.forget_idle()
        for request in waiting:
            self.arrive(request)
        # min keeps the first of equals
        return min(waiting, key=lambda r: self.counters[r.client])

    def served(self, request, num_tokens: int, kind: str) -> None:
        """The scheduler ran `num_tokens` of `request` this step ("prefill" or
        "decode")."""
        self.arrive(request)
        self.counters[request.client] += self.weights[kind] * num_tokens

    def forget_idle(self) -> None:
        """Finished requests leave `unfinished`; a client left with none is idle, and
        its counter is forgotten (a lift reads the active clients' counters only)."""
        for client, requests in list(self.unfinished.items()):
            requests.difference_update(
                [r for r in requests if r.status is Status.FINISHED]
            )
            if not requests:
                del self.unfinished[client]
        for client in [c for c in self.counters if c not in self.unfinished]:
            del self.counters[client]

    def least_active(self) -> float:
        """The least counter of the clients active now (0 when none is)."""
        return min(
            (self.counters[c] for c, requests in self.unfinished.items() if requests),
            default=0.0,
        )

    def lift(self, client: str) -> None:
        """A client with nothing unfinished asks again: its counter becomes at least the
        least counter of the clients active now (VTC's rule), so idle time is not saved
        up. Its own counter was forgotten when it went idle (`forget_idle`), so it
        starts at that least, never above it."""
        self.counters[client] = max(self.counters.get(client, 0.0), self.least_active())

    def arrive(self, request) -> None:
        """Count a request in (once): a client that had none unfinished is lifted before
        its request counts."""
        requests = self.unfinished.setdefault(request.client, set())
        if request in requests:
            return
        if not requests:
            self.lift(request.client)
        requests.add(request)

    def service(self) -> dict[str, float]:
        """Each counter as it stands (a copy, for the dashboard to show): client ->
        service. A client that went idle keeps its counter until the next pick forgets
        it."""
        return dict(self.counters)

    def victim(self):
        return MostServed(self)


class MostServed:
    """Preempt a request of the most served client; of equals, the latest admitted."""

    name = "most-served"

    def __init__(self, order: Fair):
        self.order = order

    def choose(self, candidates):
        return max(
            reversed(candidates), key=lambda r: self.order.counters.get(r.client, 0.0)
        )
