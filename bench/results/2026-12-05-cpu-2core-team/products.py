"""A decode step's products by SmolLM2-135M's shapes (random float32 weights, 121
products), four ways, interleaved, medians of `repeats` passes: panels on one core,
panels split with the helper thread (model/cpu.py's _split), panels split with a helper
process (model/team.py), and BLAS's GEMM on 2 threads. Each way has the cores to itself
(0.3 s of rest before it) and one untimed pass, then the timed one.

    .venv/bin/python bench/results/2026-12-05-cpu-2core-team/products.py 7
"""

import json
import statistics
import sys
import time

import numpy as np

from minipaged.model import cpu, team

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)] * 30 + [(576, 49152)]


def main(repeats: int) -> None:
    rng = np.random.default_rng(0)
    weights = [
        cpu.PanelWeight(rng.standard_normal(s, dtype=np.float32) * 0.02) for s in SHAPES
    ]
    xs = {n: rng.standard_normal((64, n), dtype=np.float32) for n in (576, 1536)}
    cpu.use_cores("all")
    print(cpu.start_team(weights, 1), file=sys.stderr)
    helper = cpu._team

    def threads(on):
        for controller in cpu._blas_controllers():
            controller.set_num_threads(2 if on else 1)
        # the helper process stops spinning after SPIN idle seconds, BLAS's threads
        # after a while too: each way starts with the cores to itself
        time.sleep(0.3)

    ways = {
        "panels, one core": lambda w, x: w.by_panels(x, cores=1),
        "panels, helper thread": lambda w, x: w.by_panels(x, cores=2),
        "panels, helper process": lambda w, x: helper.product(w, x, 2, team.PANELS),
        "gemm, 2 BLAS threads": lambda w, x: x @ w.dense(),
    }
    results = []
    for rows in (1, 2, 8, 16, 24, 32):
        times = {name: [] for name in ways}
        for _ in range(repeats):
            for name, way in ways.items():
                # BLAS's own threads only where they run alone
                threads(name.startswith("gemm"))
                for w in weights:  # an untimed pass: a helper wakes, runs warm
                    way(w, xs[w.shape[0]][:rows])
                start = time.perf_counter()
                for w in weights:
                    way(w, xs[w.shape[0]][:rows])
                times[name].append(time.perf_counter() - start)
        threads(False)
        row = {"rows": rows} | {
            name: round(1000 * statistics.median(t), 1) for name, t in times.items()
        }
        results.append(row)
        print(row, file=sys.stderr)
    cpu.stop_team()
    print(json.dumps({"processor": cpu.processor_name(), "results": results}, indent=1))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
