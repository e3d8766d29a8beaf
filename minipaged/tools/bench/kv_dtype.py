"""`python -m minipaged.bench kv-dtype`: compressed memory, the 8-bit KV cache
(kv_cache_dtype).

What 8 bits buy and cost on the real model: frames per GiB per dtype, greedy agreement
with the full-precision cache over varied prompts (first divergence), the perplexity
change over a fixed text, decode tokens/s on this machine; with --kernel on a GPU, v7's
GB/s beside v5's.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
from tqdm import tqdm

from minipaged.llm import number
from minipaged.model.cpu import held_cores
from minipaged.paging import KV_CACHE_DTYPES, num_blocks_for_memory
from minipaged.tools.bench.common import (
    OptionError,
    load,
    model_arguments,
    random_prompts,
)
from minipaged.tools.bench.workload import RequestSpec
from minipaged.tools.viz import BarChart

# varied on purpose: facts, code, lists, arithmetic, a story, translation, advice
PROMPTS = (
    "What is the capital of France, and what river runs through it?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List five fruits that are red.",
    "What is 17 times 23? Show your steps.",
    "Tell me a short story about a lighthouse keeper and a cat.",
    "Translate 'Good morning, how are you?' into Spanish and German.",
    "Explain what a page table does in an operating system.",
    "Give me three tips for sleeping better.",
    "Why is the sky blue? Answer in two sentences.",
    "Write a haiku about autumn rain.",
)
TEXT = (
    "The Atlas computer, built at the University of Manchester and switched on in 1962,"
    " was the first machine with virtual memory. Its one-level store let a program"
    " address more words than the core memory held: pages that were not in core waited"
    " on a magnetic drum, and the hardware looked up every address in a table of page"
    " frames. When a program touched a page that was not present, the supervisor"
    " fetched it from the drum and chose a page to send back, guessing from the recent"
    " pattern of use which one would not be needed soon. Forty years later, the same"
    " ideas decide how a language model server keeps the keys and values of many"
    " conversations in the memory of one accelerator, and how many of them it can hold"
    " at once."
)
BYTES_PER_GIB = 2**30


def add_arguments(parser) -> None:
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=["int8", "fp8"],
        choices=[d for d in KV_CACHE_DTYPES if d != "auto"],
        help="8-bit kv_cache_dtype values compared with 'auto' (default %(default)s)",
    )
    parser.add_argument(
        "--prompts",
        type=number(int, 1, len(PROMPTS)),
        default=len(PROMPTS),
        help=(
            f"chat prompts for greedy agreement, of the {len(PROMPTS)} built in"
            " (default %(default)s)"
        ),
    )
    parser.add_argument(
        "--max-tokens",
        type=number(int, 1),
        default=48,
        help="greedy tokens per prompt (default %(default)s)",
    )
    parser.add_argument(
        "--batch",
        type=number(int, 1),
        default=8,
        help="streams of the decode speed run (default %(default)s)",
    )
    parser.add_argument(
        "--decode-tokens",
        type=number(int, 2),
        default=32,
        help="tokens per stream in the decode speed run (default %(default)s)",
    )
    parser.add_argument(
        "--svg",
        default=None,
        help=(
            "also write the frames 1 GiB holds per storage (a bar chart) to this SVG"
            " file"
        ),
    )
    parser.add_argument(
        "--kernel",
        action="store_true",
        help=(
            "on a GPU only: time decode v7 (int8) beside v5 (fp16), GB/s and %% of peak"
        ),
    )
    model_arguments(parser)


def frames_per_gib(config, block_size: int = 16) -> list[dict]:
    """For each storage: frames and tokens in 1 GiB, their ratio to float32 and float16,
    and how many 2048-token contexts fit in the CPU's default 512 MiB."""
    sizes = (config.num_layers, config.num_kv_heads, config.head_dim, block_size)
    rows = []
    for name, dtype in (
        ("float32", "float32"),
        ("float16", "float16"),
        ("int8", "int8"),
        ("fp8", "uint8"),
    ):
        frames = num_blocks_for_memory(BYTES_PER_GIB, *sizes, dtype)
        rows.append(
            {
                "kv_cache_dtype": name,
                "frames_per_gib": int(frames),
                "tokens_per_gib": int(frames * block_size),
                "contexts_of_2048_in_512_mib": int(frames // 2 * block_size // 2048),
            }
        )  # the CPU default
    for row in rows:
        row["vs_float32"] = row["frames_per_gib"] / rows[0]["frames_per_gib"]
        row["vs_float16"] = row["frames_per_gib"] / rows[1]["frames_per_gib"]
    return rows


def frames_chart(rows: list[dict], model: str) -> BarChart:
    """The frames 1 GiB of KV memory holds, per storage (frames_per_gib's rows): the
    meeting's figure."""
    return BarChart(
        f"frames in 1 GiB of KV memory, {model} (block_size 16)",
        [r["kv_cache_dtype"] for r in rows],
        {"frames": [r["frames_per_gib"] for r in rows]},
        unit=" frames",
        digits=0,
    )


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (a shorter one differs at its
    end), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def greedy_tokens(engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from minipaged.sampling import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    for i, ids in enumerate(prompts):
        engine.add_request(f"g{i}", {"prompt_token_ids": ids}, params)
    done = {}
    while engine.has_unfinished_requests():
        done.update(
            {o.request_id: o.outputs[0].token_ids for o in engine.step().finished}
        )
    return [done[f"g{i}"] for i in range(len(prompts))]


def perplexity(engine, ids: list[int]) -> float:
    """exp(mean negative log-likelihood) of each token of `ids` after the first,
    teacher-forced: one prefill whose queries read the cache as this engine stores it
    (prompt_logprobs).
    """
    from minipaged.sampling import SamplingParams

    engine.add_request(
        "ppl",
        {"prompt_token_ids": ids},
        SamplingParams(max_tokens=1, prompt_logprobs=0),
    )
    while engine.has_unfinished_requests():
        for out in engine.step().finished:
            logprobs = [
                entry[token].logprob
                for entry, token in zip(out.prompt_logprobs[1:], ids[1:])
            ]
    return float(math.exp(-np.mean(logprobs)))


def decode_speed(engine, vocab: int, batch: int, tokens: int) -> float:
    """Tokens/s of `batch` greedy streams after their prefill step (prompts of 64 random
    ids)."""
    from minipaged.sampling import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    prompts = random_prompts([RequestSpec(64, tokens)] * batch, 0, vocab)
    for i, ids in enumerate(prompts):
        engine.add_request(f"d{i}", {"prompt_token_ids": ids}, params)
    engine.step()  # the prefill, not timed
    start, steps = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return batch * steps / (time.perf_counter() - start)


def load_with_panels(args):
    """load(args) with a CPU's weights as panels whatever a timing says
    (MINIPAGED_CPU_PANELS=1; one set by the user is kept): the timing decides between
    panels and BLAS's GEMM, which round differently, and on a busy machine it goes
    either way, so the answers would too."""
    before = os.environ.get("MINIPAGED_CPU_PANELS")
    os.environ["MINIPAGED_CPU_PANELS"] = before or "1"
    try:
        return load(args)
    finally:
        if before is None:
            del os.environ["MINIPAGED_CPU_PANELS"]


def bench_kv_dtype(args) -> dict:
    """Frames per GiB (no model needed), then on the model: per dtype, greedy agreement
    with 'auto' per prompt, the fixed text's perplexity, and decode tokens/s."""
    if args.kernel:
        return kernel_lines(verbose=not args.json)
    llm, threads = load_with_panels(args)
    report = {
        "model": llm.model_name,
        "device": llm.device,
        "model_dtype": str(llm.model.dtype),
        "blas_threads": threads,
        "answers_blas_threads": 1,
        "frames": frames_per_gib(llm.model.config),
    }
    prompts = [
        llm.tokenizer.encode_chat([{"role": "user", "content": p}])
        for p in PROMPTS[: args.prompts]
    ]
    text = llm.tokenizer.encode(TEXT)
    runs = {}
    dtypes = ["auto", *args.dtypes]
    bar = tqdm(total=3 * len(dtypes), desc="kv-dtype", unit="run", disable=args.json)
    for dtype in dtypes:
        options = {"kv_cache_dtype": dtype, "num_blocks": 512}
        # one BLAS thread: the same answers and perplexity from run to run (held_cores
        # says why); the speed run follows the machine's load, as serving does
        with held_cores(1):
            bar.set_postfix_str(f"{dtype}: greedy answers")
            tokens = greedy_tokens(llm.new_engine(**options), prompts, args.max_tokens)
            bar.update()
            bar.set_postfix_str(f"{dtype}: perplexity")
            text_perplexity = perplexity(llm.new_engine(**options), text)
            bar.update()
        bar.set_postfix_str(f"{dtype}: decode speed")
        speed = decode_speed(
            llm.new_engine(**options),
            llm.model.config.vocab_size,
            args.batch,
            args.decode_tokens,
        )
        bar.update()
        runs[dtype] = {
            "tokens": tokens,
            "perplexity": text_perplexity,
            "decode_tokens_per_s": speed,
        }
    bar.close()
    full = runs["auto"]
    report["runs"] = [
        {
            "kv_cache_dtype": dtype,
            "perplexity": run["perplexity"],
            "perplexity_change": run["perplexity"] / full["perplexity"] - 1,
            "decode_tokens_per_s": run["decode_tokens_per_s"],
            "first_divergence": [
                first_divergence(a, b) for a, b in zip(full["tokens"], run["tokens"])
            ],
            "identical": sum(a == b for a, b in zip(full["tokens"], run["tokens"])),
            "prompts": len(prompts),
            "max_tokens": args.max_tokens,
            "text_tokens": len(text),
        }
        for dtype, run in runs.items()
    ]
    if not args.json:
        print_report(report)
    # depends on the model's shape only: any --prompts / --max-tokens draw the same
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(frames_chart(report["frames"], llm.model_name.split("/")[-1]).svg())
    return report


def print_report(report: dict) -> None:
    print(
        f"{report['model']} on {report['device']} ({report['model_dtype']} weights)\n"
    )
    print(
        f"{'storage':<10} {'frames/GiB':>11} {'tokens/GiB':>11} {'vs fp32':>8}"
        f" {'vs fp16':>8} {'2048-token contexts in 512 MiB':>31}"
    )
    for r in report["frames"]:
        print(
            f"{r['kv_cache_dtype']:<10} {r['frames_per_gib']:>11,}"
            f" {r['tokens_per_gib']:>11,} {r['vs_float32']:>7.2f}x"
            f" {r['vs_float16']:>7.2f}x {r['contexts_of_2048_in_512_mib']:>31}"
        )
    print(
        f"\n{'kv_cache_dtype':<15} {'same greedy':>11} {'perplexity':>11} {'change':>8}"
        f" {'decode tok/s':>13}  first divergence per prompt"
    )
    for r in report["runs"]:
        where = " ".join("=" if d is None else str(d) for d in r["first_divergence"])
        print(
            f"{r['kv_cache_dtype']:<15} {r['identical']:>5}/{r['prompts']:<5}"
            f" {r['perplexity']:>11.3f} {100 * r['perplexity_change']:>+7.2f}%"
            f" {r['decode_tokens_per_s']:>13.1f}  {where}"
        )


def kernel_lines(verbose: bool = True) -> dict:
    """On a GPU: decode v5 over an fp16 cache and v7 over the same K/V coded in int8, on
    two shapes; bytes moved / seconds, and the fraction of peak bandwidth. Each is first
    checked against the NumPy reference on a slice of the batch (llm.c's habit)."""
    from minipaged.backend import cuda_available

    if not cuda_available():
        raise OptionError(
            "--kernel needs a CUDA device (and CuPy); on a CPU, v7 runs for correctness"
            " through minipaged.attention.emulated: pytest tests/test_kv_dtype.py"
        )
    import cupy as xp

    from minipaged.attention import cuda, reference
    from minipaged.tools.bench.kernel import describe_device, seconds_per_call

    device, rows = describe_device(), []
    for num_seqs, context, heads, kv_heads, head_dim in (
        (64, 1024, 9, 3, 64),
        (32, 2048, 32, 8, 128),
    ):
        pages, block_size = math.ceil(context / 16), 16
        shape = (num_seqs * pages, block_size, kv_heads, head_dim)
        rng = np.random.default_rng(0)
        k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(2))
        q = rng.standard_normal((num_seqs, heads, head_dim), dtype=np.float32).astype(
            np.float16
        )
        tables = (
            rng.permutation(num_seqs * pages).astype(np.int32).reshape(num_seqs, pages)
        )
        lens = np.full(num_seqs, context, np.int32)
        codes = [np.zeros(shape, np.int8) for _ in range(2)]
        scales = [np.zeros(shape[:3], np.float16) for _ in range(2)]
        slots = np.arange(shape[0] * block_size)
        reference.write_kv(
            k.reshape(-1, kv_heads, head_dim),
            v.reshape(-1, kv_heads, head_dim),
            *codes,
            slots,
            *scales,
        )
        expected = reference.decode(
            q[:2],
            *codes,
            tables[:2],
            lens[:2],
            1 / math.sqrt(head_dim),
            k_scales=scales[0],
            v_scales=scales[1],
        )
        d = [
            xp.asarray(a)
            for a in (
                q,
                k.astype(np.float16),
                v.astype(np.float16),
                tables,
                lens,
                *codes,
                *scales,
            )
        ]
        scale = 1 / math.sqrt(head_dim)
        calls = {
            "v5 fp16": (
                lambda d=d, scale=scale: cuda.decode(
                    d[0], d[1], d[2], d[3], d[4], scale, version=5
                ),
                2 * k.size * 2,  # K and V, 2 bytes each
            ),
            "v7 int8": (
                lambda d=d, scale=scale: cuda.decode(
                    d[0], d[5], d[6], d[3], d[4], scale, k_scales=d[7], v_scales=d[8]
                ),
                2 * k.size + 2 * scales[0].size * 2,  # 1 byte each, and the scales
            ),
        }
        error = float(
            np.abs(
                xp.asnumpy(calls["v7 int8"][0]())[:2].astype(np.float32)
                - expected.astype(np.float32)
            ).max()
        )
        for name, (call, moved) in calls.items():
            seconds = seconds_per_call([call], repeats=10)
            rows.append(
                {
                    "shape": f"{num_seqs}x{context} h{heads}/{kv_heads} d{head_dim}",
                    "version": name,
                    "seconds": seconds,
                    "gbps": moved / seconds / 1e9,
                    "peak_fraction": moved / seconds / 1e9 / device["peak_gbps"],
                    "tokens_per_s": num_seqs / seconds,
                    "max_abs_error_vs_reference": error,
                }
            )
            if verbose:
                r = rows[-1]
                print(
                    f"{r['shape']:<24} {name:<8} {seconds * 1e6:8.1f} us"
                    f" {r['gbps']:7.0f} GB/s {100 * r['peak_fraction']:5.1f}% of peak"
                )
    return {"device": device, "rows": rows}
