"""Issue 32, part 1, fair queuing: the waiting order of the least served client (the
Virtual Token Counter), the scheduler's `served` hook that feeds it, the victim it
brings, the client named by the engine and by the server, fcfs's tokens when there is
one client, and each client's service on the dashboard and /metrics. Issue 41: an idle
client's counter is forgotten (a heavy client back after a pause starts at the least
active counter, the state stays bounded) and the server drops the per-client bound
under any spelling of fair."""

import time
import types

import httpx
import pytest
from checkpoints import write_checkpoint

from minipaged import LLM, SamplingParams, policies
from minipaged.policies import checks
from minipaged.policies.fair import Fair, MostServed
from minipaged.sequence import Request, Sequence, Status
from minipaged.tools.serve import cli as serve_cli
from minipaged.tools.serve.api import Server, ServerConfig
from minipaged.tools.serve.cli import ServerThread
from minipaged.tools.serve.clients import client_name
from minipaged.tools.serve.dashboard import Dashboard


class Recording(Fair):
    """Fair, and each client's service in all, never forgotten (for a test to read)."""

    def __init__(self, *weights):
        super().__init__(*weights)
        self.total: dict[str, float] = {}

    def served(self, request, num_tokens: int, kind: str) -> None:
        super().served(request, num_tokens, kind)
        self.total[request.client] = (
            self.total.get(request.client, 0.0) + self.weights[kind] * num_tokens
        )


SHARED = Recording()  # an instance, for a "module:name" path


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(
        str(write_checkpoint(tmp_path_factory.mktemp("fair") / "tiny")),
        device="cpu",
        num_blocks=64,
        block_size=4,
    )


def request(name: str, client: str) -> Request:
    return Request(
        name,
        None,
        [5, 6, 7],
        SamplingParams(max_tokens=4),
        [Sequence(0, [5, 6, 7], 3)],
        client=client,
    )


def finishing_order(engine, late: dict[int, tuple[str, str]]) -> list[str]:
    """Four flood requests at step 0, then `late` (step -> (id, client)); who finished
    when."""
    for i in range(4):
        engine.add_request(
            f"flood{i}",
            {"prompt_token_ids": [5, 6, 7]},
            SamplingParams(max_tokens=6, ignore_eos=True),
            client="flood",
        )
    order = []
    for step in range(300):
        if step in late:
            name, client = late[step]
            engine.add_request(
                name,
                {"prompt_token_ids": [8, 9]},
                SamplingParams(max_tokens=2, ignore_eos=True),
                client=client,
            )
        order += [out.request_id for out in engine.step().finished]
        if step > max(late) and not engine.has_unfinished_requests():
            return order
    raise AssertionError(f"not done after 300 steps: {order}")


def test_the_least_served_client_goes_first_and_a_flood_does_not_hold_the_others_back(
    llm,
):
    late = {2: ("alice", "alice"), 3: ("bob", "bob")}
    fcfs = finishing_order(llm.new_engine(max_num_seqs=1), late)
    assert fcfs == ["flood0", "flood1", "flood2", "flood3", "alice", "bob"]
    fair = llm.new_engine(max_num_seqs=1, scheduling_policy="fair")
    assert (
        type(fair.scheduler.order) is Fair and type(fair.scheduler.victim) is MostServed
    )
    expected = ["flood0", "alice", "bob", "flood1", "flood2", "flood3"]
    assert finishing_order(fair, late) == expected
    # alice and bob were forgotten by the first pick after they left
    assert list(fair.scheduler.order.counters) == ["flood"]
    recording = Recording()
    assert (
        finishing_order(
            llm.new_engine(max_num_seqs=1, scheduling_policy=recording), late
        )
        == expected
    )
    # prompt 1 per token, output 2 per decoded token (the prefill samples the first)
    assert recording.total["alice"] >= 2 + 2
    assert recording.total["flood"] == 4 * (3 + 2 * 5)


def test_the_scheduler_tells_every_row_it_ran_to_an_order_that_listens(llm):
    class Listening(policies.FCFS):
        def __init__(self):
            self.heard = []

        def served(self, request, num_tokens, kind):
            self.heard.append((request.request_id, num_tokens, kind, request.client))

    order = Listening()
    engine = llm.new_engine(scheduling_policy=order, max_num_seqs=4)
    engine.add_request(
        "a",
        {"prompt_token_ids": [5, 6, 7, 8, 9]},
        SamplingParams(max_tokens=3, ignore_eos=True),
        client="alice",
    )
    engine.add_request(
        "b",
        {"prompt_token_ids": [5, 6]},
        SamplingParams(max_tokens=2, n=2, ignore_eos=True),
    )
    ran = []
    while engine.has_unfinished_requests():
        ran += [(rid, tokens, kind) for rid, _, kind, tokens in engine.step().ran]
    assert [(rid, n, kind) for rid, n, kind, _ in order.heard] == ran
    assert ("a", 5, "prefill", "alice") in order.heard and (
        "b",
        2,
        "prefill",
        "",
    ) in order.heard
    # an order without it is not asked (and that is no failure)
    errors = []
    row = types.SimpleNamespace(request=None, kind="decode")
    checks.served(policies.FCFS(), row, 1, errors)
    assert errors == []


def test_a_returning_client_is_lifted_to_the_least_active_counter_victim_most_served():
    order = Fair()
    flood, bob, old = (
        request("f0", "flood"),
        request("b0", "bob"),
        request("d0", "dave"),
    )
    for r in (flood, bob, old):
        # each arrives in turn, and is lifted to those before it
        order.served(r, 1, "prefill")
    assert order.counters == {"flood": 1, "bob": 2, "dave": 2}
    order.counters.update(flood=100.0, bob=40.0, dave=5.0)
    old.status = Status.FINISHED  # dave leaves; he comes back later with a low counter
    assert (
        order.pick([request("d1", "dave"), request("f1", "flood")], 0).request_id
        == "d1"
    )
    # lifted to bob's, the least active: not his own 5
    assert order.counters["dave"] == 40
    # zed: 40, a tie: the first
    assert (
        order.pick([request("b1", "bob"), request("z0", "zed")], 0).request_id == "b1"
    )
    assert order.counters["zed"] == 40
    assert MostServed(order).choose([bob, flood, request("b2", "bob")]) is flood
    with pytest.raises(ValueError, match="output_weight"):
        Fair(output_weight=-1)


def test_an_idle_clients_counter_is_forgotten_and_it_comes_back_at_the_least():
    """A heavy client's service before a pause is not held against it: idle, it has no
    counter; back, it starts at the least active counter, never above it."""
    order = Fair()
    heavy, bob = request("h0", "heavy"), request("b0", "bob")
    order.pick([heavy, bob], 0)
    order.served(heavy, 500, "decode")
    order.served(bob, 20, "decode")
    assert order.counters == {"heavy": 1000, "bob": 40}
    heavy.status = Status.FINISHED
    back, zed = request("h1", "heavy"), request("z0", "zed")
    # heavy's 1000 is gone: lifted to bob's 40, a tie, and heavy waited longest
    assert order.pick([back, zed], 1) is back
    assert order.counters == {"heavy": 40, "bob": 40, "zed": 40}
    # all leave: nothing is kept, and the next client starts from 0
    for r in (back, zed, bob):
        r.status = Status.FINISHED
    order.pick([request("a0", "alice")], 2)
    assert order.counters == {"alice": 0} and list(order.unfinished) == ["alice"]


class Counted:
    """A request that counts how often the order reads a status (its work)."""

    reads = 0

    def __init__(self, name: str, client: str):
        self.request_id, self.client, self.state = name, client, Status.WAITING

    @property
    def status(self):
        Counted.reads += 1
        return self.state


def test_the_state_and_the_work_per_arrival_do_not_grow_with_clients_ever_seen():
    """5,000 one-request clients in turn: the order holds the active one only, and an
    arrival reads as many statuses after 5,000 clients as after 50."""

    def work_per_arrival(seen: int) -> tuple[int, int]:
        order, held, steady = Fair(), 0, Counted("s0", "steady")
        for i in range(seen + 100):
            if i == seen:
                Counted.reads = 0
            r = Counted(f"r{i}", f"client{i}")
            order.pick([steady, r], i)
            order.served(r, 3, "prefill")
            r.state = Status.FINISHED
            held = max(held, len(order.counters), len(order.unfinished))
        return Counted.reads, held

    few, many = work_per_arrival(50), work_per_arrival(5000)
    assert few == many
    assert many[1] == 2  # the steady client, and the one arriving beside it


def test_a_heavy_client_back_after_a_pause_waits_no_longer_than_under_fcfs(llm):
    """Issue 41: a client served 8 long requests goes idle; after a pause it comes back
    beside a stream of newcomers (one every 2 steps), one row. Under fcfs it waits for
    one request; under fair it waited 89 steps behind every newcomer when its counter
    was kept."""

    def wait_of_the_return(policy) -> int:
        engine = llm.new_engine(max_num_seqs=1, scheduling_policy=policy)

        def params(n):
            return SamplingParams(max_tokens=n, ignore_eos=True)

        for i in range(8):
            engine.add_request(
                f"h{i}", {"prompt_token_ids": [5, 6, 7]}, params(24), client="heavy"
            )
        while engine.has_unfinished_requests():
            engine.step()
        for step in range(200):
            if step % 2 == 0 and step < 60:
                name = f"n{step}"
                engine.add_request(
                    name, {"prompt_token_ids": [8, 9]}, params(3), client=name
                )
            if step == 1:
                engine.add_request(
                    "back", {"prompt_token_ids": [8, 9]}, params(3), client="heavy"
                )
            for rid, _, kind, _ in engine.step().ran:
                if rid == "back" and kind == "prefill":
                    return step - 1
        raise AssertionError("the heavy client was never admitted")

    fcfs, fair = wait_of_the_return("fcfs"), wait_of_the_return("fair")
    assert fair <= fcfs <= 4, (fair, fcfs)


def test_one_client_gets_the_same_greedy_tokens_as_fcfs(llm):
    prompts = [{"prompt_token_ids": [5 + i, 6, 7 + 2 * i]} for i in range(6)]
    params = [
        SamplingParams(max_tokens=3 + i, temperature=0, ignore_eos=True)
        for i in range(6)
    ]

    # a small pool and 3 rows: requests wait, and some are preempted
    def tokens(
        policy,
    ):
        engine = llm.new_engine(
            num_blocks=10, block_size=4, max_num_seqs=3, scheduling_policy=policy
        )
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            engine.add_request(str(i), prompt, p)
        done, order = {}, []
        while engine.has_unfinished_requests():
            finished = engine.step().finished
            done |= {o.request_id: o.outputs[0].token_ids for o in finished}
            order += [o.request_id for o in finished]
        return [done[str(i)] for i in range(6)], order

    assert tokens("fair") == tokens("fcfs")


def test_the_engine_refuses_a_client_that_is_not_a_name(llm):
    engine = llm.new_engine()
    with pytest.raises(ValueError, match="client must be a string"):
        engine.add_request("x", "one two", client=5)
    assert not engine.has_unfinished_requests()


def test_the_server_orders_fairly_and_bounds_no_client_by_default():
    """Issue 41: `--scheduling-policy minipaged.policies.fair:Fair` kept fcfs's bound of
    4. Issue 40: the bound is opt-in whatever the order, and fair is the server's
    default order (LLM(...) keeps fcfs)."""
    parse = serve_cli.build_parser().parse_args

    def bound(*args: str) -> int:
        return parse(list(args)).max_concurrent_per_client

    assert bound() == 0 and parse([]).scheduling_policy == "fair"
    for spelling in (
        "fair",
        "minipaged.policies.fair:Fair",
        "test_fair_queuing:Recording",  # a subclass
        "test_fair_queuing:SHARED",  # an instance
        "sjf",
        "minipaged.policies.defaults:FCFS",
    ):
        assert bound("--scheduling-policy", spelling) == 0, spelling
        assert (
            bound("--scheduling-policy", spelling, "--max-concurrent-per-client", "2")
            == 2
        )


def test_the_server_names_the_client_by_key(llm):
    order = Recording()
    engine = llm.new_engine(scheduling_policy=order)
    with ServerThread(
        Server(engine, llm.tokenizer, ServerConfig(model_name="tiny"))
    ) as url:
        for key in ("alice", "bob", "alice"):
            r = httpx.post(
                f"{url}/v1/completions",
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
                json={"prompt": "one two", "max_tokens": 3, "ignore_eos": True, "n": 2},
            )
            assert r.status_code == 200, r.text
    total = order.total
    assert sorted(c.split(" Bearer ")[-1] for c in total) == ["alice", "bob"], total
    alice, bob = (
        next(v for c, v in total.items() if c.endswith(key)) for key in ("alice", "bob")
    )
    assert alice > bob > 0  # alice asked twice
    # bob was forgotten when alice came back, alone
    assert [c.split(" Bearer ")[-1] for c in order.counters] == ["alice"]


def test_the_dashboard_and_metrics_show_each_clients_service(llm):
    """Two clients (two API keys) through a real server under fair queuing: once it is
    idle, the dashboard's row of each (named without its key) holds the prompt tokens it
    sent and the tokens it was returned, its fair counter is the order's (bob's was
    forgotten when alice came back), and /metrics counts the same.
    """
    engine = llm.new_engine(scheduling_policy="fair")
    # key -> [prompt tokens, completion tokens] as the server's usage says
    sent = {
        "alice": [0, 0],
        "bob": [0, 0],
    }
    asks = [
        ("alice", "one two three", 5, 1),
        ("bob", "one", 3, 2),
        ("alice", "two three four five six", 4, 1),
    ]
    with ServerThread(
        Server(engine, llm.tokenizer, ServerConfig(model_name="tiny"))
    ) as url:
        for key, prompt, max_tokens, n in asks:
            r = httpx.post(
                f"{url}/v1/completions",
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
                json={
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                    "n": n,
                    "ignore_eos": True,
                },
            )
            assert r.status_code == 200, r.text
            sent[key][0] += r.json()["usage"]["prompt_tokens"]
            sent[key][1] += r.json()["usage"]["completion_tokens"]
        # the snapshot of the idle engine follows the last answer closely
        for _ in range(100):
            snapshot = httpx.get(f"{url}/dashboard/snapshot", timeout=10).json()
            if snapshot["counters"]["finished"] == len(asks) and not any(
                snapshot["queues"].values()
            ):
                break
            time.sleep(0.05)
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    # ignore_eos: every token asked for
    assert sent["alice"][1] == 5 + 4 and sent["bob"][1] == 3 * 2
    rows = {row["name"]: row for row in snapshot["clients"]}
    # no key on the page
    assert len(rows) == 2 and not any(key in name for name in rows for key in sent), (
        rows
    )
    by_key = {
        key: next(r for r in rows.values() if r["output_tokens"] == sent[key][1])
        for key in sent
    }
    for key, (prompt, output) in sent.items():
        row = by_key[key]
        assert (
            row["prompt_tokens"],
            row["output_tokens"],
            row["running"],
            row["waiting"],
        ) == (prompt, output, 0, 0)
        for kind, tokens in (("prompt", prompt), ("output", output)):
            assert (
                f'minipaged:client_tokens_total{{client="{row["name"]}",kind="{kind}",model_name="tiny"}}'
                f" {float(tokens)}" in metrics
            )
    # the order's counters as they stand: bob's was forgotten when alice came back
    counters = engine.scheduler.order.service()
    assert {client_name(c): round(v, 1) for c, v in counters.items()} == {
        r["name"]: r["counter"] for r in rows.values() if r["counter"] is not None
    }
    assert by_key["bob"]["counter"] is None and by_key["alice"]["counter"] > 0


def test_the_dashboard_shows_the_counters_of_the_active_clients(llm):
    """One row: alice's request runs, bob's waits; the dashboard's counters are the
    order's. Once both have left, carol's arrival forgets theirs."""
    engine = llm.new_engine(scheduling_policy="fair", max_num_seqs=1)
    for name in ("alice", "bob"):
        engine.add_request(
            name,
            {"prompt_token_ids": [5, 6, 7]},
            SamplingParams(max_tokens=6, ignore_eos=True),
            client=name,
        )
    dashboard = Dashboard("tiny")

    def shown() -> dict:
        rows = dashboard.snapshot(engine, time.perf_counter())["clients"]
        return {row["name"]: row["counter"] for row in rows}

    for _ in range(3):
        engine.step()
    service = engine.scheduler.order.service()
    assert service["alice"] == 3 + 2 * 2 and service["bob"] == 0  # bob came with alice
    assert shown() == {client_name(c): v for c, v in service.items()}
    while engine.has_unfinished_requests():
        engine.step()
    engine.add_request("carol", {"prompt_token_ids": [5, 6]}, client="carol")
    engine.step()
    assert list(engine.scheduler.order.service()) == ["carol"]
    assert [c for c, v in shown().items() if v is not None] == [client_name("carol")]
