"""`python -m minipaged.bench {decode,memory,kernel,throughput,sharing,serve,fragmentation,chunked,latency,calibrate} [--json]`.

Each benchmark is a function `bench_<name>(args) -> dict` registered with @command; it prints
a human summary itself (unless args.json) and returns the dict that --json prints. Progress
bars go to stderr, so stdout holds only the table or the JSON. The model benchmarks fit BLAS's
threads to the cores nobody else is using (backend.fit_blas_threads) before they measure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from tqdm import tqdm

DESCRIPTION = """\
Measure what the vLLM paper measures, on this machine: decode speed, KV-cache memory
use, continuous vs static batching, frames saved by sharing, and the CUDA attention
kernels. Each benchmark prints a short table on stdout and its progress on stderr;
with --json it prints one JSON document on stdout instead of the table. Times are
for the defaults with SmolLM2-135M on a quiet 2-core CPU (a GPU is much faster).
`python -m minipaged.bench decode --help` explains one benchmark and its options."""

EPILOG = """\
examples:
  python -m minipaged.bench decode --batch 16
  python -m minipaged.bench throughput --requests 8 --json > throughput.json

Run it inside the project's environment (`source .venv/bin/activate` after `make setup`), or
through make: make bench-decode, bench-memory, bench-throughput, bench-sharing, bench-serve,
bench-kernel."""

COMMANDS = {}  # name -> (function, add_arguments, one-line help, how long it takes)


def command(name, help, takes, add_arguments=lambda parser: None):
    """Register a benchmark: @command("decode", help=..., takes="about 10 s", add_arguments=...)."""
    def register(fn):
        COMMANDS[name] = (fn, add_arguments, help, takes)
        return fn
    return register


def _load(args, **options):
    """(LLM, BLAS threads): the model of args.model on args.device, BLAS fitted to the idle cores."""
    from minipaged.backend import fit_blas_threads
    from minipaged.engine import LLM
    llm = LLM(args.model, device=args.device, **options)
    return llm, fit_blas_threads()


def _model_arguments(parser):
    parser.add_argument("--model", default=None,
                        help="hub id or local folder (default: SmolLM2-135M-Instruct, offline if need be)")
    parser.add_argument("--device", default=None, choices=["cpu", "cuda"],
                        help="where the model runs (default: cuda when usable, else cpu)")


def _decode_arguments(parser):
    parser.add_argument("--batch", type=int, default=1, help="streams decoded together (default %(default)s)")
    parser.add_argument("--prompt-len", type=int, default=64,
                        help="prompt tokens per stream (default %(default)s)")
    parser.add_argument("--tokens", type=int, default=64,
                        help="tokens generated per stream (default %(default)s)")
    _model_arguments(parser)


@command("decode", help="decode speed: tokens/s of --batch greedy streams after one prefill",
         takes="about 5 s (10 s at --batch 16)", add_arguments=_decode_arguments)
def bench_decode(args) -> dict:
    """Sends --batch random prompts of --prompt-len tokens, runs one prefill step, then times
    the decode steps until every stream has --tokens tokens; tokens/s counts all streams."""
    from minipaged.sampling import SamplingParams

    llm, threads = _load(args)
    rng = np.random.default_rng(0)
    prompts = [{"prompt_token_ids": rng.integers(100, 10_000, args.prompt_len).tolist()}
               for _ in range(args.batch)]
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
    for i, prompt in enumerate(prompts):
        llm.engine.add_request(f"decode-{i}", prompt, params)
    with tqdm(total=args.tokens, desc=f"decode, batch {args.batch}", unit="step") as bar:
        start = time.perf_counter()
        llm.engine.step()                             # prefill: all prompts, first token each
        prefilled = time.perf_counter()
        bar.update()
        decode_steps = 0
        while llm.engine.has_unfinished_requests():   # one token per stream per step
            llm.engine.step()
            decode_steps += 1
            bar.update()
        end = time.perf_counter()
    result = {"batch": args.batch, "prompt_len": args.prompt_len, "decode_steps": decode_steps,
              "tokens_per_s": args.batch * decode_steps / (end - prefilled),
              "step_ms": 1000 * (end - prefilled) / decode_steps,
              "prefill_s": prefilled - start, "device": llm.device, "dtype": str(llm.dtype),
              "model": llm.model_name, "blas_threads": threads}
    if not args.json:
        print(f"{result['model']} on {result['device']} ({result['dtype']}, {threads} BLAS threads): "
              f"batch {args.batch}, prompt {args.prompt_len} tokens, prefill {result['prefill_s']:.2f} s; "
              f"decode {result['tokens_per_s']:.1f} tok/s ({result['step_ms']:.1f} ms/step)")
    return result


def _memory_arguments(parser):
    parser.add_argument("--requests", type=int, default=1000, help="requests in the workload (default %(default)s)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block, paged (default %(default)s)")
    parser.add_argument("--max-model-len", type=int, default=2048,
                        help="slots the static baseline reserves per request (default %(default)s)")
    parser.add_argument("--max-num-seqs", type=int, default=64,
                        help="requests running at once (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default %(default)s)")


@command("memory", help="KV-cache utilization: paging vs reserving max_model_len slots per "
         "request (no model: the block managers alone)", takes="about 1 s",
         add_arguments=_memory_arguments)
def bench_memory(args) -> dict:
    """The same requests through both allocators, in one pool of max_num_seqs × max_model_len
    slots, so memory never limits admission: the figures compare how memory is used."""
    from minipaged.paging import BlockManager, StaticBlockManager
    from minipaged.bench.workload import make_workload, simulate_memory
    requests = make_workload(args.requests, seed=args.seed)
    num_slots = args.max_num_seqs * args.max_model_len
    managers = {"paged": BlockManager(num_slots // args.block_size, args.block_size,
                                      enable_prefix_caching=False),
                "static": StaticBlockManager(num_slots, args.max_model_len)}
    result = {name: simulate_memory(manager, requests, args.max_num_seqs)
              for name, manager in tqdm(managers.items(), desc="memory", unit="allocator", delay=1)}
    result |= {"utilization_is": "time-averaged over steps: summed token slots / summed allocated slots",
               "workload": {"requests": len(requests), "max_num_seqs": args.max_num_seqs,
                            "block_size": args.block_size, "max_model_len": args.max_model_len,
                            "mean_prompt_len": sum(r.prompt_len for r in requests) / len(requests),
                            "mean_output_len": sum(r.output_len for r in requests) / len(requests)}}
    if not args.json:
        print(_memory_table(result))
    return result


def _memory_table(result: dict) -> str:
    w, paged, static = result["workload"], result["paged"], result["static"]
    rows = [("utilization", lambda r: f"{r['utilization']:.1%}"),
            ("slots per running request", lambda r: f"{r['slots_per_request']:,.0f}"),
            ("mean allocated slots", lambda r: f"{r['mean']['allocated_slots']:,.0f}"),
            ("mean token slots", lambda r: f"{r['mean']['token_slots']:,.0f}"),
            ("mean internal waste", lambda r: f"{r['mean']['internal_waste']:,.0f}"),
            ("mean reserved-but-unused", lambda r: f"{r['mean']['reserved_unused']:,.0f}"),
            ("peak allocated slots", lambda r: f"{r['peak_allocated_slots']:,}")]
    lines = [f"memory: {w['requests']:,} requests (mean prompt {w['mean_prompt_len']:.0f}, mean output "
             f"{w['mean_output_len']:.0f} tokens), {w['max_num_seqs']} running at once",
             f"utilization = slots holding real tokens / allocated slots, time-averaged over {paged['steps']:,} steps",
             "",
             f"{'':28}{'paged (block ' + str(w['block_size']) + ')':>18}{'static (' + str(w['max_model_len']) + ' each)':>20}"]
    lines += [f"{label:28}{cell(paged):>18}{cell(static):>20}" for label, cell in rows]
    lines.append("(the vLLM paper measured 20.4%-38.2% for systems that reserve per request)")
    return "\n".join(lines)


def _kernel_arguments(parser):
    parser.add_argument("--versions", default="1,2,3,4,5,6",
                        help="decode kernel versions to time, comma-separated (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=20,
                        help="timed runs per version; the median is reported (default %(default)s)")


@command("kernel", help="paged-attention decode kernels on a GPU: GB/s and % of peak memory "
         "bandwidth per version, next to dense attention (needs a CUDA device)",
         takes="under a minute on a GPU; without one it stops at once, saying so",
         add_arguments=_kernel_arguments)
def bench_kernel(args) -> list:
    """Each version is first checked against dense attention, then timed on four shapes (SmolLM2
    and Llama 3 8B batches, long contexts, an fp32 cache); one row per (shape, version). See
    minipaged/bench/kernel.py."""
    from minipaged.bench import kernel as kernel_bench
    versions = [int(v) for v in args.versions.split(",")]
    rows = []
    for shape in tqdm(kernel_bench.SHAPES, desc="kernel", unit="shape", delay=1):
        rows += kernel_bench.run(shapes=(shape,), versions=versions, repeats=args.repeats, verbose=False)
    if not args.json:
        print(f"{rows[0]['device']}, peak {rows[0]['peak_gbps']:.0f} GB/s; * marks the version "
              f"the rule picks\n{kernel_bench.HEADER}")
        print("\n".join(kernel_bench.format_row(row) for row in rows))
    return rows


def _serving_arguments(parser):
    _model_arguments(parser)
    parser.add_argument("--requests", type=int, default=32, help="requests in the workload (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default %(default)s)")


def _throughput_arguments(parser):
    _serving_arguments(parser)
    parser.add_argument("--max-model-len", type=int, default=1024,
                        help="context per request; the static baseline reserves this much each "
                             "(default %(default)s)")
    parser.add_argument("--kv-tokens", type=int, default=8192,
                        help="KV cache size in tokens, the same for both; static runs "
                             "kv-tokens / max-model-len requests at once (default %(default)s)")
    parser.add_argument("--max-num-seqs", type=int, default=32,
                        help="continuous batching's batch limit (default %(default)s)")


def _random_prompts(specs, seed: int, vocab: int) -> list[dict]:
    """Random token ids (skipping the first ids, where special tokens live) of the given lengths."""
    rng = np.random.default_rng(seed)
    low, high = min(100, vocab // 4), min(10_000, vocab)
    return [{"prompt_token_ids": rng.integers(low, high, s.prompt_len).tolist()} for s in specs]


def _serve(llm, prompts, params, desc: str) -> tuple[float, int, list]:
    """Run every request through llm.engine; returns seconds, generated tokens, step reports.
    The progress bar counts the rows that got a token (static batching's padding rows do not)."""
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        llm.engine.add_request(f"bench-{i}", prompt, p)
    reports = []
    with tqdm(total=sum(p.max_tokens for p in params), desc=desc, unit="tok") as bar:
        start = time.perf_counter()
        while llm.engine.has_unfinished_requests():
            reports.append(llm.engine.step())
            bar.update(len(reports[-1].ran) - reports[-1].padding)
        seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for r in reports for o in r.finished for c in o.outputs)
    return seconds, tokens, reports


@command("throughput", help="continuous vs static batching on one mixed-length workload: tokens/s",
         takes="about 4 min", add_arguments=_throughput_arguments)
def bench_throughput(args) -> dict:
    """The same requests (random prompts, lengths drawn like chat traffic) through continuous
    batching and through static batching (a batch runs until its longest request ends), on KV
    caches of the same size; tokens/s of generated tokens, and their ratio."""
    from minipaged.bench.workload import make_workload
    from minipaged.sampling import SamplingParams

    specs = make_workload(args.requests, min_len=8, max_len=args.max_model_len // 2,
                          prompt_mean=64, output_mean=128, seed=args.seed)
    params = [SamplingParams(temperature=0, max_tokens=s.output_len, ignore_eos=True) for s in specs]
    result = {"requests": args.requests, "output_tokens": sum(s.output_len for s in specs),
              "kv_tokens": args.kv_tokens, "max_model_len": args.max_model_len}
    for name, options in [("continuous", dict(max_num_seqs=args.max_num_seqs)),
                          ("static", dict(scheduler="static"))]:
        llm, threads = _load(args, block_size=16, num_blocks=args.kv_tokens // 16,
                             max_model_len=args.max_model_len, **options)
        prompts = _random_prompts(specs, args.seed, llm.model.config.vocab_size)
        llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)  # warm-up
        seconds, tokens, reports = _serve(llm, prompts, params, desc=name)
        result[name] = {"tokens_per_s": tokens / seconds, "seconds": seconds, "tokens": tokens,
                        "steps": len(reports), "padding_rows": sum(r.padding for r in reports),
                        "mean_batch": sum(len(r.ran) for r in reports) / len(reports),
                        "blas_threads": threads}
        result["device"] = llm.device
        del llm
    result["ratio"] = result["continuous"]["tokens_per_s"] / result["static"]["tokens_per_s"]
    if not args.json:
        print(f"{args.requests} requests, {result['output_tokens']:,} output tokens, KV cache of "
              f"{args.kv_tokens:,} tokens, max_model_len {args.max_model_len}, on {result['device']}")
        for name in ("continuous", "static"):
            r = result[name]
            print(f"  {name:<10} {r['tokens_per_s']:7.1f} tok/s  {r['seconds']:6.1f} s  {r['steps']:5} steps  "
                  f"mean batch {r['mean_batch']:5.1f}  padding rows {r['padding_rows']}")
        print(f"  continuous / static = {result['ratio']:.2f}x  (the vLLM paper: 2-4x over static systems)")
    return result


def _sharing_arguments(parser):
    _serving_arguments(parser)
    parser.set_defaults(requests=16)
    parser.add_argument("--width", type=int, default=4,
                        help="parallel samples n, and beam width (default %(default)s)")


SHARING_ABOVE_THE_PAPER = """\
Why the ShareGPT-like figures can exceed the paper's:
  - fixed-length outputs: every sample and beam runs to its max_tokens (ignore_eos), so all
    of a request's sequences share its prompt's frames until the end; real samples stop early.
  - long prompts: {prompt:.0f} prompt and {output:.0f} output tokens on average in this small
    sample (the paper's ShareGPT: 161 and 338); a prompt's full blocks of {block_size} tokens
    are all shared, only its last, partly filled block is copied on write.
  - a different baseline: here, the frames the same sequences would hold with a private copy
    each, at the same steps, over a few requests run together; the paper measured its serving
    system (OPT-13B on real traces, requests arriving over time)."""


@command("sharing", help="frames saved by fork + copy-on-write: parallel sampling and beam search",
         takes="about 7 min", add_arguments=_sharing_arguments)
def bench_sharing(args) -> dict:
    """Each step, frames in use with sharing vs the frames the same sequences would hold with a
    private copy each (sum of their block tables); saving = 1 - shared / private over the run."""
    from minipaged.bench.workload import make_workload
    from minipaged.sampling import SamplingParams

    llm, threads = _load(args, enable_prefix_caching=False)
    blocks, result = llm.engine.blocks, {}
    workloads = {  # mean prompt / output tokens of the paper's datasets
        "alpaca": make_workload(args.requests, 4, 256, prompt_mean=19, output_mean=58, seed=args.seed),
        "sharegpt": make_workload(args.requests // 2, 8, 512, prompt_mean=161, output_mean=338, seed=args.seed),
    }
    for mode in ("parallel_sampling", "beam_search"):
        result[mode] = {}
        for dataset, specs in workloads.items():
            if mode == "beam_search" and dataset == "sharegpt":
                specs = specs[:max(1, len(specs) // 2)]  # beams of long outputs are slow on a CPU
            params = [SamplingParams(n=args.width, temperature=1.0, seed=i, max_tokens=s.output_len, ignore_eos=True)
                      if mode == "parallel_sampling" else
                      SamplingParams(beam_width=args.width, max_tokens=s.output_len, ignore_eos=True)
                      for i, s in enumerate(specs)]
            shared = private = 0
            for i, (prompt, p) in enumerate(zip(_random_prompts(specs, args.seed, llm.model.config.vocab_size), params)):
                llm.engine.add_request(f"{mode}-{dataset}-{i}", prompt, p)
            total = args.width * sum(s.output_len for s in specs)
            with tqdm(total=total, desc=f"{mode} {dataset}", unit="tok") as bar:
                while llm.engine.has_unfinished_requests():
                    report = llm.engine.step()
                    shared += blocks.device.num_blocks - blocks.num_free_frames
                    private += sum(len(t.frames) for t in blocks.tables.values())
                    bar.update(len(report.ran))
            result[mode][dataset] = {"saving": 1 - shared / private, "requests": len(specs),
                                     "mean_prompt_len": sum(s.prompt_len for s in specs) / len(specs),
                                     "mean_output_len": sum(s.output_len for s in specs) / len(specs)}
        result[mode]["saving"] = result[mode]["sharegpt"]["saving"]
    result["paper"] = {"parallel_sampling": {"alpaca": [0.061, 0.098], "sharegpt": [0.162, 0.305]},
                       "beam_search": {"alpaca": [0.376, 0.552], "sharegpt": [0.443, 0.663]}}
    sharegpt = result["parallel_sampling"]["sharegpt"]
    above_the_paper = SHARING_ABOVE_THE_PAPER.format(prompt=sharegpt["mean_prompt_len"],
                                                     output=sharegpt["mean_output_len"],
                                                     block_size=blocks.block_size)
    result["above_the_paper"] = " ".join(above_the_paper.split())
    result["device"], result["width"], result["blas_threads"] = llm.device, args.width, threads
    if not args.json:
        print(f"frames saved by sharing (n = beam width = {args.width}), {llm.model_name} on {llm.device}")
        above = False
        for mode in ("parallel_sampling", "beam_search"):
            for dataset in workloads:
                low, high = result["paper"][mode][dataset]
                saving = result[mode][dataset]["saving"]
                above |= saving > high
                print(f"  {mode:<18} {dataset:<9} {saving:6.1%}   "
                      f"(paper: {low:.1%}-{high:.1%}, {result[mode][dataset]['requests']} requests)")
        if above:
            print(above_the_paper)
    return result


# the server's benchmark lives beside the server (it starts one and loads it over HTTP)
from minipaged.bench import serve as serve_bench  # noqa: E402

command("serve", help="the OpenAI server under Poisson arrivals: tokens/s, TTFT, TPOT and latency "
        "percentiles, continuous vs static batching, and the in-process engine on the same requests",
        takes="about 6 min", add_arguments=serve_bench.add_arguments)(serve_bench.bench_serve)


# the paper's measurements (issue 13) live in their own module
from minipaged.bench import paper as bench_paper  # noqa: E402

command("fragmentation", help="the paper's Figure 2: KV slots holding tokens, reserved, internal and external "
        "fragmentation, Orca's contiguous allocators vs paging (simulated, real scheduler)",
        takes="about 15 s", add_arguments=bench_paper.fragmentation_arguments)(bench_paper.bench_fragmentation)
command("chunked", help="decode time per output token (p50/p99) while long prompts arrive, with and "
        "without chunked prefill", takes="about 2 min",
        add_arguments=lambda p: (_model_arguments(p), bench_paper.chunked_arguments(p)))(
            lambda args: bench_paper.bench_chunked(args, _load))

from minipaged.bench import latency as bench_latency  # noqa: E402

command("latency", help="the paper's Figure 12 on the real engine: normalized latency against Poisson request "
        "rate, paged vs contiguous-oracle vs static, and the shortest quarter's e2e (--predict: the simulator beside it)",
        takes="about 6 min", add_arguments=lambda p: (_model_arguments(p), bench_latency.latency_arguments(p)))(
            lambda args: bench_latency.bench_latency(args, _load))
command("calibrate", help="fit the simulator's cpu-smollm2 step-time model to timed engine steps",
        takes="about 1 min", add_arguments=lambda p: (_model_arguments(p), bench_latency.calibrate_arguments(p)))(
            lambda args: bench_latency.bench_calibrate(args, _load))


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per registered benchmark, each with --json."""
    parser = argparse.ArgumentParser(prog="python -m minipaged.bench", description=DESCRIPTION,
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="name", required=True, title="benchmarks", metavar="BENCHMARK")
    for name, (fn, add_arguments, help, takes) in COMMANDS.items():
        p = sub.add_parser(name, help=f"{help} ({takes})".replace("%", "%%"),
                           description=f"{help[0].upper()}{help[1:]}. {fn.__doc__ or ''} "
                                       f"With the defaults it takes {takes}.")
        p.add_argument("--json", action="store_true",
                       help="print the result as one JSON document on stdout, instead of the table")
        add_arguments(p)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    fn = COMMANDS[args.name][0]
    try:
        result = fn(args)
    except SystemExit as stop:  # a benchmark that cannot run here says why: as JSON too
        if args.json and isinstance(stop.code, str):
            print(json.dumps({"benchmark": args.name, "error": stop.code}, indent=2))
        raise
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
