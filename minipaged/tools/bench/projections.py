"""`python -m minipaged.bench projections`: one decode step's weight products, each way
a CPU can compute them (matrix-vector per row, BLAS's GEMM, panels on one core or split
over the cores), for a few row counts, in GB/s beside the copy bandwidth: the evidence
behind `minipaged.model.cpu.projection_path`, and what a split's hand-off to a second
thread costs.
"""

from __future__ import annotations

import os
import time

import numpy as np
from tqdm import tqdm

from minipaged.llm import number
from minipaged.tools.bench.common import OptionError, load, model_arguments
from minipaged.tools.bench.decode import best_time, machine_limits

WAYS = {  # name -> what it is, for the table's footnote
    "matrix-vector per row": (
        "BLAS's matrix-vector code once per row, each reading the whole weight"
    ),
    "blas gemm": (
        "x @ w on the (in, out) matrix: BLAS chooses (its matrix-vector code for one"
        " row)"
    ),
    "panels, one core": (
        "the (out, in) layout as panels of PANEL rows, OpenBLAS's small products, one"
        " thread"
    ),
    "panels, split": (
        "the same panels split over the free cores, half handed to a helper thread"
    ),
    "panels, helper processes": (
        "the same panels, each core's columns computed by a helper process over shared"
        " weights (one row: BLAS's matrix-vector code on each core's columns;"
        " model/team.py; a server's way on Linux x86-64)"
    ),
    "gemm, helper processes": (
        "one GEMM per core on its share of the rows, in the helper processes"
    ),
}


def add_arguments(parser) -> None:
    parser.add_argument(
        "--rows",
        type=number(int, 1),
        nargs="+",
        default=[1, 2, 4, 8, 16],
        help=(
            "rows of x (sequences in a decode step), one measurement each "
            "(default %(default)s)"
        ),
    )
    parser.add_argument(
        "--repeats",
        type=number(int, 1),
        default=5,
        help=(
            "timed passes over the step's products per way; the fastest counts "
            "(default %(default)s)"
        ),
    )
    model_arguments(parser)


def bench_projections(args) -> dict:
    """Loads the model on the CPU, then for each --rows count times every way of
    computing a step's projections (the model's 4 per layer and the vocabulary's), and
    prints a table: time,
    GB/s read, share of the copy bandwidth, and which way the engine takes."""
    from minipaged.model import cpu

    if args.device == "cuda":
        raise OptionError(
            "bench projections measures the CPU's ways; on a GPU cuBLAS has one"
        )
    llm, threads = load(args, max_num_seqs=max(64, *args.rows))
    if llm.device != "cpu":
        raise OptionError(
            "bench projections measures the CPU's ways; give --device cpu"
        )
    model = llm.model
    weights = [
        w
        for layer in model.layers
        for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)
    ]
    weights.append(model.lm_head)
    weights = [
        w if isinstance(w, cpu.PanelWeight) else cpu.PanelWeight(np.asarray(w))
        for w in weights
    ]
    weight_bytes = sum(w.nbytes for w in weights)
    limits = machine_limits(model, threads)
    cores = cpu.follow_machine_load()
    ways = {
        "matrix-vector per row": lambda w, x: [w.out_rows @ row for row in x],
        "blas gemm": lambda w, x: x @ w.dense(),
        "panels, one core": lambda w, x: w.by_panels(x, cores=1),
        "panels, split": lambda w, x: w.by_panels(x, cores=cores),
    }
    # the model's own weights say which way its loading chose (panels_pay, or the
    # MINIPAGED_CPU_PANELS switch), and from how many rows the GEMM takes over
    # (choose_gemm_rows, or MINIPAGED_GEMM_ROWS)
    panels = isinstance(model.layers[0].wqkv, cpu.PanelWeight)
    gemm_rows = model.layers[0].wqkv.gemm_rows if panels else None
    rng = np.random.default_rng(0)
    rows_out = []
    for rows in tqdm(args.rows, desc="projections", unit="row count"):
        xs = {
            n: rng.standard_normal((rows, n)).astype(model.dtype)
            for n in {w.shape[0] for w in weights}
        }
        chosen = engine_way(rows, gemm_rows)
        for name, way in ways.items():
            seconds = best_time(
                lambda way=way, xs=xs: [way(w, xs[w.shape[0]]) for w in weights],
                args.repeats,
            )
            rows_out.append(
                timed(rows, name, seconds, weight_bytes, limits, name == chosen, False)
            )
    team_rows, team_gemm_rows, team_note = team_ways(
        weights, args, cores, weight_bytes, limits
    )
    rows_out = sorted(rows_out + team_rows, key=lambda row: row["rows"])
    handoff = handoff_seconds(cores)
    result = {
        "model": llm.model_name,
        "weight_bytes": weight_bytes,
        "products_per_step": len(weights),
        "blas_threads": threads,
        "cores": cores,
        "copy_bytes_per_s": limits["copy_bytes_per_s"],
        "handoff_us": None if handoff is None else 1e6 * handoff,
        "engine_uses_panels": panels,
        "gemm_rows": gemm_rows,
        "why": panels_reason(gemm_rows, cpu.gemm_rows_how(weights)),
        "helpers": team_note,
        "helpers_gemm_rows": team_gemm_rows,
        "results": rows_out,
    }
    if not args.json:
        print_table(result)
    return result


def team_ways(weights, args, cores: int, weight_bytes: int, limits: dict):
    """The products split over helper processes (model/team.py), as a server and
    `bench decode` run them (LLM.use_cores): panels and GEMM at each --rows count, timed
    like the other ways, the server's way marked ("server") by the GEMM's row count
    timed with them. Returns (rows, that row count, what ran in a few words); no rows
    where helpers cannot run here."""
    from minipaged.model import cpu, team

    note = cpu.start_team(weights, cores - 1)
    if cpu.helpers_now() == 0:
        return [], None, note
    try:
        gemm_rows = cpu.choose_gemm_rows(weights)
        kinds = {
            "panels, helper processes": team.PANELS,
            "gemm, helper processes": team.GEMM,
        }
        rng = np.random.default_rng(0)
        rows_out = []
        for rows in args.rows:
            xs = {
                n: rng.standard_normal((rows, n)).astype(np.float32)
                for n in {w.shape[0] for w in weights}
            }
            chosen = "panels" if rows < gemm_rows else "gemm"
            for name, kind in kinds.items():
                seconds = best_time(
                    lambda kind=kind, xs=xs: [
                        cpu._team.product(w, xs[w.shape[0]], cores, kind)
                        for w in weights
                    ],
                    args.repeats,
                )
                served = name.startswith(chosen)
                rows_out.append(
                    timed(rows, name, seconds, weight_bytes, limits, False, served)
                )
        return rows_out, gemm_rows, note
    finally:
        cpu.stop_team()


def timed(rows, way, seconds, weight_bytes, limits, engine, server) -> dict:
    """One line of the table: a way at a row count, its time and the GB/s it read;
    whether it is the engine's way, and a server's."""
    return {
        "rows": rows,
        "way": way,
        "ms": 1000 * seconds,
        "gb_per_s": weight_bytes / seconds / 1e9,
        "share_of_copy_bandwidth": weight_bytes / seconds / limits["copy_bytes_per_s"],
        "engine": engine,
        "server": server,
    }


def engine_way(rows: int, gemm_rows: int | None) -> str:
    """The way the engine computes a step of `rows` rows: BLAS (its matrix-vector code
    for one row, its GEMM for many) unless the model holds panels (gemm_rows: from how
    many rows they give way to the GEMM; None: no panels) and projection_path says
    "panels"."""
    from minipaged.model import cpu

    if gemm_rows and cpu.projection_path(rows, gemm_rows) == "panels":
        return "panels, split"
    return "blas gemm"


def panels_reason(gemm_rows: int | None, how: str = "timed at load") -> str:
    """Why the model holds panels or plain arrays, and which rows take them, in a
    sentence (gemm_rows: the model's, None where it holds no panels; how: how
    choose_gemm_rows had it, cpu.gemm_rows_how)."""
    choice = os.environ.get("MINIPAGED_CPU_PANELS", "")
    if gemm_rows is None:
        if choice == "0":
            return "MINIPAGED_CPU_PANELS=0 chose BLAS for every row count"
        return (
            "no panels: at this machine's first load its BLAS's GEMM was as fast at 2"
            " rows (panels_pay, kept),"
            " so every row count takes BLAS"
        )
    if choice == "1":
        why = "MINIPAGED_CPU_PANELS=1 chose panels"
    else:
        why = (
            "panels: at this machine's first load they beat its BLAS's GEMM at 2 rows"
            " (panels_pay, kept)"
        )
    return (
        f"{why}; 2 to {gemm_rows - 1} rows take them, {gemm_rows} and more the GEMM"
        f" ({how})"
    )


def handoff_seconds(cores: int, calls: int = 500) -> float | None:
    """What splitting one product over the cores costs beyond its work: an empty piece
    handed to the helper thread and waited for, the median of `calls` (None on one core:
    no hand-off).
    """
    from minipaged.model import cpu

    if cores < 2:
        return None
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        cpu._split(lambda lo, hi: None, 2, 2)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def print_table(result: dict) -> None:
    print(
        f"{result['model']}: {result['products_per_step']} products a step, "
        f"{result['weight_bytes'] / 1e6:.0f} MB of weights; copy bandwidth "
        f"{result['copy_bytes_per_s'] / 1e9:.1f} GB/s, {result['cores']} free cores"
    )
    print(f"{'rows':>4}  {'way':<24} {'step':>9} {'GB/s':>6} {'of copy bw':>10}")
    for r in result["results"]:
        mark = "  <- the engine's" if r["engine"] else ""
        mark = "  <- a server's" if r["server"] else mark
        print(
            f"{r['rows']:>4}  {r['way']:<24} {r['ms']:>6.1f} ms {r['gb_per_s']:>6.1f} "
            f"{100 * r['share_of_copy_bandwidth']:>9.0f}%{mark}"
        )
    print(f"the engine's way: {result['why']}")
    if result["helpers_gemm_rows"] is not None:
        print(
            f"a server's way, with {result['helpers']} (LLM.use_cores, as `bench"
            f" decode`): panels below {result['helpers_gemm_rows']} rows, the GEMM from"
            " there"
        )
    else:
        print(f"helper processes: {result['helpers']}")
    if result["handoff_us"] is not None:
        print(
            "handing an empty piece to the helper thread and waiting for it: "
            f"{result['handoff_us']:.0f} us, paid once per split product"
        )
    for name, what in WAYS.items():
        print(f"  {name}: {what}")
