"""Write every figure of docs/ into docs/figures/: `python scripts/make_figures.py
[--out DIR]`.

Each figure is drawn by minipaged's own pictures (minipaged.tools.viz) from minipaged's
own runs, with fixed seeds, so the files only change when the code does;
tests/test_docs.py regenerates them and fails when the committed ones are stale. The
numbers come from the same runs as `python -m minipaged.bench memory` and the notebooks
(note 13's diagram is drawn by hand with minipaged.tools.viz.svg's helpers). The
batching and serving figures run SmolLM2 on the CPU, with random prompts and answers of
fixed length (ignore_eos): what gets scheduled when depends on token counts only, never
on which tokens the model picks, so those pictures are the same on every machine. The
dashboard's screenshots (docs/figures/dashboard*.png) come from a live server in a
browser instead, never the same twice: `MINIPAGED_UPDATE_FIGURES=1 pytest
tests/test_serve_dashboard.py` writes them.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import sys
from pathlib import Path

import numpy as np

from minipaged import LLM, SamplingParams
from minipaged.paging import BlockManager, StaticBlockManager
from minipaged.tools.bench.kernel import SHAPES
from minipaged.tools.bench.workload import (
    SHAREGPT_OUTPUT_MEAN,
    SHAREGPT_PROMPT_MEAN,
    make_workload,
    simulate_memory,
)
from minipaged.tools.lab import directory_lab
from minipaged.tools.viz import BarChart, FrameMap, LineChart, PageTableView, Timeline
from minipaged.tools.viz.demo import reused_frames, two_sequences

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "docs" / "figures"
MAX_MODEL_LEN, MAX_NUM_SEQS, BLOCK_SIZE = (
    2048,
    64,
    16,
)  # the bench's and notebook 1's setting
BLOCK_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
H200_BYTES_PER_S = 4.8e12  # an H200's peak memory bandwidth
# the paper's datasets' mean lengths, as `python -m minipaged.bench sharing` uses them
SHARING_WORKLOADS = {
    "Alpaca-like": dict(
        num_requests=100, min_len=4, max_len=256, prompt_mean=19, output_mean=58
    ),
    "ShareGPT-like": dict(
        num_requests=100, min_len=8, max_len=512, prompt_mean=161, output_mean=338
    ),
}


def cache_growth() -> LineChart:
    """One request of the ShareGPT means, token by token: a slab vs frames taken on
    demand."""
    prompt = [1] * SHAREGPT_PROMPT_MEAN
    static = StaticBlockManager(MAX_MODEL_LEN, MAX_MODEL_LEN)
    paged = BlockManager(
        MAX_MODEL_LEN // BLOCK_SIZE, BLOCK_SIZE, enable_prefix_caching=False
    )
    held, reserved, allocated = [], [], []
    for manager in (static, paged):
        manager.allocate("r", prompt)
    for n in range(
        SHAREGPT_PROMPT_MEAN, SHAREGPT_PROMPT_MEAN + SHAREGPT_OUTPUT_MEAN + 1
    ):
        if n > SHAREGPT_PROMPT_MEAN:
            static.append_slot("r", 1)
            paged.append_slot("r", 1)
        held.append(n)
        reserved.append(static.usage().allocated_slots)
        allocated.append(paged.usage().allocated_slots)
    return LineChart(
        f"one request ({SHAREGPT_PROMPT_MEAN}-token prompt,"
        f" {SHAREGPT_OUTPUT_MEAN}-token answer): KV slots, token by token",
        held,
        {
            f"static: a slab of {MAX_MODEL_LEN} reserved": reserved,
            f"paged: frames of {BLOCK_SIZE}, taken on demand": allocated,
            "tokens held": held,
        },
        x_label="tokens in the cache",
        y_label="slots",
        digits=0,
    )


def memory_breakdown(requests) -> BarChart:
    """Where the allocated KV memory goes, static vs paged, over the same requests and
    pool."""
    num_slots = MAX_NUM_SEQS * MAX_MODEL_LEN
    allocators = {
        f"static, {MAX_MODEL_LEN} per request": StaticBlockManager(
            num_slots, MAX_MODEL_LEN
        ),
        f"paged, block {BLOCK_SIZE}": BlockManager(
            num_slots // BLOCK_SIZE, BLOCK_SIZE, enable_prefix_caching=False
        ),
    }
    kinds = {
        "tokens": "token_slots",
        "internal waste": "internal_waste",
        "reserved, unused": "reserved_unused",
    }
    segments = {name: [] for name in kinds}
    for manager in allocators.values():
        mean = simulate_memory(manager, requests, MAX_NUM_SEQS)["mean"]
        for name, field in kinds.items():
            segments[name].append(100 * mean[field] / mean["allocated_slots"])
    return BarChart(
        f"where the KV memory goes: {len(requests):,} requests, {MAX_NUM_SEQS} running "
        "(% of allocated slots)",
        list(allocators),
        segments,
        unit="%",
    )


def block_size_sweep(requests) -> tuple[LineChart, LineChart]:
    """Waste and page-table length for each block size, in the same pool."""
    num_slots = MAX_NUM_SEQS * MAX_MODEL_LEN
    runs = [
        simulate_memory(
            BlockManager(num_slots // size, size, enable_prefix_caching=False),
            requests,
            MAX_NUM_SEQS,
        )
        for size in BLOCK_SIZES
    ]
    waste = LineChart(
        "KV memory wasted, by block size",
        BLOCK_SIZES,
        {"wasted": [100 * (1 - run["utilization"]) for run in runs]},
        x_label="block size (tokens)",
        y_label="% of allocated slots",
        log_x=True,
    )
    table = LineChart(
        "page-table length, by block size",
        BLOCK_SIZES,
        {
            "entries": [
                run["slots_per_request"] / size for run, size in zip(runs, BLOCK_SIZES)
            ]
        },
        x_label="block size (tokens)",
        y_label="frames per running sequence",
        log_x=True,
    )
    return waste, table


# ---- 3. the kernel -------------------------------------------------------------------


def decode_floor() -> BarChart:
    """The least time one decode-attention call can take on an H200: the K and V it must
    read, for each shape `python -m minipaged.bench kernel` times, at 4.8 TB/s."""
    labels, micros = [], []
    for s in SHAPES:
        kv_bytes = (
            2
            * s.num_seqs
            * s.context_len
            * s.num_kv_heads
            * s.head_dim
            * np.dtype(s.dtype).itemsize
        )
        labels.append(
            f"{s.num_seqs} x {s.context_len:,} tokens, {s.num_heads}/{s.num_kv_heads}"
            f" heads, {s.dtype}: {kv_bytes / 1e6:,.0f} MB"
        )
        micros.append(kv_bytes / H200_BYTES_PER_S * 1e6)
    return BarChart(
        "one decode-attention call at an H200's 4.8 TB/s: the least time it takes (µs)",
        labels,
        {"µs": micros},
        unit=" µs",
    )


# ---- 4. fork and copy-on-write -------------------------------------------------------


def forked(num_samples: int = 4) -> BlockManager:
    """A 10-token prompt in frames of 4, fork()ed into `num_samples` samples s0..s3."""
    manager = BlockManager(num_blocks=12, block_size=4, enable_prefix_caching=False)
    manager.allocate("s0", list(range(10)))
    for k in range(1, num_samples):
        manager.fork("s0", f"s{k}")
    return manager


def copied_on_write() -> BlockManager:
    """After forked(): each sample writes its first token into the shared, partly full
    last frame; all but the last writer copy it first."""
    manager = forked()
    for seq_id in manager.seq_ids():
        manager.append_slot(seq_id, 100)
    return manager


# ---- 8. speculative decoding: guess slots and their rollback -------------------------


def guessing() -> BlockManager:
    """A 10-token sequence in frames of 4 that took slots for 5 guessed tokens."""
    manager = BlockManager(num_blocks=12, block_size=4, enable_prefix_caching=False)
    manager.allocate("s", list(range(10)))
    manager.append_guess_slots("s", 5)
    return manager


def rolled_back() -> BlockManager:
    """After guessing(): the model accepted the first 2 guesses; the rest are rolled
    back."""
    manager = guessing()
    manager.settle_guesses("s", [10, 11])
    return manager


# ---- 9. page replacement: hit rate against pool size, each policy beside MIN ---------

REPLACEMENT_RESULTS = (
    FIGURES.parent.parent
    / "bench"
    / "results"
    / "2026-12-01-cpu-2core-numpy-replacement"
)


def replacement_figures() -> dict:
    """Note 9: the hit-rate-against-memory curve of `bench replacement` (from its
    committed JSON)."""
    import json

    from minipaged.tools.bench.replacement import replacement_chart

    result = json.loads((REPLACEMENT_RESULTS / "replacement.json").read_text())
    return {"replacement_hit_rate.svg": replacement_chart(result)}


def sampling_saving(requests, num_samples: int) -> float:
    """Parallel sampling, paging alone: each prompt allocated once and fork()ed into
    num_samples samples that then append their answers (all of the request's output
    length). 1 - frames in use / frames with a private copy per sample, summed over the
    steps of all requests.
    """
    manager = BlockManager(4096, BLOCK_SIZE, enable_prefix_caching=False)
    used = private = 0
    for request in requests:
        samples = list(range(num_samples))  # sequence ids
        manager.allocate(samples[0], [1] * request.prompt_len)
        for sample in samples[1:]:
            manager.fork(samples[0], sample)
        for _ in range(request.output_len):
            for sample in samples:
                manager.append_slot(sample, 1)
            used += manager.num_frames - manager.num_free_frames
            private += manager.unshared_frames()
        for sample in samples:
            manager.free(sample)
    return 1 - used / private


def sharing_savings() -> BarChart:
    labels, savings = [], []
    for name, options in SHARING_WORKLOADS.items():
        requests = make_workload(**options)
        for n in (2, 4, 6):
            labels.append(f"{name}, n = {n}")
            savings.append(100 * sampling_saving(requests, n))
    return BarChart(
        "parallel sampling: KV memory saved by fork + copy-on-write (% of private"
        " copies)",
        labels,
        {"saved": savings},
        unit="%",
    )


# ---- 5 and 6. the engine at work (SmolLM2 on the CPU) --------------------------------


def random_requests(
    num: int,
    prompt_lens: tuple[int, int],
    output_lens: tuple[int, int],
    seed: int = 0,
    prefix_len: int = 0,
) -> list[tuple[list[int], int]]:
    """(prompt token ids, answer length) pairs: random ids, each prompt after one shared
    prefix."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(100, 10_000, prefix_len).tolist()
    return [
        (
            prefix + rng.integers(100, 10_000, rng.integers(*prompt_lens)).tolist(),
            int(rng.integers(*output_lens)),
        )
        for _ in range(num)
    ]


def serve(llm: LLM, requests, on_step=lambda engine: None, **options) -> list:
    """Every request through a fresh engine over llm's model (EngineConfig options); the
    StepReports. on_step(engine) is called after each step."""
    engine = llm.new_engine(**options)
    for i, (prompt, length) in enumerate(requests):
        engine.add_request(
            f"r{i}",
            {"prompt_token_ids": prompt},
            SamplingParams(temperature=0, max_tokens=length, ignore_eos=True),
        )
    reports = []
    while engine.has_unfinished_requests():
        reports.append(engine.step())
        on_step(engine)
    return reports


def timelines(llm: LLM) -> dict:
    """Ten requests of mixed answer lengths, at most 4 running at once: continuous and
    static on the same memory (room for 4 static reservations of 64 tokens), so that
    newcomers join as others leave; then continuous on a pool too small for them, where
    preempted requests (by recompute) come back later."""
    requests = random_requests(10, (8, 20), (3, 20), seed=1)
    memory = dict(num_blocks=16, block_size=16, max_model_len=64, max_num_seqs=4)
    return {
        "timeline_continuous.svg": Timeline(serve(llm, requests, **memory)),
        "timeline_static.svg": Timeline(
            serve(llm, requests, scheduler="static", **memory)
        ),
        "timeline_preemption.svg": Timeline(
            serve(
                llm,
                requests,
                num_blocks=6,
                block_size=8,
                max_num_seqs=4,
                enable_prefix_caching=False,
            )
        ),
    }


def serving(llm: LLM) -> tuple[LineChart, FrameMap]:
    """12 requests with one shared 40-token system prompt: frames in use at each step
    against the sum of the page tables (no sharing), and the frame map at the first step
    of the peak.
    """
    requests = random_requests(12, (6, 14), (12, 13), seed=1, prefix_len=40)
    used, unshared, peak = [], [], []

    def measure(engine):
        blocks = engine.blocks
        used.append(blocks.num_frames - blocks.num_free_frames)
        unshared.append(blocks.unshared_frames())
        if used[-1] > max(used[:-1], default=-1):
            peak[:] = [copy.deepcopy(engine.blocks)]

    reports = serve(llm, requests, on_step=measure, num_blocks=48, block_size=16)
    chart = LineChart(
        f"{len(requests)} chats sharing a system prompt: KV frames at each step",
        list(range(len(reports))),
        {"in use (prefix shared)": used, "without sharing": unshared},
        x_label="step",
        y_label="frames",
        digits=0,
    )
    return chart, FrameMap(peak[0])


LATENCY_RESULTS = (
    FIGURES.parent.parent
    / "bench"
    / "results"
    / "2026-11-30-cpu-2core-numpy-latency"
    / "latency.json"
)


def paper_figures() -> dict:
    """Note 7: Figure 2 through the real scheduler (simulated), Figure 12's shape on the
    opt-13b-a100 model, and the measured latency curves of `bench latency` (from its
    committed JSON).
    """
    import json

    from minipaged.tools.bench import simulate as sim
    from minipaged.tools.bench.latency import latency_chart
    from minipaged.tools.bench.paper import fragmentation_chart

    specs, rates = sim.trace_specs("sharegpt", 300), [0.5, 1, 2, 3, 4, 5, 6]
    curves = {
        s: [
            sim.simulate(
                "opt-13b-a100", s, sim.poisson_trace(specs, r)
            ).normalized_latency
            for r in rates
        ]
        for s in sim.FIGURE_SYSTEMS
    }  # static batching is off this scale (0.97 s/token at 1 req/s)
    return {
        "paper_fragmentation.svg": fragmentation_chart(
            sim.fragmentation(num_requests=300)
        ),
        "paper_figure12.svg": LineChart(
            "normalized latency, opt-13b-a100 model, ShareGPT-like (simulated)",
            rates,
            curves,
            x_label="req/s",
            y_label="s/token",
            digits=3,
        ),
        "paper_latency_cpu.svg": latency_chart(json.loads(LATENCY_RESULTS.read_text())),
    }


# ---- 10 and 11. thrashing and the working set; the order of the waiting queue --------
RESULTS = FIGURES.parent.parent / "bench" / "results"
THRASHING_RESULTS = RESULTS / "2026-12-01-cpu-2core-numpy-thrashing" / "thrashing.json"
SCHEDULING_RESULTS = (
    RESULTS / "2026-12-01-cpu-2core-numpy-scheduling" / "scheduling.json"
)


def thrashing_figures(llm: LLM) -> dict:
    """Note 10: goodput against max_num_seqs at three KV sizes, simulated at paper scale
    and measured on this CPU (from the committed JSON of `bench thrashing`); and eight
    requests on
    SmolLM2 in 8 frames, greedy and working-set admission, as batch timelines."""
    import json

    from minipaged.tools.bench.thrashing import thrashing_chart

    result = json.loads(THRASHING_RESULTS.read_text())
    requests = random_requests(8, (8, 32), (16, 40), seed=1)
    memory = dict(
        num_blocks=8, block_size=16, max_num_seqs=8, enable_prefix_caching=False
    )
    return {
        "thrashing_goodput_simulated.svg": thrashing_chart(result, "simulated"),
        "thrashing_preemptions_simulated.svg": thrashing_chart(
            result, "simulated", "recomputed_tokens"
        ),
        "thrashing_goodput_cpu.svg": thrashing_chart(result, "engine"),
        "thrashing_timeline_greedy.svg": Timeline(serve(llm, requests, **memory)),
        "thrashing_timeline_working_set.svg": Timeline(
            serve(llm, requests, admission="working-set", **memory)
        ),
    }


def scheduling_figures() -> dict:
    """Note 11: by waiting-queue order, the shortest quarter's median latency and the
    longest wait, simulated at paper scale and measured on this CPU (the JSON of `bench
    scheduling`).
    """
    import json

    from minipaged.tools.bench.scheduling import scheduling_chart

    result = json.loads(SCHEDULING_RESULTS.read_text())
    return {
        "scheduling_short_simulated.svg": scheduling_chart(
            result, "simulated", "short_p50"
        ),
        "scheduling_wait_simulated.svg": scheduling_chart(
            result, "simulated", "max_wait"
        ),
        "scheduling_short_cpu.svg": scheduling_chart(result, "engine", "short_p50"),
    }


# ---- 12. the drum: a tier behind the KV pool -----------------------------------------
DRUM_RESULTS = (
    FIGURES.parent.parent
    / "bench"
    / "results"
    / "2026-12-01-cpu-2core-numpy-drum"
    / "drum.json"
)


def drum_figures() -> dict:
    """Note 12: where the benchmark trace's returning prompts found their tokens
    (replayed through block managers, no model), and the measured time to first token
    (the committed JSON of `bench drum`)."""
    import json

    from minipaged.tools.bench.drum import make_trace, sources_chart, ttft_chart

    result = json.loads(DRUM_RESULTS.read_text())
    trace = make_trace(
        result["conversations"], result["turns"], result["active"], seed=result["seed"]
    )
    return {
        "drum_sources.svg": sources_chart(
            trace, result["pool_frames"], result["tier_frames"]
        ),
        "drum_ttft_cpu.svg": ttft_chart(result),
    }


# ---- 13. policy and mechanism: the core's step and the seams around it ---------------


class Drawing:
    """A picture drawn by hand: its SVG, as the figures' pictures give it."""

    def __init__(self, svg: str):
        self._svg = svg

    def svg(self) -> str:
        return self._svg


# (seam, meeting, option, what it asks, default, the others): the seam table of note 13
TOP_SEAMS = [
    (
        "waiting order",
        "meeting 11",
        "scheduling_policy",
        "pick(waiting, now)",
        "fcfs",
        "sjf, aging, priority",
    ),
    (
        "admission",
        "meeting 10",
        "admission",
        "growth(req, blocks, final_len)",
        "greedy",
        "working-set",
    ),
    (
        "victim",
        "meetings 5, 11",
        "preemption_victim",
        "choose(candidates)",
        "the newest",
        "least-urgent, your own",
    ),
    (
        "replacement",
        "meeting 9",
        "prefix_cache_policy",
        "victim(parked)",
        "lru",
        "fifo, clock, random",
    ),
]
BOTTOM_SEAMS = [
    (
        "batching",
        "meeting 5",
        "scheduler",
        "join? reserve? keep rows?",
        "continuous",
        "static",
    ),
    (
        "tier",
        "meeting 12",
        "kv_offload_frames",
        "where an evicted block waits",
        "nowhere",
        "the drum (paging/tier.py)",
    ),
    (
        "speculation",
        "meeting 8",
        "speculative_config",
        "reserve, propose, emit, settle",
        "none",
        "ngram, draft_layers",
    ),
]
STEPS = [
    ("schedule", "queues, frames", "+ reserve"),
    ("prepare", "page tables → slots", "+ propose"),
    ("forward", "the model, once", ""),
    ("sample", "next tokens", "+ emit"),
    ("update", "append, finish", "+ settle"),
]


def step_call_tree_size() -> str:
    """'N functions, M lines': the functions LLMEngine.step reaches through the core,
    followed by tests/test_architecture.py's own walk."""
    spec = importlib.util.spec_from_file_location(
        "test_architecture", ROOT / "tests" / "test_architecture.py"
    )
    architecture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(architecture)
    functions = architecture.core_functions()
    tree = architecture.step_call_tree()
    lines = sum(functions[k].end_lineno - functions[k].lineno + 1 for k in tree)
    return f"{len(tree)} functions, {lines} lines"


def policy_mechanism() -> Drawing:
    """Note 13: the core (the step as a row of boxes: mechanism) and the seams of
    meetings 5 to 12 plugged into it, each with its option, what it is asked, its
    default and the others. The call tree's size is measured, as the architecture
    test measures it."""
    from minipaged.tools.viz.svg import PALETTE, SMALL_FONT, _framed, _svg_text

    width, height, plug_h = 1268, 600, 130
    body: list[str] = []

    def plug(x: float, y: float, w: float, seam: tuple, color: str) -> None:
        name, meeting, option, asks, default, others = seam
        body.append(
            f'<rect x="{x}" y="{y}" width="{w}" height="{plug_h}" rx="8" fill="#ffffff"'
            f' stroke="{color}" stroke-width="3"/>'
        )
        body.append(
            f'<rect x="{x}" y="{y}" width="{w}" height="30" rx="8" fill="{color}"/>'
        )
        body.append(
            _svg_text(x + 10, y + 21, f"{name} · {meeting}", bold=True, color="#ffffff")
        )
        body.append(_svg_text(x + 10, y + 52, option, bold=True))
        for i, line in enumerate([asks, f"default: {default}", f"others: {others}"]):
            body.append(_svg_text(x + 10, y + 76 + i * 20, line, size=SMALL_FONT))

    def wire(points: list[tuple[float, float]], color: str) -> None:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        body.append(
            f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="3"/>'
        )
        body.append(
            f'<circle cx="{points[-1][0]:.1f}" cy="{points[-1][1]:.1f}" r="5"'
            f' fill="{color}"/>'
        )

    # the core: a box around the step, a row of boxes joined by arrows
    core_x, core_y, core_w, core_h = 20, 195, width - 40, 190
    body.append(
        f'<rect x="{core_x}" y="{core_y}" width="{core_w}" height="{core_h}" rx="10"'
        ' fill="#f4f4f4" stroke="#333333" stroke-width="2"/>'
    )
    # the core's words at its right: the wires come in at its left
    right = core_x + core_w - 14
    body.append(
        _svg_text(
            right,
            core_y + 24,
            "the core, mechanism only: engine.py, scheduler.py, runner.py",
            anchor="end",
            bold=True,
        )
    )
    step_w, step_h, gap, step_y = 200, 100, 45, core_y + 40
    boxes = []
    for i, (name, does, tag) in enumerate(STEPS):
        x = core_x + 24 + i * (step_w + gap)
        boxes.append(x)
        body.append(
            f'<rect x="{x}" y="{step_y}" width="{step_w}" height="{step_h}" rx="6"'
            ' fill="#ffffff" stroke="#333333" stroke-width="2"/>'
        )
        body.append(
            _svg_text(x + step_w / 2, step_y + 30, name, anchor="middle", bold=True)
        )
        body.append(
            _svg_text(
                x + step_w / 2, step_y + 55, does, size=SMALL_FONT, anchor="middle"
            )
        )
        if tag:
            body.append(
                _svg_text(
                    x + step_w / 2,
                    step_y + 82,
                    tag,
                    size=SMALL_FONT,
                    anchor="middle",
                    bold=True,
                    color=PALETTE[6],
                )
            )
        if i:
            a, b, mid = x - gap + 6, x - 6, step_y + step_h / 2
            body.append(
                f'<line x1="{a}" y1="{mid}" x2="{b - 8}" y2="{mid}" stroke="#333333"'
                ' stroke-width="2"/>'
            )
            body.append(
                f'<polygon points="{b - 10},{mid - 6} {b},{mid} {b - 10},{mid + 6}"'
                ' fill="#333333"/>'
            )
    body.append(
        _svg_text(
            right,
            core_y + core_h - 14,
            "LLMEngine.step through the three files: " + step_call_tree_size(),
            size=SMALL_FONT,
            anchor="end",
        )
    )

    # the top row: four seams the scheduler asks in schedule(), joined on one bus
    top_w = (width - 3 * 28) / 4
    bus_y, schedule_x = 165, boxes[0] + step_w / 2
    for i, seam in enumerate(TOP_SEAMS):
        x = i * (top_w + 28)
        plug(x, 0, top_w, seam, PALETTE[i])
        wire([(x + top_w / 2, plug_h), (x + top_w / 2, bus_y)], PALETTE[i])
    body.append(
        f'<line x1="{schedule_x}" y1="{bus_y}" x2="{3 * (top_w + 28) + top_w / 2}"'
        f' y2="{bus_y}" stroke="#555555" stroke-width="3"/>'
    )
    wire([(schedule_x, bus_y), (schedule_x, step_y)], "#555555")
    body.append(
        _svg_text(
            schedule_x + 12,
            bus_y - 8,
            "asked in schedule()",
            size=SMALL_FONT,
            color="#555555",
        )
    )

    # the bottom row: batching (schedule), the tier (its moves before prepare),
    # speculation (every step)
    bottom_w, bottom_y = (width - 2 * 34) / 3, height - plug_h
    colors = [PALETTE[4], PALETTE[8], PALETTE[6]]
    for i, (seam, color) in enumerate(zip(BOTTOM_SEAMS, colors)):
        plug(i * (bottom_w + 34), bottom_y, bottom_w, seam, color)
    step_bottom = step_y + step_h
    wire([(boxes[0] + 60, bottom_y), (boxes[0] + 60, step_bottom)], colors[0])
    wire(
        [(boxes[1] + step_w - 24, bottom_y), (boxes[1] + step_w - 24, step_bottom)],
        colors[1],
    )
    spec_x = 2 * (bottom_w + 34) + bottom_w / 2
    wire([(spec_x, bottom_y), (spec_x, core_y + core_h)], colors[2])
    body.append(
        _svg_text(
            spec_x - 12,
            core_y + core_h + 34,
            "the step's lookahead: its + tag in each step",
            size=SMALL_FONT,
            anchor="end",
            color=colors[2],
        )
    )
    return Drawing(
        _framed(
            "policy and mechanism: the step is the core's, each decision a policy's, on"
            " a seam",
            width,
            height,
            body,
            [
                (
                    "each plug: the seam and its meeting, the option, what it is asked,"
                    " the default, the others"
                ),
                (
                    "a policy of one's own plugs into any seam as an object or a"
                    " 'module:Class' path"
                ),
            ],
        )
    )


def routing_figures(llm: LLM) -> dict:
    """Note 17: the directory after 8 users took 4 turns each on three replicas, routed
    round robin and by LARD (notebook 17's runs): the replica that holds each block of
    each conversation. Answers of fixed length: the same on every machine."""
    drawn = directory_lab.directory_pictures(llm)
    return {
        "routing_round_robin.svg": drawn["round robin"][1],
        "routing_lard.svg": drawn["LARD"][1],
    }


def figures() -> dict:
    """File name -> picture, every figure of docs/."""
    requests = make_workload(1000)
    waste, table = block_size_sweep(requests)
    llm = LLM(device="cpu")
    serving_frames, serving_map = serving(llm)
    return {
        "cache_growth.svg": cache_growth(),
        "memory_breakdown.svg": memory_breakdown(requests),
        "page_tables.svg": PageTableView(two_sequences(), ["s1", "s2"]),
        "frame_map.svg": FrameMap(reused_frames()),
        "block_size_waste.svg": waste,
        "block_size_table.svg": table,
        "decode_floor.svg": decode_floor(),
        "fork.svg": PageTableView(forked(), ["s0", "s1", "s2", "s3"]),
        "copy_on_write.svg": PageTableView(copied_on_write(), ["s0", "s1", "s2", "s3"]),
        "sharing_savings.svg": sharing_savings(),
        "speculative_guesses.svg": PageTableView(guessing(), ["s"]),
        "speculative_rollback.svg": PageTableView(rolled_back(), ["s"]),
        **replacement_figures(),
        **timelines(llm),
        "serving_frames.svg": serving_frames,
        "serving_frame_map.svg": serving_map,
        **paper_figures(),
        **thrashing_figures(llm),
        **scheduling_figures(),
        **drum_figures(),
        "policy_mechanism.svg": policy_mechanism(),
        **routing_figures(llm),
    }


def write_figures(out: Path = FIGURES) -> dict:
    """Write every figure into `out` as a standalone .svg; returns them (name ->
    picture)."""
    out.mkdir(parents=True, exist_ok=True)
    pictures = figures()
    for name, picture in pictures.items():
        (out / name).write_text(picture.svg() + "\n", encoding="utf-8")
        print(f"wrote {out / name}")
    return pictures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=FIGURES,
        help="folder to write into (default docs/figures)",
    )
    write_figures(parser.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
