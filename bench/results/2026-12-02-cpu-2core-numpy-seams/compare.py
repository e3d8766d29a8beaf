#!/usr/bin/env python3
"""Compare the lecture series' benchmark JSON files of two folders on their deterministic fields.

Usage:
    python compare.py BEFORE_DIR AFTER_DIR [--second-suffix SUFFIX] [--spec FILE]
                      [--only NAME ...] [--ignore GLOB ...] [--rel-tol X]

  BEFORE_DIR/NAME.json is compared with AFTER_DIR/NAME{SUFFIX}.json for every benchmark NAME
  (replacement thrashing scheduling drum speculative fragmentation sharing throughput simulate).
  SUFFIX is '' by default; '.run2' or 'run2' (a leading dot is added) compares a folder's
  second run, e.g. the self-check:
      python compare.py BEFORE BEFORE --second-suffix run2 (a folder holding two runs)
  and the refactor check (after running COMMANDS.sh with OUT=/tmp/series-after on the new code):
      python compare.py before /tmp/series-after

Which fields are deterministic: the leaves (JSON paths such as
`engine.memories.128.greedy.2.preemptions` or `policies.lru.hit_rate[3]`) that were identical
in the before folder's two runs, NAME.json and NAME.run2.json. They are read from --spec
(default: deterministic.json next to this script, written by `--write-spec`), or, when that
file is missing, derived from BEFORE_DIR/NAME.json and BEFORE_DIR/NAME.run2.json on the fly.
Wall-clock fields (they differed between the two runs) are not compared.

For each benchmark it prints `NAME: EQUAL (n deterministic fields)`, or the differing fields
with both values (and fields missing on either side). Exit status 0 when all are equal, 1 when
any differ, 2 when a file is missing.

  --ignore GLOB   also skip paths matching this fnmatch pattern (repeatable). Never compared anyway
                  (EXCLUDED below): blas_threads (fitted to the idle cores: environment) and
                  thrashing's engine best_max_num_seqs / *_over_best (picked by wall-clock goodput)
  --rel-tol X     numbers equal within a relative tolerance X (default 0: exact, as they were
                  between the two before runs)
  --write-spec    derive the deterministic field lists from BEFORE_DIR's NAME.json and
                  NAME.run2.json and write them to --spec, then compare as usual
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import re
import sys

BENCHMARKS = ["replacement", "thrashing", "scheduling", "drum", "speculative", "fragmentation", "sharing",
              "throughput", "simulate"]
HERE = os.path.dirname(os.path.abspath(__file__))
MISSING = object()
# Never compared, though they may match between two runs: the BLAS threads fitted to the idle cores
# (environment, not a result) and choices made on wall-clock figures that happened to agree.
# (Regular expressions, matched against the whole path.)
EXCLUDED = {"*": [r"(.*\.)?blas_threads"],
            "thrashing": [r"engine\.memories\.[^.]+\.(best_max_num_seqs|largest_over_best|working_set_over_best)"]}


def flatten(value, path: str = "", out: dict | None = None) -> dict:
    """{json path: leaf value}; dict keys joined with '.', list items as [i]. Empty containers are leaves."""
    out = {} if out is None else out
    if isinstance(value, dict) and value:
        for k, v in value.items():
            flatten(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            flatten(v, f"{path}[{i}]", out)
    else:
        out[path] = value
    return out


def same(a, b, rel_tol: float = 0.0) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True
        return a == b or (rel_tol > 0 and math.isclose(a, b, rel_tol=rel_tol))
    return a == b


def load(path: str):
    with open(path) as f:
        return json.load(f)


def deterministic_paths(run1: dict, run2: dict) -> tuple[list[str], list[str]]:
    """(paths identical in both runs, paths that differ or exist in one only)."""
    a, b = flatten(run1), flatten(run2)
    keys = list(a) + [k for k in b if k not in a]
    equal = [k for k in keys if k in a and k in b and same(a[k], b[k])]
    varying = [k for k in keys if k not in equal]
    return equal, varying


def derive_spec(before: str, names: list[str]) -> dict:
    spec = {}
    for name in names:
        p1, p2 = os.path.join(before, f"{name}.json"), os.path.join(before, f"{name}.run2.json")
        if os.path.exists(p1) and os.path.exists(p2):
            equal, varying = deterministic_paths(load(p1), load(p2))
            globs = EXCLUDED["*"] + EXCLUDED.get(name, [])
            excluded = [k for k in equal if any(re.fullmatch(g, k) for g in globs)]
            spec[name] = {"deterministic": [k for k in equal if k not in excluded], "excluded": excluded,
                          "varying": varying}
    return spec


def show(value) -> str:
    text = json.dumps(value) if value is not MISSING else "<missing>"
    return text if len(text) <= 200 else text[:200] + "..."


def compare(name: str, a_path: str, b_path: str, fields: list[str], ignore: list[str], rel_tol: float) -> int:
    for p in (a_path, b_path):
        if not os.path.exists(p):
            print(f"{name}: MISSING FILE {p}")
            return 2
    a, b = flatten(load(a_path)), flatten(load(b_path))
    if "error" in b and "error" not in a:
        print(f"{name}: the second file is an error: {b['error']}")
        return 1
    checked = [f for f in fields if not any(fnmatch.fnmatch(f, g) for g in ignore)]
    diffs = [(f, a.get(f, MISSING), b.get(f, MISSING)) for f in checked
             if f not in a or f not in b or not same(a[f], b[f], rel_tol)]
    if not diffs:
        print(f"{name}: EQUAL ({len(checked)} deterministic fields)")
        return 0
    print(f"{name}: DIFFERENT in {len(diffs)} of {len(checked)} deterministic fields")
    for f, x, y in diffs:
        print(f"    {f}: {show(x)}  !=  {show(y)}")
    return 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Compare two folders of benchmark JSON on their deterministic "
                                                 "fields (see the top of this file).")
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--second-suffix", default="",
                        help="suffix of the second folder's files: NAME{suffix}.json (e.g. run2)")
    parser.add_argument("--spec", default=os.path.join(HERE, "deterministic.json"))
    parser.add_argument("--write-spec", action="store_true")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, default=BENCHMARKS)
    parser.add_argument("--ignore", action="append", default=None)
    parser.add_argument("--rel-tol", type=float, default=0.0)
    args = parser.parse_args(argv)
    suffix = args.second_suffix
    if suffix and not suffix.startswith("."):
        suffix = "." + suffix
    ignore = args.ignore or []

    if args.write_spec:
        spec = derive_spec(args.before, BENCHMARKS)
        with open(args.spec, "w") as f:
            json.dump(spec, f, indent=1)
        print(f"wrote {args.spec}")
    elif os.path.exists(args.spec):
        spec = load(args.spec)
    else:
        spec = derive_spec(args.before, args.only)
        print(f"(no {args.spec}: deterministic fields derived from {args.before}/NAME.json vs NAME.run2.json)")

    worst = 0
    for name in args.only:
        if name not in spec:
            print(f"{name}: no deterministic field list (need {args.before}/{name}.json and {name}.run2.json)")
            worst = max(worst, 2)
            continue
        rc = compare(name, os.path.join(args.before, f"{name}.json"), os.path.join(args.after, f"{name}{suffix}.json"),
                     spec[name]["deterministic"], ignore, args.rel_tol)
        worst = max(worst, rc)
    print("ALL EQUAL" if worst == 0 else "NOT ALL EQUAL")
    return worst


if __name__ == "__main__":
    sys.exit(main())
