"""What the benchmarks share: their model and workload options, the model loaded with BLAS
fitted to the idle cores, the random prompts a workload's lengths become, and a chart's output.

Written once here so that every benchmark serves the same prompts on the same seed.
"""

from __future__ import annotations

import numpy as np


def load(args, **options):
    """(LLM, BLAS threads): the model of args.model on args.device, BLAS fitted to the idle cores."""
    from minipaged.backend import fit_blas_threads
    from minipaged.llm import LLM
    llm = LLM(args.model, device=args.device, **options)
    return llm, fit_blas_threads()


def model_arguments(parser) -> None:
    parser.add_argument("--model", default=None,
                        help="hub id or local folder (default: SmolLM2-135M-Instruct, offline if need be)")
    parser.add_argument("--device", default=None, choices=["cpu", "cuda"],
                        help="where the model runs (default: cuda when usable, else cpu)")


def serving_arguments(parser) -> None:
    """The model options, and a seeded workload of --requests requests."""
    model_arguments(parser)
    parser.add_argument("--requests", type=int, default=32, help="requests in the workload (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default %(default)s)")


def random_prompts(specs, seed: int, vocab: int) -> list[list[int]]:
    """Random token ids (skipping the first ids, where special tokens live), one prompt of
    spec.prompt_len tokens per spec (a workload.RequestSpec)."""
    rng = np.random.default_rng(seed)
    low, high = min(100, vocab // 4), min(10_000, vocab)
    return [rng.integers(low, high, s.prompt_len).tolist() for s in specs]


def show(args, chart, table: str) -> None:
    """A benchmark's picture and table on stdout (not with --json), and the picture as SVG (--svg)."""
    if not args.json:
        print(chart)
        print(table)
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(chart.svg())
