"""Lab 7's cases: a waiting order as a participant writes it from the hints, and the
catalogue
of plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = """
def job_size(request):
    return len(request.prompt_token_ids) + request.params.max_tokens


class Aging:
    name = "aging"
    uses_priority = False

    def __init__(self, aging_rate=8.0):
        if isinstance(aging_rate, bool) or not isinstance(aging_rate, (int, float)) \
or not aging_rate > 0:
            raise ValueError(f"aging_rate must be a number > 0, got {aging_rate!r}")
        self.rate = float(aging_rate)

    def pick(self, waiting, now):
        first = waiting[0]
        if any(seq.output_ids for seq in first.seqs):
            return first
        best, best_size = None, None
        for request in waiting:
            size = job_size(request) - self.rate * (now - request.arrival)
            if best is None or size < best_size:
                best, best_size = request, size
        return best
"""

SIZE = "job_size is the prompt's tokens plus max_tokens"
SMALLEST = "pick takes the smallest job among requests that arrived together"
TIES = "ties go to the oldest (then to the first in the queue)"
PREEMPTED = "requests preempted by recompute come first, in their order"
RATE = (
    "a job waited for counts rate tokens less per step waited, the rate read from"
    " self.rate"
)
BOUND = "aging bounds the wait: a stream of short jobs does not starve a long one"

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that
# must catch it)
MISTAKES = [
    (
        "longest first",
        "if best is None or size < best_size:",
        "if best is None or size > best_size:",
        SMALLEST,
    ),
    (
        "the rate unused (plain SJF: the long job starves)",
        "size = job_size(request) - self.rate * (now - request.arrival)",
        "size = job_size(request)",
        BOUND,
    ),
    (
        "aging with the wrong sign (waiting makes a job bigger)",
        "size = job_size(request) - self.rate * (now - request.arrival)",
        "size = job_size(request) + self.rate * (now - request.arrival)",
        RATE,
    ),
    (
        "ties to the newest",
        "if best is None or size < best_size:",
        "if best is None or size <= best_size:",
        TIES,
    ),
    (
        "preempted requests not put first",
        (
            "        if any(seq.output_ids for seq in first.seqs):\n            return"
            " first\n"
        ),
        "",
        PREEMPTED,
    ),
    (
        "job size of the prompt only",
        "return len(request.prompt_token_ids) + request.params.max_tokens",
        "return len(request.prompt_token_ids)",
        SIZE,
    ),
    (
        "the default rate written in (8) instead of self.rate",
        "- self.rate * (now",
        "- 8.0 * (now",
        RATE,
    ),
    (
        "the smallest of the preempted requests, not the first",
        (
            "        if any(seq.output_ids for seq in first.seqs):\n            return"
            " first\n"
        ),
        (
            "        preempted = [r for r in waiting if any(seq.output_ids for seq in"
            " r.seqs)]\n        if preempted:\n            return min(preempted,"
            " key=job_size)\n"
        ),
        PREEMPTED,
    ),
    (
        (
            "the size of what is left, counting generated tokens as done (prompt +"
            " max_tokens - generated)"
        ),
        "return len(request.prompt_token_ids) + request.params.max_tokens",
        (
            "return len(request.seqs[0].token_ids) + request.params.max_tokens - 2 *"
            " len(request.seqs[0].output_ids)"
        ),
        SIZE,
    ),
    (
        "age counted from step 0, not from the arrival",
        "(now - request.arrival)",
        "now",
        TIES,
    ),
    (
        "the rate truncated to a whole number (int(self.rate): 2.5 counts as 2)",
        "- self.rate * (now",
        "- int(self.rate) * (now",
        RATE,
    ),
    (
        "ties broken by the request id as a string ('r10' before 'r2')",
        "if best is None or size < best_size:",
        (
            "if best is None or (size, request.request_id) < (best_size,"
            " best.request_id):"
        ),
        TIES,
    ),
]

# the line that opens a method body: the loop, crash and exit tests put a statement
# after it
BREAK_AT = "    def pick(self, waiting, now):\n"
