"""The before/after tables of this folder's README, from its JSON files:
python bench/results/2026-12-02-cpu-2core-numpy-decode/compare.py"""

import json
import pathlib
import re
import statistics

HERE = pathlib.Path(__file__).parent


def runs(side: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(HERE.glob(f"decode-{side}-*.json"))]


def decode_table() -> None:
    print("| batch | before: step | tok/s | share of limit | vs batch 1 | after: step | tok/s | share of limit | vs batch 1 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    sides = {side: runs(side) for side in ("before", "after")}
    batches = [r["batch"] for r in sides["after"][0]["runs"]]
    one = {side: statistics.median(run["runs"][0]["tokens_per_s"] for run in rs) for side, rs in sides.items()}
    for i, batch in enumerate(batches):
        cells = []
        for side, rs in sides.items():
            step = statistics.median(run["runs"][i]["step_ms"] for run in rs)
            tps = statistics.median(run["runs"][i]["tokens_per_s"] for run in rs)
            share = statistics.median(run["runs"][i]["limit_ms"] / run["runs"][i]["step_ms"] for run in rs)
            cells += [f"{step:.1f} ms", f"{tps:.1f}", f"{share:.0%}", f"{tps / one[side]:.2f}x"]
        print(f"| {batch} | " + " | ".join(cells) + " |")
    limits = [run["runs"][0]["limit_ms"] for rs in sides.values() for run in rs]
    print(f"\n(medians of {len(sides['before'])} runs each; the limit, measured in each run: "
          f"{min(limits):.1f}-{max(limits):.1f} ms)")


def serve_table() -> None:
    print("\n| workload | figure | before | after |")
    print("| --- | --- | --- | --- |")
    for name in ("serve", "room"):
        before, after = (json.loads((HERE / f"{name}-{side}.json").read_text()) for side in ("before", "after"))
        for key, value in flat(after):
            if key in dict(flat(before)) and isinstance(value, (int, float)) and not isinstance(value, bool):
                old = dict(flat(before))[key]
                if any(word in key for word in ("tokens_per_s", "p50", "p99", "share", "vs")):
                    print(f"| {name} | {key} | {old:.3g} | {value:.3g} |")


def flat(d: dict, prefix: str = ""):
    for key, value in d.items():
        if isinstance(value, dict):
            yield from flat(value, f"{prefix}{key}.")
        elif not isinstance(value, list):
            yield f"{prefix}{key}", value


def chat_table() -> None:
    print("\n| answer | before: first token | tok/s | after: first token | tok/s |")
    print("| --- | --- | --- | --- | --- |")
    pattern = re.compile(r"\[(\d+) tokens, first in ([\d.]+) s, ([\d.]+) tok/s")
    rows = {side: pattern.findall((HERE / f"chat-{side}.txt").read_text()) for side in ("before", "after")}
    for (n, f0, t0), (_, f1, t1) in zip(rows["before"], rows["after"]):
        print(f"| {n} tokens | {f0} s | {t0} | {f1} s | {t1} |")


if __name__ == "__main__":
    decode_table()
    chat_table()
    serve_table()
