"""Device choice: NumPy without a GPU, a clear error when CUDA is asked for and missing."""

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from minipaged import backend


def test_cpu_is_numpy(monkeypatch):
    monkeypatch.setenv("MINIPAGED_DEVICE", "cpu")
    assert backend.resolve_device() == "cpu" and backend.get_xp() is np


def test_unknown_device():
    with pytest.raises(ValueError, match="unknown device 'tpu'; choose one of cpu, cuda"):
        backend.resolve_device("tpu")


@pytest.mark.skipif(backend.cuda_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MINIPAGED_DEVICE", "cuda")
    with pytest.raises(RuntimeError, match="no CUDA device is usable.*MINIPAGED_DEVICE=cpu"):
        backend.resolve_device()
    monkeypatch.delenv("MINIPAGED_DEVICE")
    assert backend.resolve_device() == "cpu"  # the default falls back quietly


def test_array_module_and_to_numpy():
    a = np.arange(3)
    assert backend.array_module(a) is np and backend.to_numpy(a) is a


# ---- no device question at import --------------------------------------------------------------

@pytest.mark.skipif(backend.cuda_available(), reason="this machine has a GPU")
def test_asking_for_cuda_fails_at_llm_not_at_import():
    """MINIPAGED_DEVICE=cuda without a GPU: `import minipaged` works; LLM() says what to do."""
    code = ("import minipaged\n"
            "try:\n"
            "    minipaged.LLM(device='cuda')\n"
            "except RuntimeError as error:\n"
            "    print('RuntimeError:', error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env=os.environ | {"MINIPAGED_DEVICE": "cuda"})
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"RuntimeError: device 'cuda' was asked for, but no CUDA device is usable: "
                        r".*MINIPAGED_DEVICE=cpu\n", result.stdout)


# ---- BLAS threads on a shared CPU ----------------------------------------------------------------

@pytest.fixture
def blas_threads():
    """BLAS's thread counts, restored after the test."""
    from threadpoolctl import threadpool_info, threadpool_limits
    def now():
        return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}
    before = now()
    yield now
    threadpool_limits(limits=max(before), user_api="blas")


def test_blas_gets_the_cores_nobody_else_is_using(monkeypatch, blas_threads):
    most = backend.blas_threads_at_start()
    cores = len(os.sched_getaffinity(0))
    for busy, expected in [(0, min(most, cores)), (cores - 1, 1), (cores + 5, 1)]:
        monkeypatch.setattr(backend, "busy_cores", lambda samples, busy=busy: busy)
        assert backend.fit_blas_threads() == expected
        assert blas_threads() == {expected}


def test_busy_cores_sees_a_competing_process():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)   # running, not starting up
        assert backend.busy_cores(samples=5) >= 1
    finally:
        spinner.kill()
        spinner.wait()
