"""The array backend: NumPy on a CPU, CuPy on a CUDA GPU, behind one name `xp`.

Every array in the forward pass is written against `xp`, so the same lines run on both. The
device is looked at only when a model is loaded, never at import; imports nothing of minipaged.
"""

from __future__ import annotations

import functools
import os
import statistics
import time

import numpy as np

DEVICES = ("cpu", "cuda")


def cdiv(a: int, b: int) -> int:
    """a / b rounded up: how many blocks of size b hold a items (written -(-a // b) elsewhere)."""
    return -(-a // b)


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy
        return cupy.cuda.is_available()
    except Exception:  # no cupy wheel, no driver, broken install: all mean "no GPU"
        return False


def resolve_device(device: str | None = None) -> str:
    """'cpu' or 'cuda': the argument (`LLM(device=...)`), else $MINIPAGED_DEVICE, else cuda when
    usable."""
    device = (device or os.environ.get("MINIPAGED_DEVICE") or "").strip().lower()
    if not device:
        return "cuda" if cuda_available() else "cpu"
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "cuda" and not cuda_available():
        raise RuntimeError(
            "device 'cuda' was asked for, but no CUDA device is usable: install CuPy "
            "(pip install -e '.[gpu]' for CUDA 12, '.[cuda13]' for CUDA 13) on a machine "
            "with an NVIDIA GPU, or use device='cpu' / MINIPAGED_DEVICE=cpu")
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
    """fp32 on the CPU (NumPy has no fast fp16 matmul); fp16 on the GPU (fp32 accumulation)."""
    return "float16" if device == "cuda" else "float32"


# ---- BLAS threads on a shared CPU ----------------------------------------------------------------

def fit_blas_threads(samples: int = 5) -> int:
    """Give NumPy's BLAS one thread per core that no other program is using now; return that count.

    OpenBLAS splits every matrix product over its threads and waits for the slowest. When another
    process competes for the cores, one of those threads is often descheduled and the others spin
    waiting for it: decoding on a 2-core machine with one busy neighbour ran 5x slower with 2
    threads than with 1. On an idle machine all cores stay in use. The count never exceeds what
    BLAS started with (its default or OPENBLAS_NUM_THREADS). Called when a model is loaded
    (`LLM()` on a CPU), by the chat before each answer and by the benchmarks before they
    measure; call it again when the machine's load changes.
    """
    from threadpoolctl import threadpool_limits
    most = blas_threads_at_start()
    if most == 0:  # no BLAS with a thread pool (e.g. Apple's Accelerate): nothing to choose
        return 1
    threads = max(1, min(most, len(_usable_cores()) - busy_cores(samples)))
    threadpool_limits(limits=threads, user_api="blas")
    return threads


@functools.cache
def blas_threads_at_start() -> int:
    """BLAS's thread count before fit_blas_threads first changed it (0: no BLAS thread pool)."""
    from threadpoolctl import threadpool_info
    return max([pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"],
               default=0)


def busy_cores(samples: int = 5) -> int:
    """Cores other programs keep busy now: runnable tasks on the machine (/proc/stat's
    procs_running) less this process's own running threads, the median of `samples` looks 10 ms
    apart. 0 where /proc is missing (not Linux): there we cannot tell, and assume a quiet machine."""
    counts = []
    for i in range(samples):
        try:
            counts.append(_procs_running() - _own_running_threads())
        except OSError:
            return 0
        if i + 1 < samples:
            time.sleep(0.01)
    return max(0, round(statistics.median(counts)))


def _procs_running() -> int:
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith("procs_running"):
                return int(line.split()[1])
    raise OSError("no procs_running in /proc/stat")


def _own_running_threads() -> int:
    running = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as stat:
                running += stat.read().rsplit(")", 1)[1].split()[0] == "R"
        except OSError:  # the thread ended while we looked
            pass
    return running


def _usable_cores() -> set[int]:
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
