"""`python -m minipaged.bench scheduling`: the order of the waiting queue when short and
long requests mix.

Each `scheduling_policy` serves the same Poisson mix, on the real engine at CPU scale
and in the simulator at paper scale: p50 and p99 end-to-end latency of the shortest and
the longest quarter (by prompt + output tokens), and the longest wait any request saw
before it first ran.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
from tqdm import tqdm

from minipaged.llm import number
from minipaged.llm import policy as policy_option
from minipaged.scheduler import WAITING_ORDERS
from minipaged.tools.bench.common import load, model_arguments, random_prompts, show
from minipaged.tools.bench.latency import step_shape
from minipaged.tools.bench.simulate import (
    PROFILES,
    Profile,
    Simulator,
    poisson_trace,
    trace_specs,
)
from minipaged.tools.bench.workload import RequestSpec
from minipaged.tools.viz import BarChart

# of the workload, the prompts and the arrivals: every run sees the same requests
SEED = 0
# SmolLM2's step times on the 2-core CPU, fitted when it was quiet
CPU = PROFILES["cpu-smollm2"]


def add_arguments(parser) -> None:
    model_arguments(parser)
    parser.add_argument(
        "--requests",
        type=number(int, 4),
        default=48,
        help="requests on the engine (default %(default)s)",
    )
    parser.add_argument(
        "--rate",
        type=number(float, above=0),
        default=5.0,
        help=(
            "their Poisson arrival rate, req/s (default %(default)s: a little over what"
            " 2 cores serve, so a queue forms)"
        ),
    )
    parser.add_argument(
        "--max-num-seqs",
        type=number(int, 1),
        default=4,
        help="seats in the engine's batch: more requests wait (default %(default)s)",
    )
    parser.add_argument(
        "--policies",
        nargs="+",
        type=policy_option("scheduling_policy"),
        default=list(WAITING_ORDERS),
        metavar="POLICY",
        help=(
            f"waiting orders to compare: names of {', '.join(WAITING_ORDERS)}, or one's"
            " own as module:Class (default: all names)"
        ),
    )
    parser.add_argument(
        "--aging-rate",
        type=number(float, above=0),
        default=4.0,
        help=(
            "aging on the engine: job-size tokens forgiven per step waited (default"
            " %(default)s)"
        ),
    )
    parser.add_argument(
        "--sim-requests",
        type=number(int, 4),
        default=600,
        help=(
            "ShareGPT-like requests in the simulator at paper scale (default"
            " %(default)s)"
        ),
    )
    parser.add_argument(
        "--sim-rate",
        type=number(float, above=0),
        default=6.0,
        help=(
            "their rate, req/s, on opt-13b-a100 (default %(default)s: past its knee, a"
            " queue forms)"
        ),
    )
    parser.add_argument(
        "--sim-aging-rate",
        type=number(float, above=0),
        default=1.0,
        help=(
            "aging in the simulator, tokens per step (default %(default)s: its jobs are"
            " longer, its steps shorter)"
        ),
    )
    parser.add_argument(
        "--engine",
        choices=["yes", "no"],
        default="yes",
        help="run the real engine too (no: the simulator only, seconds)",
    )
    parser.add_argument(
        "--clock",
        choices=["wall", "model"],
        default="wall",
        help=(
            "the engine's clock: this machine's, or each real step priced by the"
            " cpu-smollm2 step-time model (the same batches and tokens, free of a"
            " loaded machine's noise)"
        ),
    )
    parser.add_argument(
        "--svg", default=None, help="also write the chart to this SVG file"
    )


def mixed_workload(
    num_requests: int, seed: int = 0, long_share: float = 0.25
) -> list[RequestSpec]:
    """Short chat turns (8-32 prompt tokens, 4-16 out) and, `long_share` of them, long
    jobs (96-192 prompt tokens, 32-64 out: a document to summarize), in random order."""
    rng = np.random.default_rng(seed)
    long = rng.random(num_requests) < long_share
    return [
        (
            RequestSpec(int(rng.integers(96, 193)), int(rng.integers(32, 65)))
            if is_long
            else RequestSpec(int(rng.integers(8, 33)), int(rng.integers(4, 17)))
        )
        for is_long in long
    ]


def priorities_of(specs: list[RequestSpec]) -> list[int]:
    """vLLM's `priority=` as a client would set it: 1 (later) for the longest quarter of
    jobs, else 0."""
    # as latency_by_size ranks
    order = np.argsort([s.prompt_len + s.output_len for s in specs], kind="stable")
    longest = set(order[len(specs) - max(1, len(specs) // 4) :].tolist())
    return [int(i in longest) for i in range(len(specs))]


def bench_scheduling(args) -> dict:
    """The same requests at the same arrival times under each waiting-queue order:
    latency of the shortest and longest quarter, the longest wait; the engine's greedy
    tokens must not change with the order (checked). `priority` marks the longest
    quarter priority=1, the rest 0.
    """
    result = {"policies": args.policies}
    if args.engine == "yes":
        result["engine"] = engine_part(args)
    result["simulated"] = simulated_part(args)
    show(args, scheduling_chart(result), scheduling_table(result))
    return result


def engine_part(args) -> dict:
    """Every policy on the real engine (wall clock of this machine): one row each."""
    specs = mixed_workload(args.requests, SEED)
    llm, threads = load(
        args, max_num_seqs=args.max_num_seqs, enable_prefix_caching=False
    )
    prompts = random_prompts(specs, SEED, llm.model.config.vocab_size)
    arrivals = [a.time for a in poisson_trace(specs, args.rate, SEED)]
    rows, outputs = {}, {}
    for policy in tqdm(args.policies, desc="scheduling (engine)", unit="policy"):
        engine = llm.new_engine(
            max_num_seqs=args.max_num_seqs,
            enable_prefix_caching=False,
            scheduling_policy=policy,
            aging_rate=args.aging_rate,
        )
        served = serve_requests(
            engine,
            arrivals,
            prompts,
            [s.output_len for s in specs],
            priorities_of(specs) if policy == "priority" else None,
            CPU if args.clock == "model" else None,
        )
        outputs[policy] = served.pop("outputs")
        rows[policy] = latency_by_size(specs, served)
    same = all(outputs[p] == outputs[args.policies[0]] for p in args.policies)
    return {
        "model": llm.model_name,
        "blas_threads": threads,
        "requests": args.requests,
        "rate": args.rate,
        "aging_rate": args.aging_rate,
        "clock": args.clock,
        "max_num_seqs": args.max_num_seqs,
        "outputs_identical": same,
        "policies": rows,
    }


def simulated_part(args) -> dict:
    """Every policy in the simulator: OPT-13B on an A100 (profile opt-13b-a100),
    ShareGPT-like lengths."""
    specs = trace_specs("sharegpt", args.sim_requests, seed=SEED)
    trace = poisson_trace(specs, args.sim_rate, SEED)
    rows = {}
    for policy in args.policies:
        sim = PrioritySimulator(
            PROFILES["opt-13b-a100"],
            "paged",
            priorities_of(specs) if policy == "priority" else None,
            scheduler_options={
                "scheduling_policy": policy,
                "aging_rate": args.sim_aging_rate,
            },
        )
        r = sim.run(trace)
        served = {
            "e2e": r.latencies,
            "waits": r.waits,
            "seconds": r.clock,
            "preemptions": r.preemptions,
        }
        # (in finish order, as r's lists)
        sizes = [RequestSpec(p, o) for p, o in zip(r.prompt_lens, r.output_lens)]
        rows[policy] = latency_by_size(sizes, served)
    return {
        "profile": "opt-13b-a100",
        "trace": "sharegpt",
        "requests": args.sim_requests,
        "rate": args.sim_rate,
        "aging_rate": args.sim_aging_rate,
        "policies": rows,
    }


class PrioritySimulator(Simulator):
    """The simulator, each arrival added with its `priority=` (the i-th arrival, the
    i-th priority)."""

    def __init__(self, profile, system, priorities: list[int] | None = None, **options):
        super().__init__(profile, system, **options)
        self.priorities = priorities

    def add(self, arrival) -> None:
        super().add(arrival)
        request = self.scheduler.waiting[-1]  # the one just added
        if self.priorities is not None:
            request.priority = self.priorities[int(request.request_id)]


def serve_requests(
    engine, arrivals, prompts, max_tokens, priorities=None, clock: Profile | None = None
) -> dict:
    """Each request added at its arrival time (seconds from the start), the engine
    stepping while work exists. Returns per request (in order) its e2e latency, its wait
    (arrival to the start of its first step) and greedy tokens; and the run's seconds,
    preemptions and recomputed tokens (prefill rows of requests preempted before: work
    done twice). The clock is this machine's, or with `clock` a step-time model's: each
    step takes what the profile says its shape costs (the real engine's batches and
    tokens, timed free of the machine's load). `modeled_seconds`
    prices every step by the cpu-smollm2 profile either way."""
    from minipaged.sampling import SamplingParams

    pending, n, computed, start = (
        deque(range(len(arrivals))),
        len(arrivals),
        {},
        time.perf_counter(),
    )
    e2e, waits, outputs, preempted = [0.0] * n, [None] * n, [None] * n, set()
    stats = {
        "preemptions": 0,
        "recomputed_tokens": 0,
        "steps": 0,
        "modeled_seconds": 0.0,
    }
    virtual = [0.0]
    now = (lambda: virtual[0]) if clock else (lambda: time.perf_counter() - start)
    while pending or engine.has_unfinished_requests():
        while pending and arrivals[pending[0]] <= now():
            i = pending.popleft()
            engine.add_request(
                f"r{i}",
                {"prompt_token_ids": prompts[i]},
                SamplingParams(
                    temperature=0, max_tokens=max_tokens[i], ignore_eos=True
                ),
                **({"priority": priorities[i]} if priorities else {}),
            )
        if not engine.has_unfinished_requests():  # idle until the next arrival
            virtual[0] = max(virtual[0], arrivals[pending[0]])
            time.sleep(0 if clock else max(0.0, arrivals[pending[0]] - now()))
            continue
        began, report = now(), engine.step()
        shape = step_shape(report, computed)
        stats["steps"], stats["modeled_seconds"] = (
            stats["steps"] + 1,
            stats["modeled_seconds"] + CPU.step_time(*shape),
        )
        virtual[0] += clock.step_time(*shape) if clock else 0.0
        for rid, _, kind, tokens in report.ran:
            i = int(rid[1:])
            waits[i] = began - arrivals[i] if waits[i] is None else waits[i]
            stats["recomputed_tokens"] += (
                tokens if kind == "prefill" and rid in preempted else 0
            )
        stats["preemptions"] += len(report.preempted)
        preempted |= {rid for rid, _ in report.preempted}
        for output in report.finished:
            i = int(output.request_id[1:])
            e2e[i], outputs[i] = now() - arrivals[i], output.outputs[0].token_ids
    return stats | {"e2e": e2e, "waits": waits, "outputs": outputs, "seconds": now()}


def latency_by_size(specs: list[RequestSpec], served: dict) -> dict:
    """p50/p99 e2e of the shortest and the longest quarter of jobs (prompt + output
    tokens), all requests' p50, and the longest wait (starvation)."""
    sizes = np.array([s.prompt_len + s.output_len for s in specs])
    e2e = np.array(served["e2e"])
    order = np.argsort(sizes, kind="stable")
    quarter = max(1, len(specs) // 4)
    short, long = e2e[order[:quarter]], e2e[order[-quarter:]]
    return {
        "short_p50": float(np.percentile(short, 50)),
        "short_p99": float(np.percentile(short, 99)),
        "long_p50": float(np.percentile(long, 50)),
        "long_p99": float(np.percentile(long, 99)),
        "e2e_p50": float(np.percentile(e2e, 50)),
        "e2e_mean": float(e2e.mean()),
        "max_wait": float(max(served["waits"])),
        "seconds": served["seconds"],
        "preemptions": served["preemptions"],
    }


FIELDS = {
    "short_p50": "shortest quarter's p50 e2e latency",
    "long_p50": "longest quarter's p50 e2e latency",
    "long_p99": "longest quarter's p99 e2e latency",
    "max_wait": "longest wait before running",
}


def scheduling_chart(result: dict, key: str = "", field: str = "short_p50") -> BarChart:
    """One bar per policy: `field` (FIELDS) of the engine's part (or `key`:
    "simulated")."""
    key = key or ("engine" if "engine" in result else "simulated")
    rows = result[key]["policies"]
    where = "engine, CPU" if key == "engine" else "simulated, opt-13b-a100"
    return BarChart(
        f"{FIELDS[field]} by policy ({where})",
        list(rows),
        {field.replace("_", " "): [r[field] for r in rows.values()]},
        unit=" s",
        digits=2,
    )


def scheduling_table(result: dict) -> str:
    lines = []
    for key in ("engine", "simulated"):
        if key not in result:
            continue
        part = result[key]
        where = (
            f"real engine ({part['model']}, {part['blas_threads']} BLAS threads),"
            f" {part['requests']} requests at {part['rate']:g}/s, max_num_seqs"
            f" {part['max_num_seqs']}, {part['clock']} clock; greedy outputs identical"
            f" across policies: {'yes' if part['outputs_identical'] else 'NO'}"
            if key == "engine"
            else (
                f"simulator, {part['profile']}, {part['requests']} {part['trace']}"
                f" requests at {part['rate']:g}/s"
            )
        )
        # a policy of one's own is named module:Class
        width = max(9, *map(len, part["policies"]))
        lines += [
            where,
            (
                f"  {'policy':<{width}} {'short p50':>10} {'short p99':>10}"
                f" {'long p50':>10} {'long p99':>10} {'all p50':>9} {'max wait':>9}"
            ),
        ]
        for policy, r in part["policies"].items():
            lines.append(
                f"  {policy:<{width}} {r['short_p50']:>9.2f}s {r['short_p99']:>9.2f}s"
                f" {r['long_p50']:>9.2f}s {r['long_p99']:>9.2f}s {r['e2e_p50']:>8.2f}s"
                f" {r['max_wait']:>8.2f}s"
            )
    return "\n".join(lines)
