"""Write every figure of docs/ into docs/figures/: `python scripts/make_figures.py [--out DIR]`.

Each figure is drawn by minipaged's own pictures (minipaged.viz) from minipaged's own runs, with
fixed seeds, so the files only change when the code does; tests/test_docs.py regenerates them
and fails when the committed ones are stale. The numbers come from the same runs as
`python -m minipaged.bench memory` and the notebooks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minipaged.paging import BlockManager, StaticAllocator
from minipaged.paging.workload import SHAREGPT_OUTPUT_MEAN, SHAREGPT_PROMPT_MEAN, make_workload, simulate_memory
from minipaged.viz import BarChart, FrameMap, LineChart, PageTableView, svg_document

FIGURES = Path(__file__).resolve().parent.parent / "docs" / "figures"
MAX_MODEL_LEN, MAX_NUM_SEQS, BLOCK_SIZE = 2048, 64, 16  # the bench's and notebook 1's setting
BLOCK_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def cache_growth() -> LineChart:
    """One request of the ShareGPT means, token by token: a slab vs frames taken on demand."""
    prompt = [1] * SHAREGPT_PROMPT_MEAN
    static = StaticAllocator(MAX_MODEL_LEN, MAX_MODEL_LEN)
    paged = BlockManager(MAX_MODEL_LEN // BLOCK_SIZE, BLOCK_SIZE, enable_prefix_caching=False)
    held, reserved, allocated = [], [], []
    for manager in (static, paged):
        manager.allocate("r", prompt)
    for n in range(SHAREGPT_PROMPT_MEAN, SHAREGPT_PROMPT_MEAN + SHAREGPT_OUTPUT_MEAN + 1):
        if n > SHAREGPT_PROMPT_MEAN:
            static.append_slot("r", 1)
            paged.append_slot("r", 1)
        held.append(n)
        reserved.append(static.usage().allocated_slots)
        allocated.append(paged.usage().allocated_slots)
    return LineChart(f"one request ({SHAREGPT_PROMPT_MEAN}-token prompt, {SHAREGPT_OUTPUT_MEAN}-token answer): "
                     "KV slots, token by token", held,
                     {f"static: a slab of {MAX_MODEL_LEN} reserved": reserved,
                      f"paged: frames of {BLOCK_SIZE}, taken on demand": allocated, "tokens held": held},
                     x_label="tokens in the cache", y_label="slots", digits=0)


def memory_breakdown(requests) -> BarChart:
    """Where the allocated KV memory goes, static vs paged, over the same requests and pool."""
    num_slots = MAX_NUM_SEQS * MAX_MODEL_LEN
    allocators = {f"static, {MAX_MODEL_LEN} per request": StaticAllocator(num_slots, MAX_MODEL_LEN),
                  f"paged, block {BLOCK_SIZE}": BlockManager(num_slots // BLOCK_SIZE, BLOCK_SIZE,
                                                             enable_prefix_caching=False)}
    kinds = {"tokens": "token_slots", "internal waste": "internal_waste", "reserved, unused": "reserved_unused"}
    segments = {name: [] for name in kinds}
    for manager in allocators.values():
        mean = simulate_memory(manager, requests, MAX_NUM_SEQS)["mean"]
        for name, field in kinds.items():
            segments[name].append(100 * mean[field] / mean["allocated_slots"])
    return BarChart(f"where the KV memory goes: {len(requests):,} requests, {MAX_NUM_SEQS} running "
                    "(% of allocated slots)", list(allocators), segments, unit="%")


def block_size_sweep(requests) -> tuple[LineChart, LineChart]:
    """Waste and page-table length for each block size, in the same pool."""
    num_slots = MAX_NUM_SEQS * MAX_MODEL_LEN
    runs = [simulate_memory(BlockManager(num_slots // size, size, enable_prefix_caching=False), requests,
                            MAX_NUM_SEQS) for size in BLOCK_SIZES]
    waste = LineChart("KV memory wasted, by block size", BLOCK_SIZES,
                      {"wasted": [100 * (1 - run["utilization"]) for run in runs]},
                      x_label="block size (tokens)", y_label="% of allocated slots", log_x=True)
    table = LineChart("page-table length, by block size", BLOCK_SIZES,
                      {"entries": [run["slots_per_request"] / size for run, size in zip(runs, BLOCK_SIZES)]},
                      x_label="block size (tokens)", y_label="frames per running sequence", log_x=True)
    return waste, table


def two_sequences() -> BlockManager:
    """Notebook 2's pool: 12 frames of 4; s1 (a 6-token prompt, 8 tokens generated) and s2 (a
    5-token prompt) then generate in turn, so their frames interleave."""
    manager = BlockManager(num_blocks=12, block_size=4, enable_prefix_caching=False)
    manager.allocate("s1", [101, 102, 103, 104, 105, 106])
    for token in range(200, 208):
        manager.append_slot("s1", token)
    manager.allocate("s2", [301, 302, 303, 304, 305])
    for step in range(6):
        manager.append_slot("s1", 400 + step)
        manager.append_slot("s2", 500 + step)
    return manager


def reused_frames() -> BlockManager:
    """After two_sequences(): s1 finishes, s3 (20 tokens) takes the free frames, s1's among them."""
    manager = two_sequences()
    manager.free("s1")
    manager.allocate("s3", list(range(600, 620)))
    return manager


def figures() -> dict:
    """File name -> picture, every figure of docs/."""
    requests = make_workload(1000)
    waste, table = block_size_sweep(requests)
    return {"cache_growth.svg": cache_growth(),
            "memory_breakdown.svg": memory_breakdown(requests),
            "page_tables.svg": PageTableView(two_sequences(), ["s1", "s2"]),
            "frame_map.svg": FrameMap(reused_frames()),
            "block_size_waste.svg": waste,
            "block_size_table.svg": table}


def write_figures(out: Path = FIGURES) -> dict:
    """Write every figure into `out` as a standalone .svg; returns them (name -> picture)."""
    out.mkdir(parents=True, exist_ok=True)
    pictures = figures()
    for name, picture in pictures.items():
        (out / name).write_text(svg_document(picture) + "\n", encoding="utf-8")
        print(f"wrote {out / name}")
    return pictures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIGURES, help="folder to write into (default docs/figures)")
    write_figures(parser.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
