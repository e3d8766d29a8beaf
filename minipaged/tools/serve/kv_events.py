"""The page table, published: the prefix cache's block events as vLLM's KV-cache events.

One listener on the prefix cache hears each block named (BlockStored), dropped
(BlockRemoved) and the cache emptied (AllBlocksCleared); a thread sends them over ZMQ in
vLLM's msgpack shape to a router, which keeps a directory of which replica holds which
block. How to start replicas and vllm-router with them, and the wire: the comment below.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import threading
import time
from argparse import ArgumentTypeError
from collections import deque
from dataclasses import dataclass

from minipaged.paging.prefix_cache import POOL

# Replicas behind vllm-router 0.1.17's kv_aware policy, on one machine (the wire needs
# `pip install 'minipaged[kv-events]'`; tried as written):
#
#     python -m minipaged.serve --port 8001 --kv-events-config \
#         '{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:5557",
#           "replay_endpoint": "tcp://127.0.0.1:5567"}'
#     python -m minipaged.serve --port 8002 --kv-events-config ... 5558 ... 5568
#     vllm-router --policy kv_aware --worker-urls http://127.0.0.1:8001 \
#         http://127.0.0.1:8002 --kv-event-block-size 16 --kv-event-model MODEL \
#         --kv-event-source http://127.0.0.1:8001=tcp://127.0.0.1:5557 \
#         --kv-event-source http://127.0.0.1:8002=tcp://127.0.0.1:5558 \
#         --kv-event-replay-source http://127.0.0.1:8001=tcp://127.0.0.1:5567 \
#         --kv-event-replay-source http://127.0.0.1:8002=tcp://127.0.0.1:5568
#
# --kv-event-block-size is the replicas' --block-size (16 by default), MODEL their
# served model name. Without --kv-event-source the router asks each replica: GET
# /get_server_info must then carry kv_block_size (or block_size, never both), and GET
# /kv_event_sources (here) says where to subscribe. The router tokenizes a prompt
# through the replica (/v1/completions/render, else /tokenize) and matches blocks by
# their token ids; it uses the block hashes only to chain a block to its parent and to
# remove it. It subscribes when it starts: a block stored before that stays unknown to
# it (it did not ask the replay socket for it when tried).
#
# An endpoint with port 0 takes a free port (/kv_event_sources reports it). minipaged
# binds each endpoint it is given (vLLM binds wildcard hosts and connects to others) and
# binds 127.0.0.1 unless told, as its HTTP server does (vLLM's default: tcp://*:5557).
#
# The wire, as vLLM's ZmqEventPublisher sends it: per batch three frames (topic,
# sequence number as 8 bytes big-endian, msgpack payload); the payload is the array [ts,
# events, data_parallel_rank] and each event a map tagged by "type" (msgspec's tag=True,
# omit_defaults): BlockStored {block_hashes, parent_block_hash, token_ids, block_size,
# lora_id, medium, lora_name}, BlockRemoved {block_hashes, medium}, AllBlocksCleared {}.
# The medium is "GPU" for the pool and "CPU" for the tier behind it
# (--kv-offload-frames): vllm-router credits a block in the tier at --kv-penalty-host
# (0.8) of one in the pool, as tried. Consecutive blocks of one chain in one medium
# travel as one BlockStored. A hash is prefix_cache.block_hash: anyone can compute it
# from token ids (sha256, no seed). The replay socket (ROUTER) answers [b"", first
# sequence number as 8 bytes] with each kept batch from there as [sequence number,
# payload], then [-1, b""].

LOG = logging.getLogger("minipaged.serve")
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay's last reply
MAX_BATCH = 1024  # events in one batch at most
INSTALL = "pip install 'minipaged[kv-events]'"
SCHEMES = ("tcp", "ipc", "inproc")  # the ZMQ transports an endpoint may name


@dataclass(slots=True)
class KVEventsConfig:
    """vLLM's --kv-events-config fields (vllm.config.KVEventsConfig)."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None  # "zmq" when events are on, else "null"
    endpoint: str = "tcp://127.0.0.1:5557"  # vLLM's default: tcp://*:5557
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # the PUB socket's high-water mark
    max_queue_size: int = 100_000  # events waiting for the thread
    topic: str = ""

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"


def parse_config(text: str) -> KVEventsConfig:
    """--kv-events-config: a JSON object of vLLM's KVEventsConfig fields, checked now
    (and, when events are on, that pyzmq and msgpack are installed)."""
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as error:
        raise ArgumentTypeError(
            f"{text!r} is not JSON ({error.msg}): write e.g."
            ' \'{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:5557"}\''
        ) from None
    if not isinstance(fields, dict):
        raise ArgumentTypeError("write a JSON object of vLLM's KVEventsConfig fields")
    known = [f.name for f in dataclasses.fields(KVEventsConfig)]
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise ArgumentTypeError(
            f"no field {', '.join(unknown)}: the fields are {', '.join(known)}"
        )
    config = KVEventsConfig(**fields)
    if config.publisher is None:
        config.publisher = "zmq" if config.enable_kv_cache_events else "null"
    what = _mistake(config)
    if what:
        raise ArgumentTypeError(what)
    if config.enabled:
        try:
            wire()
        except RuntimeError as error:
            raise ArgumentTypeError(str(error)) from None
    return config


def _mistake(config: KVEventsConfig) -> str | None:
    """What is wrong with the fields, in words (None: nothing)."""
    if not isinstance(config.enable_kv_cache_events, bool):
        return "enable_kv_cache_events is true or false"
    if config.publisher not in ("zmq", "null"):
        return f"publisher {config.publisher!r}: minipaged has 'zmq' (and 'null': none)"
    for name in ("buffer_steps", "hwm", "max_queue_size"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{name} is a whole number >= 1, got {value!r}"
    for name in ("endpoint", "replay_endpoint"):
        value = getattr(config, name)
        if value is None and name == "replay_endpoint":
            continue
        if not isinstance(value, str) or value.partition("://")[0] not in SCHEMES:
            return f"{name} {value!r} is not a ZMQ address such as tcp://127.0.0.1:5557"
    if not isinstance(config.topic, str):
        return f"topic is a string, got {config.topic!r}"
    return None


def wire():
    """pyzmq and msgpack, or an error that says how to install them."""
    try:
        import msgpack
        import zmq
    except ImportError as error:
        raise RuntimeError(
            f"KV cache events need pyzmq and msgpack ({error.name} is missing):"
            f" {INSTALL}"
        ) from None
    return zmq, msgpack


def batch_of(raw: list[tuple], block_size: int) -> list[dict]:
    """vLLM's events for the listener's calls (as tuples: the call's name, then its
    arguments, the medium last or left out for POOL), in order: consecutive blocks of
    one chain in one medium become one BlockStored, consecutive removals one
    BlockRemoved."""
    events: list[dict] = []
    for kind, *args in raw:
        last = events[-1] if events else {"type": None, "medium": None}
        if kind == "stored":
            block, parent, token_ids = args[:3]
            medium = args[3] if len(args) > 3 else POOL
            chained = last["type"] == "BlockStored" and last["medium"] == medium
            if chained and last["block_hashes"][-1] == parent:
                last["block_hashes"].append(block)
                last["token_ids"].extend(int(t) for t in token_ids)
            else:
                event = stored_event([block], parent, token_ids, block_size, medium)
                events.append(event)
        elif kind == "removed":
            block = args[0]
            medium = args[1] if len(args) > 1 else POOL
            if last["type"] == "BlockRemoved" and last["medium"] == medium:
                last["block_hashes"].append(block)
            else:
                events.append(removed_event([block], medium))
        else:
            events.append({"type": "AllBlocksCleared"})
    return events


def stored_event(block_hashes, parent, token_ids, block_size: int, medium) -> dict:
    """BlockStored as msgspec writes it: the tag, then every field without a default
    (the ones with a default, None here, are left out: omit_defaults)."""
    return {
        "type": "BlockStored",
        "block_hashes": block_hashes,
        "parent_block_hash": parent,
        "token_ids": [int(t) for t in token_ids],  # numpy ints are not msgpack's
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
    }


def removed_event(block_hashes, medium) -> dict:
    return {"type": "BlockRemoved", "block_hashes": block_hashes, "medium": medium}


class KVEventPublisher:
    """A prefix-cache listener that publishes its events (add it with
    BlockManager.add_cache_listener). The engine thread only queues a tuple per
    event; a thread of its own batches them, encodes and sends them, and answers
    replay requests. A full queue drops the event and counts it in `dropped`."""

    def __init__(self, config: KVEventsConfig, block_size: int, rank: int = 0):
        zmq, self.msgpack = wire()
        self.config, self.block_size, self.rank = config, block_size, rank
        self.inbox: queue.Queue = queue.Queue(maxsize=config.max_queue_size)
        self.kept: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self.dropped = self.seq = 0
        self.context = zmq.Context()
        self.replay, self.replay_endpoint = None, None
        try:
            self.pub = self.context.socket(zmq.PUB)
            self.pub.set_hwm(config.hwm)
            self.endpoint = self._bind(self.pub, config.endpoint)
            if config.replay_endpoint is not None:
                self.replay = self.context.socket(zmq.ROUTER)
                self.replay_endpoint = self._bind(self.replay, config.replay_endpoint)
        except OSError:
            self.context.destroy(linger=0)  # nothing stays bound
            raise
        self.topic = config.topic.encode()
        self.closing = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name="minipaged-kv-events", daemon=True
        )
        self.thread.start()

    # ---- the prefix cache's listener (called on the engine thread) -------------------
    def stored(self, block: int, parent: int | None, token_ids, medium=POOL) -> None:
        self._put(("stored", block, parent, token_ids, medium))

    def removed(self, block: int, medium=POOL) -> None:
        self._put(("removed", block, medium))

    def cleared(self) -> None:
        self._put(("cleared",))

    def _put(self, event: tuple) -> None:
        try:
            self.inbox.put_nowait(event)
        except queue.Full:  # the router's view goes stale; the engine goes on
            if not self.dropped:
                LOG.warning("KV events: the queue is full, events are dropped")
            self.dropped += 1

    # ---- what a router is told -----------------------------------------------------
    def sources(self, host: str | None = None) -> dict[str, dict]:
        """GET /kv_event_sources: where to subscribe, by data-parallel rank (the shape
        vllm-router 0.1.17 reads: it subscribes only to an entry that names the
        publisher, the encoding and the schema); a wildcard host becomes `host`, the
        one the caller reached."""
        entry = {
            "data_parallel_rank": self.rank,
            "endpoint": self._reachable(self.endpoint, host),
            "replay_endpoint": self._reachable(self.replay_endpoint, host),
            "topic": self.config.topic,
            "publisher": "zmq",
            "encoding": "msgpack",
            "schema_version": 1,
            "enable_kv_cache_events": True,
            "buffer_steps": self.config.buffer_steps,
            "hwm": self.config.hwm,
        }
        return {str(self.rank): entry}

    @staticmethod
    def _reachable(endpoint: str | None, host: str | None) -> str | None:
        if endpoint is None or host is None:
            return endpoint
        for wildcard in ("//0.0.0.0:", "//*:", "//[::]:"):
            endpoint = endpoint.replace(wildcard, f"//{host}:")
        return endpoint

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued event is sent (True), or `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self.inbox.all_tasks_done:
            while self.inbox.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.inbox.all_tasks_done.wait(left)
        return True

    def close(self) -> None:
        """Send what is queued, stop the thread, close the sockets."""
        self.flush(timeout=2.0)
        self.closing.set()
        self.thread.join(timeout=2.0)
        self.context.destroy(linger=500)

    # ---- the publishing thread -----------------------------------------------------
    def _bind(self, socket, endpoint: str) -> str:
        """Bind `endpoint` (port 0: a free one); the address bound, port resolved."""
        scheme, _, rest = endpoint.partition("://")
        try:
            if scheme == "tcp" and rest.endswith(":0"):
                host = rest[: -len(":0")]
                port = socket.bind_to_random_port(f"tcp://{host}")
                return f"tcp://{host}:{port}"
            socket.bind(endpoint)
        except Exception as error:
            raise OSError(
                f"--kv-events-config: cannot bind {endpoint}: {error} (give an address"
                " of this machine and a free port, or port 0 for any free one)"
            ) from None
        return endpoint

    def _run(self) -> None:
        while not self.closing.is_set():
            self._serve_replay()
            try:
                raw = [self.inbox.get(timeout=0.05)]
            except queue.Empty:
                continue
            while len(raw) < MAX_BATCH:
                try:
                    raw.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            try:
                self._send(batch_of(raw, self.block_size))
            except Exception:  # a batch lost, the thread goes on (vLLM's does too)
                LOG.exception("KV events: a batch could not be sent")
                self.dropped += len(raw)
            for _ in raw:
                self.inbox.task_done()

    def _send(self, events: list[dict]) -> None:
        payload = self.msgpack.packb([time.time(), events, self.rank])
        seq = self.seq.to_bytes(8, "big")
        self.pub.send_multipart([self.topic, seq, payload])
        self.kept.append((self.seq, payload))
        self.seq += 1

    def _serve_replay(self) -> None:
        """Answer each waiting replay request with the kept batches from its start."""
        while self.replay is not None and self.replay.poll(0):
            frames = self.replay.recv_multipart()
            if len(frames) != 3:
                continue  # not [identity, b"", start]: vLLM ignores it too
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.kept):
                if seq >= first:
                    reply = [client, b"", seq.to_bytes(8, "big"), payload]
                    self.replay.send_multipart(reply)
            self.replay.send_multipart([client, b"", END_SEQ, b""])


def start(config: KVEventsConfig | None, blocks) -> KVEventPublisher | None:
    """The publisher for `config`, listening to the block manager's prefix cache (None
    when events are off)."""
    if config is None or not config.enabled:
        return None
    publisher = KVEventPublisher(config, blocks.block_size)
    try:
        blocks.add_cache_listener(publisher)
    except ValueError:
        publisher.close()
        raise
    return publisher
