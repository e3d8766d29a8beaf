"""The CPU decode attention of one layer (SmolLM2's 9 query heads over 3 KV heads of
64), warm and right after a 32 MB read, for 1 sequence of 100 positions and for 32
sequences of 300-700 positions on scattered frames: the median of 200 calls, in us.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/results/2026-12-05-cpu-2core-batch1/attention.py
"""

import time

import numpy as np

from minipaged.attention import cpu as attention

rng = np.random.default_rng(0)
block, kv_heads, head_dim, heads = 16, 3, 64, 9
stream = np.ones(8 << 20, np.float32)  # 32 MB


def case(lens):
    frames = int(sum(-(-lens // block))) + 10
    k = rng.standard_normal((frames, block, kv_heads, head_dim)).astype(np.float32)
    v = rng.standard_normal((frames, block, kv_heads, head_dim)).astype(np.float32)
    order, taken = rng.permutation(frames), 0
    tables = np.zeros((len(lens), 64), np.int32)
    for i, n in enumerate(lens):
        used = -(-n // block)
        tables[i, :used] = order[taken : taken + used]
        taken += used
    q = rng.standard_normal((len(lens), heads, head_dim)).astype(np.float32)
    return q, k, v, tables, lens.astype(np.int32)


def median_us(args, flush: bool) -> float:
    times = []
    for _ in range(200):
        if flush:
            float(stream.sum())
        start = time.perf_counter()
        attention.decode(*args, 0.125)
        times.append(time.perf_counter() - start)
    return 1e6 * np.median(times)


for label, lens in (
    ("1 sequence of 100", np.array([100])),
    ("32 sequences of 300-700", rng.integers(300, 700, 32)),
):
    args = case(lens)
    print(
        f"{label}: warm {median_us(args, False):.0f} us,"
        f" after a 32 MB read {median_us(args, True):.0f} us"
    )
