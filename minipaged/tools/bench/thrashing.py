"""`python -m minipaged.bench thrashing`: too many sequences in too little KV memory
(Denning, 1968).

A burst of requests, preemption by recompute: goodput (output tokens of finished
requests per second), preemptions and recomputed tokens against max_num_seqs at three KV
sizes, beside `admission="working-set"` untuned. The real engine at CPU scale; the
simulator at paper scale.
"""

from __future__ import annotations

import dataclasses

from tqdm import tqdm

from minipaged.llm import number
from minipaged.tools.bench.common import load, model_arguments, random_prompts, show
from minipaged.tools.bench.scheduling import serve_requests
from minipaged.tools.bench.simulate import PROFILES, Arrival, Simulator, trace_specs
from minipaged.tools.bench.workload import make_workload
from minipaged.tools.viz import LineChart

SEED = 0  # of the workloads and the prompts: every run sees the same requests


def add_arguments(parser) -> None:
    model_arguments(parser)
    sizes = number(int, 16)
    parser.add_argument(
        "--kv-tokens",
        type=sizes,
        nargs="+",
        default=[128, 256, 512],
        help="engine KV cache sizes, in tokens (default %(default)s)",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=number(int, 1),
        nargs="+",
        default=[2, 4, 8, 16],
        help="admitted concurrency swept on the engine (default %(default)s)",
    )
    parser.add_argument(
        "--requests",
        type=number(int, 1),
        default=16,
        help="engine requests, all at once (default %(default)s)",
    )
    parser.add_argument(
        "--window",
        type=number(int, 1),
        default=16,
        help="admission_window of the working-set rule, steps (default %(default)s)",
    )
    parser.add_argument(
        "--sim-kv-tokens",
        type=sizes,
        nargs="+",
        default=[7500, 15000, 30000],
        help="simulated KV sizes (opt-13b-a100 has 15,000; default %(default)s)",
    )
    parser.add_argument(
        "--sim-max-num-seqs",
        type=number(int, 1),
        nargs="+",
        default=[8, 16, 32, 64, 128, 256],
        help="admitted concurrency swept in the simulator (default %(default)s)",
    )
    parser.add_argument(
        "--sim-requests",
        type=number(int, 1),
        default=200,
        help=(
            "ShareGPT-like requests in the simulator, all at once (default %(default)s)"
        ),
    )
    parser.add_argument(
        "--engine",
        choices=["yes", "no"],
        default="yes",
        help="run the real engine too (no: the simulator only)",
    )
    parser.add_argument(
        "--svg", default=None, help="also write the chart to this SVG file"
    )


def bench_thrashing(args) -> dict:
    """Per KV size: goodput, preemptions and recomputed tokens at each max_num_seqs with
    greedy admission, then the working-set rule untuned, and its goodput over the best
    hand-tuned one. The engine's greedy tokens must equal across every run (checked)."""
    result = {"window": args.window}
    if args.engine == "yes":
        result["engine"] = engine_part(args)
    result["simulated"] = simulated_part(args)
    show(args, thrashing_chart(result), thrashing_table(result))
    return result


def engine_part(args) -> dict:
    specs = make_workload(
        args.requests, min_len=8, max_len=64, prompt_mean=24, output_mean=32, seed=SEED
    )
    llm, threads = load(args, enable_prefix_caching=False)
    prompts = random_prompts(specs, SEED, llm.model.config.vocab_size)
    outputs = []

    def run(kv_tokens: int, max_num_seqs: int, admission: str) -> dict:
        engine = llm.new_engine(
            num_blocks=kv_tokens // 16,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=False,
            admission=admission,
            admission_window=args.window,
        )
        served = serve_requests(
            engine, [0.0] * len(specs), prompts, [s.output_len for s in specs]
        )
        outputs.append(served["outputs"])
        return point(sum(map(len, served["outputs"])), served)

    with tqdm(
        total=len(args.kv_tokens) * (len(args.max_num_seqs) + 1),
        desc="thrashing (engine)",
        unit="run",
    ) as bar:
        memories = sweep(run, args.kv_tokens, args.max_num_seqs, bar)
    return {
        "model": llm.model_name,
        "blas_threads": threads,
        "requests": args.requests,
        "prompt_tokens": sum(s.prompt_len for s in specs),
        "output_tokens": sum(s.output_len for s in specs),
        "outputs_identical": all(o == outputs[0] for o in outputs),
        "memories": memories,
    }


def simulated_part(args) -> dict:
    specs = trace_specs("sharegpt", args.sim_requests, seed=SEED)

    def run(kv_tokens: int, max_num_seqs: int, admission: str) -> dict:
        profile = dataclasses.replace(
            PROFILES["opt-13b-a100"], kv_slots=kv_tokens, max_num_seqs=max_num_seqs
        )
        sim = Simulator(
            profile,
            "paged",
            scheduler_options={"admission": admission, "admission_window": args.window},
        )
        r = sim.run([Arrival(0.0, s) for s in specs])
        return point(
            sum(r.output_lens),
            {
                "seconds": r.clock,
                "preemptions": r.preemptions,
                "recomputed_tokens": r.recomputed_tokens,
                "steps": r.steps,
            },
        )

    with tqdm(
        total=len(args.sim_kv_tokens) * (len(args.sim_max_num_seqs) + 1),
        desc="thrashing (simulated)",
        unit="run",
    ) as bar:
        memories = sweep(run, args.sim_kv_tokens, args.sim_max_num_seqs, bar)
    return {
        "profile": "opt-13b-a100",
        "trace": "sharegpt",
        "requests": args.sim_requests,
        "output_tokens": sum(s.output_len for s in specs),
        "memories": memories,
    }


def point(output_tokens: int, served: dict) -> dict:
    """Goodput and its counts; on the engine also `modeled_goodput`, its steps priced by
    the cpu-smollm2 step-time model (the same work, free of the machine's load)."""
    modeled = (
        {"modeled_goodput": output_tokens / served["modeled_seconds"]}
        if "modeled_seconds" in served
        else {}
    )
    return {
        "goodput": output_tokens / served["seconds"],
        "seconds": served["seconds"],
        **modeled,
        "preemptions": served["preemptions"],
        "recomputed_tokens": served["recomputed_tokens"],
        "steps": served["steps"],
    }


def sweep(run, memories: list[int], concurrencies: list[int], bar) -> dict:
    """run(kv_tokens, max_num_seqs, admission) at each size: greedy at every
    concurrency, then the working-set rule at the largest (nothing tuned), and how it
    compares with the best.
    """
    out = {}
    for kv_tokens in memories:
        greedy = {}
        for n in concurrencies:
            greedy[n] = run(kv_tokens, n, "greedy")
            bar.update()
        working_set = run(kv_tokens, max(concurrencies), "working-set")
        bar.update()
        out[kv_tokens] = {"greedy": greedy, "working_set": working_set} | compare(
            greedy, working_set, "goodput"
        )
        if "modeled_goodput" in working_set:
            out[kv_tokens]["modeled"] = compare(greedy, working_set, "modeled_goodput")
    return out


def compare(greedy: dict, working_set: dict, field: str) -> dict:
    """The best hand-tuned max_num_seqs by `field`, and the working-set rule and the
    largest max_num_seqs as fractions of it."""
    best = max(greedy, key=lambda n: greedy[n][field])
    return {
        "best_max_num_seqs": best,
        "working_set_over_best": working_set[field] / greedy[best][field],
        "largest_over_best": greedy[max(greedy)][field] / greedy[best][field],
    }


def thrashing_chart(result: dict, key: str = "", field: str = "goodput") -> LineChart:
    """`field` (goodput, preemptions, recomputed_tokens) against max_num_seqs, one line
    per KV size, of the engine's part (or `key`: "simulated"); the working-set rule's
    goodput as a flat line beside each (it has no max_num_seqs to tune)."""
    key = key or ("engine" if "engine" in result else "simulated")
    memories = result[key]["memories"]
    first = next(iter(memories.values()))
    series = {
        f"{kv} KV tokens": [p[field] for p in m["greedy"].values()]
        for kv, m in memories.items()
    }
    if field == "goodput":
        series |= {
            f"{kv}, working-set": [m["working_set"]["goodput"]] * len(m["greedy"])
            for kv, m in memories.items()
        }
    where = "engine, CPU" if key == "engine" else "simulated, opt-13b-a100"
    units = {
        "goodput": "tokens/s",
        "preemptions": "preemptions",
        "recomputed_tokens": "tokens",
    }
    return LineChart(
        f"{field.replace('_', ' ')} against max_num_seqs, greedy admission ({where})",
        [int(n) for n in first["greedy"]],
        series,
        x_label="max_num_seqs",
        y_label=units[field],
        log_x=True,
        digits=0,
    )


def thrashing_table(result: dict) -> str:
    lines = []
    for key in ("engine", "simulated"):
        if key not in result:
            continue
        part = result[key]
        lines.append(
            f"real engine ({part['model']}, {part['blas_threads']} BLAS threads),"
            f" {part['requests']} requests at once; greedy outputs identical in every"
            f" run: {'yes' if part['outputs_identical'] else 'NO'}; modeled: its steps"
            " priced by the cpu-smollm2 step-time model"
            if key == "engine"
            else (
                f"simulator, {part['profile']}, {part['requests']} {part['trace']} "
                "requests at once"
            )
        )
        lines.append(
            f"  {'KV tokens':>9} {'admission':<18} {'goodput':>9} {'modeled':>9}"
            f" {'preempted':>9} {'recomputed':>10}"
        )
        for kv, m in part["memories"].items():
            rows = [(f"max_num_seqs {n}", p) for n, p in m["greedy"].items()] + [
                ("working-set", m["working_set"])
            ]
            for label, p in rows:
                modeled = (
                    f"{p['modeled_goodput']:>7.1f}/s"
                    if "modeled_goodput" in p
                    else f"{'':>9}"
                )
                lines.append(
                    f"  {kv:>9} {label:<18} {p['goodput']:>7.1f}/s {modeled}"
                    f" {p['preemptions']:>9} {p['recomputed_tokens']:>10}"
                )
            for name, c in (("", m), (" (modeled)", m.get("modeled"))):
                if c:
                    lines.append(
                        f"  {'':>9} working-set at"
                        f" {100 * c['working_set_over_best']:.0f}% of the best"
                        f" hand-tuned{name} (max_num_seqs {c['best_max_num_seqs']});"
                        f" the largest at {100 * c['largest_over_best']:.0f}%"
                    )
    return "\n".join(lines)
