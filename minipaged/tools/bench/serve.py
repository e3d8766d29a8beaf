"""`python -m minipaged.bench serve`: the server under load, in a process of its own.

The mixed workload streams Poisson arrivals through the official async `openai` client,
measures what vLLM's benchmark_serving measures (continuous vs static), then the same
requests in-process. The room workload: participants beside one flooding client (the
defaults; fcfs; fair at each bound on the step's decode rows).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time

import numpy as np

from minipaged.llm import number
from minipaged.tools.bench.common import (
    blas_threads_env,
    load,
    random_prompts,
    serving_arguments,
    show,
)
from minipaged.tools.bench.workload import make_workload
from minipaged.tools.viz import BarChart

# a participant's short request: prompt tokens, answer tokens
ROOM_PROMPT, ROOM_TOKENS = (
    32,
    16,
)
FLOOD_PROMPT = (
    "Write a very long essay about page tables, frames, paging and virtual memory,"
    " request {}."
)
# every phase of the room workload ends within this, whatever happens
PHASE_SECONDS = 600
# the flooder alone on an idle server: its tokens/s, measured this long
FLOOD_ALONE_SECONDS = 15.0


def room_servers(decode_rows: list[int]) -> list[tuple[str, str, list[str], list]]:
    """(name, label, server options, runs: (result key, participants?, flooding?)) of
    each server the room runs on: the defaults (the participants alone there too), fcfs
    with every row decoded each step, and fair with each --room-decode-rows bound."""
    servers = [
        (
            "defaults",
            "the server's defaults",
            [],
            [
                ("alone", True, False),
                ("flooder_alone_defaults", False, True),
                ("flood", True, True),
            ],
        ),
        (
            "fcfs",
            "fcfs, every row",
            ["--scheduling-policy", "fcfs", "--max-decode-rows", "0"],
            [("flooder_alone_fcfs", False, True), ("flood_fcfs", True, True)],
        ),
    ]
    for rows in decode_rows:
        label = f"fair, {rows} decode rows" if rows else "fair, every row"
        options = ["--scheduling-policy", "fair", "--max-decode-rows", str(rows)]
        runs = [(f"flooder_alone_rows_{rows}", False, True)]
        runs.append((f"flood_rows_{rows}", True, True))
        servers.append((f"rows_{rows}", label, options, runs))
    return servers


def row_counts(text: str) -> list[int]:
    """--room-decode-rows: a comma-separated list of counts >= 0, checked now."""
    counts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() for part in counts):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of row counts (0 or more)"
        )
    return sorted(set(map(int, counts)))


def add_arguments(parser) -> None:
    serving_arguments(parser)  # --model --device --requests --seed
    parser.set_defaults(requests=32)
    parser.add_argument(
        "--request-rate",
        type=number(float, above=0, infinity=True),
        default=8.0,
        help=(
            "mean arrivals per second, Poisson (default %(default)s; inf: all at once)"
        ),
    )
    parser.add_argument(
        "--max-model-len",
        type=number(int, 16),
        default=1024,
        help="(default %(default)s)",
    )
    parser.add_argument(
        "--kv-tokens",
        type=number(int, 16),
        default=8192,
        help="KV cache in tokens, the same for every run (default %(default)s)",
    )
    parser.add_argument(
        "--max-num-seqs", type=number(int, 1), default=32, help="(default %(default)s)"
    )
    parser.add_argument(
        "--blas-threads",
        type=number(int, 1),
        default=1,
        help=(
            "BLAS threads of the server and of the in-process engine; leave a core "
            "to the HTTP side and the clients (default %(default)s)"
        ),
    )
    parser.add_argument(
        "--scheduler",
        choices=["continuous", "static", "both"],
        default="both",
        help="which batching the server runs (default %(default)s)",
    )
    parser.add_argument(
        "--workload",
        choices=["mixed", "room"],
        default="mixed",
        help=(
            "mixed: --requests of mixed lengths, Poisson arrivals, through the options"
            " above; room: --room-clients participants share --requests short requests"
            f" (a {ROOM_PROMPT}-token prompt, {ROOM_TOKENS} tokens), alone and beside"
            " one client flooding --flood-streams long chats with no max_tokens,"
            " against the server's default options, fcfs with every row decoded each"
            " step, and fair with each --room-decode-rows; and the flooder alone on"
            " each (default %(default)s)"
        ),
    )
    parser.add_argument(
        "--room-clients",
        type=number(int, 1),
        default=8,
        help="room: participants, each with its own API key (default %(default)s)",
    )
    parser.add_argument(
        "--flood-streams",
        type=number(int, 1),
        default=32,
        help=(
            "room: the flooding client's requests in flight at once (default"
            " %(default)s)"
        ),
    )
    parser.add_argument(
        "--room-decode-rows",
        type=row_counts,
        default=[0],
        help=(
            "room: a fair server with each of these --max-decode-rows (0: every row),"
            " beside the defaults and fcfs, e.g. 0,8,12,16 (default 0)"
        ),
    )
    parser.add_argument(
        "--svg",
        default=None,
        help=(
            "room: also write the participants' median beside the flood, per server, to"
            " this SVG"
        ),
    )


def workload(args, vocab: int):
    """(prompts as token ids, max_tokens of each, arrival offsets in seconds): the
    throughput
    benchmark's lengths, arrivals drawn from a Poisson process at args.request_rate."""
    specs = make_workload(
        args.requests,
        min_len=8,
        max_len=args.max_model_len // 2,
        prompt_mean=64,
        output_mean=128,
        seed=args.seed,
    )
    prompts = random_prompts(specs, args.seed, vocab)
    rng = np.random.default_rng(args.seed + 1)
    gaps = (
        rng.exponential(1 / args.request_rate, len(specs))
        if np.isfinite(args.request_rate)
        else np.zeros(len(specs))
    )
    return prompts, [s.output_len for s in specs], np.cumsum(gaps) - gaps[0]


def mixed_options(args, scheduler: str) -> list[str]:
    """The mixed workload's server options: one pool and batch for every run."""
    return [
        "--block-size",
        "16",
        "--num-blocks",
        str(args.kv_tokens // 16),
        "--max-model-len",
        str(args.max_model_len),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--scheduler",
        scheduler,
        "--max-waiting",
        str(args.requests),
        "--max-concurrent-per-client",
        "0",
    ]  # one client is the room here


def start_server(
    args, folder, options: list[str]
) -> tuple[subprocess.Popen, str, list[str]]:
    """The server in its own process (as a lecturer runs it), with these options;
    returns it, its URL and what it printed as it started (its pool and its bounds)."""
    env = blas_threads_env(args.blas_threads)
    command = [
        sys.executable,
        "-m",
        "minipaged.serve",
        "--model",
        str(folder),
        "--port",
        "0",
        "--served-model-name",
        "bench",
        *options,
    ]
    if args.device:
        command += ["--device", args.device]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines = []
    while not any("API" in line for line in lines):
        lines.append(process.stdout.readline())
        if process.poll() is not None:
            raise RuntimeError("the server did not start:\n" + "".join(lines))
    return (
        process,
        re.search(r"(http://127\.0\.0\.1:\d+)", "".join(lines))[1],
        [line.strip() for line in lines],
    )


async def send_all(
    url: str,
    prompts,
    max_tokens,
    arrivals,
    model: str = "bench",
    concurrency: int | None = None,
) -> dict:
    """Every request streamed at its arrival time, at most `concurrency` in flight
    (None: no bound) to the served `model`; per request: ttft, e2e, tpot, tokens."""
    import httpx
    import openai

    results = [None] * len(prompts)
    in_flight = asyncio.Semaphore(concurrency or len(prompts))

    async def one(client, i):
        await asyncio.sleep(arrivals[i])
        async with in_flight:
            await stream_one(client, i)

    async def stream_one(client, i):
        start = time.perf_counter()
        first, tokens = None, 0
        stream = await client.completions.create(
            model=model,
            prompt=prompts[i],
            max_tokens=max_tokens[i],
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].text:
                first = time.perf_counter()
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        end = time.perf_counter()
        first = first or end
        results[i] = {
            "ttft": first - start,
            "e2e": end - start,
            "tokens": tokens,
            "tpot": (end - first) / max(1, tokens - 1),
            "end": end,
        }

    limits = httpx.Limits(max_connections=len(prompts) + 8)
    async with openai.AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=3600,
        http_client=openai.DefaultAsyncHttpxClient(limits=limits),
    ) as client:
        start = time.perf_counter()
        await asyncio.gather(*(one(client, i) for i in range(len(prompts))))
    return summarize(results, time.perf_counter() - start)


def summarize(results: list[dict], seconds: float) -> dict:
    def pct(key, q, rows=results):
        return float(np.percentile([r[key] for r in rows], q))

    tokens = sum(r["tokens"] for r in results)
    shortest = sorted(results, key=lambda r: r["tokens"])[: max(1, len(results) // 4)]
    summary = {
        "tokens_per_s": tokens / seconds,
        "seconds": seconds,
        "tokens": tokens,
        "short_e2e_p50": pct("e2e", 50, shortest),
    }
    for key in ("ttft", "tpot", "e2e"):
        summary |= {f"{key}_p{q}": pct(key, q) for q in (50, 90, 99)}
    return summary


def warm_up(url: str) -> None:
    import httpx

    httpx.post(
        f"{url}/v1/completions",
        json={"prompt": [100, 200, 300], "max_tokens": 2},
        timeout=600,
    )


def engine_tokens_per_s(engine, prompts, max_tokens, arrivals) -> float:
    """The workload without HTTP: each request added to the engine at its arrival
    time."""
    from minipaged.sampling import SamplingParams

    pending, tokens, start = list(range(len(prompts))), 0, time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and arrivals[pending[0]] <= time.perf_counter() - start:
            i = pending.pop(0)
            engine.add_request(
                f"bench-{i}",
                {"prompt_token_ids": prompts[i]},
                SamplingParams(
                    temperature=0, max_tokens=max_tokens[i], ignore_eos=True
                ),
            )
        if engine.has_unfinished_requests():
            tokens += sum(
                len(c.token_ids) for o in engine.step().finished for c in o.outputs
            )
        else:
            time.sleep(0.001)
    return tokens / (time.perf_counter() - start)


def bench_serve(args) -> dict:
    """The server runs in a process of its own; the clients stream every request and
    time it. Reported per batching: tokens/s, TTFT, TPOT and end-to-end latency
    (p50/p90/p99), and the median e2e of the quarter of requests with the fewest output
    tokens; then the tokens/s of an in-process engine given the same requests at the
    same moments. With --workload room: the participants' short-request latency
    (p50/p99) and TTFT, alone, then beside a flooding client on the server's default
    options, on fcfs with every row decoded each step, and on fair at each
    --room-decode-rows."""
    from threadpoolctl import threadpool_limits

    from minipaged.sampling import SamplingParams

    if args.workload == "room":
        return bench_room(args)
    schedulers = (
        ["continuous", "static"] if args.scheduler == "both" else [args.scheduler]
    )
    engine_options = dict(
        block_size=16,
        num_blocks=args.kv_tokens // 16,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        scheduler=schedulers[0],
    )
    with threadpool_limits(limits=args.blas_threads, user_api="blas"):
        llm = load(args, **engine_options)[0]
    folder = llm.folder
    prompts, max_tokens, arrivals = workload(args, llm.model.config.vocab_size)
    result = {
        "requests": args.requests,
        "request_rate": args.request_rate,
        "kv_tokens": args.kv_tokens,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "output_tokens": sum(max_tokens),
        "blas_threads": args.blas_threads,
        "device": llm.device,
    }
    for scheduler in schedulers:
        process, url, _ = start_server(args, folder, mixed_options(args, scheduler))
        try:
            warm_up(url)
            print(
                f"serve: {scheduler} batching, {args.requests} requests at"
                f" {args.request_rate}/s ...",
                file=sys.stderr,
                flush=True,
            )
            result[scheduler] = asyncio.run(
                send_all(url, prompts, max_tokens, arrivals)
            )
        finally:
            process.terminate()
            process.wait(timeout=30)
        # right after its server run: the machine's load is alike
        if scheduler == schedulers[0]:
            print(
                f"serve: the same requests at the same moments, through a {scheduler}"
                " engine in-process ...",
                file=sys.stderr,
                flush=True,
            )
            with threadpool_limits(limits=args.blas_threads, user_api="blas"):
                llm.generate(
                    [{"prompt_token_ids": [100, 200, 300]}],
                    SamplingParams(max_tokens=2),
                    use_tqdm=False,
                )
                result["engine_tokens_per_s"] = engine_tokens_per_s(
                    llm.engine, prompts, max_tokens, arrivals
                )
            result["server_vs_engine"] = (
                result[scheduler]["tokens_per_s"] / result["engine_tokens_per_s"]
            )
    if "static" in result and "continuous" in result:
        result["continuous_vs_static"] = (
            result["continuous"]["tokens_per_s"] / result["static"]["tokens_per_s"]
        )
        result["short_e2e_static_vs_continuous"] = (
            result["static"]["short_e2e_p50"] / result["continuous"]["short_e2e_p50"]
        )
    if not args.json:
        print(table(result))
    return result


def table(result: dict) -> str:
    lines = [
        (
            f"{result['requests']} requests ({result['output_tokens']:,} output tokens)"
            f" at {result['request_rate']}/s through the server, on {result['device']}"
        ),
        (
            f"  {'':<11}{'tok/s':>8}{'ttft p50':>10}{'p99':>8}{'tpot p50':>10}"
            f"{'e2e p50':>9}{'p99':>8}{'short e2e p50':>15}"
        ),
    ]
    for name in ("continuous", "static"):
        if name in result:
            r = result[name]
            lines.append(
                f"  {name:<11}{r['tokens_per_s']:8.1f}{r['ttft_p50']:9.2f}s"
                f"{r['ttft_p99']:7.2f}s{1000 * r['tpot_p50']:8.0f}ms"
                f"{r['e2e_p50']:8.1f}s{r['e2e_p99']:7.1f}s{r['short_e2e_p50']:14.1f}s"
            )
    lines.append(
        "  in-process engine, same requests at the same moments:"
        f" {result['engine_tokens_per_s']:.1f} tok/s"
    )
    if "server_vs_engine" in result:
        lines.append(f"  server / engine throughput = {result['server_vs_engine']:.2f}")
    if "continuous_vs_static" in result:
        lines.append(
            f"  continuous / static throughput = {result['continuous_vs_static']:.2f}x;"
            " shortest quarter's median e2e, static / continuous ="
            f" {result['short_e2e_static_vs_continuous']:.1f}x"
        )
    return "\n".join(lines)


# ---- the room workload ---------------------------------------------------------------
def room_plan(args, vocab: int) -> list[list[tuple[float, list[int]]]]:
    """Per participant: (pause before it in seconds, prompt token ids) of each short
    request, the same for every run: --requests spread over --room-clients, pauses of
    0.5 s on average.
    """
    rng = np.random.default_rng(args.seed)
    low, high = min(100, vocab // 4), min(10_000, vocab)
    per_client = max(1, args.requests // args.room_clients)
    return [
        [
            (float(rng.exponential(0.5)), rng.integers(low, high, ROOM_PROMPT).tolist())
            for _ in range(per_client)
        ]
        for _ in range(args.room_clients)
    ]


async def stream_lines(http, path: str, body: dict, key: str):
    """(200, line) for each SSE data line of one streamed request, or (its status, its
    Retry-After)."""
    async with http.stream(
        "POST", path, json=body, headers={"Authorization": f"Bearer {key}"}
    ) as r:
        if r.status_code != 200:
            yield r.status_code, r.headers.get("retry-after")
            return
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield 200, line


async def participant(http, key: str, plan) -> list[dict]:
    """One participant's short requests, one after another: e2e and TTFT of each
    (refused: None)."""
    rows = []
    for pause, prompt in plan:
        await asyncio.sleep(pause)
        body = {
            "prompt": prompt,
            "max_tokens": ROOM_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        start, first, status = time.perf_counter(), None, 200
        async for status, _ in stream_lines(http, "/v1/completions", body, key):
            first = first or (time.perf_counter() if status == 200 else None)
        end = time.perf_counter()
        rows.append(
            {"e2e": end - start, "ttft": first - start}
            if status == 200 and first
            else None
        )
    return rows


async def flooder(http, stop: asyncio.Event, counts: dict, i: int) -> None:
    """One of the flooding client's streams: long chats without max_tokens (ignore_eos:
    each takes the server's whole default), one after another until `stop` (then
    cancelled: a hang-up); a 429 (the opt-in per-client bound) waits its Retry-After
    and tries again."""
    while not stop.is_set():
        body = {
            "stream": True,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": FLOOD_PROMPT.format(i)}],
        }
        counts["requests_sent"] += 1
        async for status, extra in stream_lines(
            http, "/v1/chat/completions", body, "flooder"
        ):
            if status == 429:
                counts["refused_429"] += 1
                await asyncio.sleep(min(float(extra or 1), 1.0))
            elif status != 200:
                counts["other_errors"] += 1
                await asyncio.sleep(1.0)
            else:
                counts["chunks_received"] += 1
                counts["tokens_received"] += bool(chunk_text(extra))


def chunk_text(line: str) -> str:
    """The text a streamed chunk's line ("data: {...}") carries ("" for a role or usage
    chunk)."""
    choices = json.loads(line[len("data: ") :]).get("choices") or [{}]
    return choices[0].get("delta", {}).get("content") or choices[0].get("text") or ""


async def room_run(
    url: str, plans, flood_streams: int, hold_seconds: float = 0.0
) -> dict:
    """The participants' plans, beside flood_streams flooding streams (once the flood
    runs), for at least hold_seconds; the flood's tokens/s while they ran."""
    import httpx

    counts = {
        "streams": flood_streams,
        "requests_sent": 0,
        "refused_429": 0,
        "other_errors": 0,
        "chunks_received": 0,
        "tokens_received": 0,
    }
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=len(plans) + flood_streams + 8)
    async with httpx.AsyncClient(
        base_url=url, timeout=PHASE_SECONDS, limits=limits
    ) as http:
        floods = [
            asyncio.create_task(flooder(http, stop, counts, i))
            for i in range(flood_streams)
        ]
        deadline = time.monotonic() + 60
        # the flood is generating
        while floods and counts["chunks_received"] < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        start, before = time.perf_counter(), counts["tokens_received"]
        rows = await asyncio.wait_for(
            asyncio.gather(
                *(
                    participant(http, f"participant-{i}", plan)
                    for i, plan in enumerate(plans)
                )
            ),
            PHASE_SECONDS,
        )
        await asyncio.sleep(max(0.0, start + hold_seconds - time.perf_counter()))
        seconds = time.perf_counter() - start
        counts["tokens_per_s"] = (counts["tokens_received"] - before) / seconds
        stop.set()
        for task in floods:  # a hang-up: the server aborts what the flood left running
            task.cancel()
        await asyncio.gather(*floods, return_exceptions=True)
    return room_summary([r for client in rows for r in client], seconds) | (
        {"flood": counts} if flood_streams else {}
    )


def room_summary(rows: list[dict | None], seconds: float) -> dict:
    done = [r for r in rows if r is not None]
    summary = {
        "requests": len(rows),
        "refused": len(rows) - len(done),
        "seconds": seconds,
    }
    if not rows:
        return summary
    for key in ("e2e", "ttft"):
        summary |= {
            f"short_{key}_p{q}": (
                float(np.percentile([r[key] for r in done], q))
                if done
                else float("nan")
            )
            for q in (50, 99)
        }
    return summary


def bench_room(args) -> dict:
    """The room: participants alone, then beside a flood on each server (room_servers);
    the flooder alone on each server, and its share beside them."""
    llm = load(args, num_blocks=64)[0]
    folder, device, plans = (
        llm.folder,
        llm.device,
        room_plan(args, llm.model.config.vocab_size),
    )
    del llm  # the server loads its own copy
    servers = room_servers(args.room_decode_rows)
    result = {
        "workload": "room",
        "device": device,
        "blas_threads": args.blas_threads,
        "room_clients": args.room_clients,
        "short_requests": sum(map(len, plans)),
        "short_prompt_tokens": ROOM_PROMPT,
        "short_max_tokens": ROOM_TOKENS,
        "flood_streams": args.flood_streams,
        "runs": {runs[-1][0]: label for _, label, _, runs in servers},
    }
    for server, _, options, runs in servers:
        process, url, banner = start_server(args, folder, options)
        result[f"server_{server}"] = {"options": options, "printed": banner[:2]}
        try:
            warm_up(url)
            for name, people, flooding in runs:
                print(
                    f"serve room: {name}, {result['short_requests'] if people else 0}"
                    f" short requests from {args.room_clients if people else 0}"
                    " participants ...",
                    file=sys.stderr,
                    flush=True,
                )
                result[name] = asyncio.run(
                    room_run(
                        url,
                        plans if people else [],
                        args.flood_streams * flooding,
                        0.0 if people else FLOOD_ALONE_SECONDS,
                    )
                )
        finally:
            process.terminate()
            process.wait(timeout=30)
    room_shares(result, servers)
    show(args, room_chart(result), room_table(result))
    return result


def room_shares(result: dict, servers) -> None:
    """Each flood run's participants' p50 as a multiple of alone, and the flooder's
    share: of its tok/s alone on the same server, and of its tok/s alone on fcfs's
    (every row, nothing refused: its idle rate)."""
    idle = result["flooder_alone_fcfs"]["flood"]["tokens_per_s"]
    for server, _, _, runs in servers:
        name = runs[-1][0]
        for key in ("e2e", "ttft"):
            result[f"{name}_vs_alone_{key}_p50"] = (
                result[name][f"short_{key}_p50"] / result["alone"][f"short_{key}_p50"]
            )
        tokens_per_s = result[name]["flood"]["tokens_per_s"]
        result[f"{name}_flooder_share"] = (
            tokens_per_s / result[f"flooder_alone_{server}"]["flood"]["tokens_per_s"]
        )
        result[f"{name}_flooder_share_of_idle"] = tokens_per_s / idle
        result[f"{name}_meets_aims"] = (
            result[f"{name}_vs_alone_e2e_p50"] <= 1.3
            and result[f"{name}_flooder_share_of_idle"] >= 0.8
        )


# the runs of a result written before room_servers (fcfs with a per-client bound then)
EARLIER_RUNS = {
    "flood": "fcfs, bound 4 (defaults)",
    "flood_no_bound": "fcfs, no bound",
    "flood_fair": "fair queuing",
}


def room_chart(result: dict) -> BarChart:
    """The participants' median short request beside the flood, as a multiple of alone,
    per server."""
    runs = result.get("runs", EARLIER_RUNS)
    labels = [
        f"{label}: flooder {result[f'{name}_flooder_share_of_idle']:.0%} of its tok/s"
        " on an idle server"
        for name, label in runs.items()
    ]
    return BarChart(
        "participants' median short request beside a flood, x their median alone",
        labels,
        {"x alone": [result[f"{name}_vs_alone_e2e_p50"] for name in runs]},
        unit="x",
        digits=2,
    )


def room_table(result: dict) -> str:
    runs = result.get("runs", EARLIER_RUNS)
    width = max(len(label) for label in runs.values()) + 2
    lines = [
        (
            f"{result['room_clients']} participants, {result['short_requests']} short"
            f" requests ({result['short_prompt_tokens']} + {result['short_max_tokens']}"
            f" tokens), one client flooding {result['flood_streams']} streams, on"
            f" {result['device']}"
        ),
        (
            f"  {'':<{width}}{'e2e p50':>9}{'p99':>8}{'ttft p50':>10}{'p99':>8}"
            f"{'vs alone':>10}{'flood 429s':>12}{'flood tok/s':>13}{'share':>7}"
            f"{'of idle':>9}"
        ),
    ]
    for name, label in {"alone": "alone (no flood)", **runs}.items():
        r, flood = result[name], result[name].get("flood", {})
        ratio = f"{'':>10}"
        if name != "alone":
            ratio = f"{result[f'{name}_vs_alone_e2e_p50']:9.2f}x"
        share = ""
        if flood:
            share = (
                f"{flood['tokens_per_s']:13.1f}{result[f'{name}_flooder_share']:7.0%}"
                f"{result[f'{name}_flooder_share_of_idle']:9.0%}"
            )
        lines.append(
            f"  {label:<{width}}{r['short_e2e_p50']:8.2f}s{r['short_e2e_p99']:7.2f}s"
            f"{r['short_ttft_p50']:9.2f}s{r['short_ttft_p99']:7.2f}s{ratio}"
            f"{flood.get('refused_429', ''):>12}{share}"
        )
    lines.append(
        "  share: of the flooder's tok/s alone on the same server; of idle: of its"
        " tok/s alone on fcfs with every row (nothing refused)"
    )
    return "\n".join(lines)
