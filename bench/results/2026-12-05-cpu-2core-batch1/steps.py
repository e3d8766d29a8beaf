"""Decode steps of 1 and of 16 greedy streams in process, with helper processes
(LLM.use_cores), the weights they share on 2 MB pages as the team puts them, or, with
`4k` as argument, on 4 KB pages (team.huge_pages made to say no before the team
starts): the median step of 96 after one prefill, in ms.

    .venv/bin/python bench/results/2026-12-05-cpu-2core-batch1/steps.py [4k]
"""

import json
import statistics
import sys
import time

import numpy as np

from minipaged import LLM, SamplingParams
from minipaged.model import team

if sys.argv[1:] == ["4k"]:
    team.huge_pages = lambda memory, start, end: False

llm = LLM(max_num_seqs=64)
cores, way = llm.use_cores("fit")
rng = np.random.default_rng(0)
result = {"pages": "4 KB" if sys.argv[1:] == ["4k"] else "2 MB", "way": way}
for batch in (1, 16):
    params = SamplingParams(max_tokens=97, temperature=0, ignore_eos=True)
    for i in range(batch):
        prompt = {"prompt_token_ids": rng.integers(0, 40000, 64).tolist()}
        llm.engine.add_request(f"b{batch}-{i}", prompt, params)
    llm.engine.step()  # the prompts
    steps = []
    while llm.engine.has_unfinished_requests():
        start = time.perf_counter()
        llm.engine.step()
        steps.append(time.perf_counter() - start)
    result[f"batch {batch} step ms"] = round(1000 * statistics.median(steps), 2)
print(json.dumps(result))
