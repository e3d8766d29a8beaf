"""`python -m minipaged.simulate`: the command line of the simulator
(minipaged.tools.bench.simulate), the real scheduler on a virtual clock. Here, not
beside the simulator: its options are checked with minipaged.llm's number, and the
simulator itself imports nothing of the model side.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from minipaged.llm import CommandParser, number
from minipaged.tools.bench.simulate import (
    ABLATION_BLOCK_SIZES,
    FIGURE_SYSTEMS,
    MIN_RATE,
    PAPER_RATE_RATIOS,
    PROFILES,
    PROFILES_HELP,
    SYSTEMS,
    ablations,
    figure12,
    poisson_trace,
    simulate,
    trace_specs,
)

DESCRIPTION = """\
The real Scheduler and allocators on a virtual clock. No model runs. Each step, \
the scheduler
picks its batch over real block managers (paged, contiguous chunks, static regions) \
exactly as
in the engine; a step-time model (--profile) says how long that batch would take; \
sampled
tokens are dummies, and a request ends at its trace's output length. \
So the paper's experiments
run at its scale: a Poisson trace of thousands of requests against OPT-13B's KV budget \
on an
A100, or a million requests to see what a simulated one costs.
"""


def build_parser() -> CommandParser:
    rate = number(float, MIN_RATE)  # req/s
    parser = CommandParser(
        prog="python -m minipaged.simulate",
        description=DESCRIPTION,
        epilog=PROFILES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--profile",
        default="opt-13b-a100",
        choices=sorted(PROFILES),
        help="the step-time model (profiles: below)",
    )
    parser.add_argument("--trace", default="sharegpt", choices=["sharegpt", "alpaca"])
    parser.add_argument(
        "--requests",
        type=number(int, 1),
        default=1000,
        help="requests per simulated run",
    )
    parser.add_argument(
        "--rates",
        type=rate,
        nargs="+",
        default=[0.25, 0.5, 1, 1.5, 2, 3, 4],
        help="request rates (req/s) of the latency curves",
    )
    parser.add_argument(
        "--threshold",
        type=number(float, 0),
        default=0.0,
        help=(
            "s/token a sustainable rate stays under (default 0: four times paging's "
            "at the lowest of --rates)"
        ),
    )
    parser.add_argument(
        "--rate",
        type=rate,
        default=None,
        help=(
            "instead: one run per --systems at this rate, timed (e.g. a million"
            " requests)"
        ),
    )
    parser.add_argument(
        "--systems", nargs="+", default=list(FIGURE_SYSTEMS), choices=sorted(SYSTEMS)
    )
    parser.add_argument(
        "--ablations",
        type=rate,
        default=None,
        metavar="RATE",
        help="instead: block size and recompute-vs-swap ablations at this rate",
    )
    parser.add_argument(
        "--fixed-scale",
        type=number(float, above=0),
        default=1.0,
        metavar="F",
        help=(
            "multiply the profile's fixed time per step by F: slower steps, as a real"
            " system's are next to a roofline (docs/07_paper.md: how the rate ratios"
            " depend on it)"
        ),
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document instead of the text",
    )
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    profile = dataclasses.replace(profile, fixed=args.fixed_scale * profile.fixed)
    start = time.perf_counter()
    if args.rate is not None:
        specs = trace_specs(args.trace, args.requests)
        result = {
            s: {
                "normalized_latency": (
                    simulate(
                        profile, s, poisson_trace(specs, args.rate)
                    ).normalized_latency
                )
            }
            for s in args.systems
        }
    elif args.ablations is not None:
        result = ablations(profile, args.trace, args.requests, args.ablations)
    else:
        result = figure12(
            profile, args.trace, args.requests, args.rates, args.threshold
        )
        # only a given threshold can be out of reach
        if not result["max_rate"]["paged"]:
            lowest = min(p["normalized_latency"] for p in result["curves"]["paged"])
            parser.error(
                "argument --threshold: no request rate keeps paging's normalized"
                f" latency under {args.threshold:g} s/token (the lowest on its curve is"
                f" {lowest:.3g});"
                " give a larger one, or 0 for four times paging's at the lowest rate"
            )
    seconds = time.perf_counter() - start
    result = {
        "profile": args.profile,
        "requests": args.requests,
        "seconds": seconds,
    } | result
    if args.fixed_scale != 1:
        result["fixed_scale"] = args.fixed_scale
    print(json.dumps(result, indent=2) if args.json else text_report(result))
    return 0


def text_report(result: dict) -> str:
    scale = (
        f" (fixed step time x {result['fixed_scale']:g})"
        if "fixed_scale" in result
        else ""
    )
    lines = [
        f"{result['profile']}{scale}, {result['requests']:,} requests per run,"
        f" simulated in {result['seconds']:.1f} s"
    ]
    for name, points in result.get("curves", {}).items():
        lines.append(
            f"  {name:<18} "
            + "  ".join(
                f"{p['rate']:g}/s: {p['normalized_latency']:.3f}" for p in points
            )
        )
    if "max_rate" in result:
        lines.append(
            f"highest rate under {result['threshold']:.3f} s/token: "
            + ", ".join(f"{s} {r:.2f}/s" for s, r in result["max_rate"].items())
        )
        for key, ratio in result["rate_ratio"].items():
            low, high = PAPER_RATE_RATIOS[key]
            lines.append(
                f"  paged {key.replace('_', ' ')}: {ratio:.2f}x (paper: {low}-{high}x)"
            )
    if "swap" in result:
        lines.append(
            f"paged at {result['rate']:g} req/s, normalized latency (s/token) and"
            " preemptions, by block size:"
        )
        lines.append(
            f"  {'block size':<12}" + "".join(f"{b:>9}" for b in ABLATION_BLOCK_SIZES)
        )
        for name in ("recompute", "swap"):
            lines.append(
                f"  {name:<12}"
                + "".join(
                    f"{r['normalized_latency']:>9.4f}" for r in result[name].values()
                )
            )
            lines.append(
                f"  {'  preempted':<12}"
                + "".join(f"{r['preemptions']:>9}" for r in result[name].values())
            )
    for name, r in result.items():
        if isinstance(r, dict) and "normalized_latency" in r and name != "curves":
            lines.append(f"  {name}: {r['normalized_latency']:.4f} s/token")
    return "\n".join(lines)
