"""The CPU's decode attention before and after its rows were reshaped (issue 43), in
the engine's steps, interleaved: `before` is minipaged/attention/cpu.py as committed at
BEFORE (read with git show), `after` the working tree's. Two workloads of 16 requests at
once, greedy, ignore_eos: the race's (prompts of 32-512 random tokens, 64-256 output
tokens) and bench decode's (prompts of 64, 64 output tokens).
    .venv/bin/python bench/results/2026-12-05-cpu-2core-attention-rows/steps.py [ROUNDS]
Prints each run's decode-step medians (all decode steps, and those decoding all 16
sequences) and output tokens/s, then the medians over the runs, as JSON.
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

BEFORE = "1e712bb"
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3

source = subprocess.run(
    ["git", "show", f"{BEFORE}:minipaged/attention/cpu.py"],
    capture_output=True,
    text=True,
    check=True,
).stdout
before = types.ModuleType("cpu_before")
exec(compile(source, "cpu_before.py", "exec"), before.__dict__)

rng = np.random.default_rng(0)
llm = LLM()
vocab = llm.model.config.vocab_size


def race_work():
    return [
        (
            rng.integers(100, vocab, int(rng.integers(32, 513))).tolist(),
            int(rng.integers(64, 257)),
        )
        for _ in range(16)
    ]


workloads = {
    "race": race_work(),
    "decode": [(rng.integers(100, vocab, 64).tolist(), 64) for _ in range(16)],
}


def run(impl, work):
    engine = llm.new_engine()
    engine.runner.attention.impl = impl
    for i, (prompt, n) in enumerate(work):
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, params)
    decode_steps, full_steps, tokens, outputs = [], [], 0, {}
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        report = engine.step()
        if all(kind == "decode" for _, _, kind, _ in report.ran):
            decode_steps.append(report.seconds)
            if len(report.ran) == len(work):
                full_steps.append(report.seconds)
        for out in report.finished:
            outputs[out.request_id] = out.outputs[0].token_ids
            tokens += len(out.outputs[0].token_ids)
    seconds = time.perf_counter() - start
    return {
        "decode_step_ms_p50": 1000 * statistics.median(decode_steps),
        "decode_steps": len(decode_steps),
        # the steps that decode all 16 sequences at once
        "full_step_ms_p50": 1000 * statistics.median(full_steps),
        "full_steps": len(full_steps),
        "output_tokens_per_s": tokens / seconds,
        "seconds": seconds,
    }, outputs


impls = {"before": before, "after": cpu}
runs = {(w, name): [] for w in workloads for name in impls}
answers = {}
run(cpu, workloads["decode"])  # warm-up: first-use costs off the record
for r in range(ROUNDS):
    names = list(impls) if r % 2 == 0 else list(impls)[::-1]
    for w, work in workloads.items():
        for name in names:
            result, outputs = run(impls[name], work)
            runs[w, name].append(result)
            answers[w, name] = outputs
            print(w, name, json.dumps(result), flush=True)

summary = {}
for w in workloads:
    same = sum(
        answers[w, "after"][k] == answers[w, "before"][k] for k in answers[w, "after"]
    )
    summary[w] = {
        name: {
            key: statistics.median(run[key] for run in runs[w, name])
            for key in ("decode_step_ms_p50", "full_step_ms_p50", "output_tokens_per_s")
        }
        for name in impls
    }
    summary[w]["after_over_before_full_step"] = (
        summary[w]["before"]["full_step_ms_p50"]
        / summary[w]["after"]["full_step_ms_p50"]
    )
    summary[w]["greedy_outputs_equal"] = f"{same} of {len(workloads[w])}"
print(
    json.dumps(
        {
            "rounds": ROUNDS,
            "runs": {f"{w} {n}": v for (w, n), v in runs.items()},
            "summary": summary,
        },
        indent=1,
    )
)
