"""`python -m minipaged.bench speculative`: speculative decoding against plain decoding.

Per proposer and k: how many guesses the model accepts, tokens per target forward, and
wall-clock tokens/s on the same prompts, on a workload where lookup fits (rewriting a
given text, editing code) and one where it does not (free chat). Greedy outputs must be
identical; they are checked.
"""

from __future__ import annotations

import statistics
import time

from tqdm import tqdm

from minipaged.llm import number
from minipaged.tools.bench.common import load, model_arguments

TEXT = (
    "The Atlas computer, built at the University of Manchester in 1962, was the first"
    " machine with virtual memory. Its designers split memory into pages of 512 words"
    " and kept a table that mapped each page to a frame of core memory; when a program"
    " touched a page that was not in core, the supervisor fetched it from the drum and"
    " updated the table."
)
CODE = """def total_price(items, tax):
    total = 0
    for item in items:
        total = total + item.price * item.count
    total = total * (1 + tax)
    return round(total, 2)
"""
WORKLOADS = {  # name -> chat messages, one conversation per request
    "rewrite": [
        f"Repeat this text word for word:\n\n{TEXT}",
        f"Rewrite this text in plain words, keeping every fact:\n\n{TEXT}",
        (
            "Rename the function total_price to order_total and return the whole"
            f" code:\n\n{CODE}"
        ),
        f"Add a docstring to this function and return the whole code:\n\n{CODE}",
    ],
    "chat": [
        "Write a short story about a dragon who is afraid of the dark.",
        "What are three good habits for studying well?",
        "Explain why the sky is blue to a ten-year-old.",
        "Give me a recipe for a simple tomato soup.",
    ],
}


def add_arguments(parser) -> None:
    parser.add_argument(
        "--k",
        type=number(int, 1, 16),
        nargs="+",
        default=[2, 4],
        help=(
            "guesses per step (num_speculative_tokens) of the n-gram proposer (default"
            " %(default)s)"
        ),
    )
    parser.add_argument(
        "--draft-layers",
        type=number(int, 1),
        nargs="+",
        default=[24],
        help=(
            "layers of the draft_layers proposer, several to compare (default"
            " %(default)s of SmolLM2's 30: fewer are cheaper but almost never right)"
        ),
    )
    parser.add_argument(
        "--draft-k",
        type=number(int, 1, 16),
        nargs="+",
        default=[2],
        help="guesses per step of the draft_layers proposer (default %(default)s)",
    )
    parser.add_argument(
        "--max-tokens",
        type=number(int, 1),
        default=48,
        help="tokens generated per request (default %(default)s)",
    )
    parser.add_argument(
        "--batch",
        type=number(int, 1),
        default=1,
        help=(
            "requests running at once (max_num_seqs; default %(default)s: one at a"
            " time)"
        ),
    )
    parser.add_argument(
        "--repeats",
        type=number(int, 1),
        default=3,
        help=(
            "timed runs of each configuration; the median is reported (default"
            " %(default)s)"
        ),
    )
    parser.add_argument(
        "--workloads",
        nargs="+",
        choices=sorted(WORKLOADS),
        default=sorted(WORKLOADS, reverse=True),
        help="which workloads (default: both)",
    )
    model_arguments(parser)


def configurations(args) -> list[tuple[str, dict | None]]:
    """(label, speculative_config): plain decoding first, then each proposer at each
    k."""
    configs = [("plain", None)]
    for k in args.k:
        configs.append(
            (
                f"ngram k={k}",
                {
                    "method": "ngram",
                    "num_speculative_tokens": k,
                    "prompt_lookup_max": 3,
                    "prompt_lookup_min": 1,
                },
            )
        )
    for layers in args.draft_layers:
        for k in args.draft_k:
            configs.append(
                (
                    f"draft_layers L={layers} k={k}",
                    {
                        "method": "draft_layers",
                        "num_speculative_tokens": k,
                        "num_draft_layers": layers,
                    },
                )
            )
    return configs


def bench_speculative(args) -> dict:
    """Each workload's chat prompts, greedy, --max-tokens each, run by plain decoding
    and by each proposer at each --k (--repeats times; medians). Reports the acceptance
    rate, tokens per target forward (a plain decode gives 1) and tokens/s, with the
    speed-up over plain.
    """
    from minipaged.sampling import SamplingParams

    llm, threads = load(args, max_num_seqs=args.batch)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    result = {
        "model": llm.model_name,
        "device": llm.device,
        "blas_threads": threads,
        "batch": args.batch,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "workloads": {},
    }
    for workload in args.workloads:
        prompts = [
            {
                "prompt_token_ids": llm.tokenizer.encode_chat(
                    [{"role": "user", "content": m}]
                )
            }
            for m in WORKLOADS[workload]
        ]
        rows, plain = {}, None
        for label, spec in configurations(args):
            engine = llm.new_engine(max_num_seqs=args.batch, speculative_config=spec)
            runs = [
                run_once(engine, prompts, params, f"{workload} {label}")
                for _ in range(args.repeats)
            ]
            row = summarize(runs)
            plain = plain or row
            row["speedup"] = row["tokens_per_s"] / plain["tokens_per_s"]
            row["identical_to_plain"] = (
                row.pop("outputs") == plain["outputs"] if label != "plain" else True
            )
            rows[label] = row
        rows["plain"].pop("outputs")
        result["workloads"][workload] = {"prompts": WORKLOADS[workload], "runs": rows}
    if not args.json:
        print_table(result)
    return result


def run_once(engine, prompts, params, desc: str) -> dict:
    """All prompts through the engine; seconds, tokens, steps, rows and guesses."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"spec-{i}", prompt, params)
    outputs, steps, rows, guessed, accepted = {}, 0, 0, 0, 0
    with tqdm(
        total=len(prompts) * params.max_tokens, desc=desc, unit="tok", leave=False
    ) as bar:
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            report = engine.step()
            steps, rows = steps + 1, rows + len(report.ran)
            guessed, accepted = guessed + report.guessed, accepted + report.accepted
            bar.update(len(report.ran) + report.accepted)
            outputs |= {o.request_id: o.outputs[0].token_ids for o in report.finished}
        seconds = time.perf_counter() - start
    tokens = sum(map(len, outputs.values()))
    return {
        "seconds": seconds,
        "tokens": tokens,
        "steps": steps,
        "rows": rows,
        "guessed": guessed,
        "accepted": accepted,
        "outputs": [outputs[f"spec-{i}"] for i in range(len(prompts))],
    }


def summarize(runs: list[dict]) -> dict:
    """Median time of the runs; counts from the first (greedy: every run guesses the
    same)."""
    first = runs[0]
    seconds = statistics.median(r["seconds"] for r in runs)
    return {
        "seconds_median": seconds,
        "seconds_all": [r["seconds"] for r in runs],
        "tokens": first["tokens"],
        "tokens_per_s": first["tokens"] / seconds,
        "target_forwards": first["steps"],
        "tokens_per_forward": first["tokens"] / first["rows"],
        "guessed": first["guessed"],
        "accepted": first["accepted"],
        "acceptance_rate": (
            first["accepted"] / first["guessed"] if first["guessed"] else None
        ),
        "outputs": first["outputs"],
    }


def print_table(result: dict) -> None:
    print(
        f"{result['model']} on {result['device']} ({result['blas_threads']} BLAS"
        f" threads), batch {result['batch']}, {result['max_tokens']} tokens per"
        f" request, median of {result['repeats']} runs"
    )
    for workload, data in result["workloads"].items():
        print(f"\n{workload}:")
        print(
            f"  {'':<26} {'accepted':>9} {'tok/forward':>12} {'tok/s':>7}"
            f" {'speed-up':>9}  same output"
        )
        for label, r in data["runs"].items():
            rate = (
                "-"
                if r["acceptance_rate"] is None
                else f"{100 * r['acceptance_rate']:.0f}%"
            )
            print(
                f"  {label:<26} {rate:>9} {r['tokens_per_forward']:12.2f}"
                f" {r['tokens_per_s']:7.1f} {r['speedup']:8.2f}x "
                f" {'yes' if r['identical_to_plain'] else 'NO'}"
            )
