"""Lab 10's cases: a fair waiting order as a participant writes it from the hints, and
the catalogue of plausible mistakes, each caught by the property it names
(tests/test_labs.py).
"""

WRITTEN = """
from minipaged.policies.fair import MostServed
from minipaged.sequence import Status


class Fair:
    name = "fair"
    uses_priority = False

    def __init__(self, prompt_weight: float = 1.0, output_weight: float = 2.0):
        self.weights = {"prefill": float(prompt_weight), "decode": float(output_weight)}
        self.counters = {}
        self.unfinished = {}

    def pick(self, waiting, now: int):
        for request in waiting:
            self.arrive(request)
        best = None
        for request in waiting:
            if best is None or \
self.counters[request.client] < self.counters[best.client]:
                best = request
        return best

    def served(self, request, num_tokens: int, kind: str) -> None:
        self.arrive(request)
        self.counters[request.client] += self.weights[kind] * num_tokens

    def lift(self, client: str) -> None:
        active = [self.counters[c] for c, requests in self.unfinished.items() \
if requests]
        least = min(active) if active else 0.0
        self.counters[client] = max(self.counters.get(client, 0.0), least)

    def arrive(self, request) -> None:
        if request in self.unfinished.get(request.client, ()):
            return
        for requests in self.unfinished.values():
            requests.difference_update([r for r in requests \
if r.status is Status.FINISHED])
        if not self.unfinished.get(request.client):
            self.lift(request.client)
        self.unfinished.setdefault(request.client, set()).add(request)

    def victim(self):
        return MostServed(self)
"""

SERVED = (
    "served grows the client's counter by the tokens, weighted by kind (prompt 1,"
    " output 2 by default)"
)
LEAST = "pick serves the waiting request of the least served client"
TIES = "ties go to the oldest (the first in the queue), of one client too"
LIFT = (
    "a client that comes back is lifted to the least counter of the active clients,"
    " never lowered"
)
CONSERVING = "work conserving: one client alone is served at once"
STARVE = (
    "a flooder cannot starve the others: their short requests wait for one row at most"
)

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that
# must catch it)
MISTAKES = [
    (
        "the weights swapped (output tokens cheap)",
        "self.weights[kind] * num_tokens",
        "self.weights['decode' if kind == 'prefill' else 'prefill'] * num_tokens",
        SERVED,
    ),
    ("tokens unweighted", "self.weights[kind] * num_tokens", "num_tokens", SERVED),
    (
        "one per call, not per token",
        "self.weights[kind] * num_tokens",
        "self.weights[kind]",
        SERVED,
    ),
    (
        "the default weights written in (1 and 2) instead of self.weights",
        "self.weights[kind] * num_tokens",
        "(1.0 if kind == 'prefill' else 2.0) * num_tokens",
        SERVED,
    ),
    (
        "the counter set, not grown",
        "self.counters[request.client] += self.weights",
        "self.counters[request.client] = self.weights",
        SERVED,
    ),
    (
        "the most served first",
        "self.counters[request.client] < self.counters[best.client]",
        "self.counters[request.client] > self.counters[best.client]",
        LEAST,
    ),
    (
        "ties to the newest",
        "self.counters[request.client] < self.counters[best.client]",
        "self.counters[request.client] <= self.counters[best.client]",
        TIES,
    ),
    (
        "no lift: a new client starts at 0 (it banks its idle time)",
        "least = min(active) if active else 0.0",
        "least = 0.0",
        LIFT,
    ),
    (
        "lifted to the most served active client",
        "least = min(active) if active else 0.0",
        "least = max(active) if active else 0.0",
        LIFT,
    ),
    ("lifted over every client, idle ones too", "if requests]", "]", LIFT),
    (
        "the counter set to the least, lowering a client above it",
        "self.counters[client] = max(self.counters.get(client, 0.0), least)",
        "self.counters[client] = least",
        LIFT,
    ),
    (
        (
            "the least served client of all, even with nothing waiting (not work"
            " conserving)"
        ),
        "        best = None\n        for request in waiting:\n",
        (
            "        least = min(self.counters, key=self.counters.get)\n"
            "        return next((r for r in waiting if r.client == least), None)\n"
            "        best = None\n        for request in waiting:\n"
        ),
        CONSERVING,
    ),
    (
        "pick does not count new requests in (a new client has no counter)",
        "        for request in waiting:\n            self.arrive(request)\n",
        "",
        STARVE,
    ),
]

# the line that opens a method body: the loop, crash and exit tests put a statement
# after it
BREAK_AT = "    def pick(self, waiting, now: int):\n"
