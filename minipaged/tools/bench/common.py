"""What the benchmarks share: their model and workload options, the model loaded with
BLAS fitted to the idle cores (or an OptionError: why it cannot be), the random prompts
a workload's lengths become, and a chart's output.

Written once here so that every benchmark serves the same prompts on the same seed.
"""

from __future__ import annotations

import os

import numpy as np

from minipaged.llm import number


class OptionError(Exception):
    """Options this benchmark cannot run with, found after parsing (it takes the model
    to know): `python -m minipaged.bench` prints it as the parser's one-line error, exit
    code 2.
    """


def load(args, helpers: bool = False, **options):
    """(LLM, BLAS threads): the model of args.model on args.device, BLAS fitted to the
    idle cores; with `helpers`, on a CPU, the products and the attention split over
    helper processes as a server's are (LLM.use_cores). No such model, no usable GPU,
    engine options the engine refuses, or a max_model_len beyond what the model and the
    KV cache hold (the engine would cap it; the workload would not): an OptionError."""
    from minipaged.llm import LLM
    from minipaged.model.cpu import fit_blas_threads

    try:
        llm = LLM(args.model, device=args.device, **options)
    except (ValueError, RuntimeError, FileNotFoundError) as error:
        raise OptionError(str(error)) from None
    if options.get("max_model_len", 0) > llm.max_model_len:
        raise OptionError(
            f"--max-model-len {options['max_model_len']} is more than this model and KV"
            f" cache hold, {llm.max_model_len} tokens"
        )
    if helpers and llm.device == "cpu":
        return llm, llm.use_cores("fit")[0]
    return llm, fit_blas_threads()


def model_arguments(parser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help=(
            "hub id or local folder (default: SmolLM2-135M-Instruct, offline if"
            " need be)"
        ),
    )
    parser.add_argument(
        "--device",
        default=None,
        choices=["cpu", "cuda"],
        help="where the model runs (default: cuda when usable, else cpu)",
    )


def serving_arguments(parser) -> None:
    """The model options, and a seeded workload of --requests requests."""
    model_arguments(parser)
    parser.add_argument(
        "--requests",
        type=number(int, 1),
        default=32,
        help="requests in the workload (default %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=number(int, 0),
        default=0,
        help="workload seed (default %(default)s)",
    )


def random_prompts(specs, seed: int, vocab: int) -> list[list[int]]:
    """Random token ids (skipping the first ids, where special tokens live), one prompt
    of spec.prompt_len tokens per spec (a workload.RequestSpec)."""
    rng = np.random.default_rng(seed)
    low, high = min(100, vocab // 4), min(10_000, vocab)
    return [rng.integers(low, high, s.prompt_len).tolist() for s in specs]


OUTPUT_FILES = ("svg",)  # options naming a file a benchmark writes (--svg FILE)


def check_output_files(args) -> None:
    """An OptionError, before any work, for an output file (OUTPUT_FILES) that cannot be
    written: its folder does not exist or cannot be written in, or it is a folder."""
    for dest in OUTPUT_FILES:
        path = getattr(args, dest, None)
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        option = f"argument --{dest.replace('_', '-')}"
        if os.path.isdir(path):
            raise OptionError(
                f"{option}: {path!r} is a folder; give a file path, e.g. "
                f"{os.path.join(path, 'figure.' + dest)!r}"
            )
        if not os.path.isdir(folder):
            raise OptionError(
                f"{option}: the folder {folder!r} does not exist (for {path!r}); make"
                " it first or give a path in an existing folder"
            )
        if not os.access(folder, os.W_OK):
            raise OptionError(
                f"{option}: cannot write in the folder {folder!r} (for {path!r}); give"
                " a path in a writable folder"
            )


def blas_threads_env(threads: int) -> dict[str, str]:
    """This process's environment with every BLAS library held to `threads` threads, for
    a server the benchmark starts (OpenBLAS, OpenMP's and MKL's variables alike)."""
    names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    return os.environ | {name: str(threads) for name in names}


def show(args, chart, table: str) -> None:
    """A benchmark's picture and table on stdout (not with --json), and the picture as
    SVG (--svg)."""
    if not args.json:
        print(chart)
        print(table)
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(chart.svg())
