"""Two minipaged replicas behind vllm-router (from PyPI), as `bench route` builds them:
every request kind routed under four policies with no 404 in the router's calls to a
replica, kv_aware sending a returning conversation to the replica that holds its blocks,
bench route's figures (cache_aware at the one-replica ceiling), and the cluster's
failures (a replica killed mid-stream, a cold replica, a router restarted mid-stream,
the prefix cache reset under load) as a client sees them. A tiny random model; every
wait bounded; every process stopped by its PID.
"""

import asyncio
import json
import re
import shutil
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from checkpoints import write_checkpoint
from test_serve import wait_until_idle

from minipaged.tools.bench import route

pytestmark = pytest.mark.skipif(
    shutil.which("vllm-router", path=route.router_search_path()) is None,
    reason="vllm-router is not installed here (pip install -e '.[router]': Linux only)",
)
# one system prompt per conversation, in the tiny model's words: no block of one is a
# block of another
USERS = route.conversations(users=4, turns=2, system_words=40, seed=1)
POLICIES = ["round_robin", "power_of_two", "cache_aware", "kv_aware"]
# tokens of a stream long enough to be cut by a kill (the tiny model makes about a
# thousand a second on a quiet core)
LONG = 3000
# every request kind a client sends: (path, body)
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
KINDS = {
    "chat": (CHAT, {"messages": [{"role": "user", "content": "hello"}]}),
    "completions": (COMPLETIONS, {"prompt": "the page table of a"}),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tiny random checkpoint with room for long streams."""
    return write_checkpoint(tmp_path_factory.mktemp("tiny-router"), max_positions=4096)


@dataclass
class Cluster:
    """The module's two replicas (a test may replace one), their logs' folder, and the
    stack that stops them."""

    replicas: list[route.Started]
    logs: Path
    stack: ExitStack


@pytest.fixture(scope="module")
def cluster(model, tmp_path_factory):
    """Two replicas publishing their KV-cache events, shared by the tests (each starts
    a router of its own in front of them); long streams allowed."""
    logs = tmp_path_factory.mktemp("router-logs")
    with ExitStack() as stack:
        replicas = route.start_replicas(
            model,
            2,
            logs,
            stack,
            kv_events=True,
            options=("--max-tokens-limit", str(LONG)),
        )
        yield Cluster(replicas, logs, stack)


def post(url: str, path: str, body: dict, key: str = "test") -> httpx.Response:
    body = {"model": route.SERVED_NAME, "max_tokens": 6, "temperature": 0} | body
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=60)


def stream(url: str, path: str, body: dict) -> list[dict]:
    """A streamed request's chunks, [DONE] seen (an error if it ends without)."""
    body = {"model": route.SERVED_NAME, "max_tokens": 6, "temperature": 0} | body
    chunks, done = [], False
    with httpx.stream(
        "POST", f"{url}{path}", json=body | {"stream": True}, timeout=60
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks.append(json.loads(line[len("data: ") :]))
    assert done, "the stream ended without [DONE]"
    return chunks


def text_of(answer: dict) -> str:
    choice = answer["choices"][0]
    return choice.get("text") or choice.get("message", {}).get("content") or ""


def streamed_text(chunks: list[dict]) -> str:
    return "".join(
        c["choices"][0].get("text")
        or c["choices"][0].get("delta", {}).get("content")
        or ""
        for c in chunks
        if c.get("choices")
    )


def generations(replica: route.Started, since: int = 0) -> int:
    """Completions and chats the replica answered 200 (its access log, from character
    `since`)."""
    served = r'"POST /v1/(chat/)?completions HTTP/[\d.]+" 200'
    return len(re.findall(served, replica.output()[since:]))


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_routes_every_kind_without_a_404(cluster, policy):
    """Chat and completions, streamed and not, answer through the router exactly as
    from a replica itself (greedy), the two replicas share the work under round_robin,
    and no call the router made to a replica was answered 404."""
    replicas = cluster.replicas
    marks = [len(r.output()) for r in replicas]
    with ExitStack() as stack:
        router = route.start_router(replicas, policy, cluster.logs, stack)
        for name, (path, body) in KINDS.items():
            alone = text_of(post(replicas[0].url, path, body).json())
            for _ in range(2):
                answer = post(router.url, path, body)
                assert answer.status_code == 200, (policy, name, answer.text)
                assert text_of(answer.json()) == alone, (policy, name)
                assert streamed_text(stream(router.url, path, body)) == alone
        time.sleep(0.5)  # the router's background calls, if any, come in too
    served = [generations(r, mark) for r, mark in zip(replicas, marks)]
    if policy == "round_robin":
        assert min(served) >= 4, served
    missing = route.not_found(replicas, marks)
    assert not missing, f"{policy}: the router's calls answered 404: {missing}"


def test_kv_aware_sends_a_returning_conversation_to_the_replica_holding_its_blocks(
    cluster,
):
    """Each conversation's first turn is sent to a replica chosen here, behind the
    router's back: only the replicas' KV events tell the router where its blocks are.
    Its second turn, through the router, must land there: each replica serves no user
    it had not served, and every second turn finds its first turn's blocks cached."""
    replicas = cluster.replicas
    with ExitStack() as stack:
        router = route.start_router(replicas, "kv_aware", cluster.logs, stack)
        histories = []
        for u, user in enumerate(USERS):
            messages = [
                {"role": "system", "content": user.system},
                {"role": "user", "content": user.questions[0]},
            ]
            home = replicas[2 * u // len(USERS)]  # A, A, B, B: not round robin
            answer = post(home.url, CHAT, {"messages": messages}, user.key)
            assert answer.status_code == 200, answer.text
            messages.append({"role": "assistant", "content": text_of(answer.json())})
            messages.append({"role": "user", "content": user.questions[1]})
            histories.append(messages)
        before = [route.scrape(r) for r in replicas]
        time.sleep(2.0)  # the events reach the router's directory (no signal says when)
        for user, messages in zip(USERS, histories):
            answer = post(router.url, CHAT, {"messages": messages}, user.key)
            assert answer.status_code == 200, answer.text
        after = [route.scrape(r) for r in replicas]
    for b, a in zip(before, after):
        assert a["clients"] == b["clients"], (
            "a returning turn went to the other replica"
        )
    queries = sum(a["queries"] - b["queries"] for a, b in zip(after, before))
    hits = sum(a["hits"] - b["hits"] for a, b in zip(after, before))
    assert hits >= 0.5 * queries, (hits, queries)


def measure(front: str, replicas: list[route.Started], users) -> dict:
    """bench route's measure of one run: the conversations through `front`, the
    replicas' counters around them (their prefix caches emptied first)."""
    from tqdm import tqdm

    for replica in replicas:
        assert httpx.post(f"{replica.url}/reset_prefix_cache", timeout=30).is_success
    before = [route.scrape(r) for r in replicas]
    with tqdm(disable=True) as progress:
        rows = asyncio.run(route.converse(front, users, 4, progress))
    after = [route.scrape(r) for r in replicas]
    return route.summarize(rows, before, after, seconds=1.0)


def test_the_bench_measures_cache_aware_at_the_ceiling(cluster):
    """bench route's workload and figures, on the module's replicas: through
    cache_aware each user stays on one replica and the hit rate is the one of every
    conversation on one replica; the table and the chart show both."""
    replicas = cluster.replicas
    users = route.conversations(users=3, turns=3, system_words=40, seed=2)
    for u, user in enumerate(users):  # keys no other test sent: new clients
        user.key = f"bench-{u}"
    with ExitStack() as stack:
        router = route.start_router(replicas, "cache_aware", cluster.logs, stack)
        routed = measure(router.url, replicas, users)
    ceiling = measure(replicas[0].url, replicas, users)
    assert sum(routed["users_per_replica"]) == 3  # no user on two replicas
    assert routed["prompt_tokens"] == ceiling["prompt_tokens"] > 0
    assert routed["hit_rate"] == ceiling["hit_rate"] > 0.3, (routed, ceiling)
    assert routed["computed_tokens"] == ceiling["computed_tokens"]
    assert routed["ttft_later_p50_ms"] > 0 and routed["first_prompt_tokens_mean"] > 40
    result = {
        "model": "tiny",
        "router": "vllm-router",
        "replicas": 2,
        "users": 3,
        "turns": 3,
        "max_tokens": 4,
        "cpus": 2,
        "policies": {"cache_aware": routed | {"worker_404s": {}}},
        "ceiling": ceiling | {"worker_404s": {}},
    }
    text = route.table(result)
    for label, run in (("cache_aware", routed), ("one replica (ceiling)", ceiling)):
        row = re.search(rf"^  {re.escape(label)} +(\S+) +(\S+)", text, re.M)
        assert row[1] == f"{run['hit_rate']:.3f}", text
        assert row[2] == f"{run['computed_tokens']:,}", text
    assert f"hit rate {ceiling['hit_rate']:.2f}" in route.chart(result).svg()


def test_prefix_cache_reset_under_load(cluster):
    """Resets of both replicas' prefix caches while requests run through the router
    change no answer; afterwards a reset drops the finished requests' blocks, and the
    same prompt again finds nothing cached."""
    replicas = cluster.replicas
    prompts = [f"{user.system} {user.questions[0]}" for user in USERS]
    alone = [
        text_of(post(replicas[0].url, COMPLETIONS, {"prompt": p}).json())
        for p in prompts
    ]

    async def load(router: str) -> list[str]:
        async with httpx.AsyncClient(timeout=60) as http:

            async def one(prompt: str) -> str:
                body = {
                    "model": route.SERVED_NAME,
                    "prompt": prompt,
                    "max_tokens": 6,
                    "temperature": 0,
                }
                r = await http.post(f"{router}{COMPLETIONS}", json=body)
                assert r.status_code == 200, r.text
                return text_of(r.json())

            async def resets() -> list[int]:
                dropped = []
                for _ in range(5):
                    for replica in replicas:
                        r = await http.post(f"{replica.url}/reset_prefix_cache")
                        assert r.status_code == 200, r.text
                        dropped.append(r.json()["dropped_blocks"])
                    await asyncio.sleep(0.05)
                return dropped

            *answers, dropped = await asyncio.gather(
                *(one(p) for p in prompts * 3), resets()
            )
            assert all(isinstance(n, int) and n >= 0 for n in dropped)
            return answers

    with ExitStack() as stack:
        router = route.start_router(replicas, "round_robin", cluster.logs, stack)
        answers = asyncio.run(asyncio.wait_for(load(router.url), 120))
    assert answers == alone * 3
    replica = replicas[0]
    assert post(replica.url, COMPLETIONS, {"prompt": prompts[0]}).status_code == 200
    dropped = httpx.post(f"{replica.url}/reset_prefix_cache", timeout=30).json()
    assert dropped["dropped_blocks"] > 0
    before = route.scrape(replica)
    assert post(replica.url, COMPLETIONS, {"prompt": prompts[0]}).status_code == 200
    after = route.scrape(replica)
    assert after["queries"] > before["queries"] and after["hits"] == before["hits"]


def long_stream(url: str, going: threading.Event, results: dict, i: int) -> None:
    """A stream of LONG tokens through `url`: its lines, and how it ended ("ended", or
    the transport error's name); `going` is set once it has sent a few."""
    body = {
        "model": route.SERVED_NAME,
        "prompt": "hello world",
        "max_tokens": LONG,
        "ignore_eos": True,
        "stream": True,
    }
    lines = []
    try:
        with httpx.stream("POST", f"{url}{COMPLETIONS}", json=body, timeout=60) as r:
            for line in r.iter_lines():
                lines.append(line)
                if len(lines) == 8:
                    going.set()
        results[i] = ("ended", lines)
    except httpx.TransportError as error:
        results[i] = (type(error).__name__, lines)


def abort_count(replica: route.Started) -> float:
    """Requests the replica aborted (its clients hung up), from its /metrics."""
    text = httpx.get(f"{replica.url}/metrics", timeout=10).text
    pattern = (
        r'^minipaged:request_success_total\{[^}]*finished_reason="abort"[^}]*\} (\S+)$'
    )
    return float(re.search(pattern, text, re.M)[1])


def test_a_router_restarted_mid_stream(cluster):
    """The router killed while a stream runs through it: the client's stream ends in a
    transport error (never [DONE]), the replica aborts the request it was serving (it
    falls idle: nothing running or waiting, no frame held), and a router started again
    on the same port routes as before."""
    with ExitStack() as stack:
        router = route.start_router(
            cluster.replicas, "round_robin", cluster.logs, stack
        )
        aborts = [abort_count(replica) for replica in cluster.replicas]
        results, going = {}, threading.Event()
        thread = threading.Thread(
            target=long_stream, args=(router.url, going, results, 0)
        )
        thread.start()
        assert going.wait(30), results
        router.process.kill()
        router.process.wait(10)
        thread.join(60)
        assert not thread.is_alive()
        how, lines = results[0]
        assert how != "ended", "the stream ended cleanly through a killed router"
        assert "data: [DONE]" not in lines
        # the replicas abort what the router's hang-up left running
        for replica in cluster.replicas:
            wait_until_idle(replica.url, seconds=30)
        after = [abort_count(replica) for replica in cluster.replicas]
        assert sum(after) - sum(aborts) == 1, "the router's hang-up aborted nothing"
        # the same command again, on the same port
        again = route.launch(
            list(router.process.args),
            router.url,
            cluster.logs / "router-restarted.log",
            stack,
        )
        route.wait_healthy(again)
        path, body = KINDS["completions"]
        alone = text_of(post(cluster.replicas[0].url, path, body).json())
        for _ in range(4):
            answer = post(again.url, path, body)
            assert answer.status_code == 200, answer.text
            assert text_of(answer.json()) == alone


def test_a_replica_killed_mid_stream_then_back_cold(cluster):
    """(Last: it replaces a replica.) Two long streams, one on each replica; one
    replica is killed: its stream ends in a transport error (never [DONE], never a
    finish reason), the other's completes; the requests after it are served; the
    replica restarted on its port (cold: an empty prefix cache) is routed to again and
    answers as the other does."""
    replicas = cluster.replicas
    with ExitStack() as stack:
        router = route.start_router(
            replicas,
            "round_robin",
            cluster.logs,
            stack,
            ("--health-check-interval-secs", "1", "--health-failure-threshold", "1"),
        )
        results, going = {}, [threading.Event(), threading.Event()]
        threads = [
            threading.Thread(
                target=long_stream, args=(router.url, going[i], results, i)
            )
            for i in range(2)
        ]
        for thread in threads:
            thread.start()
            time.sleep(0.2)  # one stream to each replica, in turn
        assert all(event.wait(30) for event in going), results
        killed = replicas[1]
        killed.process.kill()
        killed.process.wait(10)
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
        (cut, cut_lines), (ended, lines) = sorted(results.values())
        assert ended == "ended" and "data: [DONE]" in lines
        assert cut == "RemoteProtocolError", cut
        assert "data: [DONE]" not in cut_lines
        assert '"finish_reason":"length"' not in "".join(cut_lines).replace(" ", "")
        # the survivor is unharmed, and the cluster serves what comes next
        assert httpx.get(f"{replicas[0].url}/health", timeout=10).status_code == 200
        path, body = KINDS["chat"]
        alone = text_of(post(replicas[0].url, path, body).json())
        statuses = [post(router.url, path, body).status_code for _ in range(6)]
        assert statuses[-3:] == [200, 200, 200], statuses
        # back on its port, cold (an empty prefix cache): routed to again in time
        cold = route.launch(
            list(killed.process.args),
            killed.url,
            cluster.logs / "replica-1-cold.log",
            cluster.stack,
        )
        replicas[1] = cold
        route.wait_healthy(cold)
        deadline = time.monotonic() + 30
        while generations(cold) == 0 and time.monotonic() < deadline:
            answer = post(router.url, path, body)
            assert answer.status_code == 200 and text_of(answer.json()) == alone
            time.sleep(0.2)
        assert generations(cold) > 0, "the router never sent the cold replica a request"
