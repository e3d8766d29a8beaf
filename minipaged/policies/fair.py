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
    token it decoded. A client that comes back after being idle starts at the least
    counter of the clients still active, so it cannot bank the service it did not ask
    for. Work conserving: it only orders,
    so one client alone is served at once and as fast as alone."""

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
        self.counters: dict[str, float] = {}  # client -> weighted tokens served
        # client -> its requests seen and not finished
        self.unfinished: dict[str, set] = {}

    def pick(self, waiting, now: int):
        for request in waiting:
            self.arrive(request)
        # min keeps the first of equals
        return min(waiting, key=lambda r: self.counters[r.client])

    def served(self, request, num_tokens: int, kind: str) -> None:
        """The scheduler ran `num_tokens` of `request` this step ("prefill" or
        "decode")."""
        self.arrive(request)
        self.counters[request.client] += self.weights[kind] * num_tokens

    def lift(self, client: str) -> None:
        """A client with nothing unfinished asks again: its counter becomes at least the
        least
        counter of the clients active now (VTC's rule), so idle time is not saved up."""
        active = [
            self.counters[c] for c, requests in self.unfinished.items() if requests
        ]
        self.counters[client] = max(
            self.counters.get(client, 0.0), min(active, default=0.0)
        )

    def arrive(self, request) -> None:
        """Count a request in (once): finished requests leave `unfinished`, and a client
        that had none unfinished is lifted before its request counts."""
        if request in self.unfinished.get(request.client, ()):
            return
        for requests in self.unfinished.values():
            requests.difference_update(
                [r for r in requests if r.status is Status.FINISHED]
            )
        if not self.unfinished.get(request.client):
            self.lift(request.client)
        self.unfinished.setdefault(request.client, set()).add(request)

    def service(self) -> dict[str, float]:
        """Each client's counter as it stands (a copy, for the dashboard to show):
        client -> service."""
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
