"""max_decode_rows: while several clients' requests run, a step decodes at most that
many rows, the waiting order's choice first; the others keep their frames and sit the
step out (issue 41: the step's width is what a room shares on a CPU)."""

from __future__ import annotations

import pytest
from checkpoints import write_checkpoint

from minipaged import LLM, SamplingParams
from minipaged.policies import FCFS, PolicyError
from minipaged.sequence import Status
from minipaged.tools.serve import cli as serve_cli


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(
        str(write_checkpoint(tmp_path_factory.mktemp("rows") / "tiny")),
        device="cpu",
        num_blocks=128,
        block_size=4,
    )


def add(engine, name: str, client: str, max_tokens: int) -> None:
    """One request; its prompt is its name's (the same in every engine)."""
    first = 5 + sum(name.encode()) % 40
    engine.add_request(
        name,
        {"prompt_token_ids": [first, 6, 7, first + 2]},
        SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
        client=client,
    )


def run(engine, late: dict[int, list[tuple[str, str, int]]]) -> tuple[dict, list]:
    """Step until done, adding `late` (step -> [(id, client, max_tokens)]); each
    request's greedy tokens, and each step's decode rows as (request id, client)."""
    clients, tokens, steps = {}, {}, []
    for step in range(400):
        for name, client, max_tokens in late.get(step, []):
            add(engine, name, client, max_tokens)
            clients[name] = client
        report = engine.step()
        steps.append([r for r, _, kind, _ in report.ran if kind == "decode"])
        tokens |= {o.request_id: o.outputs[0].token_ids for o in report.finished}
        if step > max(late) and not engine.has_unfinished_requests():
            return tokens, [[(r, clients[r]) for r in rows] for rows in steps]
    raise AssertionError("not done after 400 steps")


FLOOD_THEN_TWO = {
    0: [(f"flood{i}", "flood", 12) for i in range(4)],
    3: [("alice", "alice", 4), ("bob", "bob", 4)],
}


def test_a_bounded_step_decodes_the_least_served_clients_first(llm):
    engine = llm.new_engine(max_decode_rows=3, scheduling_policy="fair")
    _, steps = run(engine, FLOOD_THEN_TWO)
    for rows in steps:
        if len({client for _, client in rows}) > 1:
            assert len(rows) <= 3, rows
    # while alice and bob decode, the flood gets the one row left
    both = [rows for rows in steps if {"alice", "bob"} <= {r for r, _ in rows}]
    assert both and all(len(rows) == 3 for rows in both), both
    # without the bound every running row decodes: four floods and both of them
    _, wide = run(llm.new_engine(scheduling_policy="fair"), FLOOD_THEN_TWO)
    assert max(map(len, wide)) == 6


def test_one_client_alone_decodes_every_row(llm):
    """With one client there is nobody to protect: the bound does not apply."""
    engine = llm.new_engine(max_decode_rows=2, scheduling_policy="fair")
    _, steps = run(engine, {0: [(f"r{i}", "one", 6) for i in range(5)]})
    assert max(map(len, steps)) == 5


def test_the_bound_changes_no_greedy_token(llm):
    """A request that sits a step out keeps its frames and its place: its tokens are
    the same as in an unbounded engine, under each order."""
    late = FLOOD_THEN_TWO | {5: [("carol", "carol", 7)]}
    expected, _ = run(llm.new_engine(), late)
    for policy in ("fcfs", "fair", "sjf"):
        engine = llm.new_engine(max_decode_rows=2, scheduling_policy=policy)
        tokens, steps = run(engine, late)
        assert tokens == expected, policy
        for rows in steps:
            clients = {client for _, client in rows}
            if len(clients) > 1:  # one row each, and no more than 2 in all
                assert len(rows) <= max(2, len(clients)), (policy, rows)
        assert engine.blocks.num_free_frames == engine.blocks.num_frames


def test_each_client_first_row_decodes_whatever_the_order(llm):
    """Under fcfs too: alice and bob decode from their first step, and the flood's own
    rows make up the rest of the bound."""
    engine = llm.new_engine(max_decode_rows=3)
    _, steps = run(engine, FLOOD_THEN_TWO)
    first = next(i for i, rows in enumerate(steps) if ("alice", "alice") in rows)
    assert first <= 5
    for rows in steps[first:]:
        names = {r for r, _ in rows}
        if {"alice", "bob"} <= names:
            assert len(rows) == 3 and sum(c == "flood" for _, c in rows) == 1


def test_a_room_of_light_clients_is_not_bounded(llm):
    """Six clients with one request each: nobody has a second row, so all six decode
    every step although the bound is 2."""
    engine = llm.new_engine(max_decode_rows=2, scheduling_policy="fair")
    _, steps = run(engine, {0: [(f"r{i}", f"client{i}", 6) for i in range(6)]})
    assert max(map(len, steps)) == 6


@pytest.mark.parametrize(
    "value, message",
    [
        (-1, "max_decode_rows must be a whole number >= 0, got -1"),
        (1.5, "max_decode_rows must be a whole number >= 0, got 1.5"),
        ("8", "max_decode_rows must be a whole number >= 0, got '8'"),
        (True, "max_decode_rows must be a whole number >= 0, got True"),
    ],
)
def test_a_wrong_bound_is_refused_by_name(llm, value, message):
    with pytest.raises(ValueError, match=message):
        llm.new_engine(max_decode_rows=value)


def test_a_static_batch_refuses_the_bound(llm):
    with pytest.raises(
        ValueError, match="max_decode_rows needs scheduler='continuous'"
    ):
        llm.new_engine(max_decode_rows=4, scheduler="static")


class FailsOnRunning(FCFS):
    """Picks like fcfs, but raises when it is asked to rank running requests."""

    name = "fails-on-running"

    def pick(self, waiting, now: int):
        if any(r.status is Status.RUNNING for r in waiting):
            raise RuntimeError("only waiting requests, please")
        return waiting[0]


def test_an_order_that_fails_to_rank_running_requests_loses_nothing(llm):
    """Its failure is reported naming the seam and the policy; the default (the oldest
    first) decides that step, and every request finishes with its own tokens."""
    expected, _ = run(llm.new_engine(), FLOOD_THEN_TWO)
    engine = llm.new_engine(max_decode_rows=3, scheduling_policy=FailsOnRunning())
    tokens, errors = {}, []
    late = dict(FLOOD_THEN_TWO)
    for step in range(400):
        for name, client, max_tokens in late.pop(step, []):
            add(engine, name, client, max_tokens)
        try:
            report = engine.step()
        except PolicyError as error:
            errors.append(error)
            report = error.report
        tokens |= {o.request_id: o.outputs[0].token_ids for o in report.finished}
        if not late and not engine.has_unfinished_requests():
            break
    assert errors and all(e.option == "scheduling_policy" for e in errors)
    assert "fails-on-running" in str(errors[0]) and "only waiting" in str(errors[0])
    assert tokens == expected
    assert engine.blocks.num_free_frames == engine.blocks.num_frames


def test_the_server_takes_the_bound_and_names_a_wrong_one(capsys):
    parse = serve_cli.build_parser().parse_args
    args = parse(["--max-decode-rows", "8"])
    assert serve_cli.engine_options(args)["max_decode_rows"] == 8
    with pytest.raises(SystemExit) as stop:
        parse(["--max-decode-rows", "-1"])
    assert stop.value.code == 2
    assert "--max-decode-rows" in capsys.readouterr().err


def test_the_servers_auto_bound_is_for_a_cpus_continuous_batch():
    parse = serve_cli.build_parser().parse_args
    assert parse([]).max_decode_rows == "auto"
    on = serve_cli.decode_rows_on
    assert on(parse(["--device", "cpu"])) == serve_cli.CPU_DECODE_ROWS
    assert on(parse(["--device", "cpu", "--scheduler", "static"])) == 0
    assert on(parse(["--device", "cpu", "--max-decode-rows", "0"])) == 0
    assert on(parse(["--max-decode-rows", "5"])) == 5


def test_the_room_benchmark_runs_fair_at_each_bound_beside_the_defaults_and_fcfs():
    import argparse

    from minipaged.tools.bench.serve import room_servers, row_counts

    assert row_counts("16, 0,8,8") == [0, 8, 16]
    for wrong in ("8,x", "-1", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="row counts"):
            row_counts(wrong)
    servers = room_servers([0, 12])
    assert [name for name, *_ in servers] == ["defaults", "fcfs", "rows_0", "rows_12"]
    _, label, options, runs = servers[-1]
    assert label == "fair, 12 decode rows"
    assert options == ["--scheduling-policy", "fair", "--max-decode-rows", "12"]
    assert runs == [
        ("flooder_alone_rows_12", False, True),
        ("flood_rows_12", True, True),
    ]
    # the participants alone run once, on the defaults
    assert (
        sum(people and not flood for *_, runs in servers for _, people, flood in runs)
        == 1
    )
