"""Paged attention on a CUDA GPU: the kernels of cuda/*.cu, compiled by NVRTC through CuPy.

Each kernel instance (a name expression such as "paged_attention_v5<__half, 64, 3>") is compiled
by cupy.RawModule the first time it is launched; CuPy keeps the binary in its on-disk cache, so
later runs only load it. The launches (grids, arguments, the decode version rule) are those of
kernels.py, the same the CPU emulation runs.
"""

from __future__ import annotations

import functools

import cupy

from . import kernels

OPTIONS = ("-std=c++17",)


@functools.cache
def _kernel(name: str) -> cupy.RawKernel:
    source = kernels.SOURCES[kernels.source_of(name)].read_text()
    module = cupy.RawModule(code=source, options=OPTIONS, name_expressions=(name,))
    return module.get_function(name)


def _launch(name: str, grid: tuple, block: tuple, args: tuple) -> None:
    _kernel(name)(grid, block, args)


def _num_sms() -> int:
    if not cupy.cuda.is_available():
        raise RuntimeError("minipaged.attention.cuda needs a CUDA device; on a CPU use "
                           "minipaged.attention.reference (or .emulated, the kernels' own code)")
    return cupy.cuda.Device().attributes["MultiProcessorCount"]


LAUNCHER = kernels.Launcher(launch=_launch, xp=cupy, num_sms=_num_sms())   # the current device
write_kv, copy_blocks = LAUNCHER.write_kv, LAUNCHER.copy_blocks
decode, prefill = LAUNCHER.decode, LAUNCHER.prefill
