"""The waiting queue's order (fcfs, sjf, aging, priority) and working-set admission.

The orders are checked on the scheduler alone (no model: dummy tokens, as the simulator
runs it): who is admitted when, that a request preempted by recompute keeps its place,
and that aging bounds the starvation shortest-job-first causes. The working-set rule
admits fewer sequences when memory is tight, the same as greedy admission when it is
ample, and never stalls; and no policy changes a token: greedy outputs equal each
request run alone, on a tiny random checkpoint.
"""

import numpy as np
import pytest

from minipaged import LLM, SamplingParams
from minipaged.engine import EngineConfig
from minipaged.model.oracle import greedy_generate
from minipaged.paging import BlockManager
from minipaged.scheduler import (
    ADMISSIONS,
    WAITING_ORDERS,
    Request,
    Scheduler,
    SchedulerConfig,
    Sequence,
)


def make_request(i: int, prompt_len: int, max_tokens: int) -> Request:
    prompt = [i % 50 + 1] * prompt_len
    return Request(
        str(i),
        None,
        prompt,
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        [Sequence(i, list(prompt), prompt_len)],
    )


class Run:
    """A scheduler over a BlockManager, stepped with a dummy token per sampler. Records,
    per request id, the step it arrived at and the step it was first admitted at."""

    def __init__(self, num_blocks=256, block_size=4, **config):
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.scheduler = Scheduler(
            SchedulerConfig(max_model_len=num_blocks * block_size, **config),
            self.blocks,
        )
        self.arrived, self.admitted, self.preempted, self.batches = {}, {}, [], []
        # request id -> the step it came back after a recompute
        self.readmitted: dict[str, int] = {}

    def add(self, request: Request, priority: int = 0) -> Request:
        self.arrived[request.request_id] = self.scheduler.steps
        self.scheduler.add(request, priority)
        return request

    def step(self):
        batch = self.scheduler.schedule()
        assert batch.scheduled or not self.scheduler.has_unfinished(), (
            "a step scheduled nobody: stalled"
        )
        for s in batch.scheduled:
            self.admitted.setdefault(s.request.request_id, self.scheduler.steps)
            if s.kind == "prefill" and s.seq.output_ids:
                self.readmitted.setdefault(s.request.request_id, self.scheduler.steps)
        self.preempted += [rid for rid, _ in batch.preempted]
        self.batches.append(batch)
        self.scheduler.update(
            batch, {seq: 0 for s in batch.scheduled for seq in s.samplers}
        )
        return batch

    def until_done(self, limit=10_000) -> int:
        for steps in range(limit):
            if not self.scheduler.has_unfinished():
                return steps
            self.step()
        raise AssertionError(f"not done after {limit} steps")

    def order(self) -> list[str]:
        return sorted(self.admitted, key=lambda rid: (self.admitted[rid], int(rid)))


# ---- the orders ----------------------------------------------------------------------
ORDERS = {"fcfs": ["1", "2", "3"], "sjf": ["2", "3", "1"], "priority": ["1", "3", "2"]}


@pytest.mark.parametrize("policy", sorted(ORDERS))
def test_each_policy_admits_in_its_order(policy):
    run = Run(max_num_seqs=1, scheduling_policy=policy)
    run.add(make_request(0, 4, 4))
    run.step()  # request 0 holds the only seat
    for i, (prompt_len, priority) in enumerate([(40, 0), (4, 2), (20, 1)], start=1):
        run.add(make_request(i, prompt_len, 4), priority if policy == "priority" else 0)
    run.until_done()
    assert run.order() == ["0"] + ORDERS[policy]


def test_aging_with_a_fast_rate_is_first_come_first_served():
    """Forgiving more tokens per step than any job has makes the oldest the smallest."""
    run = Run(max_num_seqs=1, scheduling_policy="aging", aging_rate=1000)
    run.add(make_request(0, 4, 4))
    run.step()
    run.step()  # the three below arrive a step apart: 40 tokens, then 4, then 20
    for i, prompt_len in enumerate([40, 4, 20], start=1):
        run.add(make_request(i, prompt_len, 4))
        run.step()
    run.until_done()
    assert run.order() == ["0", "1", "2", "3"]


@pytest.mark.parametrize("policy", ["fcfs", "sjf", "aging"])
def test_a_request_preempted_by_recompute_keeps_its_place(policy):
    """Two long jobs outgrow the pool and the newer is preempted; a tiny job that
    arrives then (the smallest: sjf and aging would take it first) still waits until the
    preempted one is back.
    """
    run = Run(num_blocks=8, block_size=4, max_num_seqs=4, scheduling_policy=policy)
    run.add(make_request(0, 4, 24))
    run.add(make_request(1, 4, 24))
    while not run.preempted:
        run.step()
    assert run.preempted == ["1"]
    run.add(make_request(2, 2, 2))
    run.until_done()
    assert run.admitted["2"] >= run.readmitted["1"]


def test_priority_preempts_the_least_urgent_request_not_the_newest():
    victims = {}
    for policy in ("fcfs", "priority"):
        run = Run(num_blocks=4, block_size=4, max_num_seqs=4, scheduling_policy=policy)
        # admitted first,
        run.add(make_request(0, 4, 12), priority=1 if policy == "priority" else 0)
        run.add(make_request(1, 4, 12))  # less urgent
        while not run.preempted:
            run.step()
        victims[policy] = run.preempted[0]
    assert victims == {"fcfs": "1", "priority": "0"}


# ---- starvation, and aging's bound ---------------------------------------------------
LONG_PROMPT, LONG_OUT, AGING_RATE = 40, 10, 1.0


def short_stream(policy: str, steps: int) -> Run:
    """One seat; a long job arrives with a short one running; then a short job (2 prompt
    tokens, 2 out: two steps of the seat) arrives every step, faster than the seat
    serves them.
    """
    run = Run(max_num_seqs=1, scheduling_policy=policy, aging_rate=AGING_RATE)
    run.add(make_request(0, 2, 2))
    run.step()
    run.add(make_request(1, LONG_PROMPT, LONG_OUT))
    for i in range(2, steps + 2):
        run.add(make_request(i, 2, 2))
        run.step()
    return run


def test_shortest_job_first_starves_a_long_job():
    run = short_stream("sjf", 400)
    assert "1" not in run.admitted, (
        "the long job ran: the stream was meant to starve it"
    )
    assert len(run.admitted) > 150


def test_aging_admits_the_long_job_within_its_bound():
    """`Scheduler._next_waiting`: a job of S tokens waits only for requests that arrived
    fewer than (S - 1) / aging_rate steps after it (and those before it)."""
    run = short_stream("aging", 400)
    assert "1" in run.admitted, "aging did not admit the long job"
    bound = (LONG_PROMPT + LONG_OUT - 1) / AGING_RATE
    overtook = [
        rid
        for rid in run.admitted
        if rid != "1"
        and run.arrived[rid] > run.arrived["1"]
        and run.admitted[rid] < run.admitted["1"]
    ]
    assert overtook, "no short job overtook the long one: nothing was aged"
    assert all(run.arrived[rid] - run.arrived["1"] < bound for rid in overtook)
    # ahead of it: those that overtook it, the short job that arrived with it, and the
    # one running then; each holds the seat 2 steps, so the wait is bounded by the
    # arrivals in the window
    ahead = [rid for rid in run.admitted if run.admitted[rid] < run.admitted["1"]]
    assert sorted(ahead, key=int) == ["0", "2"] + sorted(overtook, key=int)
    assert run.admitted["1"] - run.arrived["1"] <= 2 * len(ahead)


# ---- working-set admission -----------------------------------------------------------
def burst(run: Run, num=30, seed=2, start=0):
    rng = np.random.default_rng(seed)
    for i in range(start, start + num):
        run.add(make_request(i, int(rng.integers(2, 12)), int(rng.integers(20, 60))))


def most_running(run: Run) -> int:
    return max(len({s.request for s in b.scheduled}) for b in run.batches)


def test_working_set_admits_fewer_when_memory_is_tight_and_thrashes_less():
    runs = {}
    for admission in ADMISSIONS:
        runs[admission] = run = Run(
            num_blocks=40,
            block_size=4,
            max_num_seqs=32,
            admission=admission,
            admission_window=16,
        )
        burst(run)
        run.until_done()
    greedy, working_set = runs["greedy"], runs["working-set"]
    assert most_running(working_set) < most_running(greedy)
    assert len(working_set.preempted) < len(greedy.preempted)
    assert len(working_set.admitted) == len(greedy.admitted) == 30


def test_working_set_admits_as_many_when_memory_is_ample():
    runs = {}
    for admission in ADMISSIONS:
        runs[admission] = run = Run(
            num_blocks=1000, block_size=4, max_num_seqs=32, admission=admission
        )
        burst(run)
        run.until_done()
    shapes = {
        a: [
            [(s.request.request_id, s.num_new_tokens) for s in b.scheduled]
            for b in r.batches
        ]
        for a, r in runs.items()
    }
    assert shapes["working-set"] == shapes["greedy"]
    assert most_running(runs["working-set"]) == 30


@pytest.mark.parametrize("window", [1, 64, 10_000])
def test_working_set_never_stalls_even_with_a_huge_window(window):
    """An idle engine admits whatever fits alone; every step schedules someone (Run.step
    checks)."""
    run = Run(
        num_blocks=16,
        block_size=4,
        max_num_seqs=8,
        admission="working-set",
        admission_window=window,
    )
    run.add(make_request(0, 50, 14))  # 64 tokens: the whole pool, alone
    burst(run, num=12, start=1)
    run.until_done()
    assert len(run.admitted) == 13


# ---- options at the door -------------------------------------------------------------
@pytest.mark.parametrize(
    "options, words",
    [
        ({"admission": "lazy"}, "admission must be one of"),
        ({"admission_window": 0}, "admission_window"),
        ({"scheduling_policy": "lifo"}, "scheduling_policy must be one of"),
        ({"aging_rate": 0}, "aging_rate"),
    ],
)
def test_bad_options_are_refused_by_name(options, words):
    for make in (SchedulerConfig, EngineConfig):
        with pytest.raises(ValueError, match=words):
            make(**options)


def test_every_order_and_admission_is_listed():
    assert set(WAITING_ORDERS) == {"fcfs", "sjf", "aging", "priority", "fair"}
    assert set(ADMISSIONS) == {"greedy", "working-set"}


# ---- outputs unchanged (a tiny random checkpoint) ------------------------------------
@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from checkpoints import write_checkpoint

    return write_checkpoint(
        tmp_path_factory.mktemp("tiny"),
        hidden=64,
        heads=4,
        kv_heads=2,
        max_positions=256,
    )


def test_priority_is_checked_at_the_door(folder):
    engine = LLM(str(folder), device="cpu", num_blocks=32).engine
    with pytest.raises(ValueError, match="needs scheduling_policy='priority'"):
        engine.add_request(
            "a", {"prompt_token_ids": [5, 6]}, SamplingParams(), priority=1
        )
    engine = LLM(
        str(folder), device="cpu", num_blocks=32, scheduling_policy="priority"
    ).engine
    with pytest.raises(ValueError, match="priority must be a whole number"):
        engine.add_request(
            "a", {"prompt_token_ids": [5, 6]}, SamplingParams(), priority=0.5
        )
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize(
    "policy, admission",
    [
        ("sjf", "greedy"),
        ("aging", "working-set"),
        ("priority", "working-set"),
        ("fcfs", "working-set"),
    ],
)
def test_outputs_equal_each_request_run_alone(folder, policy, admission):
    llm = LLM(
        str(folder),
        device="cpu",
        num_blocks=24,
        block_size=8,
        max_num_seqs=12,
        enable_prefix_caching=False,
        scheduling_policy=policy,
        aging_rate=2.0,
        admission=admission,
        admission_window=8,
    )
    rng = np.random.default_rng(7)
    prompts = [rng.integers(5, 60, rng.integers(1, 50)).tolist() for _ in range(30)]
    max_tokens = rng.integers(1, 40, len(prompts)).tolist()
    engine, outputs, preempted = llm.engine, {}, 0
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens)):
        engine.add_request(
            str(i),
            {"prompt_token_ids": prompt},
            SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
            **({"priority": i % 3} if policy == "priority" else {}),
        )
    while engine.has_unfinished_requests():
        report = engine.step()
        preempted += len(report.preempted)
        outputs |= {o.request_id: o.outputs[0].token_ids for o in report.finished}
    assert admission == "working-set" or preempted, "the pool was meant to be too small"
    for i, prompt in enumerate(prompts):
        assert outputs[str(i)] == greedy_generate(llm.model, prompt, max_tokens[i]), i
    assert (
        not engine.blocks.tables
        and engine.blocks.num_free_frames == engine.blocks.num_frames
    )


# ---- the benchmarks' simulated parts, small ------------------------------------------
def test_thrashing_benchmark_working_set_near_the_best_hand_tuned_fewer_preemptions():
    from argparse import Namespace

    from minipaged.tools.bench.thrashing import simulated_part

    result = simulated_part(
        Namespace(
            sim_requests=60,
            sim_kv_tokens=[4000],
            sim_max_num_seqs=[4, 64, 256],
            window=16,
        )
    )
    m = result["memories"][4000]
    # it thrashes when over-admitted
    assert m["greedy"][256]["preemptions"] > m["greedy"][4]["preemptions"]
    assert m["greedy"][256]["recomputed_tokens"] > 0
    assert m["working_set"]["preemptions"] < m["greedy"][256]["preemptions"]
    assert m["working_set_over_best"] >= 0.9


def test_scheduling_benchmark_short_requests_pass_long_ones_under_sjf_and_priority():
    """The benchmark's pieces on the CPU profile (fast): its mix, its priorities, its
    quarters."""
    import dataclasses

    from minipaged.tools.bench.scheduling import (
        PrioritySimulator,
        latency_by_size,
        mixed_workload,
        priorities_of,
    )
    from minipaged.tools.bench.simulate import PROFILES, poisson_trace
    from minipaged.tools.bench.workload import RequestSpec

    specs = mixed_workload(48, seed=0)
    assert sum(priorities_of(specs)) == len(specs) // 4  # the longest quarter is marked
    profile, rows = dataclasses.replace(PROFILES["cpu-smollm2"], max_num_seqs=4), {}
    for policy in WAITING_ORDERS:
        sim = PrioritySimulator(
            profile,
            "paged",
            priorities_of(specs) if policy == "priority" else None,
            scheduler_options={"scheduling_policy": policy},
        )
        r = sim.run(poisson_trace(specs, 4.0, seed=0))
        rows[policy] = latency_by_size(
            [RequestSpec(p, o) for p, o in zip(r.prompt_lens, r.output_lens)],
            {
                "e2e": r.latencies,
                "waits": r.waits,
                "seconds": r.clock,
                "preemptions": 0,
            },
        )
    assert rows["sjf"]["short_p50"] < rows["fcfs"]["short_p50"] / 2
    assert rows["priority"]["short_p50"] < rows["fcfs"]["short_p50"]
    # the long ones pay for it
    assert rows["sjf"]["max_wait"] > rows["fcfs"]["max_wait"]


def test_latency_by_size_takes_quarters_by_prompt_plus_output():
    from minipaged.tools.bench.scheduling import latency_by_size
    from minipaged.tools.bench.workload import RequestSpec

    specs = [RequestSpec(p, o) for p, o in [(50, 50), (1, 1), (10, 10), (5, 5)]]
    row = latency_by_size(
        specs,
        {
            "e2e": [4.0, 1.0, 3.0, 2.0],
            "waits": [0.5, 0, 0, 0],
            "seconds": 9,
            "preemptions": 0,
        },
    )
    assert (row["short_p50"], row["long_p50"], row["max_wait"]) == (1.0, 4.0, 0.5)
