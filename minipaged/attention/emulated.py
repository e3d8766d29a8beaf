"""Paged attention on a CPU by running the CUDA kernels themselves, for tests and for
study.

The .cu files compiled by the system C++ compiler with a shim header, launched through
ctypes with the very launches `cuda` uses (kernels.py). Slow, exact, and the same code.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from . import kernels

SHIM_DIR = kernels.CUDA_DIR / "emulate"
# -g: for gdb
OPTIMIZE = ["-O0", "-g"] if os.environ.get("MINIPAGED_EMULATE_DEBUG") else ["-O2"]
# g++ or clang++ (CXX chooses). macOS: Xcode's clang, a .dylib, and ucontext's
# deprecation quiet.
if sys.platform == "darwin":
    COMPILER = [
        os.environ.get("CXX", "clang++"),
        "-std=c++20",
        *OPTIMIZE,
        "-dynamiclib",
        "-Wno-deprecated-declarations",
    ]
else:
    COMPILER = [
        os.environ.get("CXX", "g++"),
        "-std=c++20",
        *OPTIMIZE,
        "-shared",
        "-fPIC",
    ]
# the version rule answers as for an H200, so the default is what a GPU would run
NUM_SMS = 132


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "minipaged" / "emulated"


def _translation_unit(source: Path, names: tuple[str, ...]) -> str:
    """The shim, the .cu file unchanged, and the table of the kernel instances
    `names`."""
    entries = "".join(f'    emu::entry<&{name}>("{name}"),\n' for name in names)
    return (
        f'#include "cuda_shim.h"\n#include "{source}"\n\n'
        f"const std::vector<emu::Kernel> emu::kernels = {{\n{entries}}};\n"
    )


@functools.cache
def library(source: Path, names: tuple[str, ...]) -> ctypes.CDLL:
    """A .cu file compiled for the CPU with its kernel instances `names`, built if not
    cached. The system C++ compiler (g++ or clang++) builds it together with
    cuda/emulate/cuda_shim.h (threadIdx, __syncthreads, warp shuffles, __half; every
    CUDA thread a fiber) into a shared library, once, cached under
    ~/.cache/minipaged/emulated by a hash of the sources and the
    compiler. Slow (a few microseconds per thread and barrier) but exact."""
    unit = _translation_unit(source, names)
    inputs = [
        source.read_text(),
        *names,
        *(p.read_text() for p in sorted(SHIM_DIR.glob("*.h"))),
        " ".join(COMPILER),
        compiler_version(),
    ]  # not the path: a copy elsewhere is the same
    digest = hashlib.sha256("\0".join(inputs).encode()).hexdigest()[:16]
    path = cache_dir() / f"{source.stem}-{digest}.so"
    if not path.exists():
        _compile(unit, path)
    compiled = ctypes.CDLL(str(path))
    compiled.emu_launch.restype = ctypes.c_int
    return compiled


@functools.cache
def compiler_version() -> str:
    """The first line of `$CXX --version`: g++ and clang++ builds (or two versions of
    one) are cached apart."""
    if sys.platform == "win32":
        raise RuntimeError(
            "the emulated kernels run each CUDA thread as a POSIX ucontext fiber, "
            "which Windows lacks: run them under WSL (Linux), or use "
            "minipaged.attention.reference"
        )
    if shutil.which(COMPILER[0]) is None:
        install = (
            "xcode-select --install"
            if sys.platform == "darwin"
            else "install g++ or clang"
        )
        raise RuntimeError(
            f"the emulated kernels need a C++20 compiler; {COMPILER[0]} was not "
            f"found ({install}, or set CXX)"
        )
    done = subprocess.run([COMPILER[0], "--version"], capture_output=True, text=True)
    return done.stdout.partition("\n")[0]


def _compile(unit: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cpp, so = Path(tmp) / "unit.cpp", Path(tmp) / "unit.so"
        cpp.write_text(unit)
        command = [*COMPILER, f"-I{SHIM_DIR}", str(cpp), "-o", str(so)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(
                f"compiling the emulated kernels failed:\n{' '.join(command)}\n"
                f"{done.stderr}"
            )
        os.replace(so, path)  # atomic: a concurrent test run never loads half a file


def _as_ctype(arg):
    """A kernel argument as ctypes holds it: arrays by their data pointer."""
    if isinstance(arg, np.ndarray):
        return ctypes.c_void_p(arg.ctypes.data)
    if isinstance(arg, np.int32):
        return ctypes.c_int32(arg)
    if isinstance(arg, np.float32):
        return ctypes.c_float(arg)
    raise TypeError(
        f"kernel arguments are arrays, np.int32 or np.float32; got {type(arg)}"
    )


def _dim3(dims: tuple):
    return (ctypes.c_uint * 3)(*dims, *(1,) * (3 - len(dims)))


def launch_on(
    compiled: ctypes.CDLL, name: str, grid: tuple, block: tuple, args: tuple
) -> None:
    """Launch a kernel as cuLaunchKernel would: an array of pointers to the
    arguments."""
    values = [_as_ctype(a) for a in args]
    pointers = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
    sizes = (ctypes.c_int * len(values))(*(ctypes.sizeof(v) for v in values))
    message = ctypes.create_string_buffer(512)
    if compiled.emu_launch(
        name.encode(),
        _dim3(grid),
        _dim3(block),
        pointers,
        len(values),
        sizes,
        message,
        len(message),
    ):
        raise RuntimeError(f"emulated {name}: {message.value.decode()}")


def _launch(name: str, grid: tuple, block: tuple, args: tuple) -> None:
    source = kernels.source_of(name)
    compiled = library(kernels.SOURCES[source], tuple(kernels.kernel_names(source)))
    launch_on(compiled, name, grid, block, args)


# the CPU, posing as an H200
LAUNCHER = kernels.Launcher(launch=_launch, xp=np, num_sms=NUM_SMS)

write_kv, copy_blocks = LAUNCHER.write_kv, LAUNCHER.copy_blocks
decode, prefill = LAUNCHER.decode, LAUNCHER.prefill
