"""`python -m minipaged.bench decode`: decode speed, tokens/s of a batch of greedy
streams.

One prefill step for every stream, then the decode steps are timed: each gives every
stream one token, so this is the speed a user watches once the answer starts. Beside
each step time, the machine's limit: the weights read at its copy bandwidth, or the
step's work at its GEMM peak.
"""

from __future__ import annotations

import time

from tqdm import tqdm

from minipaged.backend import cdiv
from minipaged.llm import number
from minipaged.tools.bench.common import (
    OptionError,
    load,
    model_arguments,
    random_prompts,
)
from minipaged.tools.bench.workload import RequestSpec


def add_arguments(parser) -> None:
    parser.add_argument(
        "--batch",
        type=number(int, 1),
        nargs="+",
        default=[1],
        help=(
            "streams decoded together; several sizes run one after another, e.g. "
            "--batch 1 2 4 8 16 (default %(default)s)"
        ),
    )
    parser.add_argument(
        "--prompt-len",
        type=number(int, 1),
        default=64,
        help="prompt tokens per stream (default %(default)s)",
    )
    parser.add_argument(
        "--tokens",
        type=number(int, 2),
        default=64,
        help=(
            "tokens generated per stream, the first by the prefill: at least 2, so "
            "one decode step is timed (default %(default)s)"
        ),
    )
    model_arguments(parser)


def bench_decode(args) -> dict:
    """Sends --batch random prompts of --prompt-len tokens, runs one prefill step, then
    times the decode steps until every stream has --tokens tokens; tokens/s counts all
    streams. With several --batch sizes, one such run per size and a list of results."""
    llm, threads = load(args, helpers=True, max_num_seqs=max(64, *args.batch))
    for batch in args.batch:
        check_fits(llm.engine, args, batch)
    limits = machine_limits(llm.model, threads)
    runs = [decode_run(llm, args, batch, threads, limits) for batch in args.batch]
    return runs[0] if len(runs) == 1 else {"runs": runs, "machine": limits}


def decode_run(llm, args, batch: int, threads: int, limits: dict) -> dict:
    """One batch size: prefill, then the timed decode steps, and the limit beside
    them."""
    from minipaged.sampling import SamplingParams

    specs = [RequestSpec(args.prompt_len, args.tokens)] * batch
    prompts = [
        {"prompt_token_ids": ids}
        for ids in random_prompts(specs, 0, llm.model.config.vocab_size)
    ]
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    # warm-up
    llm.generate(
        prompts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False
    )
    for i, prompt in enumerate(prompts):
        llm.engine.add_request(f"decode-{batch}-{i}", prompt, params)
    with tqdm(total=args.tokens, desc=f"decode, batch {batch}", unit="step") as bar:
        start = time.perf_counter()
        llm.engine.step()  # prefill: all prompts, first token each
        prefilled = time.perf_counter()
        bar.update()
        decode_steps = 0
        while llm.engine.has_unfinished_requests():  # one token per stream per step
            llm.engine.step()
            decode_steps += 1
            bar.update()
        end = time.perf_counter()
    step_ms = 1000 * (end - prefilled) / decode_steps
    memory_ms = 1000 * limits["weight_bytes"] / limits["copy_bytes_per_s"]
    compute_ms = 1000 * 2 * limits["weight_params"] * batch / limits["gemm_flops_per_s"]
    result = {
        "batch": batch,
        "prompt_len": args.prompt_len,
        "decode_steps": decode_steps,
        "tokens_per_s": batch * decode_steps / (end - prefilled),
        "step_ms": step_ms,
        "limit_ms": max(memory_ms, compute_ms),
        "memory_limit_ms": memory_ms,
        "compute_limit_ms": compute_ms,
        "prefill_s": prefilled - start,
        "device": llm.device,
        "dtype": str(llm.dtype),
        "model": llm.model_name,
        "blas_threads": threads,
    }
    if not args.json:
        print(
            f"{result['model']} on {result['device']} ({result['dtype']}, {threads}"
            f" cores): batch {batch}, prompt {args.prompt_len} tokens, prefill"
            f" {result['prefill_s']:.2f} s; decode {result['tokens_per_s']:.1f} tok/s"
            f" ({step_ms:.1f} ms/step; limit {result['limit_ms']:.1f} ms: weights at"
            f" {limits['copy_bytes_per_s'] / 1e9:.0f} GB/s {memory_ms:.1f} ms, work at"
            f" {limits['gemm_flops_per_s'] / 1e9:.0f} GFLOP/s {compute_ms:.1f} ms)"
        )
    return result


def machine_limits(model, threads: int) -> dict:
    """What bounds a decode step here: the bytes of the projection weights (read once a
    step, whatever the batch) and their multiply-adds (2 flops per weight per row),
    beside this machine's copy bandwidth (a 256 MB array copied) and GEMM rate (a
    1024-square product in cache), both measured now with `threads` threads. Attention's
    few flops are left out.
    """
    import numpy as np
    from threadpoolctl import threadpool_limits

    weights = [
        w
        for layer in model.layers
        for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)
    ]
    weights.append(model.lm_head)
    params = sum(w.shape[0] * w.shape[1] for w in weights)
    source, target = np.ones(64 << 20, np.float32), np.empty(64 << 20, np.float32)
    a = np.ones((1024, 1024), np.float32)
    with threadpool_limits(limits=threads, user_api="blas"):
        copy_s = best_time(lambda: np.copyto(target, source))
        gemm_s = best_time(lambda: a @ a)
    return {
        "weight_params": params,
        "weight_bytes": params * model.dtype.itemsize,
        "copy_bytes_per_s": 2 * source.nbytes / copy_s,
        "gemm_flops_per_s": 2 * 1024**3 / gemm_s,
        "threads": threads,
    }


def best_time(work, repeats: int = 5) -> float:
    """The fastest of `repeats` timed calls: the machine's capability, not its noise."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def check_fits(engine, args, batch: int) -> None:
    """The streams must all prefill in one step and decode to their last token without
    being preempted, or the steps timed are not what this benchmark says: an OptionError
    otherwise.
    """
    prompts, length = batch * args.prompt_len, args.prompt_len + args.tokens
    frames = batch * cdiv(length, engine.blocks.block_size)
    usable = engine.blocks.num_frames - engine.scheduler.watermark_frames
    if length > engine.max_model_len:
        raise OptionError(
            f"--prompt-len {args.prompt_len} + --tokens {args.tokens} is longer than"
            f" this model's context here, {engine.max_model_len} tokens"
        )
    if prompts > engine.scheduler.config.max_num_batched_tokens:
        raise OptionError(
            f"--batch {batch} prompts of {args.prompt_len} tokens do not fit one"
            f" prefill step ({engine.scheduler.config.max_num_batched_tokens} tokens):"
            " give fewer or shorter"
        )
    if frames > usable:
        raise OptionError(
            f"--batch {batch} streams of {length} tokens need {frames} KV frames; the"
            f" cache has {usable}: give fewer or shorter"
        )
