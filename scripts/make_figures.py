"""Write every figure of docs/ into docs/figures/: `python scripts/make_figures.py [--out DIR]`.

Each figure is drawn by minipaged's own pictures (minipaged.viz) from minipaged's own runs, with
fixed seeds, so the files only change when the code does; tests/test_docs.py regenerates them
and fails when the committed ones are stale. The numbers come from the same runs as
`python -m minipaged.bench memory` and the notebooks. The batching and serving figures run
SmolLM2 on the CPU, with random prompts and answers of fixed length (ignore_eos): what gets
scheduled when depends on token counts only, never on which tokens the model picks, so those
pictures are the same on every machine. The dashboard's screenshots (docs/figures/dashboard*.png)
come from a live server in a browser instead, never the same twice:
`MINIPAGED_UPDATE_FIGURES=1 pytest tests/test_serve_dashboard.py` writes them.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np

from minipaged import LLM, SamplingParams
from minipaged.bench.kernel import SHAPES
from minipaged.viz.demo import reused_frames, two_sequences
from minipaged.paging import BlockManager, StaticBlockManager
from minipaged.bench.workload import SHAREGPT_OUTPUT_MEAN, SHAREGPT_PROMPT_MEAN, make_workload, simulate_memory
from minipaged.viz import BarChart, FrameMap, LineChart, PageTableView, Timeline

FIGURES = Path(__file__).resolve().parent.parent / "docs" / "figures"
MAX_MODEL_LEN, MAX_NUM_SEQS, BLOCK_SIZE = 2048, 64, 16  # the bench's and notebook 1's setting
BLOCK_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
H200_BYTES_PER_S = 4.8e12  # an H200's peak memory bandwidth
SHARING_WORKLOADS = {  # the paper's datasets' mean lengths, as `python -m minipaged.bench sharing` uses them
    "Alpaca-like": dict(num_requests=100, min_len=4, max_len=256, prompt_mean=19, output_mean=58),
    "ShareGPT-like": dict(num_requests=100, min_len=8, max_len=512, prompt_mean=161, output_mean=338)}


def cache_growth() -> LineChart:
    """One request of the ShareGPT means, token by token: a slab vs frames taken on demand."""
    prompt = [1] * SHAREGPT_PROMPT_MEAN
    static = StaticBlockManager(MAX_MODEL_LEN, MAX_MODEL_LEN)
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
    allocators = {f"static, {MAX_MODEL_LEN} per request": StaticBlockManager(num_slots, MAX_MODEL_LEN),
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


# ---- 3. the kernel -------------------------------------------------------------------------

def decode_floor() -> BarChart:
    """The least time one decode-attention call can take on an H200: the K and V it must read,
    for each shape `python -m minipaged.bench kernel` times, at 4.8 TB/s."""
    labels, micros = [], []
    for s in SHAPES:
        kv_bytes = 2 * s.num_seqs * s.context_len * s.num_kv_heads * s.head_dim * np.dtype(s.dtype).itemsize
        labels.append(f"{s.num_seqs} x {s.context_len:,} tokens, {s.num_heads}/{s.num_kv_heads} heads, "
                      f"{s.dtype}: {kv_bytes / 1e6:,.0f} MB")
        micros.append(kv_bytes / H200_BYTES_PER_S * 1e6)
    return BarChart("one decode-attention call at an H200's 4.8 TB/s: the least time it takes (µs)",
                    labels, {"µs": micros}, unit=" µs")


# ---- 4. fork and copy-on-write --------------------------------------------------------------

def forked(num_samples: int = 4) -> BlockManager:
    """A 10-token prompt in frames of 4, fork()ed into `num_samples` samples s0..s3."""
    manager = BlockManager(num_blocks=12, block_size=4, enable_prefix_caching=False)
    manager.allocate("s0", list(range(10)))
    for k in range(1, num_samples):
        manager.fork("s0", f"s{k}")
    return manager


def copied_on_write() -> BlockManager:
    """After forked(): each sample writes its first token into the shared, partly full last
    frame; all but the last writer copy it first."""
    manager = forked()
    for seq_id in manager.seq_ids():
        manager.append_slot(seq_id, 100)
    return manager


# ---- 8. speculative decoding: guess slots and their rollback -----------------------------------

def guessing() -> BlockManager:
    """A 10-token sequence in frames of 4 that took slots for 5 guessed tokens."""
    manager = BlockManager(num_blocks=12, block_size=4, enable_prefix_caching=False)
    manager.allocate("s", list(range(10)))
    manager.append_guess_slots("s", 5)
    return manager


def rolled_back() -> BlockManager:
    """After guessing(): the model accepted the first 2 guesses; the rest are rolled back."""
    manager = guessing()
    manager.settle_guesses("s", [10, 11])
    return manager


# ---- 9. page replacement: hit rate against pool size, each policy beside MIN -------------------

REPLACEMENT_RESULTS = FIGURES.parent.parent / "bench" / "results" / "2026-12-01-cpu-2core-numpy-replacement"


def replacement_figures() -> dict:
    """Note 9: the hit-rate-against-memory curve of `bench replacement` (from its committed JSON)."""
    import json

    from minipaged.bench.replacement import replacement_chart
    result = json.loads((REPLACEMENT_RESULTS / "replacement.json").read_text())
    return {"replacement_hit_rate.svg": replacement_chart(result)}


def sampling_saving(requests, num_samples: int) -> float:
    """Parallel sampling, paging alone: each prompt allocated once and fork()ed into num_samples
    samples that then append their answers (all of the request's output length). 1 - frames in
    use / frames with a private copy per sample, summed over the steps of all requests."""
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
    return BarChart("parallel sampling: KV memory saved by fork + copy-on-write (% of private copies)",
                    labels, {"saved": savings}, unit="%")


# ---- 5 and 6. the engine at work (SmolLM2 on the CPU) ------------------------------------

def random_requests(num: int, prompt_lens: tuple[int, int], output_lens: tuple[int, int], seed: int = 0,
                    prefix_len: int = 0) -> list[tuple[list[int], int]]:
    """(prompt token ids, answer length) pairs: random ids, each prompt after one shared prefix."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(100, 10_000, prefix_len).tolist()
    return [(prefix + rng.integers(100, 10_000, rng.integers(*prompt_lens)).tolist(),
             int(rng.integers(*output_lens))) for _ in range(num)]


def serve(llm: LLM, requests, on_step=lambda engine: None, **options) -> list:
    """Every request through a fresh engine over llm's model (EngineConfig options); the StepReports.
    on_step(engine) is called after each step."""
    engine = llm.new_engine(**options)
    for i, (prompt, length) in enumerate(requests):
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt},
                           SamplingParams(temperature=0, max_tokens=length, ignore_eos=True))
    reports = []
    while engine.has_unfinished_requests():
        reports.append(engine.step())
        on_step(engine)
    return reports


def timelines(llm: LLM) -> dict:
    """Ten requests of mixed answer lengths, at most 4 running at once: continuous and static on
    the same memory (room for 4 static reservations of 64 tokens), so that newcomers join as
    others leave; then continuous on a pool too small for them, where preempted requests (by
    recompute) come back later."""
    requests = random_requests(10, (8, 20), (3, 20), seed=1)
    memory = dict(num_blocks=16, block_size=16, max_model_len=64, max_num_seqs=4)
    return {"timeline_continuous.svg": Timeline(serve(llm, requests, **memory)),
            "timeline_static.svg": Timeline(serve(llm, requests, scheduler="static", **memory)),
            "timeline_preemption.svg": Timeline(serve(llm, requests, num_blocks=6, block_size=8, max_num_seqs=4,
                                                      enable_prefix_caching=False))}


def serving(llm: LLM) -> tuple[LineChart, FrameMap]:
    """12 requests with one shared 40-token system prompt: frames in use at each step against
    the sum of the page tables (no sharing), and the frame map at the first step of the peak."""
    requests = random_requests(12, (6, 14), (12, 13), seed=1, prefix_len=40)
    used, unshared, peak = [], [], []

    def measure(engine):
        blocks = engine.blocks
        used.append(blocks.num_frames - blocks.num_free_frames)
        unshared.append(blocks.unshared_frames())
        if used[-1] > max(used[:-1], default=-1):
            peak[:] = [copy.deepcopy(engine.blocks)]

    reports = serve(llm, requests, on_step=measure, num_blocks=48, block_size=16)
    chart = LineChart(f"{len(requests)} chats sharing a system prompt: KV frames at each step",
                      list(range(len(reports))), {"in use (prefix shared)": used, "without sharing": unshared},
                      x_label="step", y_label="frames", digits=0)
    return chart, FrameMap(peak[0])


LATENCY_RESULTS = FIGURES.parent.parent / "bench" / "results" / "2026-11-30-cpu-2core-numpy-latency" / "latency.json"


def paper_figures() -> dict:
    """Note 7: Figure 2 through the real scheduler (simulated), Figure 12's shape on the
    opt-13b-a100 model, and the measured latency curves of `bench latency` (from its committed JSON)."""
    import json

    from minipaged.bench import simulate as sim
    from minipaged.bench.latency import latency_chart
    from minipaged.bench.paper import fragmentation_chart
    specs, rates = sim.trace_specs("sharegpt", 300), [0.5, 1, 2, 3, 4, 5, 6]
    curves = {s: [sim.simulate("opt-13b-a100", s, sim.poisson_trace(specs, r)).normalized_latency for r in rates]
              for s in sim.FIGURE_SYSTEMS}  # static batching is off this scale (0.97 s/token at 1 req/s)
    return {"paper_fragmentation.svg": fragmentation_chart(sim.fragmentation(num_requests=300)),
            "paper_figure12.svg": LineChart("normalized latency, opt-13b-a100 model, ShareGPT-like (simulated)",
                                            rates, curves, x_label="req/s", y_label="s/token", digits=3),
            "paper_latency_cpu.svg": latency_chart(json.loads(LATENCY_RESULTS.read_text()))}


# ---- 10 and 11. thrashing and the working set; the order of the waiting queue --------------
RESULTS = FIGURES.parent.parent / "bench" / "results"
THRASHING_RESULTS = RESULTS / "2026-12-01-cpu-2core-numpy-thrashing" / "thrashing.json"
SCHEDULING_RESULTS = RESULTS / "2026-12-01-cpu-2core-numpy-scheduling" / "scheduling.json"


def thrashing_figures(llm: LLM) -> dict:
    """Note 10: goodput against max_num_seqs at three KV sizes, simulated at paper scale and
    measured on this CPU (from the committed JSON of `bench thrashing`); and eight requests on
    SmolLM2 in 8 frames, greedy and working-set admission, as batch timelines."""
    import json

    from minipaged.bench.thrashing import thrashing_chart
    result = json.loads(THRASHING_RESULTS.read_text())
    requests = random_requests(8, (8, 32), (16, 40), seed=1)
    memory = dict(num_blocks=8, block_size=16, max_num_seqs=8, enable_prefix_caching=False)
    return {"thrashing_goodput_simulated.svg": thrashing_chart(result, "simulated"),
            "thrashing_preemptions_simulated.svg": thrashing_chart(result, "simulated", "recomputed_tokens"),
            "thrashing_goodput_cpu.svg": thrashing_chart(result, "engine"),
            "thrashing_timeline_greedy.svg": Timeline(serve(llm, requests, **memory)),
            "thrashing_timeline_working_set.svg": Timeline(serve(llm, requests, admission="working-set", **memory))}


def scheduling_figures() -> dict:
    """Note 11: by waiting-queue order, the shortest quarter's median latency and the longest
    wait, simulated at paper scale and measured on this CPU (the JSON of `bench scheduling`)."""
    import json

    from minipaged.bench.scheduling import scheduling_chart
    result = json.loads(SCHEDULING_RESULTS.read_text())
    return {"scheduling_short_simulated.svg": scheduling_chart(result, "simulated", "short_p50"),
            "scheduling_wait_simulated.svg": scheduling_chart(result, "simulated", "max_wait"),
            "scheduling_short_cpu.svg": scheduling_chart(result, "engine", "short_p50")}


# ---- 12. the drum: a tier behind the KV pool --------------------------------------------------
DRUM_RESULTS = FIGURES.parent.parent / "bench" / "results" / "2026-12-01-cpu-2core-numpy-drum" / "drum.json"


def drum_figures() -> dict:
    """Note 12: where the benchmark trace's returning prompts found their tokens (replayed
    through block managers, no model), and the measured time to first token (the committed
    JSON of `bench drum`)."""
    import json

    from minipaged.bench.drum import make_trace, sources_chart, ttft_chart
    result = json.loads(DRUM_RESULTS.read_text())
    trace = make_trace(result["conversations"], result["turns"], result["active"], seed=result["seed"])
    return {"drum_sources.svg": sources_chart(trace, result["pool_frames"], result["tier_frames"]),
            "drum_ttft_cpu.svg": ttft_chart(result)}


def figures() -> dict:
    """File name -> picture, every figure of docs/."""
    requests = make_workload(1000)
    waste, table = block_size_sweep(requests)
    llm = LLM(device="cpu")
    serving_frames, serving_map = serving(llm)
    return {"cache_growth.svg": cache_growth(),
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
            **drum_figures()}


def write_figures(out: Path = FIGURES) -> dict:
    """Write every figure into `out` as a standalone .svg; returns them (name -> picture)."""
    out.mkdir(parents=True, exist_ok=True)
    pictures = figures()
    for name, picture in pictures.items():
        (out / name).write_text(picture.svg() + "\n", encoding="utf-8")
        print(f"wrote {out / name}")
    return pictures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIGURES, help="folder to write into (default docs/figures)")
    write_figures(parser.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
