"""Compile the .cu kernels with NVRTC, no GPU needed: the check that runs on any Linux
or Windows.

NVRTC is NVIDIA's runtime compiler, the one CuPy's RawModule calls on a GPU machine;
here it comes from the wheels of the `nvrtc` extra (see `compile_cu`), which exist for
Linux and Windows.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path

try:
    from cuda.bindings import nvrtc
except ImportError:  # compile_cu says what to install
    nvrtc = None


# The machines NVIDIA ships NVRTC's wheels for (pyproject.toml's markers on the `nvrtc`
# extra say the same; tests/test_install.py checks both against PyPI). A Mac has none.
WHEELS = {
    ("linux", "x86_64"),
    ("linux", "aarch64"),
    ("win32", "AMD64"),
}  # (sys.platform, machine)
WHEELS_EXIST = (sys.platform, platform.machine()) in WHEELS
INSTALL = (
    "pip install -e '.[nvrtc]'"
    if WHEELS_EXIST
    else (
        f"NVIDIA ships no NVRTC wheels for {sys.platform} {platform.machine()}: "
        "the kernels compile with NVRTC on Linux and Windows, and run here emulated"
    )
)


class CompileError(RuntimeError):
    """NVRTC could not compile a source; the message holds its log."""


@dataclass(frozen=True, slots=True)
class KernelReport:
    name: str  # the name expression, e.g. "paged_attention_v5<__half, 64, 3>"
    registers: int  # per thread
    spill_bytes: int  # spill stores + loads: local-memory traffic nobody asked for
    shared_bytes: int  # static shared memory per block


@dataclass(frozen=True, slots=True)
class CompileResult:
    arch: str  # "sm_90"
    log: str  # NVRTC's log: warnings and the ptxas report
    kernels: dict[str, KernelReport]  # by name expression
    ptx: dict[str, str]  # each kernel's PTX (its .entry), by name expression


def cuda_include_dir() -> Path:
    """The folder holding cuda_fp16.h, from the nvidia-cuda-runtime-cu12 wheel."""
    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    if spec is None or not spec.submodule_search_locations:
        raise CompileError(
            f"cuda_fp16.h not found (the nvidia-cuda-runtime-cu12 wheel): {INSTALL}"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "include"


def compile_cu(path: Path, names: list[str], arch: str = "sm_90") -> CompileResult:
    """Compile the template instances `names` of a .cu file for `arch` (sm_80, sm_90,
    ...): what ptxas reports for each kernel (registers, spills, shared memory) and each
    kernel's PTX; a compile error raises CompileError with NVRTC's log. Needs the
    `nvrtc` extra's wheels: `nvidia-cuda-nvrtc-cu12` (the library),
    `nvidia-cuda-runtime-cu12` (for `cuda_fp16.h`) and
    `cuda-bindings` (the Python binding)."""
    if nvrtc is None:
        raise CompileError(f"the NVRTC binding (cuda-bindings) is missing: {INSTALL}")
    path = Path(path)
    _, program = nvrtc.nvrtcCreateProgram(
        path.read_bytes(), path.name.encode(), 0, [], []
    )
    try:
        for name in names:
            nvrtc.nvrtcAddNameExpression(program, name.encode())
        options = [
            f"-arch={arch}",
            "-std=c++17",
            f"-I{cuda_include_dir()}",
            "--ptxas-options=-v",
        ]
        (status,) = nvrtc.nvrtcCompileProgram(
            program, len(options), [o.encode() for o in options]
        )
        log = _read(program, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog)
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(
                f"NVRTC could not compile {path.name} for {arch}:\n{log}"
            )
        ptx = _read(program, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
        lowered = {
            nvrtc.nvrtcGetLoweredName(program, name.encode())[1].decode(): name
            for name in names
        }  # mangled symbol -> name expression
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return CompileResult(
        arch, log, _ptxas_reports(log, lowered), _ptx_entries(ptx, lowered)
    )


def _read(program, get_size, get) -> str:
    """A text NVRTC hands out in two calls, its size and then its bytes (the log, the
    PTX)."""
    _, size = get_size(program)
    text = b" " * size
    get(program, text)
    return text.rstrip(b"\0 ").decode()


def _ptxas_reports(log: str, lowered: dict[str, str]) -> dict[str, KernelReport]:
    """ptxas's -v report, one KernelReport per kernel of `lowered`."""
    reports = {}
    for chunk in log.split("Compiling entry function '")[1:]:
        name = lowered.get(chunk.split("'", 1)[0])
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", chunk)
        shared = re.search(r"(\d+) bytes smem", chunk)
        if name is not None:
            reports[name] = KernelReport(
                name=name,
                registers=int(re.search(r"Used (\d+) registers", chunk).group(1)),
                spill_bytes=int(spills.group(1)) + int(spills.group(2)),
                shared_bytes=int(shared.group(1)) if shared else 0,
            )
    return reports


def _ptx_entries(ptx: str, lowered: dict[str, str]) -> dict[str, str]:
    """The PTX of each kernel of `lowered`: from its `.entry` line to the next one."""
    entries = {}
    for part in re.split(r"(?=\.(?:visible|weak) \.entry )", ptx)[1:]:
        name = lowered.get(re.match(r"\.\w+ \.entry (\w+)", part).group(1))
        if name is not None:
            entries[name] = part
    return entries
