"""16 greedy streams stepped in process, as a server's engine steps them (helper
processes started by LLM.use_cores): the median decode step, which way the products
went, and each process's CPU ticks. Run it with MINIPAGED_CPU_PANELS=0 to see the way a
load took when panels_pay said no: BLAS's threads, no helper, the slow mode.

    .venv/bin/python bench/results/2026-12-05-cpu-2core-slow-mode/steps.py
"""

import os
import statistics
import time

import numpy as np

from minipaged import LLM, SamplingParams
from minipaged.model import cpu


def ticks(pid: int) -> int:
    """user + system clock ticks of a process (all its threads), from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


llm = LLM(max_num_seqs=64)
cores, way = llm.use_cores("fit")
pids = [os.getpid()] + (cpu._team.pids() if cpu._team is not None else [])
rng = np.random.default_rng(0)
params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
for i in range(16):
    prompt = {"prompt_token_ids": rng.integers(0, 40000, 64).tolist()}
    llm.engine.add_request(f"r{i}", prompt, params)
llm.engine.step()  # the prompts
before = [ticks(pid) for pid in pids]
steps = []
while llm.engine.has_unfinished_requests():
    start = time.perf_counter()
    llm.engine.step()
    steps.append(time.perf_counter() - start)
used = [ticks(pid) - t for pid, t in zip(pids, before)]
print(
    f"{cores} cores, {way}: decode step {1000 * statistics.median(steps):.1f} ms"
    f" (median of {len(steps)}); CPU ticks by process {used}"
)
