"""The array backend: NumPy on a CPU, CuPy on a CUDA GPU, behind one name `xp`.

Every array in the forward pass is written against `xp`, so the same lines run on both.
The device is looked at only when a model is loaded, never at import; imports nothing of
minipaged.
"""

from __future__ import annotations

import os

import numpy as np

DEVICES = ("cpu", "cuda")


def cdiv(a: int, b: int) -> int:
    """a / b rounded up: how many blocks of size b hold a items (written -(-a // b)
    elsewhere)."""
    return -(-a // b)


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return cupy.cuda.is_available()
    except Exception:  # no cupy wheel, no driver, broken install: all mean "no GPU"
        return False


def resolve_device(device: str | None = None) -> str:
    """'cpu' or 'cuda': the argument (`LLM(device=...)`), else $MINIPAGED_DEVICE, else
    cuda when usable."""
    device = (device or os.environ.get("MINIPAGED_DEVICE") or "").strip().lower()
    if not device:
        return "cuda" if cuda_available() else "cpu"
    if device not in DEVICES:
        raise ValueError(
            f"unknown device {device!r}; choose one of {', '.join(DEVICES)}"
        )
    if device == "cuda" and not cuda_available():
        raise RuntimeError(
            "device 'cuda' was asked for, but no CUDA device is usable: install CuPy"
            " (pip install -e '.[gpu]' for CUDA 12, '.[cuda13]' for CUDA 13) on a"
            " machine with an NVIDIA GPU, or use device='cpu' / MINIPAGED_DEVICE=cpu"
        )
    return device


def get_xp(device: str | None = None):
    """The array module for a device: numpy for 'cpu', cupy for 'cuda'."""
    if resolve_device(device) == "cuda":
        import cupy

        return cupy
    return np


def array_module(a):
    """numpy or cupy: the module that owns array `a` (so helpers work on either)."""
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def to_numpy(a) -> np.ndarray:
    """A NumPy copy of an array from either backend (a no-op view for NumPy input)."""
    if isinstance(a, np.ndarray):
        return a
    return a.get() if hasattr(a, "get") else np.asarray(a)


def default_dtype(device: str) -> str:
    """fp32 on the CPU (NumPy has no fast fp16 matmul); fp16 on the GPU (fp32
    accumulation)."""
    return "float16" if device == "cuda" else "float32"
