"""`python -m minipaged.serve`: load a model, start the engine loop and the HTTP server.

Prints where the API and the dashboard are. `ServerThread` runs the same server in a
thread of the calling process (tests, the serving benchmark, a notebook).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import socket
import sys
import threading
import time

import uvicorn

from minipaged.backend import resolve_device
from minipaged.llm import CommandParser, number, policy
from minipaged.speculative import SpeculativeConfig
from minipaged.tools.serve import kv_events
from minipaged.tools.serve.api import Server, ServerConfig
from minipaged.tools.serve.clients import network

# --max-decode-rows auto on a CPU: measured with bench serve --workload room on a
# 2-core CPU (bench/results/2026-12-05-cpu-2core-room-rows), participants' p50 beside
# a flood within 1.3x of alone
CPU_DECODE_ROWS = 12

EPILOG = """\
examples:
  python -m minipaged.serve                                 # SmolLM2 on 127.0.0.1:8000
  python -m minipaged.serve --host 0.0.0.0 --api-key room42 # a workshop room \
on the network
  python -m minipaged.serve --scheduler static --max-model-len 1024  \
# the before picture

Then, from any machine that reaches it:
  from openai import OpenAI
  client = OpenAI(base_url="http://HOST:8000/v1", api_key="room42")
  print(client.chat.completions.create(model=client.models.list().data[0].id, \
max_tokens=128, temperature=0.7,
        messages=[{"role": "user", "content": "What is a page table?"}])\
.choices[0].message.content)"""


def size(text: str) -> int:
    """Bytes from '536870912', '512M', '512MiB' or '1G' (binary units)."""
    match = re.fullmatch(r"\s*(\d{1,15})\s*([KMG]?)(i?B)?\s*", text, re.I)
    if not match:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: write bytes, or e.g. 512M or 1G"
        )
    if int(match[1]) == 0:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the KV cache needs more than 0 bytes"
        )
    return int(match[1]) * 1024 ** " KMG".index((match[2] or " ").upper())


def seam(option: str) -> dict:
    """add_argument's type and metavar for a seam's option (a name, or module:Class)."""
    return {"type": policy(option), "metavar": policy(option).metavar}


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="python -m minipaged.serve",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="An OpenAI-compatible server with a live page-table dashboard.",
    )
    add = parser.add_argument
    add(
        "--model",
        default=None,
        help=(
            "hub id or local folder (default: SmolLM2-135M-Instruct, offline if"
            " need be)"
        ),
    )
    add(
        "--served-model-name",
        default=None,
        help="the name clients send as `model` (default: --model's)",
    )
    add(
        "--device",
        default=None,
        choices=["cpu", "cuda"],
        help="default: cuda when usable, else cpu",
    )
    add(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default %(default)s; 0.0.0.0 for a room)",
    )
    add(
        "--port",
        type=number(int, 0, 65535),
        default=8000,
        help="default %(default)s; 0 picks a free one",
    )
    add(
        "--api-key",
        default=os.environ.get("MINIPAGED_API_KEY"),
        help=(
            "every /v1 route then wants 'Authorization: Bearer KEY', and the"
            " dashboard's data (/dashboard/snapshot, /dashboard/events) holds prompts"
            " and answers only for the key: the page at / stays open for the projector,"
            " /?key=KEY shows the text (default: $MINIPAGED_API_KEY)"
        ),
    )
    add(
        "--block-size",
        type=number(int, 1),
        default=16,
        help="tokens per KV block (default %(default)s)",
    )
    # a default of 0 below means "work it out" (argparse does not check a default):
    # typed, it is refused
    add(
        "--kv-cache-memory",
        type=size,
        default=0,
        help="KV cache size, e.g. 256M (default: 512M on a CPU)",
    )
    add(
        "--num-blocks",
        type=number(int, 1),
        default=0,
        help="KV frames, instead of --kv-cache-memory (a small pool shows more)",
    )
    add(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "int8", "fp8"],
        help=(
            "how K and V are stored: the model's dtype, or 8-bit codes with a scale per"
            " token and head (~2x the frames of fp16 in the same memory;"
            " docs/15_compressed_memory.md) (default %(default)s)"
        ),
    )
    add(
        "--max-model-len",
        type=number(int, 2),
        default=0,
        help="longest prompt + answer (default: the model's)",
    )
    add(
        "--max-num-seqs",
        type=number(int, 1),
        default=64,
        help="most sequences in one batch (default %(default)s)",
    )
    add(
        "--max-decode-rows",
        type=decode_rows,
        default="auto",
        help=(
            "rows decoded per step while several clients' requests run: each"
            " client's first, then the waiting order's choice; the others keep their"
            " frames and wait a step, so that one client's many requests cannot widen"
            " (and on a CPU slow) everyone's step. 0: every running row (default"
            f" %(default)s: {CPU_DECODE_ROWS} on a CPU, whose step costs more the more"
            " rows it has; 0 on a GPU)"
        ),
    )
    add("--preemption-mode", default="recompute", choices=["recompute", "swap"])
    add(
        "--scheduler",
        default="continuous",
        choices=["continuous", "static"],
        help="static: the pre-Orca baseline, for a before/after demo",
    )
    add("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    # the series' old systems ideas (docs/09_replacement.md to docs/12_drum.md), each a
    # choice of the engine each takes a name or a policy of one's own, "module:Class"
    # (importable from here)
    add(
        "--prefix-cache-policy",
        default="lru",
        **seam("prefix_cache_policy"),
        help=(
            "which cached prefix block leaves first when the pool needs a frame"
            " (default %(default)s)"
        ),
    )
    add(
        "--scheduling-policy",
        default="fair",
        **seam("scheduling_policy"),
        help=(
            "the waiting queue's order: fair, the least served client first (counted"
            " in tokens; a client is its address and key; one client alone is served"
            " first come first served), fcfs, shortest job first, SJF with aging, or"
            " each request's `priority` field, lower first (vLLM's"
            " --scheduling-policy priority) (default %(default)s: a room's share is"
            " kept by order, not by refusals; LLM(...) keeps fcfs)"
        ),
    )
    add(
        "--admission",
        default="greedy",
        **seam("admission"),
        help=(
            "working-set: admit a request only while the running ones' growth fits too,"
            " against thrashing (default %(default)s)"
        ),
    )
    add(
        "--preemption-victim",
        default=None,
        **seam("preemption_victim"),
        help=(
            "whom to preempt when frames run out (default: the waiting order's; else"
            " the newest)"
        ),
    )
    add(
        "--kv-offload-frames",
        type=number(int, 0),
        default=0,
        help=(
            "the drum: host frames that keep the prefix cache's evicted blocks, copied"
            " back on a hit (0: off; default %(default)s)"
        ),
    )
    add(
        "--max-waiting",
        type=number(int, 0),
        default=256,
        help=(
            "requests that may queue beyond --max-num-seqs; more get 503 (default"
            " %(default)s)"
        ),
    )
    add(
        "--default-max-tokens",
        type=number(int, 1),
        default=256,
        help=(
            "tokens a chat answer may take when the request gives no max_tokens, fewer"
            " if the context or the KV pool (for n answers) holds less; completions"
            " keep OpenAI's 16 (default %(default)s)"
        ),
    )
    add(
        "--max-tokens-limit",
        type=number(int, 1),
        default=1024,
        help=(
            "the most max_tokens a request may ask for: more is a 400 that says the"
            " limit. 1024 is four default answers, about 40 s of one stream on a laptop"
            " CPU; four such requests hold about a third of SmolLM2's default CPU pool"
            " (728 frames of 16 tokens); --max-model-len's value leaves the context as"
            " the only limit (default %(default)s)"
        ),
    )
    add(
        "--max-concurrent-per-client",
        type=number(int, 0),
        default=0,
        help=(
            "opt-in: sequences (each prompt's n samples) one client may have"
            " unfinished at once; more is a 429 with a Retry-After estimated from the"
            " client's requests in flight, so that one laptop cannot widen the room's"
            " every step (on a CPU a wider step is a slower one). A client is its"
            " address and the API key it sends. 4 gives a room of 20 about 3 each of"
            " the default batch of 64 rows (default %(default)s: no bound, requests"
            " queue as in vLLM, and the fair order keeps each client's share)"
        ),
    )
    add(
        "--forwarded-allow-ips",
        type=proxies,
        default=(),
        metavar="IPS",
        help=(
            "opt-in, for replicas behind a router or proxy: comma-separated addresses"
            " or networks (10.0.0.0/8, or * for any) whose word on the client is"
            " taken: a request from one of them is counted, for the per-client bound"
            " and the fair order, as its X-Forwarded-For client and, when the body"
            " names OpenAI's `user`, as that user (a router passes `user` as its"
            " client wrote it: trust it where your own programs set it) (default:"
            " none, the client is the connection's address)"
        ),
    )
    add(
        "--speculative-config",
        type=speculative_config,
        default=None,
        metavar="JSON",
        help=(
            'speculative decoding, as vLLM\'s option: e.g. \'{"method": "ngram",'
            ' "num_speculative_tokens": 4}\' (methods: ngram, draft_layers); the'
            " dashboard's timeline marks each guess kept or rolled back"
        ),
    )
    add(
        "--root-path",
        default="",
        help=(
            "as vLLM's option: the path prefix of a proxy in front (e.g. /llm): /llm/v1"
            " and /v1 both answer"
        ),
    )
    add(
        "--enable-force-include-usage",
        action="store_true",
        help=(
            "as vLLM's option: every stream carries the usage so far in every chunk,"
            " whatever its stream_options ask"
        ),
    )
    add(
        "--dashboard-show-text",
        action="store_true",
        help=(
            "show prompts and answers on the dashboard (by default: ids and token"
            " counts only); with --api-key, only to the key"
        ),
    )
    add(
        "--kv-events-config",
        type=kv_events.parse_config,
        default=None,
        metavar="JSON",
        help=(
            "publish the prefix cache's block events to a router, as vLLM's option:"
            ' e.g. \'{"enable_kv_cache_events": true, "endpoint":'
            ' "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5567"}\''
            " (GET /kv_event_sources says where; needs pip install"
            " 'minipaged[kv-events]')"
        ),
    )
    add(
        "--cpu-threads",
        type=cpu_threads,
        default="fit",
        metavar="{fit,all,N}",
        help=(
            "on a CPU: fit, one BLAS thread per core other programs leave idle, looked"
            " at again before each step (a good neighbour, as the chat); all, every"
            " core the server may run on, whatever else runs (a machine of its own, as"
            " vLLM's); N, that many. Beside a neighbour keeping a core busy, all"
            " threads wait on a descheduled one: 2-core serving at concurrency 16 took"
            " 5x the CPU per token and gave a quarter of fit's tokens/s. On Linux"
            " x86-64 the products split over helper processes, one per extra core"
            " (MINIPAGED_CPU_HELPERS=0: BLAS threads instead) (default %(default)s)"
        ),
    )
    add(
        "--log-level",
        default="warning",
        choices=["critical", "error", "warning", "info", "debug"],
    )
    return parser


def engine_options(args) -> dict:
    return {
        "block_size": args.block_size,
        "kv_cache_memory": args.kv_cache_memory,
        "kv_cache_dtype": args.kv_cache_dtype,
        "num_blocks": args.num_blocks,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "max_decode_rows": decode_rows_on(args),
        "preemption_mode": args.preemption_mode,
        "scheduler": args.scheduler,
        "enable_prefix_caching": args.enable_prefix_caching,
        "speculative_config": args.speculative_config,
        "prefix_cache_policy": args.prefix_cache_policy,
        "scheduling_policy": args.scheduling_policy,
        "admission": args.admission,
        "preemption_victim": args.preemption_victim,
        "kv_offload_frames": args.kv_offload_frames,
    }


def decode_rows(text: str) -> str | int:
    """--max-decode-rows: auto or a count of rows (0: every row), checked now."""
    if text == "auto":
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not auto or a number of rows (0 or more)"
        )
    return int(text)


def decode_rows_on(args) -> int:
    """The bound --max-decode-rows gives: auto is CPU_DECODE_ROWS with continuous
    batching on a CPU, none on a GPU or for a static batch."""
    if args.max_decode_rows != "auto":
        return args.max_decode_rows
    if args.scheduler == "continuous" and resolve_device(args.device) == "cpu":
        return CPU_DECODE_ROWS
    return 0


def cpu_threads(text: str) -> str | int:
    """--cpu-threads: fit, all or a count of threads, checked now."""
    if text in ("fit", "all"):
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not fit, all or a number of threads (1 or more)"
        )
    return int(text)


def speculative_config(text: str) -> SpeculativeConfig:
    """--speculative-config: a JSON object of vLLM's speculative_config fields, checked
    now."""
    try:
        return SpeculativeConfig.from_dict(json.loads(text))
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not JSON ({error.msg}): write e.g. "
            '\'{"method": "ngram", "num_speculative_tokens": 4}\''
        ) from None
    except (TypeError, ValueError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def proxies(text: str) -> tuple[str, ...]:
    """--forwarded-allow-ips: 'ADDRESS[,NETWORK...]' or '*', each entry checked now."""
    entries = tuple(e.strip() for e in text.split(",") if e.strip())
    if not entries:
        raise argparse.ArgumentTypeError(
            f"{text!r} names no proxy: write e.g. 127.0.0.1 or 10.0.0.0/8"
        )
    for entry in entries:
        if entry != "*":
            try:
                network(entry)
            except ValueError as error:
                raise argparse.ArgumentTypeError(str(error)) from None
    return entries


def cpu_threads_line(choice: str | int, threads: int) -> str:
    """What --cpu-threads does, said at start."""
    if choice == "fit":
        return (
            f"{threads} core(s) now, one per core other programs leave idle,"
            " followed before each step (--cpu-threads fit)"
        )
    return f"{threads} core(s), whatever else runs (--cpu-threads {choice})"


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (bound before uvicorn starts, so port 0 gives a known free
    port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def urls(host: str, port: int) -> list[str]:
    """Where clients reach a server listening on host: every address of this machine for
    0.0.0.0."""
    if host not in ("0.0.0.0", "::", ""):
        return [f"http://{f'[{host}]' if ':' in host else host}:{port}"]
    names = {socket.gethostname()}
    try:
        names |= {
            info[4][0]
            for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
        }
    except OSError:
        pass
    return [f"http://{name}:{port}" for name in sorted(names)] + [
        f"http://127.0.0.1:{port}"
    ]


class ServerThread:
    """`with ServerThread(server) as url:` serves on 127.0.0.1 on a free port, in a
    thread."""

    def __init__(self, server: Server, host: str = "127.0.0.1", port: int = 0):
        self.server, self.sock = server, bind(host, port)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.uvicorn = uvicorn.Server(
            uvicorn.Config(
                server.app,
                log_level="warning",
                lifespan="on",
                timeout_graceful_shutdown=2,
                # the client is the connection's address, or what the server's own
                # --forwarded-allow-ips trusts (clients.TrustedProxies)
                proxy_headers=False,
            )
        )
        self.thread = threading.Thread(
            target=self.uvicorn.run,
            kwargs={"sockets": [self.sock]},
            name="minipaged-http",
            daemon=True,
        )

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.uvicorn.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start (see its log above)")
            time.sleep(0.01)
        return self.url

    def __exit__(self, *exc) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()


def listen(host: str, port: int) -> socket.socket:
    """bind(), or an OSError that says what to do (before the model loads: no wait to
    learn it)."""
    try:
        return bind(host, port)
    except socket.gaierror:
        raise OSError(
            f"--host {host}: no such address on this machine (try 127.0.0.1, or 0.0.0.0"
            " for a room)"
        ) from None
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise OSError(
                f"--port {port}: another program listens there already (pick another"
                " port, or 0 for a free one)"
            ) from None
        raise OSError(
            f"cannot listen on {host}:{port}: {error.strerror or error}"
        ) from None


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from minipaged.llm import LLM
    from minipaged.model.weights import DEFAULT_MODEL

    # a mistake found after parsing reads as argparse's: one line on stderr, exit code 2
    try:
        sock = listen(args.host, args.port)
        llm = LLM(args.model, device=args.device, **engine_options(args))
    except (
        ValueError,
        RuntimeError,
        OSError,
    ) as error:  # a bad option, no GPU, no such model or address
        parser.error(str(error))
    threads = split = None
    if llm.device == "cpu":  # LLM() fitted them; the server's own choice now
        threads, split = llm.use_cores(args.cpu_threads)
    name = args.served_model_name or args.model or DEFAULT_MODEL
    server = Server(
        llm.engine,
        llm.tokenizer,
        ServerConfig(
            model_name=name,
            api_key=args.api_key,
            max_waiting=args.max_waiting,
            dashboard_show_text=args.dashboard_show_text,
            default_max_tokens=args.default_max_tokens,
            max_tokens_limit=args.max_tokens_limit,
            max_concurrent_per_client=args.max_concurrent_per_client,
            force_include_usage=args.enable_force_include_usage,
            root_path=args.root_path,
            forwarded_allow_ips=args.forwarded_allow_ips,
            model_path=str(llm.folder),
        ),
    )
    port = sock.getsockname()[1]
    try:  # the prefix cache's events, for a router (None: not asked for)
        events = kv_events.start(args.kv_events_config, llm.engine.blocks)
    except (ValueError, OSError) as error:
        parser.error(str(error))
    server.workers.kv_events = events  # GET /kv_event_sources says where
    blocks = llm.engine.blocks
    print(
        f"minipaged serving {name} on {llm.device} ({llm.load_seconds:.1f} s to load): "
        f"{blocks.num_frames} KV frames of {blocks.block_size} tokens, max_model_len "
        f"{llm.max_model_len}, {args.scheduler} batching"
    )
    share = (
        f"at most {args.max_concurrent_per_client}"
        if args.max_concurrent_per_client
        else "no bound on the"
    )
    print(
        f"  a request: at most {args.max_tokens_limit} tokens"
        f" ({args.default_max_tokens} if a chat gives no max_tokens); a client (address"
        f" + key): {share} sequences at once"
    )
    rows = llm.engine.scheduler.config.max_decode_rows
    if rows:
        print(
            f"  a step: at most {rows} decode rows while several clients' requests run,"
            " each client's first (--max-decode-rows)"
        )
    if threads is not None:
        print(f"  CPU: {cpu_threads_line(args.cpu_threads, threads)}; {split}")
    if args.forwarded_allow_ips:
        print(
            "  from a proxy in --forwarded-allow-ips"
            f" {','.join(args.forwarded_allow_ips)}: the client is its X-Forwarded-For"
            " client (and the body's `user`)"
        )
    for url in urls(args.host, port):
        print(
            f"  API (OpenAI):  {url}/v1    dashboard: {url}/    metrics: {url}/metrics"
        )
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(
            "  warning: listening beyond this machine with no --api-key: anyone on the"
            " network may send requests",
            file=sys.stderr,
        )
    if events is not None:
        print(f"  KV cache events (vLLM's, for a router): {events.endpoint}")
    print("Ctrl-C stops it.", flush=True)
    config = uvicorn.Config(
        server.app,
        log_level=args.log_level,
        lifespan="on",
        timeout_graceful_shutdown=2,
        proxy_headers=False,  # as ServerThread's
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except (
        KeyboardInterrupt
    ):  # uvicorn stops cleanly, then raises the Ctrl-C it caught again
        pass
    if events is not None:
        events.close()
    print("stopped.")
    return 0
