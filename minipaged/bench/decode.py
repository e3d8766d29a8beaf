"""`python -m minipaged.bench decode`: decode speed, tokens/s of a batch of greedy streams.

One prefill step for every stream, then the decode steps are timed: each gives every stream one
token, so this is the speed a user watches once the answer starts.
"""

from __future__ import annotations

import time

from tqdm import tqdm

from minipaged.backend import cdiv
from minipaged.bench.common import OptionError, load, model_arguments, random_prompts
from minipaged.bench.workload import RequestSpec
from minipaged.llm import number


def add_arguments(parser) -> None:
    parser.add_argument("--batch", type=number(int, 1), default=1, help="streams decoded together (default %(default)s)")
    parser.add_argument("--prompt-len", type=number(int, 1), default=64,
                        help="prompt tokens per stream (default %(default)s)")
    parser.add_argument("--tokens", type=number(int, 2), default=64,
                        help="tokens generated per stream, the first by the prefill: at least 2, so "
                             "one decode step is timed (default %(default)s)")
    model_arguments(parser)


def bench_decode(args) -> dict:
    """Sends --batch random prompts of --prompt-len tokens, runs one prefill step, then times
    the decode steps until every stream has --tokens tokens; tokens/s counts all streams."""
    from minipaged.sampling import SamplingParams

    llm, threads = load(args, max_num_seqs=max(64, args.batch))
    check_fits(llm.engine, args)
    specs = [RequestSpec(args.prompt_len, args.tokens)] * args.batch
    prompts = [{"prompt_token_ids": ids} for ids in random_prompts(specs, 0, llm.model.config.vocab_size)]
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


def check_fits(engine, args) -> None:
    """The streams must all prefill in one step and decode to their last token without being
    preempted, or the steps timed are not what this benchmark says: an OptionError otherwise."""
    prompts, length = args.batch * args.prompt_len, args.prompt_len + args.tokens
    frames = args.batch * cdiv(length, engine.blocks.block_size)
    usable = engine.blocks.num_frames - engine.scheduler.watermark_frames
    if length > engine.max_model_len:
        raise OptionError(f"--prompt-len {args.prompt_len} + --tokens {args.tokens} is longer than this "
                          f"model's context here, {engine.max_model_len} tokens")
    if prompts > engine.scheduler.config.max_num_batched_tokens:
        raise OptionError(f"--batch {args.batch} prompts of {args.prompt_len} tokens do not fit one prefill "
                          f"step ({engine.scheduler.config.max_num_batched_tokens} tokens): give fewer or shorter")
    if frames > usable:
        raise OptionError(f"--batch {args.batch} streams of {length} tokens need {frames} KV frames; the cache "
                          f"has {usable}: give fewer or shorter")
