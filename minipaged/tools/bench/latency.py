"""Latency under load, the paper's Figure 12 on the real engine: `python -m
minipaged.bench latency`.

Requests arrive as a Poisson process; the engine adds each at its arrival time on this
machine's clock. `--predict` puts the simulator (minipaged.simulate, profile
cpu-smollm2) beside each point; `python -m minipaged.bench calibrate` fits that profile
to timed engine steps.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque

import numpy as np
from tqdm import tqdm

from minipaged.llm import number
from minipaged.tools.bench.common import (
    OptionError,
    load,
    model_arguments,
    random_prompts,
    show,
)
from minipaged.tools.bench.simulate import (
    MIN_RATE,
    PROFILES,
    Profile,
    poisson_trace,
    simulate,
)
from minipaged.tools.bench.workload import make_workload
from minipaged.tools.viz import LineChart

SYSTEMS = {
    "paged": {},
    "contiguous-oracle": {"allocator": "contiguous-oracle"},
    "static": {"scheduler": "static"},
}  # name -> engine options (name as in simulate.SYSTEMS)


def latency_arguments(parser) -> None:
    model_arguments(parser)
    parser.add_argument(
        "--requests",
        type=number(int, 1),
        default=32,
        help="requests per run (default %(default)s)",
    )
    parser.add_argument(
        "--rates",
        type=number(float, MIN_RATE),
        nargs="+",
        default=[1, 2, 3, 4, 6],
        help="request rates, req/s, Poisson (default %(default)s)",
    )
    parser.add_argument(
        "--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS)
    )
    parser.add_argument(
        "--prompt-mean",
        type=number(float, 1),
        default=32,
        help="mean prompt tokens (default %(default)s)",
    )
    parser.add_argument(
        "--output-mean",
        type=number(float, 1),
        default=32,
        help="mean output tokens (default %(default)s)",
    )
    parser.add_argument(
        "--kv-tokens",
        type=number(int, 16),
        default=2048,
        help="KV cache in tokens (default %(default)s)",
    )
    parser.add_argument(
        "--max-model-len",
        type=number(int, 16),
        default=512,
        help="(default %(default)s)",
    )
    parser.add_argument(
        "--max-num-seqs", type=number(int, 1), default=16, help="(default %(default)s)"
    )
    parser.add_argument(
        "--seed",
        type=number(int, 0),
        default=0,
        help="workload seed (default %(default)s)",
    )
    parser.add_argument(
        "--predict",
        action="store_true",
        help=(
            "also the simulator's prediction (profile cpu-smollm2, fitted to the steps "
            "timed at the other rates) and its relative error"
        ),
    )
    parser.add_argument(
        "--svg", default=None, help="also write the latency curves to this SVG file"
    )


def engine_options(args) -> dict:
    return dict(
        block_size=16,
        num_blocks=args.kv_tokens // 16,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        enable_prefix_caching=False,
    )


def bench_latency(args, virtual: Profile | None = None) -> dict:
    """Every system (paging and Orca's contiguous-oracle, both with continuous batching,
    and static batching) serves the same requests at the same arrival times, once per
    rate: the normalized latency (mean of end-to-end latency / output length, s/token)
    and the end-to-end latency of the shortest quarter of requests."""
    # virtual (tests): the profile's step times replace this machine's clock,
    # deterministic
    specs = make_workload(
        args.requests,
        min_len=4,
        max_len=args.max_model_len // 2,
        prompt_mean=args.prompt_mean,
        output_mean=args.output_mean,
        seed=args.seed,
    )
    result = {"requests": args.requests, "kv_tokens": args.kv_tokens, "systems": {}}
    # rate -> (tokens, context, seconds) of each step
    timed: dict[float, list] = {rate: [] for rate in args.rates}
    with tqdm(
        total=len(args.systems) * len(args.rates), desc="latency", unit="run"
    ) as bar:
        for name in args.systems:
            llm = load(args, **engine_options(args), **SYSTEMS[name])[0]
            prompts = random_prompts(specs, args.seed, llm.model.config.vocab_size)
            serve_trace(llm.engine, [0.0], prompts[:1], [2], virtual)  # warm-up
            points = []
            for rate in args.rates:
                bar.set_postfix_str(f"{name} at {rate:g}/s")
                arrivals = [a.time for a in poisson_trace(specs, rate, args.seed)]
                done = serve_trace(
                    llm.engine,
                    arrivals,
                    prompts,
                    [s.output_len for s in specs],
                    virtual,
                    timed[rate],
                )
                points.append({"rate": rate, **latency_stats(done)})
                bar.update()
            result["systems"][name] = points
            del llm
    if args.predict:
        result["profile"] = predict(args, specs, result["systems"], timed, virtual)
    if {"paged", "static"} <= set(result["systems"]):
        result["at_knee"] = at_knee(result["systems"])
    show(args, latency_chart(result), latency_table(result))
    return result


def predict(args, specs, systems: dict, timed: dict, virtual: Profile | None) -> dict:
    """The simulator's normalized latency beside every measured point. Its cpu-smollm2
    step times are fitted to the steps this run timed, at the *other* rates (all
    systems): a point's own steps never enter the fit that predicts it, so the check is
    of the scheduling and queueing the simulator reproduces, on this machine as loaded
    now. Returns the fit on all steps.
    """

    def fitted(rows) -> Profile:
        return simulator_profile(args, virtual or fit_profile(rows))

    every = [row for rows in timed.values() for row in rows]
    for name, points in systems.items():
        for p in points:
            others = [
                row for rate, rows in timed.items() if rate != p["rate"] for row in rows
            ] or every
            predicted = simulate(
                fitted(others), name, poisson_trace(specs, p["rate"], args.seed)
            ).normalized_latency
            p |= {
                "predicted": predicted,
                "relative_error": predicted / p["normalized_latency"] - 1,
            }
    profile = fitted(every)
    return {
        "fixed": profile.fixed,
        "per_token": profile.per_token,
        "per_context": profile.per_context,
        "steps": len(every),
        "fit_error_p50": fit_error(profile, every, 50),
        "fit_error_p90": fit_error(profile, every, 90),
    }


def serve_trace(
    engine,
    arrivals,
    prompts,
    max_tokens,
    virtual: Profile | None = None,
    timed: list | None = None,
) -> list[tuple[int, float]]:
    """Each request added at its arrival time (seconds from the start); the engine steps
    while work exists. Returns (output tokens, end-to-end seconds) per request. With
    `virtual`, the clock moves by the profile's time for each step instead of the time
    it took. `timed`, if
    given, receives (tokens computed, tokens attended, seconds) of every step."""
    from minipaged.sampling import SamplingParams

    pending, clock, start, done = (
        deque(range(len(arrivals))),
        0.0,
        time.perf_counter(),
        {},
    )
    # (request, sequence) -> tokens in its KV cache
    computed: dict[tuple[str, int], int] = {}
    now = (lambda: clock) if virtual else (lambda: time.perf_counter() - start)
    while pending or engine.has_unfinished_requests():
        while pending and arrivals[pending[0]] <= now():
            i = pending.popleft()
            engine.add_request(
                f"latency-{i}",
                {"prompt_token_ids": prompts[i]},
                SamplingParams(
                    temperature=0, max_tokens=max_tokens[i], ignore_eos=True
                ),
            )
        if not engine.has_unfinished_requests():  # idle until the next arrival
            if virtual:
                clock = arrivals[pending[0]]
            else:
                time.sleep(max(0.0, arrivals[pending[0]] - now()))
            continue
        report = engine.step()
        shape = step_shape(report, computed)
        seconds = virtual.step_time(*shape) if virtual else report.seconds
        clock += seconds
        if timed is not None:
            timed.append((*shape, seconds))
        for output in report.finished:
            i = int(output.request_id.removeprefix("latency-"))
            done[i] = (len(output.outputs[0].token_ids), now() - arrivals[i])
    return [done[i] for i in range(len(arrivals))]


def step_shape(report, computed: dict) -> tuple[int, int]:
    """(tokens computed, tokens attended) of one step, as the simulator counts them:
    each row attends to its cache plus its new tokens; static batching's padding rows
    compute one token.
    """
    tokens = context = 0
    for rid, seq, _, new in report.ran:
        computed[rid, seq] = computed.get((rid, seq), 0) + new
        tokens, context = tokens + new, context + computed[rid, seq]
    for rid, seq in report.padded:
        tokens, context = tokens + 1, context + computed.get((rid, seq), 0)
    return tokens, context


def latency_stats(done: list[tuple[int, float]]) -> dict:
    """Normalized latency (the paper's metric) and the e2e latency of the shortest
    quarter."""
    # (requests,)
    lengths, e2e = (
        np.array([n for n, _ in done]),
        np.array([s for _, s in done]),
    )
    short = e2e[np.argsort(lengths, kind="stable")[: max(1, len(done) // 4)]]
    return {
        "normalized_latency": float(np.mean(e2e / lengths)),
        "short_e2e_p50": float(np.percentile(short, 50)),
        "short_e2e_p99": float(np.percentile(short, 99)),
        "e2e_p50": float(np.percentile(e2e, 50)),
    }


def simulator_profile(args, base: Profile | None = None) -> Profile:
    """The cpu-smollm2 step times with this run's KV cache and batch limits."""
    return dataclasses.replace(
        base or PROFILES["cpu-smollm2"],
        kv_slots=args.kv_tokens,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
    )


def knee(points: list[dict], factor: float = 2.0) -> float:
    """The highest rate whose normalized latency stays under `factor` x the lowest
    rate's."""
    base = points[0]["normalized_latency"]
    return max(p["rate"] for p in points if p["normalized_latency"] <= factor * base)


def at_knee(systems: dict) -> dict:
    """Static against paging at paging's knee: the issue's two ratios (each should be >=
    3)."""
    rate = knee(systems["paged"])
    paged, static = (
        next(p for p in systems[s] if p["rate"] == rate) for s in ("paged", "static")
    )
    return {
        "rate": rate,
        "normalized_latency_ratio": (
            static["normalized_latency"] / paged["normalized_latency"]
        ),
        "short_e2e_p50_ratio": static["short_e2e_p50"] / paged["short_e2e_p50"],
    }


def latency_chart(result: dict) -> LineChart:
    systems = result["systems"]
    rates = [p["rate"] for p in next(iter(systems.values()))]
    series = {
        name: [p["normalized_latency"] for p in points]
        for name, points in systems.items()
    }
    for name, points in systems.items():
        if "predicted" in points[0]:
            series[f"{name} (simulated)"] = [p["predicted"] for p in points]
    return LineChart(
        "normalized latency against request rate",
        rates,
        series,
        x_label="req/s",
        y_label="s/token",
        digits=3,
    )


def latency_table(result: dict) -> str:
    lines = [
        f"{'system':<18} {'req/s':>6} {'s/token':>8} {'short p50':>9} {'short p99':>9}"
        f" {'simulated':>9}"
    ]
    for name, points in result["systems"].items():
        for p in points:
            sim = (
                f"{p['predicted']:.3f} ({100 * p['relative_error']:+.0f}%)"
                if "predicted" in p
                else ""
            )
            lines.append(
                f"{name:<18} {p['rate']:>6g} {p['normalized_latency']:>8.3f}"
                f" {p['short_e2e_p50']:>8.2f}s {p['short_e2e_p99']:>8.2f}s {sim}"
            )
        lines.append(
            f"{'':<18} knee (under 2x its lowest rate's latency): {knee(points):g}"
            " req/s"
        )
    if "at_knee" in result:
        k = result["at_knee"]
        lines.append(
            f"at paging's knee ({k['rate']:g} req/s), static over paging: normalized"
            f" latency {k['normalized_latency_ratio']:.1f}x, shortest quarter's median"
            f" e2e {k['short_e2e_p50_ratio']:.1f}x"
        )
    return "\n".join(lines)


CALIBRATION_SHAPES = [
    (1, 16),
    (1, 256),
    (4, 64),
    (4, 192),
    (8, 128),
    (16, 32),
    (16, 96),
]  # (batch, prompt tokens)
CALIBRATION_STEPS = 12  # tokens generated per request of each shape


def calibrate_arguments(parser) -> None:
    model_arguments(parser)
    parser.add_argument(
        "--decode-steps",
        type=number(int, 1),
        default=CALIBRATION_STEPS,
        help="tokens generated per request of each shape (default %(default)s)",
    )


def bench_calibrate(args) -> dict:
    """Times real engine steps of a few batch shapes (a prefill of `batch` prompts, then
    their decode steps) and fits the simulator's step-time model to them by least
    squares on the relative error: seconds = fixed + per_token x tokens computed +
    per_context x tokens attended.
    """
    llm = load(
        args,
        block_size=16,
        num_blocks=512,
        max_num_seqs=16,
        enable_prefix_caching=False,
    )[0]
    if args.decode_steps >= llm.max_model_len:
        raise OptionError(
            f"--decode-steps {args.decode_steps} leaves no room for a prompt in this "
            f"model's context here, {llm.max_model_len} tokens"
        )
    # warm-up
    serve_trace(llm.engine, [0.0], [[llm.model.config.vocab_size // 2] * 8], [2])
    rows = time_steps(llm, args.decode_steps)
    profile = fit_profile(rows)
    result = {
        "fixed": profile.fixed,
        "per_token": profile.per_token,
        "per_context": profile.per_context,
        "steps": len(rows),
        "fit_error_p50": fit_error(profile, rows, 50),
        "fit_error_p90": fit_error(profile, rows, 90),
    }
    if not args.json:
        print(
            f"cpu-smollm2 step time = {1e3 * profile.fixed:.2f} ms +"
            f" {1e3 * profile.per_token:.3f} ms x tokens +"
            f" {1e6 * profile.per_context:.3f} µs x tokens attended   ({len(rows)}"
            f" steps; relative error p50 {100 * result['fit_error_p50']:.0f}%, p90"
            f" {100 * result['fit_error_p90']:.0f}%)"
        )
    return result


def time_steps(llm, decode_steps: int) -> list[tuple[int, int, float]]:
    """(tokens computed, tokens attended, seconds) of every step of each calibration
    shape (a prompt longer than the engine's max_model_len allows is cut to fit)."""
    from minipaged.sampling import SamplingParams

    vocab, rows = llm.model.config.vocab_size, []
    for batch, prompt_len in tqdm(CALIBRATION_SHAPES, desc="calibrate", unit="shape"):
        prompt_len = min(prompt_len, llm.engine.max_model_len - decode_steps)
        prompts = random_prompts(
            make_workload(batch, prompt_len, prompt_len, seed=batch), batch, vocab
        )
        computed = {}
        for i, prompt in enumerate(prompts):
            llm.engine.add_request(
                f"calibrate-{i}",
                {"prompt_token_ids": prompt},
                SamplingParams(temperature=0, max_tokens=decode_steps, ignore_eos=True),
            )
        while llm.engine.has_unfinished_requests():
            report = llm.engine.step()
            rows.append((*step_shape(report, computed), report.seconds))
    return rows


def fit_profile(rows) -> Profile:
    """Least squares on relative error (each step weighs 1 / its seconds), coefficients
    >= 0."""
    shape = np.array([(1.0, t, c) for t, c, _ in rows])  # (steps, 3)
    seconds = np.array([s for *_, s in rows])  # (steps,)
    keep = [0, 1, 2]
    while True:  # drop a coefficient that comes out negative and fit again
        coef = np.linalg.lstsq(
            shape[:, keep] / seconds[:, None], np.ones(len(rows)), rcond=None
        )[0]
        if (coef >= 0).all():
            break
        keep.pop(int(np.argmin(coef)))
    full = dict.fromkeys(range(3), 0.0) | dict(zip(keep, coef.tolist()))
    return dataclasses.replace(
        PROFILES["cpu-smollm2"], fixed=full[0], per_token=full[1], per_context=full[2]
    )


def fit_error(profile: Profile, rows, percentile: float) -> float:
    return float(
        np.percentile(
            [abs(profile.step_time(t, c) / s - 1) for t, c, s in rows], percentile
        )
    )
