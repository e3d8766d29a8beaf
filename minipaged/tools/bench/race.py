"""`python -m minipaged.bench race`: any OpenAI-compatible servers, one at a time, on
the same random workload.

Each server is a command this benchmark starts and stops, or a URL with the PID of one
running. Per concurrency: output tokens/s, TTFT and TPOT p50/p99, the CPU time per
output token of the server's process tree (/proc) and the CPU other programs took.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minipaged.llm import number
from minipaged.tools.bench.common import OptionError, random_prompts
from minipaged.tools.bench.serve import send_all
from minipaged.tools.bench.workload import RequestSpec

# the workload's seed: every run of the race sends the same requests
SEED = 0
EXAMPLE = (
    "minipaged=python -m minipaged.serve --model {model} --port {port}"
    " --max-num-seqs 32"
)


@dataclass(slots=True)
class Contestant:
    """One server of the race: started from `command` ({port} and {model} filled in),
    or already running at `url` as process `pid` (None: its CPU time is not known)."""

    name: str
    command: list[str] | None = None
    url: str | None = None
    pid: int | None = None


def contestant(text: str) -> Contestant:
    """--server NAME=COMMAND or NAME=URL[,PID], checked before any work."""
    import argparse

    name, _, rest = text.partition("=")
    if not name or not rest.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r}: write NAME=COMMAND (e.g. '{EXAMPLE}') or"
            " NAME=http://127.0.0.1:8000,PID"
        )
    rest = rest.strip()
    if not rest.startswith(("http://", "https://")):
        if "{port}" not in rest:
            raise argparse.ArgumentTypeError(
                f"{text!r}: the command must say where to listen with {{port}}"
                " (a free port is put there), e.g. '--port {port}'"
            )
        return Contestant(name, command=shlex.split(rest))
    url, _, pid = rest.partition(",")
    if pid and not pid.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: {pid!r} is not a process id")
    return Contestant(name, url=url.rstrip("/"), pid=int(pid) if pid else None)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--server",
        type=contestant,
        action="append",
        default=[],
        metavar="NAME=COMMAND|NAME=URL[,PID]",
        help=(
            "a server of the race (give it again for each): a command that this"
            " benchmark starts in a process group of its own, waits for (GET"
            " /v1/models) and stops after its turn, with {port} and {model} filled in,"
            f" e.g. '{EXAMPLE}'; or the URL of one already running, with its PID for"
            " its CPU time"
        ),
    )
    parser.add_argument(
        "--model",
        default=None,
        help=(
            "the model folder the servers serve: {model} in a command, and its"
            " config.json's vocabulary for the random prompts (default: SmolLM2's"
            " folder as minipaged loads it, converted from the GGUF offline)"
        ),
    )
    parser.add_argument(
        "--concurrency",
        type=number(int, 1),
        nargs="+",
        default=[1, 8, 16, 32],
        help="requests in flight at once, one measurement each (default %(default)s)",
    )
    parser.add_argument(
        "--requests-per-stream",
        type=number(int, 1),
        default=2,
        help=(
            "requests of a measurement per stream in flight: 2 at concurrency 16 is"
            " 32 requests (default %(default)s)"
        ),
    )
    parser.add_argument(
        "--prompt-len",
        type=number(int, 1),
        nargs=2,
        default=[32, 512],
        metavar=("MIN", "MAX"),
        help="prompt tokens, uniform between MIN and MAX (default %(default)s)",
    )
    parser.add_argument(
        "--output-len",
        type=number(int, 1),
        nargs=2,
        default=[64, 256],
        metavar=("MIN", "MAX"),
        help=(
            "output tokens, uniform between MIN and MAX, ignore_eos (default"
            " %(default)s)"
        ),
    )
    parser.add_argument(
        "--rounds",
        type=number(int, 1),
        default=1,
        help=(
            "times each server runs every concurrency, in turn (the order reversed"
            " every other round); the table shows medians (default %(default)s)"
        ),
    )
    parser.add_argument(
        "--greedy-tokens",
        type=number(int, 1),
        default=48,
        help=(
            f"each server's greedy answer (temperature 0) to {len(GREEDY_COMPLETIONS)}"
            f" completions and {len(GREEDY_CHATS)} chats, at most this many tokens"
            " each, compared between the servers (default %(default)s)"
        ),
    )
    parser.add_argument(
        "--no-greedy",
        dest="greedy",
        action="store_false",
        help="skip the greedy comparison",
    )
    parser.add_argument(
        "--start-timeout",
        type=number(float, above=0),
        default=600.0,
        help="seconds a started server may take to answer (default %(default)s)",
    )


def workload(args, vocab: int, concurrency: int):
    """(prompts as token ids, max_tokens of each) of one measurement: the same for every
    server."""
    rng = np.random.default_rng([SEED, concurrency])
    count = concurrency * args.requests_per_stream
    lows, highs = args.prompt_len, args.output_len
    specs = [
        RequestSpec(
            int(rng.integers(lows[0], lows[1] + 1)),
            int(rng.integers(highs[0], highs[1] + 1)),
        )
        for _ in range(count)
    ]
    prompts = random_prompts(specs, SEED + concurrency, vocab)
    return prompts, [s.output_len for s in specs]


# ---- CPU time of a process tree, from /proc (Linux) ---------------------------------


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        # after the command name, which may hold spaces: state, ppid, ...
        return f.read().rsplit(")", 1)[1].split()


def tree_cpu_seconds(root: int) -> float | None:
    """User + system CPU seconds of `root` and every process below it, with what their
    reaped children spent; None where /proc cannot tell (not Linux, no such process)."""
    parents = {}
    times = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            fields = _stat_fields(int(entry))
        except OSError:  # it ended while we looked
            continue
        # utime, stime, cutime, cstime: fields 14-17 of stat(5), in clock ticks
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(v) for v in fields[11:15])
    if root not in times:
        return None
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        tree.update(children)
        frontier += children
    return sum(times[pid] for pid in tree) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float | None:
    """CPU seconds every core of the machine spent busy since boot (/proc/stat)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


# ---- a server's turn -----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def served_model(url: str) -> str | None:
    """The first model id GET /v1/models names, or None while the server cannot
    answer."""
    import httpx

    try:
        response = httpx.get(f"{url}/v1/models", timeout=5)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return response.json()["data"][0]["id"]


def start(server: Contestant, args, model_folder: str, log) -> tuple:
    """(process, url, model id): the command started in a process group of its own,
    once GET /v1/models answers; a RuntimeError with the end of its log if it exits or
    stays silent past --start-timeout."""
    port = free_port()
    command = [
        part.replace("{port}", str(port)).replace("{model}", model_folder)
        for part in server.command
    ]
    process = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline and process.poll() is None:
        model = served_model(url)
        if model:
            return process, url, model
        time.sleep(0.5)
    stop(process)
    log.flush()
    tail = Path(log.name).read_text(errors="replace")[-3000:]
    raise RuntimeError(
        f"{server.name} did not answer at {url} within {args.start_timeout:.0f} s"
        f" ({shlex.join(command)}):\n{tail}"
    )


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (its workers too), SIGKILL after 30 s."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def measure(url: str, model: str, pid: int | None, prompts, max_tokens, c) -> dict:
    """One measurement at concurrency c: the client's figures (serve.send_all), the
    server tree's CPU seconds per output token and cores used, the cores other programs
    kept busy meanwhile (not the server, not this client) and the load average."""
    cpu_before = tree_cpu_seconds(pid) if pid else None
    busy_before = machine_busy_seconds()
    own_before = own_cpu_seconds()
    start = time.perf_counter()
    result = asyncio.run(
        send_all(url, prompts, max_tokens, [0.0] * len(prompts), model, c)
    )
    wall = time.perf_counter() - start
    cpu_after = tree_cpu_seconds(pid) if pid else None
    busy_after = machine_busy_seconds()
    own = own_cpu_seconds() - own_before
    result |= {
        "concurrency": c,
        "requests": len(prompts),
        "expected_tokens": sum(max_tokens),
        "load_average": os.getloadavg()[0],
        "client_cores": own / wall,
    }
    if cpu_before is not None and cpu_after is not None:
        server = cpu_after - cpu_before
        result["server_cpu_seconds"] = server
        result["cpu_ms_per_token"] = 1000 * server / max(1, result["tokens"])
        result["server_cores"] = server / wall
        if busy_before is not None:
            others = busy_after - busy_before - server - own
            result["other_cores"] = max(0.0, others / wall)
    return result


def warm_up(url: str, model: str, vocab: int) -> None:
    """Two short requests: first-use costs (compilation, caches) out of the figures."""
    prompts = random_prompts([RequestSpec(16, 4), RequestSpec(48, 4)], 12345, vocab)
    asyncio.run(send_all(url, prompts, [4, 4], [0.0, 0.0], model, 2))


def turn(server: Contestant, args, model_folder: str, vocab: int) -> tuple[dict, list]:
    """Every concurrency of the race on this server, started for it and stopped after
    it when it is a command: ({concurrency: figures}, its greedy answers)."""
    results = {}
    with tempfile.NamedTemporaryFile(
        "w", prefix=f"race-{server.name}-", suffix=".log", delete=False
    ) as log:
        process = None
        url = server.url
        pid = server.pid
        if server.command:
            process, url, model = start(server, args, model_folder, log)
            pid = process.pid
        else:
            model = served_model(url)
            if model is None:
                raise OptionError(
                    f"--server {server.name}: no answer at {url}/v1/models"
                )
        try:
            warm_up(url, model, vocab)
            answers = []
            if args.greedy:
                answers = greedy_answers(url, model, args.greedy_tokens)
            for c in args.concurrency:
                prompts, max_tokens = workload(args, vocab, c)
                print(
                    f"race: {server.name}, concurrency {c}, {len(prompts)} requests"
                    " ...",
                    file=sys.stderr,
                    flush=True,
                )
                results[c] = measure(url, model, pid, prompts, max_tokens, c)
        finally:
            if process is not None:
                stop(process)
    os.unlink(log.name)  # kept only when the server failed (start() shows its end)
    return results, answers


# the greedy comparison: completions of text, and chats through the model's template
GREEDY_COMPLETIONS = [
    "The capital of France is",
    "A page table maps",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "Water boils at",
    "The largest planet in our solar system is",
]
GREEDY_CHATS = [
    "What is a page table?",
    "Name three fruits.",
    "Write a haiku about memory.",
    "Explain continuous batching in one sentence.",
]


def greedy_answers(url: str, model: str, max_tokens: int) -> list[str]:
    """The text of each greedy prompt's answer (temperature 0, max_tokens tokens unless
    the model ends it), one request at a time."""
    import httpx

    common = {"model": model, "max_tokens": max_tokens, "temperature": 0}
    texts = []
    with httpx.Client(base_url=url, timeout=600) as http:
        for prompt in GREEDY_COMPLETIONS:
            body = common | {"prompt": prompt}
            answer = http.post("/v1/completions", json=body).raise_for_status()
            texts.append(answer.json()["choices"][0]["text"])
        for prompt in GREEDY_CHATS:
            body = common | {"messages": [{"role": "user", "content": prompt}]}
            answer = http.post("/v1/chat/completions", json=body).raise_for_status()
            texts.append(answer.json()["choices"][0]["message"]["content"])
    return texts


def greedy_agreement(answers: dict[str, list[str]], tokens: int) -> dict:
    """How many greedy prompts every server answered with the same text; each server's
    answers."""
    names = list(answers)
    same = [
        len({answers[name][i] for name in names}) == 1
        for i in range(len(answers[names[0]]))
    ]
    return {
        "tokens": tokens,
        "prompts": GREEDY_COMPLETIONS + GREEDY_CHATS,
        "agree": sum(same),
        "of": len(same),
        "answers": answers,
    }


FIGURES = (
    "tokens_per_s",
    "ttft_p50",
    "ttft_p99",
    "tpot_p50",
    "tpot_p99",
    "cpu_ms_per_token",
    "server_cores",
    "other_cores",
    "load_average",
)


def median_of(runs: list[dict]) -> dict:
    """Each figure's median over the rounds (a figure some run lacks: left out)."""
    return {
        key: statistics.median(run[key] for run in runs)
        for key in FIGURES
        if all(key in run for run in runs)
    }


def model_vocab(model: str | None) -> tuple[str, int]:
    """(the model folder, its vocabulary size)."""
    from minipaged.model import resolve_model

    try:
        folder = resolve_model(model)
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError, RuntimeError) as error:
        raise OptionError(f"--model: {error}") from None
    return str(folder), int(config["vocab_size"])


def bench_race(args) -> dict:
    """The servers take turns, one up at a time where this benchmark starts them: per
    round, each runs every concurrency in --concurrency (the order of the servers
    reversed every other round, so a drift of the machine's speed falls on both). A
    measurement sends concurrency x --requests-per-stream requests, all at once, at most
    concurrency in flight (streamed completions of random token ids, temperature 0,
    ignore_eos): output tokens/s, TTFT and TPOT p50/p99 of the client, and from /proc
    the CPU time per output token of the server's process tree, the cores it used and
    the cores other programs kept busy meanwhile."""
    if not args.server:
        raise OptionError(
            f"give the servers to race with --server, e.g. --server '{EXAMPLE}'"
        )
    names = [s.name for s in args.server]
    if len(set(names)) != len(names):
        raise OptionError(f"--server names must differ: {names}")
    if (
        args.prompt_len[0] > args.prompt_len[1]
        or args.output_len[0] > args.output_len[1]
    ):
        raise OptionError("--prompt-len and --output-len: MIN must not exceed MAX")
    folder, vocab = model_vocab(args.model)
    runs = {s.name: {c: [] for c in args.concurrency} for s in args.server}
    answers = {}
    for i in range(args.rounds):
        order = args.server if i % 2 == 0 else args.server[::-1]
        for server in order:
            try:
                figures, answers[server.name] = turn(server, args, folder, vocab)
            except RuntimeError as error:
                raise SystemExit(str(error)) from None
            for c, result in figures.items():
                runs[server.name][c].append(result)
    result = {
        "model": folder,
        "concurrency": args.concurrency,
        "requests_per_stream": args.requests_per_stream,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "rounds": args.rounds,
        "cores": os.cpu_count(),
        "servers": {
            s.name: {
                "command": shlex.join(s.command) if s.command else s.url,
                "median": {
                    str(c): median_of(runs[s.name][c]) for c in args.concurrency
                },
                "runs": {str(c): runs[s.name][c] for c in args.concurrency},
            }
            for s in args.server
        },
    }
    if args.greedy:
        result["greedy"] = greedy_agreement(answers, args.greedy_tokens)
    if not args.json:
        print(table(result))
    return result


def table(result: dict) -> str:
    lines = [
        (
            f"prompts {result['prompt_len'][0]}-{result['prompt_len'][1]} tokens,"
            f" outputs {result['output_len'][0]}-{result['output_len'][1]}"
            " (ignore_eos),"
            f" {result['requests_per_stream']} requests per stream; medians of"
            f" {result['rounds']} round(s) on {result['cores']} cores"
        ),
        (
            f"  {'conc':>4} {'server':<12}{'tok/s':>8}{'ttft p50':>10}{'p99':>8}"
            f"{'tpot p50':>10}{'p99':>8}{'cpu/tok':>9}{'cores':>7}{'others':>8}"
            f"{'load':>6}"
        ),
    ]

    def cell(row, key, scale, width, unit="") -> str:
        if key not in row:
            return f"{'-':>{width}}"
        return f"{scale * row[key]:{width - len(unit)}.{1 if scale == 1 else 0}f}{unit}"

    for c in result["concurrency"]:
        for name, server in result["servers"].items():
            row = server["median"][str(c)]
            lines.append(
                f"  {c:>4} {name:<12}{row['tokens_per_s']:8.1f}"
                f"{row['ttft_p50']:9.2f}s{row['ttft_p99']:7.2f}s"
                f"{1000 * row['tpot_p50']:8.0f}ms{1000 * row['tpot_p99']:6.0f}ms"
                f"{cell(row, 'cpu_ms_per_token', 1, 9, 'ms')}"
                f"{cell(row, 'server_cores', 1, 7)}{cell(row, 'other_cores', 1, 8)}"
                f"{row['load_average']:6.1f}"
            )
    lines.append(
        "  cpu/tok: CPU time of the server's process tree per output token; cores: the"
        " cores it used; others: the cores other programs (not the server, not this"
        " client) kept busy meanwhile; load: the 1-minute load average at the end"
    )
    if "greedy" in result:
        greedy = result["greedy"]
        lines.append(
            f"  greedy answers ({greedy['tokens']} tokens at most) the same on every"
            f" server: {greedy['agree']} of {greedy['of']} prompts"
        )
    return "\n".join(lines)
