"""`python -m minipaged.bench NAME [--json]`: the command line of every benchmark.

Each benchmark is a function `bench_<name>(args) -> dict` in its own module, registered
below with its options; it prints a human summary itself (unless args.json) and returns
what --json prints. Progress bars go to stderr, so stdout holds only the table or the
JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

from minipaged.llm import CommandParser
from minipaged.tools.bench import (
    decode,
    drum,
    kernel,
    kv_dtype,
    latency,
    memory,
    paper,
    projections,
    race,
    replacement,
    route,
    scheduling,
    serve,
    sharing,
    speculative,
    structured,
    thrashing,
    throughput,
)
from minipaged.tools.bench.common import OptionError, check_output_files

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

Run it inside the project's environment \
(`source .venv/bin/activate` after `make setup`), or
through make: \
make bench-decode, bench-memory, bench-throughput, bench-sharing, bench-serve,
bench-kernel."""

COMMANDS = {  # name -> (function, add_arguments, one-line help, how long it takes)
    "decode": (
        decode.bench_decode,
        decode.add_arguments,
        "decode speed: tokens/s of --batch greedy streams after one prefill",
        "about 5 s (10 s at --batch 16)",
    ),
    "projections": (
        projections.bench_projections,
        projections.add_arguments,
        (
            "a decode step's weight products on the CPU, each way (matrix-vector per"
            " row, BLAS's GEMM, panels on one core and split over the cores) for --rows"
            " rows, in GB/s beside the copy bandwidth: why the engine computes them as"
            " it does"
        ),
        "about 15 s",
    ),
    "memory": (
        memory.bench_memory,
        memory.add_arguments,
        (
            "KV-cache utilization: paging vs reserving max_model_len slots per request"
            " (no model: the block managers alone)"
        ),
        "a few seconds",
    ),
    "kernel": (
        kernel.bench_kernel,
        kernel.add_arguments,
        (
            "paged-attention decode kernels on a GPU: GB/s and % of peak memory"
            " bandwidth per version, next to dense attention (needs a CUDA device)"
        ),
        "under a minute on a GPU; without one it stops at once, saying so",
    ),
    "throughput": (
        throughput.bench_throughput,
        throughput.add_arguments,
        "continuous vs static batching on one mixed-length workload: tokens/s",
        "about 4 min",
    ),
    "sharing": (
        sharing.bench_sharing,
        sharing.add_arguments,
        "frames saved by fork + copy-on-write: parallel sampling and beam search",
        "about 7 min",
    ),
    "serve": (
        serve.bench_serve,
        serve.add_arguments,
        (
            "the OpenAI server under Poisson arrivals: tokens/s, TTFT, TPOT and latency"
            " percentiles, continuous vs static batching, and the in-process engine on"
            " the same requests; --workload room: participants' short-request latency"
            " beside a client flooding the server's defaults, fcfs and fair at each"
            " --room-decode-rows"
        ),
        "about 6 min, 5 min for the room and 90 s more a bound",
    ),
    "fragmentation": (
        paper.bench_fragmentation,
        paper.fragmentation_arguments,
        (
            "the paper's Figure 2: KV slots holding tokens, reserved, internal and"
            " external fragmentation, Orca's contiguous allocators vs paging"
            " (simulated, real scheduler)"
        ),
        "about 15 s",
    ),
    "chunked": (
        paper.bench_chunked,
        paper.chunked_arguments,
        (
            "decode time per output token (p50/p99) while long prompts arrive, with and"
            " without chunked prefill"
        ),
        "about 2 min",
    ),
    "latency": (
        latency.bench_latency,
        latency.latency_arguments,
        (
            "the paper's Figure 12 on the real engine: normalized latency against"
            " Poisson request rate, paged vs contiguous-oracle vs static, and the"
            " shortest quarter's e2e (--predict: the simulator beside it)"
        ),
        "about 6 min",
    ),
    "speculative": (
        speculative.bench_speculative,
        speculative.add_arguments,
        (
            "speculative decoding (n-gram lookup, draft layers) vs plain decoding:"
            " acceptance, tokens per target forward, tokens/s, where lookup fits"
            " (rewriting) and where not (chat)"
        ),
        "about 4 min",
    ),
    "kv-dtype": (
        kv_dtype.bench_kv_dtype,
        kv_dtype.add_arguments,
        (
            "compressed memory: the 8-bit KV cache (kv_cache_dtype int8, fp8) vs full"
            " precision: frames per GiB, greedy agreement per prompt (first"
            " divergence), perplexity change, decode tok/s (--kernel: v7's GB/s on a"
            " GPU)"
        ),
        "about a minute (90 s on a busy machine)",
    ),
    "structured": (
        structured.bench_structured,
        structured.add_arguments,
        (
            "automata: structured output (a JSON schema, any JSON object, a regex, a"
            " choice) on the real model, the share of answers that parse and fit"
            " without and with the automaton's mask, and what the mask costs per step"
            " at batch 1 and 16"
        ),
        "about 2 min",
    ),
    "drum": (
        drum.bench_drum,
        drum.add_arguments,
        (
            "the drum: prefix-cache blocks the KV pool evicts kept in a tier of host"
            " frames (kv_offload_frames) or a file: time to first token of returning"
            " chat turns, with and without it, and the tier's hit rate"
        ),
        "about 3 min",
    ),
    "scheduling": (
        scheduling.bench_scheduling,
        scheduling.add_arguments,
        (
            "the waiting queue's order (fcfs, sjf, aging, priority) when short and long"
            " requests mix: p50/p99 latency of the shortest and longest quarter, the"
            " longest wait; engine and simulator"
        ),
        "about 2 min",
    ),
    "thrashing": (
        thrashing.bench_thrashing,
        thrashing.add_arguments,
        (
            "too many sequences in too little KV memory: goodput, preemptions and"
            " recomputed tokens against max_num_seqs, and working-set admission"
            " untuned; engine and simulator"
        ),
        "about 3 min",
    ),
    "replacement": (
        replacement.bench_replacement,
        replacement.add_arguments,
        (
            "page replacement for the prefix cache: hit rate and prefill tokens saved"
            " against pool size on a multi-turn chat trace, LRU, FIFO, CLOCK and random"
            " beside Belady's MIN, and a search for FIFO's anomaly (no model: the block"
            " managers alone)"
        ),
        "about 10 s",
    ),
    "route": (
        route.bench_route,
        route.add_arguments,
        (
            "replicas behind a router on one machine (vllm-router from PyPI):"
            " prefix-cache hit rate, prompt tokens computed, TTFT of first and later"
            " turns and users per replica, per routing policy, on a conversation"
            " workload"
        ),
        "about 6 min on 2 cores",
    ),
    "race": (
        race.bench_race,
        race.add_arguments,
        (
            "OpenAI-compatible servers (minipaged, vllm serve, ...) one at a time on"
            " the same random workload: output tokens/s, TTFT and TPOT p50/p99 and the"
            " CPU time per output token of each server's process tree, per concurrency"
        ),
        "about 2 min per server and concurrency 16 on 2 cores",
    ),
    "calibrate": (
        latency.bench_calibrate,
        latency.calibrate_arguments,
        "fit the simulator's cpu-smollm2 step-time model to timed engine steps",
        "about 1 min",
    ),
}


def build_parser() -> CommandParser:
    """The command line: one subcommand per registered benchmark, each with --json."""
    parser = CommandParser(
        prog="python -m minipaged.bench",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(
        dest="name", required=True, title="benchmarks", metavar="BENCHMARK"
    )
    for name, (fn, add_arguments, help, takes) in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=f"{help} ({takes})".replace("%", "%%"),
            description=(
                f"{help[0].upper()}{help[1:]}. {fn.__doc__ or ''} "
                f"With the defaults it takes {takes}."
            ),
        )
        p.add_argument(
            "--json",
            action="store_true",
            help=(
                "print the result as one JSON document on stdout, instead of the table"
            ),
        )
        add_arguments(p)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    fn = COMMANDS[args.name][0]
    try:
        # before any work: a file it could not write at the end is refused now
        check_output_files(args)
        result = fn(args)
    except (
        OptionError
    ) as error:  # found after parsing: one line, exit code 2, as the parser's
        CommandParser(prog=f"{parser.prog} {args.name}").error(str(error))
    except SystemExit as stop:  # a benchmark that cannot run here says why: as JSON too
        if args.json and isinstance(stop.code, str):
            print(json.dumps({"benchmark": args.name, "error": stop.code}, indent=2))
        raise
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    return 0
