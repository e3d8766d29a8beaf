"""`bench latency` and `bench calibrate` (issue 13): the real engine under Poisson
arrivals, and the simulator's step-time model fitted to it. On a virtual clock the
engine and the simulator must agree exactly: both drive the same scheduler, so any gap
is a bug in one of them.
"""

import dataclasses
import json
import types

import pytest
from checkpoints import write_checkpoint

from minipaged.tools.bench import cli as bench_cli
from minipaged.tools.bench import latency as bench_latency
from minipaged.tools.bench.simulate import PROFILES, poisson_trace, simulate
from minipaged.tools.bench.workload import make_workload


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(
        write_checkpoint(
            tmp_path_factory.mktemp("latency") / "tiny", max_positions=1024
        )
    )


def arguments(**options):
    defaults = dict(
        requests=12,
        rates=[0.5, 2, 8],
        systems=list(bench_latency.SYSTEMS),
        prompt_mean=32,
        output_mean=32,
        kv_tokens=1024,
        max_model_len=256,
        max_num_seqs=16,
        seed=0,
        predict=True,
        svg=None,
        json=True,
        model=None,
        device="cpu",
    )
    return types.SimpleNamespace(**defaults | options)


def test_on_a_virtual_clock_the_engine_is_what_the_simulator_predicts(folder):
    args = arguments(model=folder)
    result = bench_latency.bench_latency(
        args, virtual=bench_latency.simulator_profile(args)
    )
    systems = result["systems"]
    for name, points in systems.items():
        assert [p["rate"] for p in points] == args.rates
        for p in points:
            assert p["relative_error"] == pytest.approx(0, abs=1e-9), (name, p)
        latency = [p["normalized_latency"] for p in points]
        # more load, slower
        assert latency == sorted(latency) and latency[-1] > latency[0]
    for paged, static in zip(systems["paged"], systems["static"]):
        assert static["normalized_latency"] > paged["normalized_latency"]
        # below saturation a short request waits for the longest of its static
        # batch; at 8 req/s all 12 arrive at once, and static's first batch of 4 may
        # hold only short ones
        if paged["rate"] < 8:
            assert static["short_e2e_p50"] > 1.5 * paged["short_e2e_p50"]
    knee = result["at_knee"]
    assert (
        knee["rate"] == bench_latency.knee(systems["paged"])
        and knee["rate"] in args.rates
    )
    paged, static = (
        next(p for p in systems[s] if p["rate"] == knee["rate"])
        for s in ("paged", "static")
    )
    assert knee["normalized_latency_ratio"] == pytest.approx(
        static["normalized_latency"] / paged["normalized_latency"]
    )


def test_each_point_is_predicted_from_steps_timed_at_the_other_rates():
    """Steps timed at rate 1 follow one step-time model, steps at rate 2 another: the
    point at rate 1 must be predicted with the model of rate 2's steps, and the other
    way round.
    """
    slow, fast = (
        dataclasses.replace(
            PROFILES["cpu-smollm2"], fixed=f, per_token=t, per_context=c
        )
        for f, t, c in ((0.04, 0.004, 4e-5), (0.01, 0.001, 1e-5))
    )
    shapes = [(t, c) for t in (1, 3, 16, 40) for c in (t, 10 * t, 50 * t)]
    timed = {
        1: [(t, c, slow.step_time(t, c)) for t, c in shapes],
        2: [(t, c, fast.step_time(t, c)) for t, c in shapes],
    }
    args = arguments(rates=[1, 2], requests=8)
    specs = make_workload(
        8, min_len=4, max_len=128, prompt_mean=32, output_mean=32, seed=0
    )
    systems = {
        "paged": [
            {"rate": 1, "normalized_latency": 1.0},
            {"rate": 2, "normalized_latency": 1.0},
        ]
    }
    fit = bench_latency.predict(args, specs, systems, timed, None)
    expected = {
        rate: (
            simulate(
                bench_latency.simulator_profile(args, profile),
                "paged",
                poisson_trace(specs, rate, 0),
            ).normalized_latency
        )
        for rate, profile in ((1, fast), (2, slow))
    }
    for p in systems["paged"]:
        assert p["predicted"] == pytest.approx(expected[p["rate"]], rel=1e-6)
    # one line cannot fit both
    assert fit["steps"] == 2 * len(shapes) and fit["fit_error_p50"] > 0.05


def test_latency_json_on_this_machines_clock(folder, capsys):
    bench_cli.main(
        [
            "latency",
            "--json",
            "--model",
            folder,
            "--device",
            "cpu",
            "--requests",
            "5",
            "--rates",
            "4",
            "16",
            "--systems",
            "paged",
            "static",
            "--kv-tokens",
            "1024",
            "--max-model-len",
            "256",
            "--predict",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert list(result["systems"]) == ["paged", "static"]
    for points in result["systems"].values():
        assert [p["rate"] for p in points] == [4, 16]
        for p in points:
            assert {
                "normalized_latency",
                "short_e2e_p50",
                "short_e2e_p99",
                "predicted",
                "relative_error",
            } <= set(p)
            assert (
                0 < p["short_e2e_p50"] <= p["short_e2e_p99"]
                and p["normalized_latency"] > 0
            )


def test_the_fit_recovers_a_known_step_time_model():
    truth = PROFILES["cpu-smollm2"]
    shapes = [(t, c) for t in (1, 4, 16, 64, 256) for c in (t, 4 * t, 40 * t)]
    rows = [(t, c, truth.step_time(t, c)) for t, c in shapes]
    fitted = bench_latency.fit_profile(rows)
    for name in ("fixed", "per_token", "per_context"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6)
    assert bench_latency.fit_error(fitted, rows, 90) < 1e-6


def test_calibrate_fits_timed_steps(folder, capsys):
    bench_cli.main(
        [
            "calibrate",
            "--json",
            "--model",
            folder,
            "--device",
            "cpu",
            "--decode-steps",
            "3",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert result["steps"] == 3 * len(bench_latency.CALIBRATION_SHAPES)
    assert (
        min(result["fixed"], result["per_token"], result["per_context"]) >= 0
        and result["fixed"] > 0
    )
