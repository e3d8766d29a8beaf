"""`python -m minipaged.bench {decode,memory,kernel,throughput,sharing} [--json]`.

Each benchmark is a function `bench_<name>(args) -> dict` registered with @command; it prints
a human summary itself (unless args.json) and returns the dict that --json prints.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

COMMANDS = {}  # name -> (function, add_arguments, help)


def command(name, help, add_arguments=lambda parser: None):
    """Register a benchmark: @command("decode", help=..., add_arguments=...) over bench_decode."""
    def register(fn):
        COMMANDS[name] = (fn, add_arguments, help)
        return fn
    return register


def _decode_arguments(parser):
    parser.add_argument("--batch", type=int, default=1, help="concurrent sequences (default 1)")
    parser.add_argument("--prompt-len", type=int, default=64, help="prompt tokens per sequence")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per sequence")
    parser.add_argument("--model", default=None, help="hub id or folder (default SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default: cuda if usable")


@command("decode", help="decode speed: tokens/s of `batch` greedy streams after one prefill",
         add_arguments=_decode_arguments)
def bench_decode(args) -> dict:
    import time

    from minipaged.engine import LLM
    from minipaged.sampling import SamplingParams

    llm = LLM(args.model, device=args.device)
    rng = np.random.default_rng(0)
    prompts = [{"prompt_token_ids": rng.integers(100, 10_000, args.prompt_len).tolist()}
               for _ in range(args.batch)]
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
    for i, prompt in enumerate(prompts):
        llm.engine.add_request(f"decode-{i}", prompt, params)
    start = time.perf_counter()
    llm.engine.step()                             # prefill: all prompts, first token each
    prefilled = time.perf_counter()
    decode_steps = 0
    while llm.engine.has_unfinished_requests():   # one token per stream per step
        llm.engine.step()
        decode_steps += 1
    end = time.perf_counter()
    result = {"batch": args.batch, "prompt_len": args.prompt_len, "decode_steps": decode_steps,
              "tokens_per_s": args.batch * decode_steps / (end - prefilled),
              "step_ms": 1000 * (end - prefilled) / decode_steps,
              "prefill_s": prefilled - start, "device": llm.device, "dtype": str(llm.dtype),
              "model": llm.model_name}
    if not args.json:
        print(f"{result['model']} on {result['device']} ({result['dtype']}): batch {args.batch}, "
              f"prompt {args.prompt_len} tokens, prefill {result['prefill_s']:.2f} s; "
              f"decode {result['tokens_per_s']:.1f} tok/s ({result['step_ms']:.1f} ms/step)")
    return result


def _memory_arguments(parser):
    parser.add_argument("--requests", type=int, default=1000, help="how many requests (default 1000)")
    parser.add_argument("--block-size", type=int, default=16, help="paged block size (default 16)")
    parser.add_argument("--max-model-len", type=int, default=2048,
                        help="slots the static baseline reserves per request (default 2048)")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="requests running at once (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")


@command("memory", help="KV-cache utilization: paging vs reserving max_model_len slots per request",
         add_arguments=_memory_arguments)
def bench_memory(args) -> dict:
    """The same requests through both allocators, in one pool of max_num_seqs × max_model_len
    slots, so memory never limits admission: the figures compare how memory is used."""
    from minipaged.paging import BlockManager, StaticBlockManager
    from minipaged.paging.workload import make_workload, simulate_memory
    requests = make_workload(args.requests, seed=args.seed)
    num_slots = args.max_num_seqs * args.max_model_len
    paged = BlockManager(num_slots // args.block_size, args.block_size, enable_prefix_caching=False)
    static = StaticBlockManager(num_slots, args.max_model_len)
    result = {"paged": simulate_memory(paged, requests, args.max_num_seqs),
              "static": simulate_memory(static, requests, args.max_num_seqs),
              "utilization_is": "time-averaged over steps: summed token slots / summed allocated slots",
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
                        help="decode kernel versions to time, comma-separated (default all)")
    parser.add_argument("--repeats", type=int, default=20,
                        help="timed runs per version; the median is reported (default 20)")


@command("kernel", help="paged-attention decode kernels on a GPU: GB/s and fraction of peak "
         "memory bandwidth per version, next to dense attention", add_arguments=_kernel_arguments)
def bench_kernel(args) -> list:
    """One row per (shape, version); see minipaged/attention/kernel_bench.py."""
    from minipaged.attention import kernel_bench
    versions = [int(v) for v in args.versions.split(",")]
    return kernel_bench.run(versions=versions, repeats=args.repeats, verbose=not args.json)


def _serving_arguments(parser):
    parser.add_argument("--model", default=None, help="hub id or folder (default SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default: cuda if usable")
    parser.add_argument("--requests", type=int, default=32, help="requests in the workload")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")


def _throughput_arguments(parser):
    _serving_arguments(parser)
    parser.add_argument("--max-model-len", type=int, default=1024,
                        help="context per request; the static baseline reserves this much each")
    parser.add_argument("--kv-tokens", type=int, default=8192,
                        help="KV cache size in tokens, the same for both (static: kv-tokens / max-model-len requests)")
    parser.add_argument("--max-num-seqs", type=int, default=32, help="continuous batching's batch limit")


def _random_prompts(specs, seed: int, vocab: int) -> list[dict]:
    """Random token ids (skipping the first ids, where special tokens live) of the given lengths."""
    rng = np.random.default_rng(seed)
    low, high = min(100, vocab // 4), min(10_000, vocab)
    return [{"prompt_token_ids": rng.integers(low, high, s.prompt_len).tolist()} for s in specs]


def _serve(llm, prompts, params) -> tuple[float, int, list]:
    """Run every request through llm.engine; returns seconds, generated tokens, step reports."""
    import time
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        llm.engine.add_request(f"bench-{i}", prompt, p)
    reports, start = [], time.perf_counter()
    while llm.engine.has_unfinished_requests():
        reports.append(llm.engine.step())
    seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for r in reports for o in r.finished for c in o.outputs)
    return seconds, tokens, reports


@command("throughput", help="continuous vs static batching on one mixed-length workload: tokens/s",
         add_arguments=_throughput_arguments)
def bench_throughput(args) -> dict:
    from minipaged.engine import LLM
    from minipaged.paging.workload import make_workload
    from minipaged.sampling import SamplingParams

    specs = make_workload(args.requests, min_len=8, max_len=args.max_model_len // 2,
                          prompt_mean=64, output_mean=128, seed=args.seed)
    params = [SamplingParams(temperature=0, max_tokens=s.output_len, ignore_eos=True) for s in specs]
    result = {"requests": args.requests, "output_tokens": sum(s.output_len for s in specs),
              "kv_tokens": args.kv_tokens, "max_model_len": args.max_model_len}
    for name, options in [("continuous", dict(max_num_seqs=args.max_num_seqs)),
                          ("static", dict(scheduler="static"))]:
        llm = LLM(args.model, device=args.device, block_size=16, num_blocks=args.kv_tokens // 16,
                  max_model_len=args.max_model_len, **options)
        prompts = _random_prompts(specs, args.seed, llm.model.config.vocab_size)
        llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)  # warm-up
        seconds, tokens, reports = _serve(llm, prompts, params)
        result[name] = {"tokens_per_s": tokens / seconds, "seconds": seconds, "tokens": tokens,
                        "steps": len(reports), "padding_rows": sum(r.padding for r in reports),
                        "mean_batch": sum(len(r.ran) for r in reports) / len(reports)}
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
    parser.add_argument("--width", type=int, default=4, help="parallel samples n, and beam width")


@command("sharing", help="frames saved by fork + copy-on-write: parallel sampling and beam search",
         add_arguments=_sharing_arguments)
def bench_sharing(args) -> dict:
    """Each step, frames in use with sharing vs the frames the same sequences would hold with a
    private copy each (sum of their block tables); saving = 1 - shared / private over the run."""
    from minipaged.engine import LLM
    from minipaged.paging.workload import make_workload
    from minipaged.sampling import SamplingParams

    llm = LLM(args.model, device=args.device, enable_prefix_caching=False)
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
            while llm.engine.has_unfinished_requests():
                llm.engine.step()
                shared += blocks.device.num_blocks - blocks.num_free_frames
                private += sum(len(t.frames) for t in blocks.tables.values())
            result[mode][dataset] = {"saving": 1 - shared / private, "requests": len(specs)}
        result[mode]["saving"] = result[mode]["sharegpt"]["saving"]
    result["paper"] = {"parallel_sampling": {"alpaca": [0.061, 0.098], "sharegpt": [0.162, 0.305]},
                       "beam_search": {"alpaca": [0.376, 0.552], "sharegpt": [0.443, 0.663]}}
    result["device"], result["width"] = llm.device, args.width
    if not args.json:
        print(f"frames saved by sharing (n = beam width = {args.width}), {llm.model_name} on {llm.device}")
        for mode in ("parallel_sampling", "beam_search"):
            for dataset in workloads:
                low, high = result["paper"][mode][dataset]
                print(f"  {mode:<18} {dataset:<9} {result[mode][dataset]['saving']:6.1%}   "
                      f"(paper: {low:.1%}-{high:.1%}, {result[mode][dataset]['requests']} requests)")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minipaged.bench", description=__doc__)
    sub = parser.add_subparsers(dest="name", required=True)
    for name, (fn, add_arguments, help) in COMMANDS.items():
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("--json", action="store_true", help="print the result as one JSON document")
        add_arguments(p)
    args = parser.parse_args(argv)
    fn = COMMANDS[args.name][0]
    result = fn(args)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
