"""`python -m minipaged.bench throughput`: continuous vs static batching, tokens/s.

One mixed-length workload (random prompts, lengths drawn like chat traffic) through both
kinds of batching on KV caches of the same size: static batching runs a batch until its
longest request ends, continuous batching re-forms the batch at every step.
"""

from __future__ import annotations

import time

from tqdm import tqdm

from minipaged.llm import number
from minipaged.tools.bench.common import load, random_prompts, serving_arguments
from minipaged.tools.bench.workload import make_workload


def add_arguments(parser) -> None:
    serving_arguments(parser)
    parser.add_argument(
        "--max-model-len",
        type=number(int, 16),
        default=1024,
        help=(
            "context per request; the static baseline reserves this much each "
            "(default %(default)s)"
        ),
    )
    parser.add_argument(
        "--kv-tokens",
        type=number(int, 16),
        default=8192,
        help=(
            "KV cache size in tokens, the same for both; static runs "
            "kv-tokens / max-model-len requests at once (default %(default)s)"
        ),
    )
    parser.add_argument(
        "--max-num-seqs",
        type=number(int, 1),
        default=32,
        help="continuous batching's batch limit (default %(default)s)",
    )


def bench_throughput(args) -> dict:
    """The same requests (random prompts, lengths drawn like chat traffic) through
    continuous batching and through static batching (a batch runs until its longest
    request ends), on KV
    caches of the same size; tokens/s of generated tokens, and their ratio."""
    from minipaged.sampling import SamplingParams

    specs = make_workload(
        args.requests,
        min_len=8,
        max_len=args.max_model_len // 2,
        prompt_mean=64,
        output_mean=128,
        seed=args.seed,
    )
    params = [
        SamplingParams(temperature=0, max_tokens=s.output_len, ignore_eos=True)
        for s in specs
    ]
    result = {
        "requests": args.requests,
        "output_tokens": sum(s.output_len for s in specs),
        "kv_tokens": args.kv_tokens,
        "max_model_len": args.max_model_len,
    }
    for name, options in [
        ("continuous", dict(max_num_seqs=args.max_num_seqs)),
        ("static", dict(scheduler="static")),
    ]:
        llm, threads = load(
            args,
            block_size=16,
            num_blocks=args.kv_tokens // 16,
            max_model_len=args.max_model_len,
            **options,
        )
        prompts = [
            {"prompt_token_ids": ids}
            for ids in random_prompts(specs, args.seed, llm.model.config.vocab_size)
        ]
        # warm-up
        llm.generate(
            prompts[:2], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False
        )
        seconds, tokens, reports = serve(llm, prompts, params, desc=name)
        result[name] = {
            "tokens_per_s": tokens / seconds,
            "seconds": seconds,
            "tokens": tokens,
            "steps": len(reports),
            "padding_rows": sum(r.padding for r in reports),
            "mean_batch": sum(len(r.ran) for r in reports) / len(reports),
            "blas_threads": threads,
        }
        result["device"] = llm.device
        del llm
    result["ratio"] = (
        result["continuous"]["tokens_per_s"] / result["static"]["tokens_per_s"]
    )
    if not args.json:
        print(
            f"{args.requests} requests, {result['output_tokens']:,} output tokens, KV"
            f" cache of {args.kv_tokens:,} tokens, max_model_len {args.max_model_len},"
            f" on {result['device']}"
        )
        for name in ("continuous", "static"):
            r = result[name]
            print(
                f"  {name:<10} {r['tokens_per_s']:7.1f} tok/s  {r['seconds']:6.1f} s "
                f" {r['steps']:5} steps  mean batch {r['mean_batch']:5.1f}  padding"
                f" rows {r['padding_rows']}"
            )
        print(
            f"  continuous / static = {result['ratio']:.2f}x  (the vLLM paper: 2-4x"
            " over static systems)"
        )
    return result


def serve(llm, prompts, params, desc: str) -> tuple[float, int, list]:
    """Run every request through llm.engine; returns seconds, generated tokens, step
    reports. The progress bar counts the rows that got a token (static batching's
    padding rows do not).
    """
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        llm.engine.add_request(f"bench-{i}", prompt, p)
    reports = []
    with tqdm(total=sum(p.max_tokens for p in params), desc=desc, unit="tok") as bar:
        start = time.perf_counter()
        while llm.engine.has_unfinished_requests():
            reports.append(llm.engine.step())
            bar.update(len(reports[-1].ran) - reports[-1].padding)
        seconds = time.perf_counter() - start
    tokens = sum(
        len(c.token_ids) for r in reports for o in r.finished for c in o.outputs
    )
    return seconds, tokens, reports
