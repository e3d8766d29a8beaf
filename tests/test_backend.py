"""Device choice: NumPy without a GPU, a clear error when CUDA is asked for and missing."""

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
