"""The suite's results (results/*.jsonl) as a table: per library, calls that worked,
and the failures, each with its error."""

import json
import sys
from collections import Counter

rows = [
    json.loads(line)
    for path in sys.argv[1:]
    for line in open(path)
    if line.startswith("{")
]
per_lib, ok = Counter(), Counter()
for row in rows:
    per_lib[row["lib"]] += 1
    ok[row["lib"]] += row["ok"]
print("| library | calls | worked |")
print("| --- | --- | --- |")
for lib in per_lib:
    print(f"| {lib.removesuffix('_client')} | {per_lib[lib]} | {ok[lib]} |")
print(f"| **all** | {sum(per_lib.values())} | {sum(ok.values())} |")
for row in rows:
    if not row["ok"]:
        lib = row["lib"].removesuffix("_client")
        print(f"- {lib}: {row['call']}: {row['error'][:300]}")
