"""Synthetic request workloads, and a memory-only run of one through a block manager.

Lengths vary like chat traffic (most requests short, a long tail of long ones), seeded so every
run sees the same requests: what the benchmarks, the simulator and the notebooks send in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, astuple, dataclass

import numpy as np

from minipaged.paging.manager import BlockManager, MemoryUsage

SHAREGPT_PROMPT_MEAN, SHAREGPT_OUTPUT_MEAN = 161, 338  # tokens; the vLLM paper's ShareGPT figures


@dataclass(slots=True)
class RequestSpec:
    prompt_len: int
    output_len: int


def make_workload(num_requests: int = 1000, min_len: int = 10, max_len: int = 1000,
                  prompt_mean: float = SHAREGPT_PROMPT_MEAN, output_mean: float = SHAREGPT_OUTPUT_MEAN,
                  seed: int = 0) -> list[RequestSpec]:
    """Prompt and output lengths from log-normal distributions (sigma 1: long-tailed) with the
    given means, clipped to [min_len, max_len]."""
    rng = np.random.default_rng(seed)

    def lengths(mean: float) -> np.ndarray:  # (num_requests,)
        sigma = 1.0
        drawn = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, num_requests)
        return np.clip(np.round(drawn), min_len, max_len).astype(int)

    return [RequestSpec(int(p), int(o)) for p, o in zip(lengths(prompt_mean), lengths(output_mean))]


def simulate_memory(manager: BlockManager, requests: list[RequestSpec], max_num_seqs: int = 64) -> dict:
    """Serve `requests` with at most `max_num_seqs` running: each step, waiting requests join
    while they fit, every running sequence appends one token, finished ones free. Returns the
    utilization time-averaged over steps (summed token slots / summed allocated slots), the
    mean slots a running request holds, the peak allocation and the mean of each usage figure."""
    waiting, running = deque(enumerate(requests)), {}  # running: seq id -> tokens left to generate
    steps: list[MemoryUsage] = []
    seq_steps = 0
    while waiting or running:
        while waiting and len(running) < max_num_seqs and manager.can_allocate(waiting[0][1].prompt_len):
            seq_id, request = waiting.popleft()
            manager.allocate(seq_id, [seq_id] * request.prompt_len)  # distinct per request: no sharing
            running[seq_id] = request.output_len
        if not running:
            raise ValueError(f"a prompt of {waiting[0][1].prompt_len} tokens never fits this pool "
                             f"of {manager.num_frames} frames: make the pool larger")
        for seq_id in running:
            manager.append_slot(seq_id, seq_id)
            running[seq_id] -= 1
        steps.append(manager.usage())
        seq_steps += len(running)
        for seq_id in [s for s, left in running.items() if left == 0]:
            manager.free(seq_id)
            del running[seq_id]
    total = MemoryUsage(*(sum(field) for field in zip(*map(astuple, steps))))  # summed over steps
    return {"utilization": total.utilization,
            "slots_per_request": total.allocated_slots / seq_steps,
            "peak_allocated_slots": max(usage.allocated_slots for usage in steps),
            "mean": {k: v / len(steps) for k, v in asdict(total).items()}, "steps": len(steps)}
