"""The CPU emulation builds with clang as well as g++ (a Mac has only Xcode's clang): a
sample of tests/test_kernels_emulated.py, run again by a pytest of its own with
CXX=clang++, against the same NumPy reference. Debian's clang 14 also takes the shim's
path for compilers without _Float16 (an Intel Mac's older Xcode)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EMULATED = "tests/test_kernels_emulated.py::"
SAMPLE = [  # fp32 and fp16 (cases 5-7), every kind of kernel, the emulator's own checks
    "test_decode_matches_reference[0-1]",
    "test_decode_matches_reference[2-5]",
    "test_decode_matches_reference[5-6]",
    "test_decode_matches_reference[7-4]",
    "test_prefill_matches_reference[0]",
    "test_prefill_matches_reference[6]",
    "test_write_kv_matches_reference[float16]",
    "test_copy_blocks_matches_reference[float16]",
    "test_the_emulator_runs_threads_in_a_shuffled_order_so_a_missing_barrier_shows",
    "test_the_emulator_reports_a_shuffle_that_part_of_a_warp_skips",
]


def clang() -> str:
    """clang++, or a skip that says why; as root (CI) a missing clang is a failure:
    `make test` installs Debian's clang there."""
    path = shutil.which("clang++")
    if path:
        return path
    message = (
        "no clang++ on PATH: install clang (`make test` installs Debian's clang when"
        " run as root)"
    )
    if os.environ.get("CI") or (hasattr(os, "geteuid") and os.geteuid() == 0):
        pytest.fail(message)
    pytest.skip(message)


@pytest.mark.skipif(
    sys.platform == "win32", reason="the emulation needs POSIX ucontext (use WSL)"
)
def test_the_kernels_built_by_clang_match_the_reference():
    env = {**os.environ, "CXX": clang()}
    version = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "from minipaged.attention import emulated; "
                "print(emulated.compiler_version())"
            ),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "clang" in version.stdout, version.stdout + version.stderr
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *(EMULATED + test for test in SAMPLE),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert f"{len(SAMPLE)} passed" in result.stdout, result.stdout[-2000:]
