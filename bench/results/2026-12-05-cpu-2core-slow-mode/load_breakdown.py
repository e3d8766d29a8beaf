"""The race's workload in process, without HTTP: 2 x C requests (prompts of 32-512
random tokens, answers of 64-256, ignore_eos), at most C running, stepped by the engine
with the helper processes a server starts. Prints tokens/s and where the forward
pass's time went, in core-milliseconds per output token (2 cores x wall time).

    .venv/bin/python bench/results/2026-12-05-cpu-2core-slow-mode/load_breakdown.py 32
"""

import collections
import sys
import time

import numpy as np

from minipaged import LLM, SamplingParams
from minipaged.model import cpu, llama

C = int(sys.argv[1]) if len(sys.argv) > 1 else 32
llm = LLM(max_num_seqs=64, kv_cache_memory=1 << 30, max_model_len=1024)
print(llm.use_cores("fit"), file=sys.stderr)
spent = collections.Counter()


def timed(owner, name, label):
    """Wrap owner.name so that its time adds up under label(*args)."""
    inner = getattr(owner, name)

    def call(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label(*args)] += time.perf_counter() - start

    setattr(owner, name, call)


timed(
    cpu.PanelWeight,
    "__rmatmul__",
    lambda w, x: "products, 48 rows or more" if len(x) >= 48 else "products, < 48 rows",
)
attention = llm.engine.runner.attention
for name in ("decode", "prefill", "write_kv"):
    timed(attention.impl, name, lambda *a, name=name: f"attention {name}")
for name in ("rms_norm", "apply_rope", "silu"):
    timed(llama, name, lambda *a, name=name: name)
timed(llm.engine.model, "forward", lambda *a: "forward, all of it")

rng = np.random.default_rng(1)
waiting = [
    (int(rng.integers(32, 513)), int(rng.integers(64, 257))) for _ in range(2 * C)
]
running = tokens = 0


def add() -> None:
    global running
    prompt_len, answer_len = waiting.pop()
    prompt = {"prompt_token_ids": rng.integers(0, 40000, prompt_len).tolist()}
    params = SamplingParams(max_tokens=answer_len, temperature=0, ignore_eos=True)
    llm.engine.add_request(f"r{len(waiting)}", prompt, params)
    running += 1


while running < C and waiting:
    add()
start = time.perf_counter()
while llm.engine.has_unfinished_requests():
    for output in llm.engine.step().finished:
        running -= 1
        tokens += len(output.outputs[0].token_ids)
        if waiting:
            add()
wall = time.perf_counter() - start
print(f"C={C}: {tokens} tokens in {wall:.1f} s, {tokens / wall:.1f} tok/s")
for label, seconds in spent.most_common():
    print(
        f"  {label:28s} {seconds:6.2f} s  {2000 * seconds / tokens:5.2f} core-ms/token"
    )
