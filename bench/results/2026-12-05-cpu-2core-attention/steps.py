"""The engine's steps with each CPU attention, interleaved: the reference's decode
(every sequence padded to the longest context) and minipaged.attention.cpu's (one
sequence at a time over exactly its frames), on the race's workload (16 requests at
once, prompts of 32-512 random tokens, 64-256 output tokens, greedy, ignore_eos).
    .venv/bin/python bench/results/2026-12-05-cpu-2core-attention/steps.py [ROUNDS]
Prints each run's decode-step medians (all decode steps, and those decoding all 16
sequences) and output tokens/s, then the medians over the runs, as JSON.
"""

import json
import statistics
import sys
import time

import numpy as np

from minipaged import LLM, SamplingParams
from minipaged.attention import cpu, reference

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
rng = np.random.default_rng(0)
llm = LLM()
vocab = llm.model.config.vocab_size
work = [
    (
        rng.integers(100, vocab, int(rng.integers(32, 513))).tolist(),
        int(rng.integers(64, 257)),
    )
    for _ in range(16)
]


def run(impl):
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


impls = {"reference": reference, "cpu": cpu}
runs = {name: [] for name in impls}
answers = {}
run(cpu)  # warm-up: first-use costs off the record
for r in range(ROUNDS):
    names = list(impls) if r % 2 == 0 else list(impls)[::-1]
    for name in names:
        result, outputs = run(impls[name])
        runs[name].append(result)
        answers[name] = outputs
        print(name, json.dumps(result), flush=True)

same = sum(answers["cpu"][k] == answers["reference"][k] for k in answers["cpu"])
summary = {
    name: {
        key: statistics.median(run[key] for run in results)
        for key in ("decode_step_ms_p50", "full_step_ms_p50", "output_tokens_per_s")
    }
    for name, results in runs.items()
}
summary["cpu_over_reference_tokens_per_s"] = (
    summary["cpu"]["output_tokens_per_s"] / summary["reference"]["output_tokens_per_s"]
)
summary["greedy_outputs_equal"] = f"{same} of {len(work)}"
print(json.dumps({"rounds": ROUNDS, "runs": runs, "summary": summary}, indent=1))
