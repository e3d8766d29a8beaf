"""`python -m minipaged.bench serve`: the server under load, continuous vs static batching.

Starts `python -m minipaged.serve` in a process of its own, streams a mixed workload to it with
Poisson arrivals through the official async `openai` client, and measures what vLLM's
benchmark_serving measures; then the same requests through an engine in-process.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time

import numpy as np

from minipaged.bench.common import load, random_prompts, serving_arguments
from minipaged.bench.workload import make_workload
from minipaged.llm import number


def add_arguments(parser) -> None:
    serving_arguments(parser)  # --model --device --requests --seed
    parser.set_defaults(requests=32)
    parser.add_argument("--request-rate", type=number(float, above=0, infinity=True), default=8.0,
                        help="mean arrivals per second, Poisson (default %(default)s; inf: all at once)")
    parser.add_argument("--max-model-len", type=number(int, 16), default=1024, help="(default %(default)s)")
    parser.add_argument("--kv-tokens", type=number(int, 16), default=8192,
                        help="KV cache in tokens, the same for every run (default %(default)s)")
    parser.add_argument("--max-num-seqs", type=number(int, 1), default=32, help="(default %(default)s)")
    parser.add_argument("--blas-threads", type=number(int, 1), default=1,
                        help="BLAS threads of the server and of the in-process engine; leave a core "
                             "to the HTTP side and the clients (default %(default)s)")
    parser.add_argument("--scheduler", choices=["continuous", "static", "both"], default="both",
                        help="which batching the server runs (default %(default)s)")


def workload(args, vocab: int):
    """(prompts as token ids, max_tokens of each, arrival offsets in seconds): the throughput
    benchmark's lengths, arrivals drawn from a Poisson process at args.request_rate."""
    specs = make_workload(args.requests, min_len=8, max_len=args.max_model_len // 2,
                          prompt_mean=64, output_mean=128, seed=args.seed)
    prompts = random_prompts(specs, args.seed, vocab)
    rng = np.random.default_rng(args.seed + 1)
    gaps = rng.exponential(1 / args.request_rate, len(specs)) if np.isfinite(args.request_rate) else np.zeros(len(specs))
    return prompts, [s.output_len for s in specs], np.cumsum(gaps) - gaps[0]


def start_server(args, folder, scheduler: str) -> tuple[subprocess.Popen, str]:
    """The server in its own process (as a lecturer runs it); returns it and its URL."""
    threads = str(args.blas_threads)
    env = os.environ | {"OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    command = [sys.executable, "-m", "minipaged.serve", "--model", str(folder), "--port", "0",
               "--served-model-name", "bench", "--block-size", "16", "--num-blocks", str(args.kv_tokens // 16),
               "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
               "--scheduler", scheduler, "--max-waiting", str(args.requests)]
    if args.device:
        command += ["--device", args.device]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    while not any("API" in line for line in lines):
        lines.append(process.stdout.readline())
        if process.poll() is not None:
            raise RuntimeError("the server did not start:\n" + "".join(lines))
    return process, re.search(r"(http://127\.0\.0\.1:\d+)", "".join(lines))[1]


async def send_all(url: str, prompts, max_tokens, arrivals) -> dict:
    """Every request streamed at its arrival time; per request: ttft, e2e, tpot, tokens."""
    import httpx
    import openai
    results = [None] * len(prompts)

    async def one(client, i):
        await asyncio.sleep(arrivals[i])
        start = time.perf_counter()
        first, tokens = None, 0
        stream = await client.completions.create(
            model="bench", prompt=prompts[i], max_tokens=max_tokens[i], temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].text:
                first = time.perf_counter()
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        end = time.perf_counter()
        first = first or end
        results[i] = {"ttft": first - start, "e2e": end - start, "tokens": tokens,
                      "tpot": (end - first) / max(1, tokens - 1), "end": end}

    limits = httpx.Limits(max_connections=len(prompts) + 8)
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=3600,
                                  http_client=openai.DefaultAsyncHttpxClient(limits=limits)) as client:
        start = time.perf_counter()
        await asyncio.gather(*(one(client, i) for i in range(len(prompts))))
    return summarize(results, time.perf_counter() - start)


def summarize(results: list[dict], seconds: float) -> dict:
    def pct(key, q, rows=results):
        return float(np.percentile([r[key] for r in rows], q))
    tokens = sum(r["tokens"] for r in results)
    shortest = sorted(results, key=lambda r: r["tokens"])[:max(1, len(results) // 4)]
    summary = {"tokens_per_s": tokens / seconds, "seconds": seconds, "tokens": tokens,
               "short_e2e_p50": pct("e2e", 50, shortest)}
    for key in ("ttft", "tpot", "e2e"):
        summary |= {f"{key}_p{q}": pct(key, q) for q in (50, 90, 99)}
    return summary


def warm_up(url: str) -> None:
    import httpx
    httpx.post(f"{url}/v1/completions", json={"prompt": [100, 200, 300], "max_tokens": 2}, timeout=600)


def engine_tokens_per_s(engine, prompts, max_tokens, arrivals) -> float:
    """The workload without HTTP: each request added to the engine at its arrival time."""
    from minipaged.sampling import SamplingParams
    pending, tokens, start = list(range(len(prompts))), 0, time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and arrivals[pending[0]] <= time.perf_counter() - start:
            i = pending.pop(0)
            engine.add_request(f"bench-{i}", {"prompt_token_ids": prompts[i]},
                               SamplingParams(temperature=0, max_tokens=max_tokens[i], ignore_eos=True))
        if engine.has_unfinished_requests():
            tokens += sum(len(c.token_ids) for o in engine.step().finished for c in o.outputs)
        else:
            time.sleep(0.001)
    return tokens / (time.perf_counter() - start)


def bench_serve(args) -> dict:
    """The server runs in a process of its own; the clients stream every request and time it.
    Reported per batching: tokens/s, TTFT, TPOT and end-to-end latency (p50/p90/p99), and the
    median e2e of the quarter of requests with the fewest output tokens; then the tokens/s of
    an in-process engine given the same requests at the same moments."""
    from threadpoolctl import threadpool_limits

    from minipaged.sampling import SamplingParams

    schedulers = ["continuous", "static"] if args.scheduler == "both" else [args.scheduler]
    engine_options = dict(block_size=16, num_blocks=args.kv_tokens // 16, max_model_len=args.max_model_len,
                          max_num_seqs=args.max_num_seqs, scheduler=schedulers[0])
    with threadpool_limits(limits=args.blas_threads, user_api="blas"):
        llm = load(args, **engine_options)[0]
    folder = llm.folder
    prompts, max_tokens, arrivals = workload(args, llm.model.config.vocab_size)
    result = {"requests": args.requests, "request_rate": args.request_rate, "kv_tokens": args.kv_tokens,
              "max_model_len": args.max_model_len, "max_num_seqs": args.max_num_seqs,
              "output_tokens": sum(max_tokens), "blas_threads": args.blas_threads, "device": llm.device}
    for scheduler in schedulers:
        process, url = start_server(args, folder, scheduler)
        try:
            warm_up(url)
            print(f"serve: {scheduler} batching, {args.requests} requests at {args.request_rate}/s ...",
                  file=sys.stderr, flush=True)
            result[scheduler] = asyncio.run(send_all(url, prompts, max_tokens, arrivals))
        finally:
            process.terminate()
            process.wait(timeout=30)
        if scheduler == schedulers[0]:  # right after its server run: the machine's load is alike
            print(f"serve: the same requests at the same moments, through a {scheduler} engine in-process ...",
                  file=sys.stderr, flush=True)
            with threadpool_limits(limits=args.blas_threads, user_api="blas"):
                llm.generate([{"prompt_token_ids": [100, 200, 300]}], SamplingParams(max_tokens=2), use_tqdm=False)
                result["engine_tokens_per_s"] = engine_tokens_per_s(llm.engine, prompts, max_tokens, arrivals)
            result["server_vs_engine"] = result[scheduler]["tokens_per_s"] / result["engine_tokens_per_s"]
    if "static" in result and "continuous" in result:
        result["continuous_vs_static"] = result["continuous"]["tokens_per_s"] / result["static"]["tokens_per_s"]
        result["short_e2e_static_vs_continuous"] = (result["static"]["short_e2e_p50"]
                                                    / result["continuous"]["short_e2e_p50"])
    if not args.json:
        print(table(result))
    return result


def table(result: dict) -> str:
    lines = [f"{result['requests']} requests ({result['output_tokens']:,} output tokens) at "
             f"{result['request_rate']}/s through the server, on {result['device']}",
             f"  {'':<11}{'tok/s':>8}{'ttft p50':>10}{'p99':>8}{'tpot p50':>10}{'e2e p50':>9}{'p99':>8}"
             f"{'short e2e p50':>15}"]
    for name in ("continuous", "static"):
        if name in result:
            r = result[name]
            lines.append(f"  {name:<11}{r['tokens_per_s']:8.1f}{r['ttft_p50']:9.2f}s{r['ttft_p99']:7.2f}s"
                         f"{1000 * r['tpot_p50']:8.0f}ms{r['e2e_p50']:8.1f}s{r['e2e_p99']:7.1f}s"
                         f"{r['short_e2e_p50']:14.1f}s")
    lines.append(f"  in-process engine, same requests at the same moments: {result['engine_tokens_per_s']:.1f} tok/s")
    if "server_vs_engine" in result:
        lines.append(f"  server / engine throughput = {result['server_vs_engine']:.2f}")
    if "continuous_vs_static" in result:
        lines.append(f"  continuous / static throughput = {result['continuous_vs_static']:.2f}x; "
                     f"shortest quarter's median e2e, static / continuous = "
                     f"{result['short_e2e_static_vs_continuous']:.1f}x")
    return "\n".join(lines)
