"""The simulator: the real scheduler and allocators on a virtual clock, at the paper's
scale. What the paper measured must come out in its order: fragmentation, then latency
under load.
"""

import json

import pytest

from minipaged.tools import simulate as command
from minipaged.tools.bench import simulate as sim
from minipaged.tools.bench.paper import (
    PAPER_TOKEN_STATES,
    fragmentation_chart,
    fragmentation_table,
)


@pytest.fixture(scope="module")
def shares():
    return sim.fragmentation(num_requests=300)


def test_fragmentation_in_the_papers_order(shares):
    token = {name: r["token_states"] for name, r in shares.items()}
    assert (
        token["contiguous-max"]
        < token["contiguous-pow2"]
        < token["contiguous-oracle"]
        < token["paged"]
    )
    assert token["paged"] >= 0.96
    for name, r in shares.items():
        assert sum(
            r[k] for k in ("token_states", "reserved", "internal", "external")
        ) == pytest.approx(1)
        if name != "paged":
            assert r["external"] > 0  # free while a request waits
    assert (
        shares["contiguous-oracle"]["internal"] == 0
        and shares["contiguous-max"]["internal"] > 0.3
    )
    assert (
        shares["contiguous-pow2"]["refusals"] > 0
        and shares["contiguous-oracle"]["refusals"] > 0
    )
    assert shares["paged"]["refusals"] == 0


def test_fragmentation_chart_and_table_show_ours_beside_the_papers(shares):
    table = fragmentation_table(shares)
    for name, paper in PAPER_TOKEN_STATES.items():
        assert (
            f"{100 * paper:.1f}%" in table
            and f"{100 * shares[name]['token_states']:.1f}%" in table
        )
    chart = fragmentation_chart(shares)
    assert "token states" in str(chart) and chart.svg().startswith("<svg")


def test_every_request_finishes_and_static_batching_waits_longest():
    specs = sim.trace_specs("sharegpt", 150)
    trace = sim.poisson_trace(specs, rate=2.0)
    results = {
        s: sim.simulate("opt-13b-a100", s, trace)
        for s in ("paged", "contiguous-max", "static")
    }
    for result in results.values():
        assert len(result.latencies) == 150 and min(result.latencies) > 0
    latency = {s: r.normalized_latency for s, r in results.items()}
    assert latency["paged"] < latency["contiguous-max"] < latency["static"]


def test_chunked_prefill_and_swap_run_in_the_simulator_too():
    trace = sim.poisson_trace(sim.trace_specs("sharegpt", 100), rate=4.0)
    chunked = sim.simulate(
        "opt-13b-a100", "paged", trace, chunked_prefill=True, max_num_batched_tokens=256
    )
    swap = sim.simulate(
        "opt-13b-a100", "paged", trace, preemption_mode="swap", block_size=4
    )
    assert len(chunked.latencies) == len(swap.latencies) == 100


def test_paging_sustains_a_higher_rate_than_contiguous_memory():
    rate = {
        s: sim.max_sustainable_rate("opt-13b-a100", s, threshold=0.06, num_requests=120)
        for s in ("paged", "contiguous-oracle", "contiguous-max")
    }
    assert rate["paged"] > rate["contiguous-oracle"] > rate["contiguous-max"] > 0


def test_a_search_from_a_curves_points_runs_less_and_lands_beside_the_full_one(
    monkeypatch,
):
    from minipaged.tools.bench import simulate

    runs, real = [], simulate.simulate  # one entry per simulated run
    monkeypatch.setattr(
        simulate,
        "simulate",
        lambda *args, **options: runs.append(1) or real(*args, **options),
    )
    curve = {
        p["rate"]: p["normalized_latency"]
        for p in simulate.latency_curve("opt-13b-a100", "paged", [1, 2, 4, 8], 60)
    }
    plain = simulate.max_sustainable_rate("opt-13b-a100", "paged", 0.021, 60)
    full = len(runs) - len(curve)
    started = simulate.max_sustainable_rate(
        "opt-13b-a100", "paged", 0.021, 60, known=curve
    )
    assert len(runs) - len(curve) - full < full, (full, len(runs) - len(curve) - full)
    assert started == pytest.approx(plain, rel=0.05)
    # the threshold lies inside the curve
    assert min(curve.values()) <= 0.021 < max(curve.values()), curve


def test_json_of_one_timed_run(capsys):
    command.main(
        [
            "--trace",
            "alpaca",
            "--requests",
            "300",
            "--rate",
            "20",
            "--systems",
            "paged",
            "static",
            "--json",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert (
        result["profile"] == "opt-13b-a100"
        and result["requests"] == 300
        and result["seconds"] > 0
    )
    assert (
        result["paged"]["normalized_latency"] < result["static"]["normalized_latency"]
    )


def test_a_trace_too_short_to_saturate_sustains_the_highest_rate_instead_of_hanging():
    from minipaged.tools.bench import simulate

    assert (
        simulate.max_sustainable_rate("opt-13b-a100", "paged", 1e9, 20, "alpaca")
        == simulate.MAX_RATE
    )


def test_the_gpu_profile_is_a_roofline_and_the_cpu_profile_a_sum():
    gpu, cpu = sim.PROFILES["opt-13b-a100"], sim.PROFILES["cpu-smollm2"]
    # memory-bound: the weights and KV read dominate
    decode = gpu.step_time(32, 32 * 400, 32 * 25)
    assert decode == pytest.approx(
        gpu.fixed + gpu.per_context * 32 * 400 + gpu.per_frame * 32 * 25
    )
    # compute-bound: 2000 tokens through the matmuls
    prefill = gpu.step_time(2000, 2000, 125)
    assert prefill == pytest.approx(gpu.per_token * 2000) and prefill > gpu.fixed
    assert cpu.step_time(4, 400) == pytest.approx(
        cpu.fixed + 4 * cpu.per_token + 400 * cpu.per_context
    )


def test_small_blocks_pay_per_frame_and_contiguous_chunks_read_one_region_per_row():
    trace = sim.poisson_trace(sim.trace_specs("alpaca", 200), rate=60)
    one, sixteen = (
        sim.simulate("opt-13b-a100", "paged", trace, block_size=b) for b in (1, 16)
    )
    # the same schedule, only slower steps
    assert one.preemptions == sixteen.preemptions == 0
    assert one.normalized_latency > 1.1 * sixteen.normalized_latency
    for system, frames_per_row in (
        ("contiguous-oracle", lambda tokens: 1),
        ("paged", lambda tokens: tokens),
    ):
        simulator = sim.Simulator(sim.PROFILES["opt-13b-a100"], system, block_size=1)
        for arrival in trace[:3]:
            simulator.add(arrival)
        batch = simulator.scheduler.schedule()  # the three prompts
        tokens, frames = simulator._context(batch)
        assert len(batch.scheduled) == 3 and tokens == sum(
            s.num_new_tokens for s in batch.scheduled
        )
        assert frames == sum(
            frames_per_row(s.num_new_tokens) for s in batch.scheduled
        ), system


def test_ablations_count_preemptions_and_swap_moves_frames():
    # far past paging's knee
    result = sim.ablations("opt-13b-a100", "alpaca", 400, rate=400)
    recompute, swap = result["recompute"], result["swap"]
    assert list(recompute) == list(swap) == sim.ABLATION_BLOCK_SIZES
    assert any(r["preemptions"] for r in recompute.values()) and any(
        r["swapped_frames"] for r in swap.values()
    )
    assert all(r["swapped_frames"] == 0 for r in recompute.values())
    text = command.text_report(
        {"profile": "opt-13b-a100", "requests": 400, "seconds": 1.0} | result
    )
    assert "preempted" in text and "swap" in text


def test_fixed_scale_slows_every_step_and_is_checked(capsys):
    command.main(
        [
            "--trace",
            "alpaca",
            "--requests",
            "100",
            "--rate",
            "5",
            "--systems",
            "paged",
            "--json",
        ]
    )
    plain = json.loads(capsys.readouterr().out)
    command.main(
        [
            "--trace",
            "alpaca",
            "--requests",
            "100",
            "--rate",
            "5",
            "--systems",
            "paged",
            "--json",
            "--fixed-scale",
            "2",
        ]
    )
    slow = json.loads(capsys.readouterr().out)
    assert slow["fixed_scale"] == 2 and "fixed_scale" not in plain
    assert (
        slow["paged"]["normalized_latency"] > 1.5 * plain["paged"]["normalized_latency"]
    )
    with pytest.raises(SystemExit):
        command.main(["--fixed-scale", "0"])
    assert (
        capsys.readouterr().err
        == "python -m minipaged.simulate: error: argument --fixed-scale: "
        "0 must be greater than 0\n"
    )
