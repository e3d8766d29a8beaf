"""Structured output on a server under load: a pattern compiles on a worker thread after
the admission checks, so that another client's stream keeps its pace and /health
answers while costly ones compile; a request refused with 429 compiles nothing, and one
refused with 400 gives its client's slots back; the cache of automata stays bounded
after 100 distinct costly patterns. SmolLM2 servers on 127.0.0.1 on free ports; every
loop bounded in count and time."""

from __future__ import annotations

import threading
import time

import httpx

from minipaged.sampling import StructuredOutputsParams
from minipaged.tools.serve.api import Server, ServerConfig
from minipaged.tools.serve.cli import ServerThread

TEN_THOUSAND = [f"w{i}x" for i in range(10_000)]


def serving(llm, **config):
    """A server over a fresh engine of llm, and the thread that serves it."""
    engine = llm.new_engine(max_num_seqs=8)
    server = Server(engine, llm.tokenizer, ServerConfig(model_name="smol", **config))
    return server, ServerThread(server)


def complete(url: str, **fields) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/completions",
        json={"prompt": "Say", "max_tokens": 2, **fields},
        timeout=120,
    )


def stream(url: str, arrivals: list, max_tokens: int, stop=None) -> None:
    """A greedy stream whose chunks' arrival times go into `arrivals`, until it ends or
    `stop` (an Event) is set (then it hangs up)."""
    body = {
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.perf_counter())
            if stop is not None and stop.is_set():
                return


def wait_for(condition, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.01)


def pace_while_compiling(llm) -> tuple[list[float], list[float], list, tuple]:
    """On a fresh server, another client's inter-token gaps (seconds) while 10,000
    choices, then (a{300}){300}, compile, /health's times meanwhile, the costly
    requests' windows, and (largest gap, slowest /health) before they came: the
    machine's own pace. The first also builds the vocabulary's trie."""
    server, thread = serving(llm)
    with thread as url:
        assert complete(url).status_code == 200  # warm
        arrivals: list[float] = []
        stop = threading.Event()
        reader = threading.Thread(
            target=stream, args=(url, arrivals, 600, stop), daemon=True
        )
        reader.start()
        wait_for(lambda: len(arrivals) >= 3)
        quiet_health = []
        for _ in range(10):  # the pace before anything costly is asked
            start = time.perf_counter()
            assert httpx.get(f"{url}/health", timeout=10).status_code == 200
            quiet_health.append(time.perf_counter() - start)
            time.sleep(0.1)
        wait_for(lambda: len(arrivals) >= 15)
        quiet_arrivals = list(arrivals)
        windows, health = [], []
        for fields in (
            {"guided_choice": TEN_THOUSAND},
            {"guided_regex": "(a{300}){300}"},
        ):
            answer: dict = {}

            def costly(fields=fields, answer=answer) -> None:
                start = time.perf_counter()
                answer["response"] = complete(url, **fields)
                answer["window"] = (start, time.perf_counter())

            asking = threading.Thread(target=costly, daemon=True)
            asking.start()
            deadline = time.monotonic() + 90
            while asking.is_alive() and time.monotonic() < deadline:
                start = time.perf_counter()
                assert httpx.get(f"{url}/health", timeout=10).status_code == 200
                health.append(time.perf_counter() - start)
                time.sleep(0.05)
            asking.join(timeout=10)
            assert answer["response"].status_code == 200, answer["response"].text
            windows.append(answer["window"])
        assert reader.is_alive(), "the stream ended before the costly requests did"
        wait_for(lambda: arrivals[-1] > windows[-1][1], 10)
        stop.set()
        reader.join(timeout=30)
    gaps = [
        later - earlier
        for earlier, later in zip(arrivals, arrivals[1:])
        if any(start < later and earlier < end for start, end in windows)
    ]
    assert len(gaps) >= 10, gaps
    quiet_gap = max(b - a for a, b in zip(quiet_arrivals[1:], quiet_arrivals[2:]))
    return gaps, health, windows, (quiet_gap, max(quiet_health))


def test_another_clients_stream_keeps_its_pace_while_costly_patterns_compile(smollm2):
    """Issue 41: 10,000 choices stalled another stream 23.3 s and /health 3.1 s;
    (a{300}){300} 2.9 s. Now the largest gap is a step or a few: 0.2 to 0.4 s on 2
    quiet cores (docs/16_automata.md), about 0.6 s while the test suite's other
    processes share them. A timed test on a shared machine holds the defect, not the
    speed: under 2 s (or 3x the machine's own pace measured just before, if slower),
    which the old 23 s stall fails by far. A second fresh server is measured before
    failing: a stall of the server's own making shows in both."""
    tries = []
    for _ in range(2):
        gaps, health, windows, (quiet_gap, quiet_health) = pace_while_compiling(smollm2)
        tries.append((max(gaps), max(health), quiet_gap, quiet_health))
        print(
            f"compiling: {[round(end - start, 2) for start, end in windows]} s;"
            f" another stream's largest gap {max(gaps):.3f} s over {len(gaps)} tokens"
            f" ({quiet_gap:.3f} s before), /health at most {max(health):.3f} s"
            f" ({quiet_health:.3f} s before)"
        )
        gap_bound = max(2.0, 3 * quiet_gap)
        health_bound = max(2.0, 3 * quiet_health)
        if max(gaps) < gap_bound and max(health) < health_bound:
            return
    raise AssertionError(
        f"(largest gap, slowest /health, both before) of each try: {tries}"
    )


def test_a_request_refused_with_429_compiles_nothing_and_a_400_gives_slots_back(
    smollm2,
):
    server, thread = serving(smollm2, max_concurrent_per_client=1)
    regex = "(a{300}){299}b"
    with thread as url:
        arrivals: list[float] = []
        reader = threading.Thread(target=stream, args=(url, arrivals, 200), daemon=True)
        reader.start()
        wait_for(lambda: len(arrivals) >= 1)
        start = time.perf_counter()
        refused = complete(url, guided_regex=regex)
        assert refused.status_code == 429, refused.text
        assert time.perf_counter() - start < 2.0
        backend = server.loop.engine.constraints
        key = StructuredOutputsParams(regex=regex).key()
        assert backend is None or key not in backend.cache
        reader.join(timeout=120)
        assert not reader.is_alive()
        # a pattern refused at compile gives the client's slot back: the next one runs
        bad = complete(url, guided_regex="a\\x04")
        assert bad.status_code == 400 and "cannot write" in bad.text, bad.text
        assert bad.json()["error"]["param"] == "guided_regex"
        assert complete(url, guided_regex=regex).status_code == 200
        backend = server.loop.engine.constraints
        assert key in backend.cache and not backend.held


def test_the_cache_of_automata_stays_bounded_after_100_distinct_costly_patterns(
    smollm2,
):
    server, thread = serving(smollm2)
    with thread as url:
        start = time.monotonic()
        for i in range(100):
            answer = complete(
                url, max_tokens=1, guided_regex=f"((a|b){{1000}}){{3}}c{i}"
            )
            assert answer.status_code == 200, answer.text
            assert time.monotonic() - start < 300
        backend = server.loop.engine.constraints
        states = backend.cached_states()
        print(
            f"{len(backend.cache)} automata cached, {states} states,"
            f" {len(backend.masks)} masks"
        )
        assert 0 < len(backend.cache) <= backend.max_cached
        assert states <= backend.max_cached_states
        assert len(backend.cache) < 100  # the least recently used went
        assert len(backend.masks) <= backend.masks.limit and not backend.held
