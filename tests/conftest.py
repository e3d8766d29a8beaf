"""Shared fixtures: tiny checkpoints, the real offline model (loaded once), GPU skipping."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/checkpoints.py

from minipaged.backend import cuda_available  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run scripts/gpu_check.sh on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2():
    """The real default model on the CPU (offline GGUF conversion on first use)."""
    from minipaged.engine import LLM
    return LLM(device="cpu")


@pytest.fixture
def tiny(tmp_path):
    """A function writing a tiny random checkpoint: tiny(tied=False, dtype='bfloat16', ...)."""
    from checkpoints import write_checkpoint
    counter = iter(range(1000))
    return lambda **options: write_checkpoint(tmp_path / f"ckpt{next(counter)}", **options)
