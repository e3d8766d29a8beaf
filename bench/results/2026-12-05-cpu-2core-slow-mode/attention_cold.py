"""One sequence's decode attention for one layer (SmolLM2's 9 query heads, 3 KV heads
of 64, 100 positions), timed warm and right after 32 MB were read: in a decode step of
one stream the weights stream through the caches between every two layers, and the
small NumPy calls between the products run with cold caches.

    .venv/bin/python bench/results/2026-12-05-cpu-2core-slow-mode/attention_cold.py
"""

import time

import numpy as np

from minipaged.attention import cpu as attention

rng = np.random.default_rng(0)
layers, frames, block, kv_heads, head_dim, heads = 30, 2700, 16, 3, 64, 9
k = np.zeros((layers, frames, block, kv_heads, head_dim), np.float32)
v = np.zeros_like(k)
k[:, :8] = rng.standard_normal((layers, 8, block, kv_heads, head_dim))
v[:, :8] = rng.standard_normal((layers, 8, block, kv_heads, head_dim))
table, lens = np.arange(8, dtype=np.int32)[None], np.array([100])
q = rng.standard_normal((1, heads, head_dim)).astype(np.float32)
stream = np.ones(8 << 20, np.float32)  # 32 MB


def one_layer(layer: int, flush: bool) -> float:
    if flush:
        float(stream.sum())
    start = time.perf_counter()
    attention.decode(q, k[layer], v[layer], table, lens, 0.125)
    return time.perf_counter() - start


for flush in (False, True):
    times = [one_layer(i % layers, flush) for i in range(600)]
    what = "after a 32 MB read" if flush else "warm"
    print(f"decode, one sequence, one layer, {what}: {1e6 * np.median(times):.0f} us")
