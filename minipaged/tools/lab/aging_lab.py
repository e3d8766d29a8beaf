"""Lab 7, shortest job first with aging (meeting 11): the properties that grade a
participant's job_size and Aging.pick (the waiting order), a stream of short jobs that
must not starve a long one, then the model served with their order next to the engine's
own 'aging'.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from minipaged.policies import sjf
from minipaged.sampling import SamplingParams
from minipaged.sequence import Request, Sequence
from minipaged.tools.lab.engine_run import QUESTIONS, SYSTEM
from minipaged.tools.lab.grading import Failed, Property, in_one_line, time_limit
from minipaged.tools.viz import LineChart
from minipaged.tools.viz.pages import plural


def solution() -> dict:
    return {"job_size": sjf.job_size, "Aging": sjf.Aging}


ENGINES = SimpleNamespace(**solution())  # the engine's own pieces, graded like theirs


def request(
    name: str, prompt: int, max_tokens: int, arrival: int, generated: int = 0
) -> Request:
    """A waiting request as the scheduler holds it: `prompt` tokens, `max_tokens`, its
    arrival step; with `generated` tokens it was preempted by recompute (its frames
    gone, its tokens kept).
    """
    tokens = [7 + i % 50 for i in range(prompt + generated)]
    seq = Sequence(int(name[1:]) if name[1:].isdigit() else 0, tokens, prompt)
    return Request(
        name,
        None,
        tokens[:prompt],
        SamplingParams(max_tokens=max_tokens),
        [seq],
        arrival=arrival,
    )


def described(r: Request) -> str:
    extra = (
        f", preempted with {len(r.seqs[0].output_ids)} tokens generated"
        if r.seqs[0].output_ids
        else ""
    )
    return (
        f"{r.request_id} ({len(r.prompt_token_ids)}-token prompt, max_tokens"
        f" {r.params.max_tokens}, arrived at step {r.arrival}{extra})"
    )


def pick(m, rate: float, waiting: list[Request], now: int, given: str) -> Request:
    """Their Aging(rate).pick(waiting, now), which must be one of `waiting`,
    unchanged."""
    before = list(waiting)
    chosen = m.Aging(rate).pick(waiting, now)
    if list(waiting) != before:
        raise Failed(
            given,
            "pick changed the waiting list: it only chooses (the scheduler removes the"
            " request)",
        )
    if not any(chosen is r for r in waiting):
        raise Failed(
            given, f"pick returned {chosen!r}, not one of the waiting requests"
        )
    return chosen


def expect(m, rate: float, waiting: list[Request], now: int, why: str) -> None:
    given = f"Aging({rate:g}).pick(waiting, now={now}) with waiting = " + "; ".join(
        described(r) for r in waiting
    )
    chosen, right = (
        pick(m, rate, waiting, now, given),
        sjf.Aging(rate).pick(waiting, now),
    )
    if chosen is not right:
        raise Failed(
            given, f"pick chose {chosen.request_id}, expected {right.request_id}: {why}"
        )


# ---- the properties ------------------------------------------------------------------


def job_size_is_prompt_plus_max_tokens(m) -> None:
    for r in [
        request("r0", 30, 5, 0),
        request("r1", 5, 40, 0),
        request("r2", 12, 12, 3),
        request("r3", 10, 20, 0, generated=6),
    ]:
        size = m.job_size(r)
        if isinstance(size, bool) or size != sjf.job_size(r):
            raise Failed(
                f"job_size({described(r)})",
                f"returned {size!r}, expected {sjf.job_size(r)}: what is known "
                "before a job runs is its prompt plus max_tokens",
            )


def smallest_job_first(m) -> None:
    sizes = [
        (40, 8),
        (6, 30),
        (18, 4),
        (3, 60),
        (9, 14),
        (25, 1),
    ]  # job sizes 48, 36, 22, 63, 23, 26
    waiting = [request(f"r{i}", p, t, 3) for i, (p, t) in enumerate(sizes)]
    expect(
        m,
        2.0,
        waiting,
        10,
        "all arrived together, so all aged alike: the smallest prompt + max_tokens goes"
        " first",
    )


def ties_go_to_the_oldest(m) -> None:
    waiting = [
        request("r0", 50, 10, 0),
        request("r1", 90, 10, 4),
        request("r2", 30, 10, 10),
        request("r3", 20, 10, 15),
    ]  # at step 20, aged by 2 a step: 20, 68, 20, 20
    expect(
        m,
        2.0,
        waiting,
        20,
        "r0, r2 and r3 are equal after aging (size - rate * steps waited = 20); "
        "the oldest of equals goes first",
    )
    waiting = [
        request("r4", 20, 4, 6),
        request("r5", 8, 16, 6),
        request("r6", 12, 12, 6),
    ]  # all 24
    expect(
        m,
        2.0,
        waiting,
        9,
        "equal sizes, equal arrivals: the first in the queue goes first",
    )
    # at step 9, aged by 2 a step: 30 - 14 = 16 and 24 - 8 = 16
    waiting = [
        request("r2", 20, 10, 2),
        request("r10", 14, 10, 5),
    ]
    expect(
        m,
        2.0,
        waiting,
        9,
        "r2 and r10 are equal after aging (16); the oldest goes first, r2, which"
        " arrived at step 2: a request id is a name, not an order ('r10' < 'r2' as"
        " strings)",
    )


def preempted_first(m) -> None:
    waiting = [
        request("r0", 60, 40, 0, generated=12),
        request("r1", 4, 4, 2, generated=2),
        request("r2", 3, 2, 5),
        request("r3", 8, 8, 6),
    ]
    expect(
        m,
        2.0,
        waiting,
        9,
        "r0 and r1 were preempted by recompute (they hold generated tokens) and stand"
        " at the front: they come back first, in their order, however big",
    )


def rate_is_read(m) -> None:
    # sizes 50 and 20, r0 has waited 10 steps
    waiting = [
        request("r0", 30, 20, 0),
        request("r1", 12, 8, 10),
    ]
    for rate in (1.0, 2.5, 3.0, 4.0, 0.5, 12.0):
        expect(
            m,
            rate,
            waiting,
            10,
            f"aging forgives self.rate = {rate:g} tokens per step waited, so r0 counts "
            f"50 - {rate:g} * 10 = {50 - rate * 10:g} tokens against r1's 20",
        )
    # a fraction of a token per step counts: with a rate of 2 r1 would go
    waiting = [
        request("r0", 30, 20, 0),
        request("r1", 12, 15, 10),
    ]
    expect(
        m,
        2.5,
        waiting,
        10,
        "aging forgives self.rate = 2.5 tokens per step waited, the fraction too, so r0"
        " counts 50 - 2.5 * 10 = 25 tokens against r1's 27 (with 2 it would count 30)",
    )


S, RATE, STEPS, SHORT = (
    200,
    4.0,
    100,
    (6, 4),
)  # the long job's size, the rate, the steps, a short job


def stream(m, rate: float) -> tuple[list[str], int | None]:
    """One long job waits at step 0; a short one arrives at every step and one job is
    admitted per
    step. The names in admission order, and the step the long one went (None: never)."""
    long = request("long", 100, 100, 0)
    waiting, order, went = [long], [], None
    for now in range(STEPS):
        waiting.append(request(f"s{now}", *SHORT, now))
        given = (
            f"a long job ({S} tokens, arrived at step 0) and a short one ({sum(SHORT)}"
            f" tokens) arriving at every step, one admitted per step, Aging({rate:g});"
            f" at step {now}"
        )
        chosen = pick(m, rate, waiting, now, given)
        waiting.remove(chosen)
        order.append(chosen.request_id)
        if chosen is long:
            went = now
    return order, went


def aging_bounds_the_wait(m) -> None:
    given = (
        f"a long job ({S} tokens) waiting at step 0, a short job ({sum(SHORT)} tokens)"
        f" arriving at every step, one job admitted per step, for {STEPS} steps,"
        f" Aging({RATE:g})"
    )
    order, went = stream(m, RATE)
    bound = (S - 1) / RATE
    if went is None:
        raise Failed(
            given,
            f"the long job never went: {STEPS} later, shorter jobs went first (plain"
            " SJF starves it); with aging it waits only for jobs that arrived fewer"
            f" than (S - 1) / rate = {bound:g} steps after it",
        )
    late = [name for name in order[: order.index("long")] if int(name[1:]) >= bound]
    if late:
        raise Failed(
            given,
            f"the long job went at step {went}, after {late[0]}, which arrived"
            f" {int(late[0][1:])} steps after it: aging lets a job of S tokens wait"
            f" only for jobs that arrived fewer than (S - 1) / rate = {bound:g} steps"
            " after it",
        )
    expected, _ = stream(ENGINES, RATE)
    if order != expected:
        k = next(i for i, (a, b) in enumerate(zip(order, expected)) if a != b)
        raise Failed(
            given,
            f"at step {k} your pick chose {order[k]}, the engine's Aging {expected[k]}",
        )


PROPERTIES = [
    Property(
        "job_size is the prompt's tokens plus max_tokens",
        job_size_is_prompt_plus_max_tokens,
        "job_size of 4 requests",
    ),
    Property(
        "pick takes the smallest job among requests that arrived together",
        smallest_job_first,
        "Aging(2).pick of 6 requests that arrived at step 3",
    ),
    Property(
        "ties go to the oldest (then to the first in the queue)",
        ties_go_to_the_oldest,
        "Aging(2).pick of requests equal after aging",
    ),
    Property(
        "requests preempted by recompute come first, in their order",
        preempted_first,
        "Aging(2).pick of 2 preempted and 2 new requests",
    ),
    Property(
        "a job waited for counts rate tokens less per step waited, the rate read from"
        " self.rate",
        rate_is_read,
        "Aging(rate).pick of an old big job and a new small one, for 6 rates and a"
        " fractional one",
    ),
    Property(
        "aging bounds the wait: a stream of short jobs does not starve a long one",
        aging_bounds_the_wait,
        f"a long job and a short one arriving at every step, {STEPS} steps,"
        f" Aging({RATE:g})",
    ),
]


# ---- the run: the model served with their waiting order ------------------------------

RUN_RATE = 4.0
# one at a time
ENGINE = dict(block_size=4, num_blocks=64, max_num_seqs=1, enable_prefix_caching=False)
MAX_STEPS = 400


def arrivals() -> list[tuple[int, str, str, SamplingParams]]:
    """(step, id, prompt, params): a long request r0 at step 0, then a short one every 2
    steps, as fast as one runs: under SJF, r0 waits for the whole stream."""

    def params(n):
        return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)

    out = [(0, "r0", f"{SYSTEM} {QUESTIONS[0]} {SYSTEM}", params(10))]
    return out + [
        (2 * (i - 1), f"r{i}", QUESTIONS[i % len(QUESTIONS)], params(2))
        for i in range(1, 11)
    ]


def serve_with(llm, policy) -> tuple[list[str], dict[str, int], dict[str, list[int]]]:
    """Admission order, each request's wait (steps from arrival to its first token
    computed) and tokens."""
    engine = llm.new_engine(**ENGINE, scheduling_policy=policy, aging_rate=RUN_RATE)
    pending, order, waits, tokens, added = arrivals(), [], {}, {}, {}
    for step in range(MAX_STEPS):
        while pending and pending[0][0] <= step:
            _, name, prompt, params = pending.pop(0)
            engine.add_request(name, prompt, params)
            added[name] = step
        if not pending and not engine.has_unfinished_requests():
            return order, waits, tokens
        report = engine.step()
        for name, _, kind, _ in report.ran:
            if kind == "prefill" and name not in waits:
                order.append(name)
                waits[name] = step - added[name]
        for output in report.finished:
            tokens[output.request_id] = list(output.outputs[0].token_ids)
    raise RuntimeError(f"the engine had not finished after {MAX_STEPS} steps")


def serve_lab7(pieces, llm, pictures: Path) -> list[str]:
    """Their Aging and the engine's 'aging' serve the same arrivals: same admission
    order, same tokens."""
    try:
        with time_limit(300):
            order, waits, tokens = serve_with(llm, pieces.Aging(RUN_RATE))
    except Exception as error:
        raise RuntimeError(
            f"the engine with your Aging failed: {in_one_line(error)}"
        ) from None
    built_order, built_waits, built_tokens = serve_with(llm, "aging")
    if order != built_order:
        raise RuntimeError(
            f"your Aging admitted {', '.join(order)}; the engine's 'aging'"
            f" {', '.join(built_order)}"
        )
    for name, expected in built_tokens.items():
        if tokens.get(name) != expected:
            raise RuntimeError(
                f"request {name}: your engine gave tokens {tokens.get(name)}, the"
                f" built-in one {expected}"
            )
    _, fcfs, _ = serve_with(llm, "fcfs")
    _, shortest, _ = serve_with(llm, "sjf")
    names = [name for _, name, _, _ in arrivals()]
    lines = [
        (
            f"  admitted in the same order as the engine's 'aging' (rate {RUN_RATE:g}):"
            f" {', '.join(order)}"
        ),
        (
            f"  same {plural(sum(map(len, tokens.values())), 'token')} for the"
            f" {len(names)} requests"
        ),
        "  steps each request waited (r0 is the long one):",
        "         " + "".join(f"{n:>4}" for n in names),
    ]
    for label, w in [("fcfs", fcfs), ("sjf", shortest), ("yours", waits)]:
        lines.append(f"    {label:<5}" + "".join(f"{w[n]:>4}" for n in names))
    lines.append(
        f"  sjf keeps r0 waiting while short jobs come ({shortest['r0']} steps); your"
        f" aging lets it in after {waits['r0']}, and fcfs makes every short job wait"
        " behind it"
    )
    chart = LineChart(
        "steps each request waited before its prompt ran (r0 long,"
        f" r1-r{len(names) - 1} short)",
        list(range(len(names))),
        {
            "fcfs": [fcfs[n] for n in names],
            "sjf": [shortest[n] for n in names],
            "your aging": [waits[n] for n in names],
        },
        x_label="request (r0 ... in arrival order)",
        y_label="steps waited",
        digits=0,
    )
    pictures.mkdir(parents=True, exist_ok=True)
    picture = pictures / "lab7_waits.svg"
    picture.write_text(chart.svg())
    return lines + [f"picture: {picture}"]
