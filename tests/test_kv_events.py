"""The page table, published: the prefix cache's block events (vLLM's KV-cache events).

The events equal the prefix cache's own state: replaying them (stored, removed, cleared)
rebuilds exactly the set of cached block hashes, after every step of a random engine run
with evictions, preemptions, aborts and resets, and through a real ZMQ subscriber that
decodes vLLM's msgpack shape. The hashes in the events are the ones a router computes
from the token ids alone, and a reset drops what no sequence maps.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import time
from argparse import ArgumentTypeError

import numpy as np
import pytest

from minipaged.paging import (
    BlockManager,
    ContiguousBlockManager,
    StaticBlockManager,
    block_hash,
)


class Recorder:
    """A listener that keeps the events in order, as plain tuples."""

    def __init__(self):
        self.events: list[tuple] = []

    def stored(self, block, parent, token_ids, medium="GPU"):
        self.events.append(("stored", block, parent, tuple(token_ids), medium))

    def removed(self, block, medium="GPU"):
        self.events.append(("removed", block, medium))

    def cleared(self):
        self.events.append(("cleared",))


def replay(events, medium: str = "GPU") -> set[int]:
    """The names of the blocks held in `medium` ("GPU": the pool, "CPU": the tier), as
    a directory builds them from the events alone."""
    names = set()
    for event in events:
        if event[0] == "cleared":
            names.clear()
        elif event[-1] != medium:
            continue
        elif event[0] == "stored":
            assert event[1] not in names, f"block {event[1]} stored twice"
            names.add(event[1])
        else:
            assert event[1] in names, f"block {event[1]} removed but never stored"
            names.discard(event[1])
    return names


def cached_names(manager: BlockManager) -> set[int]:
    """The prefix cache's own names (what the pool holds, mapped or parked)."""
    return set(manager.device.prefix_cache.frame_of)


def router_hash(parent: int | None, block) -> int:
    """A block's name as a router computes it from token ids, written here from the
    rule alone (prefix_cache.block_hash's docstring): sha256 of the parent's name (8
    bytes big-endian, none for a first block) then the token ids (4 bytes
    little-endian each); the name is the digest's last 8 bytes, big-endian."""
    data = b"" if parent is None else parent.to_bytes(8, "big")
    data += struct.pack(f"<{len(block)}I", *block)
    return int.from_bytes(hashlib.sha256(data).digest()[-8:], "big")


def router_hashes(token_ids, block_size: int) -> list[int]:
    """The names of a prompt's full blocks, chained."""
    names, parent = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = router_hash(parent, token_ids[start : start + block_size])
        names.append(parent)
    return names


# ---- the block manager: reset, and the names --------------------------------------


def test_reset_drops_the_parked_blocks_and_keeps_the_mapped_ones():
    manager = BlockManager(num_blocks=8, block_size=2)
    recorder = Recorder()
    manager.add_cache_listener(recorder)
    manager.allocate("a", [1, 2, 3, 4, 5])
    manager.allocate("b", [1, 2, 9, 9, 9])  # shares block [1, 2] with a
    manager.free("a")  # [3, 4] is parked; [1, 2] is still mapped by b
    parked = router_hashes([1, 2, 3, 4], 2)[1]
    assert manager.reset_prefix_cache() == 1
    assert recorder.events[-1] == ("removed", parked, "GPU")
    assert manager.cached_frames([1, 2, 3, 4, 0]) == manager.block_table("b")[:1]
    assert manager.num_free_frames == 5
    assert cached_names(manager) == replay(recorder.events)
    manager.free("b")
    assert manager.reset_prefix_cache() == 2
    assert recorder.events[-1] == ("cleared",)
    assert manager.num_free_frames == 8 and not cached_names(manager)
    # every frame can be taken again, and nothing is found any more
    assert manager.allocate("c", list(range(16))) == 0


def test_a_reset_with_nothing_cached_says_cleared_and_returns_zero():
    manager = BlockManager(num_blocks=4, block_size=2)
    recorder = Recorder()
    manager.add_cache_listener(recorder)
    assert manager.reset_prefix_cache() == 0
    assert recorder.events == [("cleared",)]
    for no_cache in (
        BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=False),
        ContiguousBlockManager(num_blocks=8),
        StaticBlockManager(num_slots=64, max_model_len=16),
    ):
        assert no_cache.reset_prefix_cache() == 0
        with pytest.raises(ValueError, match="enable_prefix_caching"):
            no_cache.add_cache_listener(Recorder())


def test_blocks_named_but_never_computed_are_removed_again():
    manager = BlockManager(num_blocks=8, block_size=2)
    recorder = Recorder()
    manager.add_cache_listener(recorder)
    manager.allocate("a", [1, 2, 3, 4, 5, 6, 7])  # names [1, 2], [3, 4], [5, 6]
    manager.free("a", num_computed=3)  # aborted after its first chunk
    names = router_hashes([1, 2, 3, 4, 5, 6], 2)
    assert recorder.events[-2:] == [
        ("removed", names[1], "GPU"),
        ("removed", names[2], "GPU"),
    ]
    assert replay(recorder.events) == cached_names(manager) == {names[0]}
    manager.allocate("b", [1, 2, 3, 4, 9])
    manager.rollback("b", 3)  # a rolled-back guess cuts [3, 4] short
    assert recorder.events[-1] == ("removed", names[1], "GPU")
    assert replay(recorder.events) == cached_names(manager)


def test_the_names_in_the_events_are_the_ones_a_router_computes_from_token_ids():
    rng = np.random.default_rng(0)
    manager = BlockManager(num_blocks=64, block_size=4)
    recorder = Recorder()
    manager.add_cache_listener(recorder)
    prompt = [int(t) for t in rng.integers(0, 150_000, size=37)]
    manager.allocate("a", prompt)
    stored = [e for e in recorder.events if e[0] == "stored"]
    assert [e[1] for e in stored] == router_hashes(prompt, 4)
    assert [e[2] for e in stored] == [None] + router_hashes(prompt, 4)[:-1]
    assert [list(e[3]) for e in stored] == [prompt[i : i + 4] for i in range(0, 36, 4)]
    # the same rule in another process gives the same name (no per-process seed)
    assert block_hash(None, [1, 2, 3, 4]) == router_hashes([1, 2, 3, 4], 4)[0]
    assert all(0 <= name < 2**64 for name in router_hashes(prompt, 4))


# ---- a random engine run: after every step, the events say what the cache holds ----

VOCAB = 60  # the tiny checkpoint's words are ids 0..~70


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from checkpoints import write_checkpoint

    from minipaged import LLM

    folder = write_checkpoint(tmp_path_factory.mktemp("kv_events"), max_positions=256)
    return LLM(str(folder), device="cpu", num_blocks=64, block_size=4)


def random_run(engine, seed: int, steps: int, after_step) -> dict:
    """Requests sharing a few prefixes arrive, run, are aborted and preempted, and the
    prefix cache is reset now and then, busy or idle; `after_step()` is called after
    each step. Returns what happened, so a test can say that it was exercised."""
    from minipaged import SamplingParams

    rng = np.random.default_rng(seed)
    prefixes = [[int(t) for t in rng.integers(5, VOCAB, size=n)] for n in (8, 13, 21)]
    seen = {"preempted": 0, "resets": 0, "aborts": 0, "requests": 0}
    for step in range(steps):
        busy = step // 40 % 2 == 0  # busy and quiet stretches: the engine goes idle
        if rng.random() < (0.45 if busy else 0.04) and len(engine.requests) < 6:
            prefix = prefixes[int(rng.integers(len(prefixes)))]
            tail = [int(t) for t in rng.integers(5, VOCAB, size=rng.integers(1, 10))]
            params = SamplingParams(max_tokens=int(rng.integers(1, 14)), temperature=0)
            request = {"prompt_token_ids": prefix + tail}
            engine.add_request(f"r{step}", request, params)
            seen["requests"] += 1
        if rng.random() < 0.04 and engine.requests:
            engine.abort_request(str(rng.choice(sorted(engine.requests))))
            seen["aborts"] += 1
        idle = not engine.has_unfinished_requests()
        if rng.random() < (0.2 if idle else 0.04):
            engine.blocks.reset_prefix_cache()
            seen["resets"] += 1
        if engine.has_unfinished_requests():
            seen["preempted"] += len(engine.step().preempted)
        after_step()
    return seen


def chains(events, block_size: int) -> list[tuple]:
    """Decoded vLLM events (dicts) as the listener's calls: one per block."""
    calls = []
    for event in events:
        if event["type"] == "BlockStored":
            parent = event["parent_block_hash"]
            for i, name in enumerate(event["block_hashes"]):
                tokens = event["token_ids"][i * block_size : (i + 1) * block_size]
                calls.append(("stored", name, parent, tuple(tokens), event["medium"]))
                parent = name
        elif event["type"] == "BlockRemoved":
            medium = event["medium"]
            calls += [("removed", name, medium) for name in event["block_hashes"]]
        else:
            calls.append(("cleared",))
    return calls


def check_against_cache(manager: BlockManager, events) -> None:
    """The names replayed from the events are the pool's own (medium GPU) and the
    tier's (CPU), and each name's parent and tokens (from its last BlockStored) are
    what its frame holds."""
    held = {"GPU": manager.device.prefix_cache.key_of}
    held["CPU"] = manager.tier.key_of if manager.tier is not None else {}
    for medium, key_of in held.items():
        names = replay(events, medium)
        assert names == {block_hash(*key) for key in key_of.values()}, medium
        told = {e[1]: (e[2], e[3]) for e in events if e[0] == "stored"}
        assert {name: told[name] for name in names} == {
            block_hash(*key): key for key in key_of.values()
        }


@pytest.mark.parametrize(
    "options",
    [
        {"preemption_mode": "recompute"},
        {"preemption_mode": "swap", "prefix_cache_policy": "clock"},
        {"preemption_mode": "recompute", "kv_offload_frames": 6},
        # the seams that name blocks late (guesses settled) or early (chunked prompts)
        {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
        {"enable_chunked_prefill": True, "max_num_batched_tokens": 6},
    ],
    ids=["recompute", "swap-clock", "tier", "speculation", "chunked"],
)
def test_replaying_the_events_rebuilds_the_cached_blocks_after_every_step(llm, options):
    engine = llm.new_engine(num_blocks=14, block_size=4, **options)
    recorder = Recorder()
    engine.blocks.add_cache_listener(recorder)

    def after_step():
        check_against_cache(engine.blocks, recorder.events)

    seen = random_run(engine, seed=1, steps=160, after_step=after_step)
    kinds = {(e[0], e[-1]) for e in recorder.events}
    pool = {("stored", "GPU"), ("removed", "GPU")}
    # a reset keeps the tier's blocks (as vLLM's keeps its offloaded ones), so with a
    # tier the cache is never empty again; without one, an idle reset empties it
    if "kv_offload_frames" in options:
        assert kinds == pool | {("stored", "CPU"), ("removed", "CPU")}, kinds
    else:
        assert kinds == pool | {("cleared", "cleared")}, kinds
    assert seen["preempted"] and seen["resets"] and seen["aborts"], seen
    assert any(e[0] == "removed" for e in recorder.events[:50]), "no early eviction"


# ---- the wire: a real ZMQ subscriber decodes vLLM's msgpack shape ------------------

zmq = pytest.importorskip("zmq", reason="the kv-events extra (pyzmq) is not installed")
msgpack = pytest.importorskip("msgpack", reason="the kv-events extra is not installed")

from minipaged.tools.serve import kv_events  # noqa: E402

STORED_FIELDS = {
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
}


def publisher_config(**fields) -> kv_events.KVEventsConfig:
    fields = {
        "enable_kv_cache_events": True,
        "endpoint": "tcp://127.0.0.1:0",
        "replay_endpoint": "tcp://127.0.0.1:0",
        **fields,
    }
    return kv_events.parse_config(json.dumps(fields))


def receive(sub, seqs: int, timeout: float = 10.0) -> dict[int, list]:
    """Frames from the subscriber until `seqs` batches came (or the timeout)."""
    got, deadline = {}, time.monotonic() + timeout
    while len(got) < seqs and time.monotonic() < deadline:
        if sub.poll(100):
            topic, seq, payload = sub.recv_multipart()
            got[int.from_bytes(seq, "big")] = [topic, payload]
    return got


def ask_replay(endpoint: str, start: int) -> list[tuple[int, bytes]]:
    """vLLM's replay protocol, as a router asks it: [b"", start] to the ROUTER socket,
    then (seq, payload) replies until seq -1."""
    context = zmq.Context.instance()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    replies = []
    while dealer.poll(5000):
        _, seq, payload = dealer.recv_multipart()
        if seq == kv_events.END_SEQ:
            break
        replies.append((int.from_bytes(seq, "big"), payload))
    dealer.close(linger=0)
    return replies


def test_a_zmq_subscriber_rebuilds_the_cache_from_vllm_shaped_batches(llm):
    engine = llm.new_engine(num_blocks=14, block_size=4)
    publisher = kv_events.start(publisher_config(topic="kv"), engine.blocks)
    try:
        context = zmq.Context.instance()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.connect(publisher.endpoint)
        time.sleep(0.3)  # the subscription reaches the PUB socket
        random_run(engine, seed=2, steps=120, after_step=lambda: None)
        assert publisher.flush() and publisher.dropped == 0
        got = receive(sub, publisher.seq)
        sub.close(linger=0)
        assert sorted(got) == list(range(publisher.seq)), "a batch was lost"
        events = []
        for seq in sorted(got):
            topic, payload = got[seq]
            assert topic == b"kv"
            ts, batch, rank = msgpack.unpackb(payload)  # vLLM's array_like EventBatch
            assert isinstance(ts, float) and rank == 0
            for event in batch:
                if event["type"] == "BlockStored":
                    assert set(event) == STORED_FIELDS
                    assert event["medium"] == "GPU" and event["block_size"] == 4
                    assert len(event["token_ids"]) == 4 * len(event["block_hashes"])
                elif event["type"] == "BlockRemoved":
                    assert set(event) == {"type", "block_hashes", "medium"}
                else:
                    assert event == {"type": "AllBlocksCleared"}
            events += chains(batch, 4)
        check_against_cache(engine.blocks, events)
        for call in events:  # each name is the one computed from its tokens alone
            if call[0] == "stored":
                assert call[1] == router_hash(call[2], call[3])
        # a subscriber that missed batches asks the replay socket for them
        replayed = ask_replay(publisher.replay_endpoint, start=3)
        assert [seq for seq, _ in replayed] == list(range(3, publisher.seq))
        assert all(payload == got[seq][1] for seq, payload in replayed)
    finally:
        publisher.close()


def test_the_route_says_where_to_subscribe_in_the_shape_vllm_router_reads(llm):
    """GET /kv_event_sources on every server: {} until the command line starts a
    publisher, then the entry vllm-router subscribes to; listed in /openapi.json."""
    import httpx
    from test_serve import serve

    with serve(llm, num_blocks=8, block_size=4) as url:
        assert httpx.get(f"{url}/kv_event_sources").json() == {}
        assert "/kv_event_sources" in httpx.get(f"{url}/openapi.json").json()["paths"]
    thread = serve(llm, num_blocks=8, block_size=4)
    config = publisher_config(endpoint="tcp://*:0", replay_endpoint=None)
    publisher = kv_events.start(config, thread.server.loop.engine.blocks)
    thread.server.workers.kv_events = publisher
    try:
        with thread as url:
            entry = httpx.get(f"{url}/kv_event_sources").json()["0"]
        port = publisher.endpoint.rsplit(":", 1)[1]
        assert entry["endpoint"] == f"tcp://127.0.0.1:{port}" and port != "0"
        assert entry["replay_endpoint"] is None
        assert (entry["publisher"], entry["encoding"], entry["schema_version"]) == (
            "zmq",
            "msgpack",
            1,
        )
    finally:
        publisher.close()


@pytest.mark.parametrize(
    "text, says",
    [
        ("{nope", "is not JSON"),
        ("[1]", "JSON object"),
        ('{"enable_kv_cache_events": true, "endpont": "x"}', "no field endpont"),
        ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "'zmq'"),
        ('{"enable_kv_cache_events": true, "endpoint": "5557"}', "ZMQ address"),
        ('{"enable_kv_cache_events": true, "hwm": 0}', "hwm"),
    ],
)
def test_a_bad_config_is_refused_with_a_sentence(text, says):
    with pytest.raises(ArgumentTypeError, match=says):
        kv_events.parse_config(text)


def test_events_off_publish_nothing_and_a_missing_wire_says_how_to_install(
    monkeypatch,
):
    manager = BlockManager(num_blocks=4, block_size=2)
    config = kv_events.parse_config('{"enable_kv_cache_events": false}')
    assert config.publisher == "null" and kv_events.start(config, manager) is None
    monkeypatch.setitem(sys.modules, "zmq", None)  # as if pyzmq were not installed
    with pytest.raises(
        ArgumentTypeError, match=r"pip install 'minipaged\[kv-events\]'"
    ):
        kv_events.parse_config('{"enable_kv_cache_events": true}')


def test_a_chain_travels_as_one_event_and_numpy_ids_become_ints():
    raw = [
        ("stored", 11, None, (np.int64(3), 4), "GPU"),
        ("stored", 12, 11, (5, np.int32(6)), "GPU"),  # continues the chain: one event
        ("stored", 13, 11, (7, 8), "GPU"),  # a sibling of 12: a new event
        ("stored", 14, 13, (9, 9), "CPU"),  # in the tier: a new event
        ("removed", 12, "GPU"),
        ("removed", 13, "GPU"),
        ("removed", 14, "CPU"),
        ("cleared",),
    ]
    events = kv_events.batch_of(raw, block_size=2)
    common = {"block_size": 2, "lora_id": None, "lora_name": None}
    assert events == [
        {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None}
        | {"token_ids": [3, 4, 5, 6], "medium": "GPU"}
        | common,
        {"type": "BlockStored", "block_hashes": [13], "parent_block_hash": 11}
        | {"token_ids": [7, 8], "medium": "GPU"}
        | common,
        {"type": "BlockStored", "block_hashes": [14], "parent_block_hash": 13}
        | {"token_ids": [9, 9], "medium": "CPU"}
        | common,
        {"type": "BlockRemoved", "block_hashes": [12, 13], "medium": "GPU"},
        {"type": "BlockRemoved", "block_hashes": [14], "medium": "CPU"},
        {"type": "AllBlocksCleared"},
    ]
    assert msgpack.unpackb(msgpack.packb(events)) == events
    assert chains(events, 2) == raw  # a subscriber reads back what the cache said
    # a listener's calls without a medium are the pool's
    pool = kv_events.batch_of([("stored", 11, None, (3, 4)), ("removed", 11)], 2)
    assert [event["medium"] for event in pool] == ["GPU", "GPU"]


def test_a_taken_port_is_refused_with_what_to_do():
    first = kv_events.start(publisher_config(replay_endpoint=None), BlockManager(8))
    try:
        taken = publisher_config(endpoint=first.endpoint, replay_endpoint=None)
        with pytest.raises(OSError, match="cannot bind .* port 0 for any free one"):
            kv_events.start(taken, BlockManager(8))
    finally:
        first.close()
