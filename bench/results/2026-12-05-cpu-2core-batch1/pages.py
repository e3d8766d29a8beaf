"""One core's matrix-vector product over 64 MB of float32 weights in shared memory (a
memfd, as the helper processes share them), read from memory (a 512 MB read between
runs): on 4 KB pages (Python's mmap), then on 2 MB pages (team.map_shared at a 2 MB
boundary, then team.huge_pages). The fastest of 7 runs each, in GB/s.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/results/2026-12-05-cpu-2core-batch1/pages.py
"""

import mmap
import os
import time

import numpy as np

from minipaged.model import team

SIZE, DEPTH = 64 << 20, 576
flush = np.ones(128 << 20, np.float32)  # 512 MB
x = np.ones((1, DEPTH), np.float32)


def gemv_gb_per_s(memory) -> float:
    rows = SIZE // 4 // DEPTH
    w = np.ndarray((rows, DEPTH), np.float32, memory)
    w[...] = 1.0
    out = np.empty((1, rows), np.float32)
    times = []
    for _ in range(7):
        float(flush.sum())
        start = time.perf_counter()
        np.matmul(x, w.T, out=out)
        times.append(time.perf_counter() - start)
    return w.nbytes / min(times) / 1e9


for label in ("4 KB pages", "2 MB pages", "4 KB pages", "2 MB pages"):
    fd = os.memfd_create("pages")
    os.ftruncate(fd, SIZE)
    if label == "4 KB pages":
        memory = mmap.mmap(fd, SIZE)
        took = ""
    else:
        memory = team.map_shared(fd, SIZE)
        took = f" (huge_pages: {team.huge_pages(memory, 0, SIZE)})"
    print(f"{label}: {gemv_gb_per_s(memory):.1f} GB/s{took}")
    os.close(fd)
