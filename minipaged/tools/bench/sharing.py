"""`python -m minipaged.bench sharing`: frames saved by fork + copy-on-write.

Parallel samples and beams of one prompt map the prompt's frames instead of copying
them. Each step, the frames in use are compared with the frames the same sequences would
hold with a private copy each, on workloads with the mean lengths of the paper's
datasets (Alpaca, ShareGPT).
"""

from __future__ import annotations

from tqdm import tqdm

from minipaged.llm import number
from minipaged.tools.bench.common import load, random_prompts, serving_arguments
from minipaged.tools.bench.workload import make_workload

SHARING_ABOVE_THE_PAPER = """\
Why the ShareGPT-like figures can exceed the paper's:
  - fixed-length outputs: every sample and beam runs to its max_tokens (ignore_eos), \
so all
    of a request's sequences share its prompt's frames until the end; \
real samples stop early.
  - long prompts: {prompt:.0f} prompt and {output:.0f} output tokens on average \
in this small
    sample (the paper's ShareGPT: 161 and 338); \
a prompt's full blocks of {block_size} tokens
    are all shared, only its last, partly filled block is copied on write.
  - a different baseline: here, the frames the same sequences would hold \
with a private copy
    each, at the same steps, over a few requests run together; \
the paper measured its serving
    system (OPT-13B on real traces, requests arriving over time)."""


def add_arguments(parser) -> None:
    serving_arguments(parser)
    parser.set_defaults(requests=16)
    parser.add_argument(
        "--width",
        type=number(int, 2),
        default=4,
        help=(
            "parallel samples n, and beam width: at least 2, or nothing is shared "
            "(default %(default)s)"
        ),
    )


def bench_sharing(args) -> dict:
    """Each step, frames in use with sharing vs the frames the same sequences would hold
    with a private copy each (sum of their block tables); saving = 1 - shared / private
    over the run.
    """
    from minipaged.sampling import SamplingParams

    llm, threads = load(args, enable_prefix_caching=False)
    blocks, result = llm.engine.blocks, {}
    workloads = {  # mean prompt / output tokens of the paper's datasets
        "alpaca": make_workload(
            args.requests, 4, 256, prompt_mean=19, output_mean=58, seed=args.seed
        ),
        "sharegpt": make_workload(
            args.requests // 2, 8, 512, prompt_mean=161, output_mean=338, seed=args.seed
        ),
    }
    for mode in ("parallel_sampling", "beam_search"):
        result[mode] = {}
        for dataset, specs in workloads.items():
            if mode == "beam_search" and dataset == "sharegpt":
                # beams of long outputs are slow on a CPU
                specs = specs[: max(1, len(specs) // 2)]
            params = [
                (
                    SamplingParams(
                        n=args.width,
                        temperature=1.0,
                        seed=i,
                        max_tokens=s.output_len,
                        ignore_eos=True,
                    )
                    if mode == "parallel_sampling"
                    else SamplingParams(
                        beam_width=args.width, max_tokens=s.output_len, ignore_eos=True
                    )
                )
                for i, s in enumerate(specs)
            ]
            shared = private = 0
            prompts = random_prompts(specs, args.seed, llm.model.config.vocab_size)
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                llm.engine.add_request(
                    f"{mode}-{dataset}-{i}", {"prompt_token_ids": prompt}, p
                )
            total = args.width * sum(s.output_len for s in specs)
            with tqdm(total=total, desc=f"{mode} {dataset}", unit="tok") as bar:
                while llm.engine.has_unfinished_requests():
                    report = llm.engine.step()
                    shared += blocks.num_frames - blocks.num_free_frames
                    private += blocks.unshared_frames()
                    bar.update(len(report.ran))
            result[mode][dataset] = {
                "saving": 1 - shared / private,
                "requests": len(specs),
                "mean_prompt_len": sum(s.prompt_len for s in specs) / len(specs),
                "mean_output_len": sum(s.output_len for s in specs) / len(specs),
            }
        result[mode]["saving"] = result[mode]["sharegpt"]["saving"]
    result["paper"] = {
        "parallel_sampling": {"alpaca": [0.061, 0.098], "sharegpt": [0.162, 0.305]},
        "beam_search": {"alpaca": [0.376, 0.552], "sharegpt": [0.443, 0.663]},
    }
    sharegpt = result["parallel_sampling"]["sharegpt"]
    above_the_paper = SHARING_ABOVE_THE_PAPER.format(
        prompt=sharegpt["mean_prompt_len"],
        output=sharegpt["mean_output_len"],
        block_size=blocks.block_size,
    )
    result["above_the_paper"] = " ".join(above_the_paper.split())
    result["device"], result["width"], result["blas_threads"] = (
        llm.device,
        args.width,
        threads,
    )
    if not args.json:
        print(
            f"frames saved by sharing (n = beam width = {args.width}), {llm.model_name}"
            f" on {llm.device}"
        )
        above = False
        for mode in ("parallel_sampling", "beam_search"):
            for dataset in workloads:
                low, high = result["paper"][mode][dataset]
                saving = result[mode][dataset]["saving"]
                above |= saving > high
                print(
                    f"  {mode:<18} {dataset:<9} {saving:6.1%}   (paper:"
                    f" {low:.1%}-{high:.1%}, {result[mode][dataset]['requests']}"
                    " requests)"
                )
        if above:
            print(above_the_paper)
    return result
