"""`python -m minipaged.bench route`: replicas behind a router, on one machine.

N `python -m minipaged.serve` replicas and vllm-router (from PyPI) on 127.0.0.1; for
each routing policy, fresh ones run a conversation workload (users taking turns, each
with a system prompt of its own). Reported per policy: the replicas' prefix-cache hit
rate, prompt tokens computed, time to first token of first and later turns, users per
replica.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from minipaged.llm import number
from minipaged.tools.bench.common import (
    OptionError,
    blas_threads_env,
    model_arguments,
    show,
)
from minipaged.tools.bench.serve import chunk_text, stream_lines
from minipaged.tools.viz import BarChart

# vllm-router 0.1.17's policies
POLICIES = [
    "random",
    "round_robin",
    "cache_aware",
    "kv_aware",
    "power_of_two",
    "consistent_hash",
    "sticky_least_loaded",
]
# the words of the prompts: plain English, one or two tokens each in SmolLM2, and every
# one in the vocabulary of the tests' tiny checkpoints (tests/checkpoints.py)
WORDS = (
    "the a an of to in is it and or paged frame block table token cache kv memory"
    " attention model query key value head layer step batch request sequence fork copy"
    " write read free swap share prefix hash host device page gpu cpu hello world yes"
    " no one two three four five six seven eight nine ten red blue green fast slow"
).split()
# a replica or the router answers GET /health within this, or the bench stops
START_SECONDS = 180
# a process asked to stop is killed after this
STOP_SECONDS = 10
# one policy's conversations end within this, or the bench stops
RUN_SECONDS = 900
# the model name the replicas serve, and the clients send
SERVED_NAME = "bench"
# the replicas' block size, and the router's for the KV events
BLOCK_SIZE = 16


def add_arguments(parser) -> None:
    parser.add_argument(
        "--replicas",
        type=number(int, 1, 16),
        default=3,
        help="replicas of python -m minipaged.serve behind the router (default"
        " %(default)s)",
    )
    parser.add_argument(
        "--router",
        choices=["vllm-router"],
        default="vllm-router",
        help="the router, from PyPI (pip install -e '.[router]') (default %(default)s)",
    )
    parser.add_argument(
        "--policies",
        nargs="+",
        choices=POLICIES,
        default=["round_robin", "cache_aware", "kv_aware"],
        metavar="POLICY",
        help=(
            "the router's policies to measure, in turn, each on fresh replicas: any of"
            f" {', '.join(POLICIES)} (default: round_robin cache_aware kv_aware)"
        ),
    )
    parser.add_argument(
        "--users",
        type=number(int, 1),
        default=8,
        help="users holding a conversation at once (default %(default)s)",
    )
    parser.add_argument(
        "--turns",
        type=number(int, 1),
        default=4,
        help="turns of each conversation (default %(default)s)",
    )
    parser.add_argument(
        "--system-words",
        type=number(int, 1),
        default=256,
        help=(
            "words of each user's system prompt: about 270 tokens of SmolLM2 (default"
            " %(default)s)"
        ),
    )
    parser.add_argument(
        "--max-tokens",
        type=number(int, 1),
        default=16,
        help=(
            "tokens of each answer: short, since prefix caching and the first token are"
            " what is measured (default %(default)s)"
        ),
    )
    parser.add_argument(
        "--no-ceiling",
        dest="ceiling",
        action="store_false",
        help=(
            "skip the run of every conversation on one replica, without a router,"
            " whose hit rate is the workload's ceiling (default: run it)"
        ),
    )
    parser.add_argument(
        "--svg",
        default=None,
        help=(
            "also write each policy's prompt tokens, cached and computed, to this SVG"
            " (default: none)"
        ),
    )
    model_arguments(parser)


# ---- the workload: conversations -----------------------------------------------------
@dataclass(slots=True)
class User:
    """One user's conversation: its system prompt and the question of each turn. Its
    key goes with each request as an API key: replicas without --api-key ignore it, but
    count each key as a client of its own, so /metrics says which users a replica
    served."""

    key: str
    system: str
    questions: list[str]


def conversations(users: int, turns: int, system_words: int, seed: int = 0):
    """Seeded users, each with a system prompt of its own from its first word (no block
    of it is shared with another user's) and a short question per turn."""
    rng = np.random.default_rng(seed)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS, n))

    return [
        User(f"user-{u}", words(system_words), [words(12) for _ in range(turns)])
        for u in range(users)
    ]


async def converse(url: str, users: list[User], max_tokens: int, progress) -> list:
    """Every user's turns, one after another with the answers kept in the history, all
    users at once, streamed through `url`: per turn its user, turn, time to first token
    and prompt tokens. A refused request stops the run: each turn's prompt depends on
    the answers before it."""
    import httpx

    async def talk(http, u: int, user: User) -> list[dict]:
        messages, rows = [{"role": "system", "content": user.system}], []
        for turn, question in enumerate(user.questions):
            messages.append({"role": "user", "content": question})
            body = {
                "model": SERVED_NAME,
                "messages": messages,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            start, first, answer, usage = time.perf_counter(), None, [], {}
            async for status, line in stream_lines(
                http, "/v1/chat/completions", body, user.key
            ):
                if status != 200:
                    raise RuntimeError(
                        f"{user.key}'s turn {turn + 1} was answered {status}"
                    )
                usage = json.loads(line[len("data: ") :]).get("usage") or usage
                text = chunk_text(line)
                if text and first is None:
                    first = time.perf_counter()
                answer.append(text)
            messages.append({"role": "assistant", "content": "".join(answer)})
            rows.append(
                {
                    "user": u,
                    "turn": turn,
                    "ttft": (first or time.perf_counter()) - start,
                    "prompt_tokens": usage.get("prompt_tokens", 0),
                }
            )
            progress.update()
        return rows

    limits = httpx.Limits(max_connections=len(users) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        talks = asyncio.gather(*(talk(http, u, user) for u, user in enumerate(users)))
        rows = await asyncio.wait_for(talks, RUN_SECONDS)
    return [row for user_rows in rows for row in user_rows]


# ---- the cluster: processes on 127.0.0.1, stopped by their PIDs ----------------------
@dataclass(slots=True)
class Started:
    """A program this bench started: its process, its URL, the file its output goes to,
    and (a replica publishing KV events) its --kv-events-config: the ZMQ endpoints a
    router subscribes to."""

    process: subprocess.Popen
    url: str
    log: Path
    kv_events: dict | None = None

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the system's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(command: list[str], url: str, log: Path, stack: ExitStack, **options):
    """`command` started with its output in `log`; `stack` stops it when it closes."""
    with open(log, "w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, **options
        )
    started = Started(process, url, log)
    stack.callback(stop, started)
    return started


def stop(started: Started) -> None:
    """Ask the process to end (SIGTERM), then kill it if it has not within
    STOP_SECONDS."""
    if started.process.poll() is None:
        started.process.terminate()
        try:
            started.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            started.process.kill()
            started.process.wait(STOP_SECONDS)


def wait_healthy(started: Started, seconds: float = START_SECONDS) -> None:
    """Until GET /health answers 200; a RuntimeError with the end of its output if the
    process ends first or `seconds` pass."""
    import httpx

    start = time.monotonic()
    while time.monotonic() < start + seconds:
        if started.process.poll() is not None:
            break
        try:
            if httpx.get(f"{started.url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    state = "ended" if started.process.poll() is not None else "is not healthy"
    raise RuntimeError(
        f"{started.log.stem} {state} after {time.monotonic() - start:.0f} s:\n"
        f"{started.output()[-2000:]}"
    )


def start_replicas(
    folder,
    count: int,
    logs: Path,
    stack: ExitStack,
    kv_events: bool = False,
    options: tuple[str, ...] = (),
) -> list[Started]:
    """`count` replicas of `folder` on free ports, started at once, each with one BLAS
    thread (the cores are shared), its access log on (the 404 count) and, with
    kv_events, publishing vLLM's KV-cache events on ZMQ ports of its own; `options` go
    to each as they are."""
    replicas = []
    for i in range(count):
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "minipaged.serve",
            "--model",
            str(folder),
            "--port",
            str(port),
            "--served-model-name",
            SERVED_NAME,
            "--block-size",
            str(BLOCK_SIZE),
            "--log-level",
            "info",
            *options,
        ]
        config = None
        if kv_events:
            config = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": f"tcp://127.0.0.1:{free_port()}",
                "replay_endpoint": f"tcp://127.0.0.1:{free_port()}",
            }
            command += ["--kv-events-config", json.dumps(config)]
        started = launch(
            command,
            f"http://127.0.0.1:{port}",
            logs / f"replica-{i}.log",
            stack,
            env=blas_threads_env(1),
        )
        started.kv_events = config
        replicas.append(started)
    for replica in replicas:
        wait_healthy(replica)
    return replicas


def router_search_path() -> str:
    """Where vllm-router is looked for: beside this Python (a venv's bin, activated or
    not), then PATH."""
    return os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    )


def router_executable() -> str:
    """vllm-router's path; if it is not installed, a SystemExit that says how."""
    found = shutil.which("vllm-router", path=router_search_path())
    if found is None:
        raise SystemExit(
            "bench route needs vllm-router, which is not installed: pip install -e"
            " '.[router]' (its wheels are built for Linux only)"
        )
    return found


def start_router(
    replicas: list[Started],
    policy: str,
    logs: Path,
    stack: ExitStack,
    options: tuple[str, ...] = (),
) -> Started:
    """vllm-router on a free port in front of `replicas` with `policy` (kv_aware: it
    subscribes to each replica's KV events), its Prometheus port free too; `options` go
    to it as they are."""
    port = free_port()
    command = [
        router_executable(),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-port",
        str(free_port()),
        "--policy",
        policy,
        "--worker-urls",
        *(r.url for r in replicas),
        *options,
    ]
    if policy == "kv_aware":
        for replica in replicas:
            events = replica.kv_events
            command += [
                "--kv-event-source",
                f"{replica.url}={events['endpoint']}",
                "--kv-event-replay-source",
                f"{replica.url}={events['replay_endpoint']}",
            ]
        command += ["--kv-event-block-size", str(BLOCK_SIZE)]
        command += ["--kv-event-model", SERVED_NAME]
    router = launch(
        command, f"http://127.0.0.1:{port}", logs / f"router-{policy}.log", stack
    )
    wait_healthy(router)
    return router


def warm_up(replica: Started) -> None:
    """One short request sent to the replica itself: its first forward's one-time costs
    stay out of the times measured."""
    import httpx

    body = {"model": SERVED_NAME, "prompt": "hello world", "max_tokens": 2}
    httpx.post(f"{replica.url}/v1/completions", json=body, timeout=120)


# ---- what the replicas say: /metrics and their access logs ---------------------------
def scrape(replica: Started) -> dict:
    """A replica's prefix-cache counters (vLLM's names) and the clients it has served
    (minipaged's client_tokens: a user's key shows as '#' and six hex digits)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{replica.url}/metrics", timeout=10).text
    found = {"queries": 0.0, "hits": 0.0, "clients": set()}
    names = {
        "vllm:prefix_cache_queries_total": "queries",
        "vllm:prefix_cache_hits_total": "hits",
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                found[names[sample.name]] += sample.value
            elif sample.name == "minipaged:client_tokens_total" and sample.value:
                if "#" in sample.labels.get("client", ""):
                    found["clients"].add(sample.labels["client"])
    return found


def not_found(replicas: list[Started], since: list[int] | None = None) -> dict:
    """'METHOD /path' -> how often a replica answered it 404, from their access logs
    (uvicorn's, at --log-level info; each from character since[i]): what a router
    asked that a replica lacks."""
    calls = Counter()
    for i, replica in enumerate(replicas):
        log = replica.output()[since[i] if since else 0 :]
        for method, path in re.findall(r'"([A-Z]+) (\S+) HTTP/[\d.]+" 404', log):
            calls[f"{method} {path}"] += 1
    return dict(calls)


def run_cluster(args, folder, policy: str | None, users, logs, progress) -> dict:
    """Fresh replicas, and vllm-router with `policy` in front (None: one replica, no
    router); each replica warmed up, then every conversation through the front; what
    the replicas counted meanwhile."""
    with ExitStack() as stack:
        count = args.replicas if policy else 1
        device = ("--device", args.device) if args.device else ()
        replicas = start_replicas(
            folder, count, logs, stack, policy == "kv_aware", device
        )
        front = start_router(replicas, policy, logs, stack) if policy else replicas[0]
        for replica in replicas:
            warm_up(replica)
        before = [scrape(r) for r in replicas]
        start = time.perf_counter()
        rows = asyncio.run(converse(front.url, users, args.max_tokens, progress))
        seconds = time.perf_counter() - start
        after = [scrape(r) for r in replicas]
        missing = not_found(replicas)
    return summarize(rows, before, after, seconds) | {
        "worker_404s": missing,
        # the machine's 1-minute load average as the run ended: the cores were shared
        # with this many runnable processes
        "load_average": os.getloadavg()[0],
    }


def summarize(rows: list[dict], before, after, seconds: float) -> dict:
    """A run's figures: hit rate and tokens from the replicas' counters (after less
    before), TTFT percentiles of first and later turns in ms, users per replica."""
    queries = sum(a["queries"] - b["queries"] for a, b in zip(after, before))
    hits = sum(a["hits"] - b["hits"] for a, b in zip(after, before))
    summary = {
        "hit_rate": hits / queries if queries else 0.0,
        "prompt_tokens": int(queries),
        "cached_tokens": int(hits),
        "computed_tokens": int(queries - hits),
        "users_per_replica": [
            len(a["clients"] - b["clients"]) for a, b in zip(after, before)
        ],
        "seconds": seconds,
    }
    for name, first in (("first", True), ("later", False)):
        ttft = [1e3 * r["ttft"] for r in rows if (r["turn"] == 0) == first]
        for q in (50, 99):
            summary[f"ttft_{name}_p{q}_ms"] = (
                float(np.percentile(ttft, q)) if ttft else None
            )
    summary["first_prompt_tokens_mean"] = statistics.mean(
        r["prompt_tokens"] for r in rows if r["turn"] == 0
    )
    return summary


def bench_route(args) -> dict:
    """Per policy, fresh replicas and a fresh router (kv_aware: the replicas publish
    their KV-cache events and the router subscribes); then, unless --no-ceiling, every
    conversation on one replica without a router: the hit rate no routing can pass.
    Greedy answers of --max-tokens tokens (ignore_eos), so every run sends the same
    prompts. The default model is SmolLM2-135M-Instruct; each replica loads its own
    copy and runs one BLAS thread."""
    from importlib.metadata import PackageNotFoundError, version

    from minipaged.model.weights import resolve_model

    router_executable()  # before any work: installed, or a SystemExit saying how
    try:
        folder = resolve_model(args.model)
    except (FileNotFoundError, ValueError) as error:
        raise OptionError(str(error)) from None
    try:
        router_version = version("vllm-router")
    except PackageNotFoundError:  # on PATH, not in this Python
        router_version = "unknown"
    users = conversations(args.users, args.turns, args.system_words)
    runs = list(args.policies) + ([None] if args.ceiling else [])
    result = {
        "model": str(args.model or folder.name),
        "router": f"vllm-router {router_version}",
        "replicas": args.replicas,
        "users": args.users,
        "turns": args.turns,
        "system_words": args.system_words,
        "max_tokens": args.max_tokens,
        "block_size": BLOCK_SIZE,
        "cpus": os.cpu_count(),
        "policies": {},
    }
    progress = tqdm(
        total=len(runs) * args.users * args.turns, unit="turn", desc="route"
    )
    with progress, tempfile.TemporaryDirectory(prefix="bench-route-") as logs:
        for policy in runs:
            progress.set_description(policy or "one replica")
            summary = run_cluster(args, folder, policy, users, Path(logs), progress)
            if policy:
                result["policies"][policy] = summary
            else:
                result["ceiling"] = summary
    show(args, chart(result), table(result))
    return result


def rows_of(result: dict) -> list[tuple[str, dict]]:
    """(label, figures) of each run: the policies, then the ceiling."""
    rows = list(result["policies"].items())
    if "ceiling" in result:
        rows.append(("one replica (ceiling)", result["ceiling"]))
    return rows


def chart(result: dict) -> BarChart:
    """Each run's prompt tokens: from the replicas' prefix caches, and computed."""
    rows = rows_of(result)
    return BarChart(
        f"prompt tokens of {result['users']} users x {result['turns']} turns behind"
        f" {result['router']}, {result['replicas']} replicas: cached, computed",
        [f"{label}: hit rate {r['hit_rate']:.2f}" for label, r in rows],
        {
            "from the prefix cache": [r["cached_tokens"] for _, r in rows],
            "computed": [r["computed_tokens"] for _, r in rows],
        },
        unit=" tok",
        digits=0,
    )


def table(result: dict) -> str:
    rows = rows_of(result)
    system = rows[0][1]["first_prompt_tokens_mean"]
    lines = [
        f"{result['users']} users x {result['turns']} turns (a first turn of about"
        f" {system:.0f} tokens, answers of {result['max_tokens']} tokens),"
        f" {result['model']}, {result['replicas']} replicas behind {result['router']},"
        f" {result['cpus']} cores",
        f"  {'':<22}{'hit rate':>9}{'computed':>10}{'of':>8}"
        f"{'TTFT first p50':>16}{'p99':>8}{'later p50':>11}{'p99':>8}"
        "  users per replica",
    ]
    for label, r in rows:
        users = " ".join(str(n) for n in r["users_per_replica"])
        lines.append(
            f"  {label:<22}{r['hit_rate']:9.3f}{r['computed_tokens']:10,}"
            f"{r['prompt_tokens']:8,}{r['ttft_first_p50_ms']:14.0f}ms"
            f"{r['ttft_first_p99_ms']:6.0f}ms{r['ttft_later_p50_ms']:9.0f}ms"
            f"{r['ttft_later_p99_ms']:6.0f}ms  {users}"
        )
    if "ceiling" in result:
        lines.append(
            "  (ceiling: every conversation on one replica, no router: the hit rate no"
            " routing can pass)"
        )
    for label, r in rows:
        if r["worker_404s"]:
            lines.append(
                f"  {label}: the router's calls a replica answered 404:"
                f" {r['worker_404s']}"
            )
    return "\n".join(lines)
