"""Rehearse docs/workshop.md on this machine: run each block's commands in the plan's
order, as a lecturer and an attendee would type them, and time them.

The chat's first answer; each notebook run top to bottom (its exercises' solutions too,
as the room would try them); each lab's check of the built-in solution; the lecturer's
server started with the plan's options and the room's client script sent by 8 attendees
at once; the static "before" server and its padding rows. Prints a markdown table and
writes it with a JSON copy:

    .venv/bin/python scripts/rehearse_workshop.py [--out bench/results/DATE-rehearsal]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
# docs/workshop.md, "Serving the room": the lecturer's command, less make and --host
# (local here)
ROOM = ["--api-key", "room42", "--num-blocks", "96"]
# the restart for static batching, in place of --num-blocks 96 (which holds one region)
STATIC = ["--api-key", "room42", "--scheduler", "static", "--max-model-len", "1024"]


def timed(name: str, work) -> dict:
    start = time.perf_counter()
    try:
        detail = work()
    except Exception as error:  # noqa: BLE001 - a block that fails is part of the rehearsal's report
        detail = f"FAILED: {type(error).__name__}: {str(error)[:200]}"
    row = {
        "block": name,
        "seconds": round(time.perf_counter() - start, 1),
        "detail": detail or "",
    }
    print(f"| {row['block']} | {row['seconds']} s | {row['detail']} |", flush=True)
    return row


def chat() -> str:
    result = subprocess.run(
        [PY, "-m", "minipaged.chat"],
        input="What is a page table?\n",
        text=True,
        capture_output=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return f"{len(result.stdout.split())} words answered"


def notebook(path: Path):
    def run() -> str:
        import nbformat
        from nbclient import NotebookClient

        nb = nbformat.read(path, as_version=4)
        folded = re.compile(
            r"<details><summary>Solution \d+</summary>\n\n```python\n(.+?)\n```", re.S
        )
        codes = [
            m.group(1)
            for c in nb.cells
            if c.cell_type == "markdown"
            for m in [folded.search(c.source)]
            if m
        ]
        nb.cells += [nbformat.v4.new_code_cell(code) for code in codes]
        NotebookClient(
            nb,
            timeout=600,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
        return (
            f"{sum(c.cell_type == 'code' for c in nb.cells)} code cells, {len(codes)}"
            " solutions"
        )

    return run


def lab(number: int):
    def run() -> str:
        result = subprocess.run(
            [PY, "-m", "minipaged.lab", "check", str(number), "--solution"],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )
        return (
            f"exit {result.returncode}:"
            f" {(result.stdout.strip().splitlines() or [''])[-1][:90]}"
        )

    return run


def serve_room(options: list[str], clients: int = 8):
    def run() -> str:
        server = subprocess.Popen(
            [PY, "-m", "minipaged.serve", "--port", "0", *options],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        try:
            base = wait_for_address(server)
            started = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                times = list(pool.map(lambda i: ask(base, i), range(clients)))
            seen = metrics(
                base, ("num_preemptions", "prefix_cache_hits", "prefix_cache_queries")
            )
            return (
                f"{clients} clients answered in {min(times):.0f}-{max(times):.0f} s "
                f"(all within {time.perf_counter() - started:.0f} s); "
                + ", ".join(f"{name} {value:g}" for name, value in seen.items())
            )
        finally:
            server.terminate()
            server.wait(timeout=30)

    return run


def wait_for_address(server) -> str:
    deadline = time.monotonic() + 300
    for line in server.stdout:
        found = re.search(r"(http://127\.0\.0\.1:\d+)/v1", line)
        if found:
            return found.group(1)
        if time.monotonic() > deadline:
            break
    raise RuntimeError("the server printed no address")


def metrics(base: str, names) -> dict:
    """The server's Prometheus counters by name (their `minipaged:` prefix and `_total`
    dropped)."""
    request = urllib.request.Request(
        f"{base}/metrics", headers={"Authorization": "Bearer room42"}
    )
    text = urllib.request.urlopen(request, timeout=30).read().decode()
    found = {}
    for name in names:
        values = re.findall(
            rf"^minipaged:{name}(?:_total)?(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M
        )
        found[name] = sum(map(float, values))
    return found


def ask(base: str, i: int) -> float:
    """The room's client script of docs/workshop.md, with the official openai client.
    Each attendee connects from an address of its own (127.0.0.2, .3, ...: a laptop of
    the room), as the server's per-client share counts an address and its key."""
    import httpx
    from openai import OpenAI

    start = time.perf_counter()
    laptop = httpx.Client(
        transport=httpx.HTTPTransport(local_address=f"127.0.0.{2 + i}"), timeout=600
    )
    client = OpenAI(
        base_url=f"{base}/v1", api_key="room42", max_retries=20, http_client=laptop
    )
    model = client.models.list().data[0].id
    client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"What is a page table? ({i})"}],
        max_tokens=200,
        temperature=0.7,
    )
    return time.perf_counter() - start


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for rehearsal.md and rehearsal.json",
    )
    parser.add_argument(
        "--only",
        default="",
        help="run only the blocks whose name holds this text (e.g. room)",
    )
    args = parser.parse_args()
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    print("| block | run time | what ran |\n| --- | --- | --- |")
    blocks = [("welcome: make chat, first answer", chat)]
    labs = {2: [1], 4: [2, 3], 5: [4], 3: [5]}  # notebook -> the labs that end it
    # the plan's blocks 1-7
    for path in sorted((ROOT / "notebooks").glob("0[1-7]_*.ipynb")):
        blocks.append((f"notebook {path.stem}", notebook(path)))
        blocks += [
            (f"lab {number} check --solution", lab(number))
            for number in labs.get(int(path.stem[:2]), [])
        ]
    blocks += [
        ("serving the room (paged)", serve_room(ROOM)),
        ("serving the room (static, before)", serve_room(STATIC)),
    ]
    rows = [timed(name, work) for name, work in blocks if args.only in name]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "rehearsal.json").write_text(json.dumps(rows, indent=2) + "\n")
        table = ["| block | run time | what ran |", "| --- | --- | --- |"]
        table += [f"| {r['block']} | {r['seconds']} s | {r['detail']} |" for r in rows]
        (args.out / "rehearsal.md").write_text("\n".join(table) + "\n")
