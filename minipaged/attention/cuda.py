"""Paged attention on a CUDA GPU: the kernels of cuda/*.cu, compiled by NVRTC through
CuPy.

What `get_attention("cuda")` returns. The launches (grids, arguments, the decode version
rule) are those of kernels.py, the same the CPU emulation runs.
"""

from __future__ import annotations

import functools

import cupy

from . import kernels

OPTIONS = ("-std=c++17",)


@functools.cache
def _kernel(name: str) -> cupy.RawKernel:
    """The kernel instance `name` (a name expression such as "paged_attention_v5<__half,
    64, 3>"), compiled by cupy.RawModule at its first launch; CuPy keeps the binary in
    its on-disk cache, so later runs only load it."""
    source = kernels.SOURCES[kernels.source_of(name)].read_text()
    module = cupy.RawModule(code=source, options=OPTIONS, name_expressions=(name,))
    return module.get_function(name)


def _launch(name: str, grid: tuple, block: tuple, args: tuple) -> None:
    _kernel(name)(grid, block, args)


@functools.cache
def launcher() -> kernels.Launcher:
    """The contract's functions on the current device, built on first use: importing
    this module never asks for a GPU, so an error about a missing device comes from the
    call that needs one.
    """
    if not cupy.cuda.is_available():
        raise RuntimeError(
            "minipaged.attention.cuda needs a CUDA device; on a CPU use "
            "minipaged.attention.reference (or .emulated, the kernels' own code)"
        )
    # feeds the decode version rule
    num_sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    return kernels.Launcher(launch=_launch, xp=cupy, num_sms=num_sms)


def write_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    launcher().write_kv(k, v, k_cache, v_cache, slot_mapping)


def copy_blocks(k_cache, v_cache, pairs) -> None:
    launcher().copy_blocks(k_cache, v_cache, pairs)


def decode(q, k_cache, v_cache, block_tables, context_lens, scale, **options):
    return launcher().decode(
        q, k_cache, v_cache, block_tables, context_lens, scale, **options
    )


def prefill(q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale):
    return launcher().prefill(
        q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale
    )


def __getattr__(name: str):
    """`cuda.LAUNCHER`, as the kernel benchmark and the GPU tests use it: the launcher,
    built on first use."""
    if name == "LAUNCHER":
        return launcher()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
