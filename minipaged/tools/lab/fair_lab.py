"""Lab 10, fair queuing (meeting 14): the properties that grade a participant's Fair
(the waiting order of the virtual token counter: pick, served, lift), a flooding client
that must not starve the others, then the model served with their order next to the
engine's own 'fair'.
"""

from __future__ import annotations

from pathlib import Path

from minipaged.policies import fair
from minipaged.sampling import SamplingParams
from minipaged.sequence import Request, Sequence, Status
from minipaged.tools.lab.engine_run import QUESTIONS, SYSTEM
from minipaged.tools.lab.grading import Failed, Property, in_one_line, time_limit
from minipaged.tools.viz import LineChart
from minipaged.tools.viz.pages import plural


def solution() -> dict:
    return {"Fair": fair.Fair}


def request(
    name: str, client: str, prompt: int = 6, max_tokens: int = 4, arrival: int = 0
) -> Request:
    """A waiting request of `client` as the scheduler holds it."""
    tokens = [7 + i % 50 for i in range(prompt)]
    return Request(
        name,
        None,
        tokens,
        SamplingParams(max_tokens=max_tokens),
        [Sequence(0, list(tokens), prompt)],
        arrival=arrival,
        client=client,
    )


def order_with(m, counters: dict, active: dict, weights: tuple = ()):
    """Their Fair(*weights) with these counters, and `active` (client -> its requests)
    unfinished."""
    order = m.Fair(*weights)
    order.counters.update({c: float(v) for c, v in counters.items()})
    order.unfinished.update({c: set(rs) for c, rs in active.items()})
    return order


def number(value) -> str:
    return (
        f"{float(value):g}"
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else repr(value)
    )


def counters_said(counters: dict) -> str:
    return ", ".join(f"{c} {number(v)}" for c, v in counters.items())


def pick(order, waiting: list[Request], given: str) -> Request:
    """Their pick(waiting, now=0), which must be one of `waiting`, unchanged."""
    before = list(waiting)
    chosen = order.pick(waiting, 0)
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


def queue_said(waiting: list[Request]) -> str:
    return ", ".join(f"{r.request_id} ({r.client})" for r in waiting)


def expect_pick(
    m, counters: dict, waiting: list[Request], right: str, why: str
) -> None:
    clients = {r.client for r in waiting}
    order = order_with(
        m, counters, {c: [r for r in waiting if r.client == c] for c in clients}
    )
    given = (
        f"pick(waiting) with counters {counters_said(counters)} and waiting ="
        f" {queue_said(waiting)}"
    )
    chosen = pick(order, waiting, given)
    if chosen.request_id != right:
        raise Failed(given, f"pick chose {chosen.request_id}, expected {right}: {why}")


# ---- the properties ------------------------------------------------------------------


def served_counts_weighted_tokens(m) -> None:
    for weights, (p, o) in [((), (1.0, 2.0)), ((0.5, 3.0), (0.5, 3.0))]:
        a, b, c = request("a0", "alice"), request("b0", "bob"), request("c0", "carol")
        order = order_with(
            m,
            {"alice": 5, "bob": 0, "carol": 0},
            {"alice": [a], "bob": [b], "carol": [c]},
            weights,
        )
        calls = [
            (a, 12, "prefill"),
            (b, 1, "decode"),
            (b, 1, "decode"),
            (a, 3, "decode"),
            (c, 7, "prefill"),
            (b, 1, "decode"),
        ]
        for r, n, kind in calls:
            order.served(r, n, kind)
        expected = {"alice": 5 + 12 * p + 3 * o, "bob": 3 * o, "carol": 7 * p}
        got = {client: order.counters.get(client) for client in expected}
        if any(
            not isinstance(v, (int, float)) or abs(v - expected[k]) > 1e-9
            for k, v in got.items()
        ):
            made = f"Fair({', '.join(map(number, weights))})" if weights else "Fair()"
            said = "; ".join(
                f"served({r.request_id} of {r.client}, {n}, {kind!r})"
                for r, n, kind in calls
            )
            raise Failed(
                f"{made} (prompt weight {p:g}, output weight {o:g}), alice's counter at"
                f" 5, then {said}",
                f"the counters became {counters_said(got)}, expected"
                f" {counters_said(expected)}: each call adds num_tokens times the"
                " weight of its kind (self.weights) to the client's counter",
            )


def least_served_first(m) -> None:
    counters = {"flood": 120, "alice": 30, "bob": 45, "carol": 31}
    waiting = [
        request("f0", "flood"),
        request("f1", "flood"),
        request("b0", "bob"),
        request("c0", "carol"),
        request("a0", "alice"),
        request("f2", "flood"),
        request("a1", "alice"),
    ]
    expect_pick(
        m,
        counters,
        waiting,
        "a0",
        "alice has the least counter (30), so her oldest waiting request goes "
        "first, however many requests others have waiting or however old",
    )
    counters = {"flood": 9, "alice": 30, "bob": 45}
    waiting = [request("a2", "alice"), request("b1", "bob"), request("f3", "flood")]
    expect_pick(
        m,
        counters,
        waiting,
        "f3",
        "the flooder has the least counter (9) now: the counters decide, not "
        "who floods",
    )


def ties_to_the_oldest(m) -> None:
    counters = {"alice": 10, "bob": 10, "carol": 12}
    waiting = [
        request("b0", "bob"),
        request("c0", "carol"),
        request("a0", "alice"),
        request("b1", "bob"),
    ]
    expect_pick(
        m,
        counters,
        waiting,
        "b0",
        "alice and bob are equal (10): the first of equals in waiting (the "
        "oldest) goes first",
    )
    waiting = [request("a1", "alice"), request("a2", "alice"), request("a3", "alice")]
    expect_pick(
        m,
        {"alice": 4},
        waiting,
        "a1",
        "of one client's requests, the oldest (the first in waiting)",
    )


def a_new_client_is_lifted(m) -> None:
    counters = {
        "flood": 200,
        "bob": 80,
        "carol": 140,
        "dave": 10,
        "eve": 150,
    }  # dave and eve are idle
    active = {
        "flood": [request("f0", "flood")],
        "bob": [request("b0", "bob")],
        "carol": [request("c0", "carol")],
        "dave": [],
        "eve": [],
    }
    idle = "dave (10) and eve (150) have nothing unfinished"
    for client, expected, why in [
        (
            "alice",
            80,
            (
                "a client never seen starts at the least counter of the active clients"
                " (bob's 80), not at 0: else it would be served ahead of everyone until"
                " it caught up"
            ),
        ),
        (
            "dave",
            80,
            (
                "dave was idle: he is lifted to the active clients' least (80); the"
                " counters of idle clients (his own 10) do not count"
            ),
        ),
        (
            "eve",
            150,
            (
                "eve was idle with more (150) than the active clients' least (80): she"
                " keeps hers (lifted means at least, never lowered)"
            ),
        ),
    ]:
        order = order_with(m, counters, active)
        order.lift(client)
        got = order.counters.get(client)
        if got is None or abs(got - expected) > 1e-9:
            raise Failed(
                f"lift({client!r}) with counters {counters_said(counters)}; flood, bob"
                f" and carol have requests unfinished, {idle}",
                f"{client}'s counter became {number(got)}, expected {expected}: {why}",
            )
    order = order_with(m, {"dave": 10}, {"dave": []})
    for client, expected in (("zed", 0), ("dave", 10)):
        order.lift(client)
        got = order.counters.get(client)
        if got is None or abs(got - expected) > 1e-9:
            raise Failed(
                f"lift({client!r}) with nobody active (dave, at 10, has nothing"
                " unfinished)",
                f"{client}'s counter became {number(got)}, expected {expected}: with"
                " nobody active a client keeps what it has (a new one: 0)",
            )


def work_conserving(m) -> None:
    order = order_with(m, {"alice": 3, "bob": 5, "solo": 400}, {"alice": [], "bob": []})
    waiting = [request("s0", "solo"), request("s1", "solo"), request("s2", "solo")]
    given = (
        f"pick(waiting) with counters {counters_said(order.counters)}, alice and bob"
        f" idle (nothing unfinished), waiting = {queue_said(waiting)}"
    )
    chosen = pick(order, waiting, given)
    if chosen.request_id != "s0":
        raise Failed(
            given,
            f"pick chose {chosen.request_id}, expected s0: the order is work"
            " conserving: a client alone is served at once, however much it was"
            " served, its oldest request first",
        )


SLOTS, FLOOD, SHORT, EVERY, STEPS = (
    2,
    (20, 12),
    (8, 4),
    9,
    300,
)  # running at once; (prompt, max_tokens); arrivals


def simulate(order, floods: int = 12) -> tuple[list[str], dict[str, int]]:
    """A server of SLOTS rows: `floods` flood requests at step 0, then alice and bob
    each send a short one every EVERY steps. Each step: admit while a row is free (the
    order's pick), serve a prefill (prompt tokens) or one decode token per row, finish
    those done. As the scheduler, it asks the order whenever some request waits, then
    admits if a row is free. Returns the
    admission order and each short request's wait (steps from arrival to admission)."""
    waiting, running, order_of, waits, arrived = [], [], [], {}, {}
    for i in range(floods):
        waiting.append(request(f"f{i}", "flood", *FLOOD))
        arrived[f"f{i}"] = 0
    for now in range(STEPS):
        if now % EVERY == 3 and now < 8 * EVERY:
            for client in ("alice", "bob"):
                name = f"{client[0]}{now // EVERY}"
                waiting.append(request(name, client, *SHORT, arrival=now))
                arrived[name] = now
        # as the scheduler: it asks the order every step, then sees whether a row is
        # free
        while waiting:
            chosen = pick(
                order,
                waiting,
                f"the flood simulation at step {now}, waiting = {queue_said(waiting)}",
            )
            if len(running) == SLOTS:
                break
            waiting.remove(chosen)
            running.append([chosen, 0])
            order_of.append(chosen.request_id)
            waits[chosen.request_id] = now - arrived[chosen.request_id]
        for row in list(running):
            r, done = row
            order.served(
                r,
                len(r.prompt_token_ids) if done == 0 else 1,
                "prefill" if done == 0 else "decode",
            )
            row[1] += 1
            # the prefill's step samples the first token
            if row[1] > r.params.max_tokens - 1:
                r.status = Status.FINISHED
                running.remove(row)
        if not waiting and not running and now >= 8 * EVERY:
            break
    return order_of, waits


def flooder_cannot_starve(m) -> None:
    given = (
        f"a server of {SLOTS} rows; one client floods 12 requests ({FLOOD[0]}-token"
        f" prompts, {FLOOD[1]} tokens) at step 0; alice and bob each send a short one"
        f" ({SHORT[0]} + {SHORT[1]} tokens) every {EVERY} steps; your Fair orders the"
        " waiting queue"
    )
    mine, waits = simulate(m.Fair())
    late = {name: w for name, w in waits.items() if name[0] in "ab" and w > FLOOD[1]}
    if late:
        name = min(late, key=lambda n: (int(n[1:]), n))
        raise Failed(
            given,
            f"{name} waited {plural(late[name], 'step')} before admission: a short"
            " request of a client served less must wait at most for one row to free"
            f" ({FLOOD[1]} steps), not behind the flood",
        )
    expected, _ = simulate(fair.Fair())
    if mine != expected:
        k = next(i for i, (a, b) in enumerate(zip(mine, expected)) if a != b)
        raise Failed(
            given,
            f"admission {k + 1}: your order admitted {mine[k]}, the engine's Fair"
            f" {expected[k]}",
        )


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

PROPERTIES = [
    Property(
        SERVED,
        served_counts_weighted_tokens,
        "served(...) calls on Fair() and Fair(0.5, 3)",
    ),
    Property(LEAST, least_served_first, "pick of 7 requests from 4 clients"),
    Property(TIES, ties_to_the_oldest, "pick of requests whose clients are equal"),
    Property(
        LIFT,
        a_new_client_is_lifted,
        "lift of a new, an idle low and an idle high client",
    ),
    Property(CONSERVING, work_conserving, "pick with one client waiting"),
    Property(
        STARVE, flooder_cannot_starve, f"a flood beside two clients, {SLOTS} rows"
    ),
]


# ---- the run: the model served with their waiting order ------------------------------

# two rows
ENGINE = dict(block_size=4, num_blocks=128, max_num_seqs=2, enable_prefix_caching=False)
MAX_STEPS = 400


def arrivals() -> list[tuple[int, str, str, str, SamplingParams]]:
    """(step, id, client, prompt, params): the flooder sends 6 long requests at step 0;
    alice and bob send short ones while it runs."""

    def params(n):
        return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)

    flood = [
        (
            0,
            f"flood{i}",
            "flood",
            f"{SYSTEM} {QUESTIONS[i % len(QUESTIONS)]}",
            params(12),
        )
        for i in range(6)
    ]
    short = [
        (step, f"{client}{k}", client, QUESTIONS[k % len(QUESTIONS)], params(4))
        for k, step in enumerate((3, 15, 27))
        for client in ("alice", "bob")
    ]
    return sorted(flood + short, key=lambda a: a[0])


def serve_with(
    llm, policy
) -> tuple[list[str], dict[str, int], dict[str, list[int]], dict[str, list[float]]]:
    """Admission order, each request's wait (steps to its prompt's first computed
    token), its tokens, and each client's counter after every step (empty for an order
    that keeps none).
    """
    engine = llm.new_engine(**ENGINE, scheduling_policy=policy)
    pending, order, waits, tokens, added, service = arrivals(), [], {}, {}, {}, {}
    for step in range(MAX_STEPS):
        while pending and pending[0][0] <= step:
            _, name, client, prompt, params = pending.pop(0)
            engine.add_request(name, prompt, params, client=client)
            added[name] = step
        if not pending and not engine.has_unfinished_requests():
            return order, waits, tokens, service
        report = engine.step()
        for name, _, kind, _ in report.ran:
            if kind == "prefill" and name not in waits:
                order.append(name)
                waits[name] = step - added[name]
        for output in report.finished:
            tokens[output.request_id] = list(output.outputs[0].token_ids)
        counters = getattr(engine.scheduler.order, "counters", {})
        for client in ("flood", "alice", "bob"):
            service.setdefault(client, []).append(float(counters.get(client, 0.0)))
    raise RuntimeError(f"the engine had not finished after {MAX_STEPS} steps")


def serve_lab10(pieces, llm, pictures: Path) -> list[str]:
    """Their Fair and the engine's 'fair' serve the same arrivals: same admission order,
    same tokens."""
    try:
        with time_limit(300):
            order, waits, tokens, service = serve_with(llm, pieces.Fair())
    except Exception as error:
        raise RuntimeError(
            f"the engine with your Fair failed: {in_one_line(error)}"
        ) from None
    built_order, _, built_tokens, _ = serve_with(llm, "fair")
    if order != built_order:
        raise RuntimeError(
            f"your Fair admitted {', '.join(order)}; the engine's 'fair'"
            f" {', '.join(built_order)}"
        )
    for name, expected in built_tokens.items():
        if tokens.get(name) != expected:
            raise RuntimeError(
                f"request {name}: your engine gave tokens {tokens.get(name)}, the"
                f" built-in one {expected}"
            )
    _, fcfs, _, _ = serve_with(llm, "fcfs")
    short = [name for _, name, client, _, _ in arrivals() if client != "flood"]
    lines = [
        f"  admitted in the same order as the engine's 'fair': {', '.join(order)}",
        (
            f"  same {plural(sum(map(len, tokens.values())), 'token')} for the"
            f" {len(tokens)} requests"
        ),
        (
            "  steps each short request waited beside the flood (2 rows, 6 long"
            " requests first):"
        ),
        "         " + "".join(f"{n:>8}" for n in short),
    ]
    for label, w in [("fcfs", fcfs), ("yours", waits)]:
        lines.append(f"    {label:<5}" + "".join(f"{w[n]:>8}" for n in short))
    lines.append(
        "  fcfs makes alice and bob wait behind the whole flood (up to"
        f" {max(fcfs[n] for n in short)} steps); your order lets each in at the next"
        f" free row (at most {max(waits[n] for n in short)})"
    )
    chart = LineChart(
        "each client's service (weighted tokens: prompt 1, output 2) under your fair"
        " order",
        list(range(len(service["flood"]))),
        service,
        x_label="step",
        y_label="counter",
        digits=0,
    )
    pictures.mkdir(parents=True, exist_ok=True)
    picture = pictures / "lab10_service.svg"
    picture.write_text(chart.svg())
    return lines + [f"picture: {picture}"]
