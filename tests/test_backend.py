"""Device choice: NumPy without a GPU, a clear error when CUDA is asked for and missing;
and how a projection runs on this CPU (minipaged.model.cpu): BLAS threads fitted to the
load, weight panels.
"""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from checkpoints import write_checkpoint

from minipaged import backend
from minipaged.model import Model, cpu
from minipaged.model.oracle import ContiguousKVCache


def test_cpu_is_numpy(monkeypatch):
    monkeypatch.setenv("MINIPAGED_DEVICE", "cpu")
    assert backend.resolve_device() == "cpu" and backend.get_xp() is np


def test_unknown_device():
    with pytest.raises(
        ValueError, match="unknown device 'tpu'; choose one of cpu, cuda"
    ):
        backend.resolve_device("tpu")


@pytest.mark.skipif(backend.cuda_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MINIPAGED_DEVICE", "cuda")
    with pytest.raises(
        RuntimeError, match="no CUDA device is usable.*MINIPAGED_DEVICE=cpu"
    ):
        backend.resolve_device()
    monkeypatch.delenv("MINIPAGED_DEVICE")
    assert backend.resolve_device() == "cpu"  # the default falls back quietly


def test_array_module_and_to_numpy():
    a = np.arange(3)
    assert backend.array_module(a) is np and backend.to_numpy(a) is a


# ---- no device question at import ----------------------------------------------------


@pytest.mark.skipif(backend.cuda_available(), reason="this machine has a GPU")
def test_asking_for_cuda_fails_at_llm_not_at_import():
    """MINIPAGED_DEVICE=cuda without a GPU: `import minipaged` works; LLM() says what to
    do."""
    code = (
        "import minipaged\n"
        "try:\n"
        "    minipaged.LLM(device='cuda')\n"
        "except RuntimeError as error:\n"
        "    print('RuntimeError:', error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"MINIPAGED_DEVICE": "cuda"},
    )
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(
        r"RuntimeError: device 'cuda' was asked for, but no CUDA device is usable: "
        r".*MINIPAGED_DEVICE=cpu\n",
        result.stdout,
    )


# ---- BLAS threads on a shared CPU ----------------------------------------------------


@pytest.fixture
def blas_threads():
    """BLAS's thread counts, restored after the test."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def now():
        return {
            pool["num_threads"]
            for pool in threadpool_info()
            if pool["user_api"] == "blas"
        }

    before = now()
    yield now
    threadpool_limits(limits=max(before), user_api="blas")


def test_blas_gets_the_cores_nobody_else_is_using(monkeypatch, blas_threads):
    most = cpu.blas_threads_at_start()
    cores = len(os.sched_getaffinity(0))
    for busy, expected in [(0, min(most, cores)), (cores - 1, 1), (cores + 5, 1)]:
        monkeypatch.setattr(cpu, "busy_cores", lambda samples, busy=busy: busy)
        assert cpu.fit_blas_threads() == expected
        assert blas_threads() == {expected}


def test_busy_cores_sees_a_competing_process():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # running, not starting up
        assert cpu.busy_cores(samples=5) >= 1
        cores = cpu._Cores()
        cpu.busy_cores_lately(cores)  # the first look: a snapshot
        time.sleep(0.5)
        assert cpu.busy_cores_lately(cores) >= 1  # a core's worth of ticks, not ours
    finally:
        spinner.kill()
        spinner.wait()


def test_our_own_work_is_not_a_neighbours(monkeypatch):
    """busy_cores_lately: the machine's busy ticks less our own, per second since the
    last look, rounded half up; a thread of ours spinning shows in our own ticks."""
    import threading
    from types import SimpleNamespace

    stop = threading.Event()

    def spin():
        while not stop.is_set():
            np.ones(1 << 16).sum()

    before = cpu.cpu_jiffies()
    ours = threading.Thread(target=spin)
    ours.start()
    time.sleep(0.5)
    stop.set()
    ours.join()
    after = cpu.cpu_jiffies()
    ticks = os.sysconf("SC_CLK_TCK")
    assert after[1] - before[1] >= 0.2 * ticks  # our spinning is counted as ours
    assert after[0] - before[0] >= after[1] - before[1] - 2  # and as the machine's
    # the arithmetic, on ticks given: 100 a second
    moments = iter([100.0, 101.0, 102.0])
    looks = iter([(1000, 500), (1150, 600), (1290, 700)])
    monkeypatch.setattr(cpu, "cpu_jiffies", lambda: next(looks))
    monkeypatch.setattr(cpu, "time", SimpleNamespace(monotonic=lambda: next(moments)))
    monkeypatch.setattr(cpu, "busy_cores", lambda samples: 7)  # the first look's
    monkeypatch.setattr(cpu.os, "sysconf", lambda name: 100)
    cores = cpu._Cores()
    assert [cpu.busy_cores_lately(cores) for _ in range(3)] == [7, 1, 0]


# ---- how a projection is computed on a CPU -------------------------------------------


@pytest.mark.parametrize("shape", [(576, 960), (8, 64), (5, 3), (16, 130)])
@pytest.mark.parametrize("rows", [1, 2, 7, 63, 64, 100])
def test_panel_weight_multiplies_as_the_plain_matrix(shape, rows):
    rng = np.random.default_rng(rows)
    w = rng.standard_normal(shape, dtype=np.float32)
    x = rng.standard_normal((rows, shape[0]), dtype=np.float32)
    out = x @ cpu.PanelWeight(w)
    # a transposed view
    np.testing.assert_allclose(x @ cpu.PanelWeight(np.ascontiguousarray(w.T).T), out)
    assert (
        type(out) is np.ndarray
        and out.shape == (rows, shape[1])
        and out.dtype == np.float32
    )
    np.testing.assert_allclose(out, x @ w, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(cpu.PanelWeight(w).dense(), w)


def test_panel_weight_says_what_does_not_match():
    with pytest.raises(
        ValueError, match=r"x @ w: x \(2, 4\) does not match a weight of shape \(3, 5\)"
    ):
        np.ones((2, 4), np.float32) @ cpu.PanelWeight(np.ones((3, 5), np.float32))


def test_panels_where_they_pay_plain_arrays_elsewhere(monkeypatch):
    """Unset, the machine's own timing decides; MINIPAGED_CPU_PANELS=0/1 decides without
    asking."""
    w = np.ones((4, 6), np.float32)
    monkeypatch.delenv("MINIPAGED_CPU_PANELS", raising=False)
    for pays, kind in [(True, cpu.PanelWeight), (False, np.ndarray)]:
        monkeypatch.setattr(cpu, "panels_pay", lambda pays=pays: pays)
        assert type(cpu.projection_weight(w, np, np.float32)) is kind
    monkeypatch.setenv("MINIPAGED_CPU_PANELS", "1")
    assert isinstance(cpu.projection_weight(w, np, np.float32), cpu.PanelWeight)
    monkeypatch.setenv("MINIPAGED_CPU_PANELS", "0")
    monkeypatch.setattr(cpu, "panels_pay", lambda: True)
    # (in, out) view of (out, in)
    plain = cpu.projection_weight(w.T.astype(np.float64).T, np, np.float32)
    assert (
        type(plain) is np.ndarray
        and plain.dtype == np.float32
        and plain.flags.c_contiguous
    )
    np.testing.assert_array_equal(plain, w)


def test_the_panels_are_split_over_the_free_cores(monkeypatch):
    """Each core gets its own contiguous share of the panels, and together they cover
    all; a product split over the cores free now or over one gives the same numbers."""
    seen = []
    cpu._split(lambda lo, hi: seen.append((lo, hi)), 10, 3)
    assert sorted(seen) == [(0, 3), (3, 6), (6, 10)]
    w = cpu.PanelWeight(
        np.random.default_rng(0).standard_normal((40, 100)).astype(np.float32)
    )
    x = np.random.default_rng(1).standard_normal((5, 40)).astype(np.float32)
    monkeypatch.setattr(cpu._cores, "now", 2)
    np.testing.assert_array_equal(x @ w, w.by_panels(x, cores=1))
    np.testing.assert_allclose(x @ w, x @ w.dense(), rtol=1e-5, atol=1e-5)


def test_one_rule_says_how_each_row_count_is_multiplied():
    """One row: the matrix-vector code; 2 to 63: panels; from 64 on: the GEMM
    (model/cpu.py)."""
    assert [cpu.projection_path(n) for n in (1, 2, 63, 64, 500)] == [
        "matrix-vector",
        "panels",
        "panels",
        "gemm",
        "gemm",
    ]


def test_a_weight_gives_way_to_the_gemm_from_its_own_row_count():
    """projection_path's upper bound is the weight's: panels below it, GEMM from it."""
    assert cpu.projection_path(23, 24) == "panels"
    assert cpu.projection_path(24, 24) == "gemm"
    w = cpu.PanelWeight(np.ones((8, 40), np.float32))
    w.gemm_rows = 4

    def no_panels(x, cores=None):
        raise AssertionError("panels used at the GEMM's row count")

    w.by_panels = no_panels
    x = np.ones((4, 8), np.float32)
    np.testing.assert_array_equal(x @ w, x @ w.dense())
    with pytest.raises(AssertionError, match="panels used"):
        x[:3] @ w


def test_the_gemm_takes_over_where_it_is_timed_faster(monkeypatch, tmp_path):
    """choose_gemm_rows answers the first row count where a whole step's GEMM beat its
    panels, GEMM_ROWS where it never did, once per set of shapes; MINIPAGED_GEMM_ROWS
    answers without timing, and a wrong value is named."""
    monkeypatch.delenv("MINIPAGED_GEMM_ROWS", raising=False)
    monkeypatch.setenv("MINIPAGED_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu, "_gemm_rows_seen", {})
    monkeypatch.setattr(cpu, "fit_blas_threads", lambda samples=5: 1)
    weights = [cpu.PanelWeight(np.ones((8, 40), np.float32)) for _ in range(3)]
    timed = []

    def fake_seconds(gemm_from):
        def seconds(way, ws, xs):
            rows = len(next(iter(xs.values())))
            timed.append((way, rows))
            assert all(isinstance(w, cpu.PanelWeight) for w in ws)
            return 1.0 if (way == "gemm") == (rows >= gemm_from) else 2.0

        return seconds

    monkeypatch.setattr(cpu, "_seconds", fake_seconds(32))
    assert cpu.choose_gemm_rows(weights) == 32
    assert {rows for _, rows in timed} == {16, 24, 32}
    timed.clear()
    assert cpu.choose_gemm_rows(weights) == 32 and not timed  # kept
    monkeypatch.setattr(cpu, "_seconds", fake_seconds(10**6))
    assert cpu.choose_gemm_rows(weights[:2]) == cpu.GEMM_ROWS
    monkeypatch.setenv("MINIPAGED_GEMM_ROWS", "40")
    assert cpu.choose_gemm_rows(weights[:1]) == 40
    for wrong in ("1", "many", "-3"):
        monkeypatch.setenv("MINIPAGED_GEMM_ROWS", wrong)
        with pytest.raises(ValueError, match=f"MINIPAGED_GEMM_ROWS='{wrong}'"):
            cpu.choose_gemm_rows(weights)


def test_the_answer_is_kept_for_later_loads_on_this_machine(monkeypatch, tmp_path):
    """A second process (the in-process answers forgotten) reads the file instead of
    timing; another machine's key, a file that is not JSON, or a cache folder that
    cannot be written mean timing again, and the answer still comes."""
    monkeypatch.delenv("MINIPAGED_GEMM_ROWS", raising=False)
    monkeypatch.setenv("MINIPAGED_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu, "fit_blas_threads", lambda samples=5: 1)
    weights = [cpu.PanelWeight(np.ones((8, 40), np.float32)) for _ in range(2)]
    timings = []

    def timed(ws):
        timings.append(len(ws))
        return 24

    monkeypatch.setattr(cpu, "_time_gemm_rows", timed)

    def new_process():
        monkeypatch.setattr(cpu, "_gemm_rows_seen", {})
        monkeypatch.setattr(cpu, "_gemm_rows_how", {})
        return cpu.choose_gemm_rows(weights)

    kept = tmp_path / cpu.GEMM_ROWS_FILE
    assert new_process() == 24 and timings == [2]
    assert cpu.gemm_rows_how(weights) == f"timed at load, kept in {kept}"
    key = cpu.machine_key(tuple(w.shape for w in weights))
    assert json.loads(kept.read_text()) == {key: 24}
    assert "numpy " in key and "cores" in key
    assert new_process() == 24 and timings == [2]  # read, not timed
    assert cpu.gemm_rows_how(weights) == f"kept in {kept}"
    # another machine's answer is kept beside this one's, and not read for it
    kept.write_text(json.dumps({"another machine": 48}))
    assert new_process() == 24 and timings == [2, 2]
    assert json.loads(kept.read_text()) == {"another machine": 48, key: 24}
    for broken in ("not json", json.dumps({key: "many"}), json.dumps([1, 2])):
        kept.write_text(broken)
        assert new_process() == 24
    assert timings == [2, 2, 2, 2, 2]
    kept.unlink()
    kept.mkdir()  # the file cannot be written
    assert new_process() == 24
    assert cpu.gemm_rows_how(weights).startswith("timed at load (not kept: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == [cpu.GEMM_ROWS_FILE]


def test_panels_pay_is_timed_once_per_machine_and_kept(monkeypatch, tmp_path):
    """panels_pay times at the first load and keeps its answer beside
    choose_gemm_rows's: a later process reads it (a server must not take another path
    by a noisy timing). A "no" is timed three times, a "yes" once; a broken answer in
    the file means timing again."""
    monkeypatch.setenv("MINIPAGED_CACHE", str(tmp_path))
    timings = []

    def timed():
        timings.append(1)
        return len(timings) > 3  # no, no, no, then yes

    monkeypatch.setattr(cpu, "_time_panels", timed)

    def new_process():
        cpu.panels_pay.cache_clear()
        return cpu.panels_pay()

    try:
        assert new_process() is False and timings == [1, 1, 1]
        kept = json.loads((tmp_path / cpu.GEMM_ROWS_FILE).read_text())
        [(key, answer)] = kept.items()
        assert answer is False and key.startswith("panels at 2 rows | ")
        monkeypatch.setattr(cpu, "_time_panels", lambda: pytest.fail("timed again"))
        assert new_process() is False
        (tmp_path / cpu.GEMM_ROWS_FILE).write_text(json.dumps({key: 3}))
        monkeypatch.setattr(cpu, "_time_panels", timed)
        assert new_process() is True and timings == [1, 1, 1, 1]
        assert json.loads((tmp_path / cpu.GEMM_ROWS_FILE).read_text()) == {key: True}
    finally:
        cpu.panels_pay.cache_clear()


def test_a_close_call_stays_with_the_panels(monkeypatch):
    """The GEMM must be GEMM_MARGIN faster to take over: a panels pass slowed by chance
    must not decide for every later load."""
    weights = [cpu.PanelWeight(np.ones((8, 40), np.float32))]

    def seconds(way, ws, xs):
        return 1.0 if way == "gemm" else 1.02  # the GEMM 2% faster everywhere

    monkeypatch.setattr(cpu, "_seconds", seconds)
    assert cpu._time_gemm_rows(weights) == cpu.GEMM_ROWS


def test_a_model_with_panels_sets_one_gemm_row_count_on_every_weight(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("MINIPAGED_CPU_PANELS", "1")
    monkeypatch.setenv("MINIPAGED_GEMM_ROWS", "5")
    model = Model.from_folder(write_checkpoint(tmp_path / "ckpt"))
    weights = [
        w
        for layer in model.layers
        for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)
    ]
    assert {w.gemm_rows for w in [*weights, model.lm_head]} == {5}


def test_a_running_engine_follows_the_machine_load(monkeypatch, blas_threads):
    """One cheap look every `period` seconds; the median of the last five decides; BLAS
    follows."""
    cores = cpu._Cores(period=0.0)
    monkeypatch.setattr(cpu, "_usable_cores", lambda: {0, 1})
    monkeypatch.setattr(cpu, "blas_threads_at_start", lambda: 2)
    looks = iter([0, 0, 0, 1, 1, 1, 1, 1, 0])
    monkeypatch.setattr(cpu, "busy_cores_lately", lambda cores: next(looks))
    seen = []
    for _ in range(9):
        cores.follow()
        seen.append(cores.now)
    assert seen == [
        2,
        2,
        2,
        2,
        2,
        1,
        1,
        1,
        1,
    ]  # a neighbour for three looks out of five: one core
    assert blas_threads() == {1}
    monkeypatch.setattr(cpu, "busy_cores_lately", lambda cores: 0)
    slow = cpu._Cores(period=3600)
    slow.follow()
    slow.now = 7
    slow.follow()  # within the period: no look, no change
    assert slow.now == 7


def test_held_cores_keep_one_thread_whatever_the_load_then_follow_it_again(
    monkeypatch, blas_threads
):
    """`bench kv-dtype`'s answers must not follow the machine's load: OpenBLAS's GEMM
    rounds differently on 1 and 2 threads (held_cores says why)."""
    monkeypatch.setattr(cpu, "_cores", cpu._Cores(period=0.0))
    monkeypatch.setattr(cpu, "_usable_cores", lambda: {0, 1})
    monkeypatch.setattr(cpu, "blas_threads_at_start", lambda: 2)
    monkeypatch.setattr(cpu, "busy_cores_lately", lambda cores: 0)  # a quiet machine
    assert cpu.follow_machine_load() == 2 and blas_threads() == {2}
    with cpu.held_cores(1):
        assert [cpu.follow_machine_load() for _ in range(3)] == [1, 1, 1]
        assert blas_threads() == {1}
    assert cpu.follow_machine_load() == 2 and blas_threads() == {2}


def test_the_forward_pass_never_polls_the_machine(tmp_path, monkeypatch):
    """The load is followed between steps (Model.follow_machine_load), not inside
    forward: forwards alone never look at the machine; a step each looks at /proc once
    in a short span, not each time.
    """
    follows, looks = [], []
    follow = cpu.follow_machine_load
    monkeypatch.setattr(
        cpu, "follow_machine_load", lambda: follows.append(1) or follow()
    )
    monkeypatch.setattr(cpu, "busy_cores", lambda samples: looks.append(samples) or 0)
    monkeypatch.setattr(
        cpu, "busy_cores_lately", lambda cores: looks.append("lately") or 0
    )
    monkeypatch.setattr(cpu, "_set_blas_threads", lambda threads: None)
    model = Model.from_folder(write_checkpoint(tmp_path))
    # loading may look (choose_gemm_rows fits BLAS before it times the panels); from
    # here on, never looked yet: the first call looks
    looks.clear()
    monkeypatch.setattr(cpu, "_cores", cpu._Cores(period=60))
    cache = ContiguousKVCache(model.config, 1, 16, np, model.dtype)

    def decode(token):
        return model.forward([token], cache.begin_step([0], [1]), cache)

    for token in [1, 7, 12]:
        decode(token)
    assert follows == [] and looks == []
    for token in [30, 5, 44, 9]:
        model.follow_machine_load()
        decode(token)
    assert len(follows) == 4 and looks == ["lately"]


def test_each_engine_step_that_runs_the_model_follows_the_load_once(
    tmp_path, monkeypatch
):
    """The engine asks the model to follow the machine's load before each forward, once
    a step."""
    from minipaged import LLM, SamplingParams

    follows = []
    monkeypatch.setattr(cpu, "follow_machine_load", lambda: follows.append(1))
    engine = LLM(str(write_checkpoint(tmp_path)), device="cpu", num_blocks=16).engine
    engine.add_request(
        "r",
        {"prompt_token_ids": [1, 2, 3]},
        SamplingParams(max_tokens=5, ignore_eos=True),
    )
    steps = 0
    while engine.has_unfinished_requests() and steps < 20:
        engine.step()
        steps += 1
    assert steps == 5 and len(follows) == 5


@pytest.mark.parametrize("choice, expected", [("all", 2), (1, 1), (8, 2)])
def test_a_server_may_take_every_core_whatever_the_load(
    monkeypatch, blas_threads, choice, expected
):
    """--cpu-threads all (or N): a neighbour keeping a core busy changes nothing, step
    after step (N capped at what BLAS started with); fit follows it again."""
    monkeypatch.setattr(cpu, "_cores", cpu._Cores(period=0.0))
    monkeypatch.setattr(cpu, "_usable_cores", lambda: {0, 1})
    monkeypatch.setattr(cpu, "blas_threads_at_start", lambda: 2)
    monkeypatch.setattr(cpu, "busy_cores", lambda samples=5: 1)  # a busy neighbour
    assert cpu.use_cores(choice) == expected
    assert [cpu.follow_machine_load() for _ in range(3)] == [expected] * 3
    assert blas_threads() == {expected}
    assert cpu.use_cores("fit") == 1 and blas_threads() == {1}
    assert [cpu.follow_machine_load() for _ in range(3)] == [1, 1, 1]
