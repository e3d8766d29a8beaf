"""The CPU's prefill attention before and after it went blockwise (issue 43), in the
engine, interleaved: `before` is minipaged/attention/cpu.py as committed at BEFORE (the
reference's prefill; read with git show), `after` the working tree's.
    .venv/bin/python bench/results/2026-12-05-cpu-2core-prefill/prefill.py [ROUNDS]
1. One prompt of 128, 256, 512 and 1000 random tokens, alone: its prefill step.
2. The race's requests (prompts of 32-512 random tokens, 64-256 output tokens, greedy,
   ignore_eos), 32 of them through an engine of max_num_seqs=16 and 1 GiB of KV cache,
   so that each request that finishes lets a waiting one in and its prompt is
   prefilled beside the others' decodes, as at the race's 16 streams: output tokens/s,
   the median step and the median step that prefills.
Prints each run, then the medians over the runs, as JSON.
"""

import json
import statistics
import subprocess
import sys
import time
import types

import numpy as np

from minipaged import LLM, SamplingParams
from minipaged.attention import cpu

BEFORE = "7b9e846"
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3

source = subprocess.run(
    ["git", "show", f"{BEFORE}:minipaged/attention/cpu.py"],
    capture_output=True,
    text=True,
    check=True,
).stdout
before = types.ModuleType("cpu_before")
exec(compile(source, "cpu_before.py", "exec"), before.__dict__)
impls = {"before": before, "after": cpu}

rng = np.random.default_rng(0)
llm = LLM()
vocab = llm.model.config.vocab_size
prompts = {n: rng.integers(100, vocab, n).tolist() for n in (128, 256, 512, 1000)}
race = [
    (
        rng.integers(100, vocab, int(rng.integers(32, 513))).tolist(),
        int(rng.integers(64, 257)),
    )
    for _ in range(32)
]


def engine_with(impl):
    # 16 sequences at most, as at the race's 16 streams; 1 GiB of KV cache (the race's
    # server option) holds 16 contexts of 768 tokens
    engine = llm.new_engine(max_num_seqs=16, kv_cache_memory=1 << 30)
    engine.runner.attention.impl = impl
    return engine


def prompt_step(impl, prompt) -> float:
    """Milliseconds of the step that prefills `prompt` alone."""
    engine = engine_with(impl)
    params = SamplingParams(max_tokens=1, temperature=0)
    engine.add_request("p", {"prompt_token_ids": prompt}, params)
    report = engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    return 1000 * report.seconds


def race_run(impl):
    engine = engine_with(impl)
    for i, (prompt, n) in enumerate(race):
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, params)
    steps, prefill_steps, tokens, outputs = [], [], 0, {}
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        report = engine.step()
        steps.append(report.seconds)
        if any(kind != "decode" for _, _, kind, _ in report.ran):
            prefill_steps.append(report.seconds)
        for out in report.finished:
            outputs[out.request_id] = out.outputs[0].token_ids
            tokens += len(out.outputs[0].token_ids)
    seconds = time.perf_counter() - start
    return {
        "output_tokens_per_s": tokens / seconds,
        "step_ms_p50": 1000 * statistics.median(steps),
        "prefill_step_ms_p50": 1000 * statistics.median(prefill_steps),
        "prefill_steps": len(prefill_steps),
        "steps": len(steps),
        "seconds": seconds,
    }, outputs


prompt_step(cpu, prompts[128])  # warm-up: first-use costs off the record
runs = {name: {"prompts": {n: [] for n in prompts}, "race": []} for name in impls}
answers = {}
for r in range(ROUNDS):
    names = list(impls) if r % 2 == 0 else list(impls)[::-1]
    for n, prompt in prompts.items():
        for name in names:
            ms = prompt_step(impls[name], prompt)
            runs[name]["prompts"][n].append(ms)
            print(name, "prompt", n, f"{ms:.1f} ms", flush=True)
    for name in names:
        result, answers[name] = race_run(impls[name])
        runs[name]["race"].append(result)
        print(name, "race", json.dumps(result), flush=True)

summary = {
    name: {
        "prompt_step_ms_p50": {
            n: statistics.median(times) for n, times in run["prompts"].items()
        },
        "race": {
            key: statistics.median(result[key] for result in run["race"])
            for key in ("output_tokens_per_s", "step_ms_p50", "prefill_step_ms_p50")
        },
    }
    for name, run in runs.items()
}
same = sum(answers["after"][k] == answers["before"][k] for k in answers["after"])
summary["race_greedy_outputs_equal"] = f"{same} of {len(race)}"
print(json.dumps({"rounds": ROUNDS, "runs": runs, "summary": summary}, indent=1))
