"""The simulator: the real scheduler and allocators on a virtual clock, at the paper's scale.
What the paper measured must come out in its order: fragmentation, then latency under load."""

import json

import pytest

from minipaged import simulate as sim
from minipaged.bench_paper import PAPER_TOKEN_STATES, fragmentation_chart, fragmentation_table


@pytest.fixture(scope="module")
def shares():
    return sim.fragmentation(num_requests=300)


def test_fragmentation_in_the_papers_order(shares):
    token = {name: r["token_states"] for name, r in shares.items()}
    assert token["contiguous-max"] < token["contiguous-pow2"] < token["contiguous-oracle"] < token["paged"]
    assert token["paged"] >= 0.96
    for name, r in shares.items():
        assert sum(r[k] for k in ("token_states", "reserved", "internal", "external")) == pytest.approx(1)
        if name != "paged":
            assert r["external"] > 0  # free while a request waits
    assert shares["contiguous-oracle"]["internal"] == 0 and shares["contiguous-max"]["internal"] > 0.3
    assert shares["contiguous-pow2"]["refusals"] > 0 and shares["contiguous-oracle"]["refusals"] > 0
    assert shares["paged"]["refusals"] == 0


def test_fragmentation_chart_and_table_show_ours_beside_the_papers(shares):
    table = fragmentation_table(shares)
    for name, paper in PAPER_TOKEN_STATES.items():
        assert f"{100 * paper:.1f}%" in table and f"{100 * shares[name]['token_states']:.1f}%" in table
    chart = fragmentation_chart(shares)
    assert "token states" in str(chart) and chart.svg().startswith("<svg")


def test_every_request_finishes_and_static_batching_waits_longest():
    specs = sim.trace_specs("sharegpt", 150)
    trace = sim.poisson_trace(specs, rate=2.0)
    results = {s: sim.simulate("opt-13b-a100", s, trace) for s in ("paged", "contiguous-max", "static")}
    for result in results.values():
        assert len(result.latencies) == 150 and min(result.latencies) > 0
    latency = {s: r.normalized_latency for s, r in results.items()}
    assert latency["paged"] < latency["contiguous-max"] < latency["static"]


def test_chunked_prefill_and_swap_run_in_the_simulator_too():
    trace = sim.poisson_trace(sim.trace_specs("sharegpt", 100), rate=4.0)
    chunked = sim.simulate("opt-13b-a100", "paged", trace, chunked_prefill=True, max_num_batched_tokens=256)
    swap = sim.simulate("opt-13b-a100", "paged", trace, preemption_mode="swap", block_size=4)
    assert len(chunked.latencies) == len(swap.latencies) == 100


def test_paging_sustains_a_higher_rate_than_contiguous_memory():
    rate = {s: sim.max_sustainable_rate("opt-13b-a100", s, threshold=0.06, num_requests=120)
            for s in ("paged", "contiguous-oracle", "contiguous-max")}
    assert rate["paged"] > rate["contiguous-oracle"] > rate["contiguous-max"] > 0


def test_json_of_one_timed_run(capsys):
    sim.main(["--trace", "alpaca", "--requests", "300", "--rate", "20", "--systems", "paged", "static", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["profile"] == "opt-13b-a100" and result["requests"] == 300 and result["seconds"] > 0
    assert result["paged"]["normalized_latency"] < result["static"]["normalized_latency"]


def test_a_trace_too_short_to_saturate_sustains_the_highest_rate_instead_of_hanging():
    from minipaged import simulate
    assert simulate.max_sustainable_rate("opt-13b-a100", "paged", 1e9, 20, "alpaca") == simulate.MAX_RATE
