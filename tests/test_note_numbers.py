"""The numbers a note quotes are what the command it names prints, for the commands
that take seconds (issue 42): note 1's shares of KV memory (`bench memory`) and note 7's
fragmentation table (`bench fragmentation --requests 300`). Note 15's come from a
results file (tests/test_kv_dtype.py holds them to it): its command takes minutes.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bench(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "minipaged.bench", *args, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def test_note_1_quotes_bench_memory():
    note = " ".join((ROOT / "docs" / "01_kv_cache_waste.md").read_text().split())
    assert "`python -m minipaged.bench memory`" in note
    result = bench("memory")
    static, paged = result["static"]["utilization"], result["paged"]["utilization"]
    said = (
        f"Reserving 2,048 slots per request, {percent(static)} of the allocated KV"
        f" memory holds tokens"
    )
    assert said in note, said
    said = f"With paging, {percent(paged)} does. The rest, {percent(1 - paged)},"
    assert said in note, said


def test_note_7_quotes_bench_fragmentation():
    note = (ROOT / "docs" / "07_paper.md").read_text()
    command = re.search(
        r"`python -m minipaged\.bench fragmentation( --requests \d+)?`"
        r" prints this table",
        note,
    )
    assert command, "note 7 names the command that prints its fragmentation table"
    result = bench("fragmentation", *command[1].split())
    for allocator, shares in result.items():
        row = f"| {allocator} | {percent(shares['token_states'])} |"
        assert row in note, row
