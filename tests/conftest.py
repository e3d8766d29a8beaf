"""Shared fixtures: tiny checkpoints, the real offline model (loaded once), GPU
skipping."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/checkpoints.py

from minipaged.backend import cuda_available  # noqa: E402

# Tests that drive the whole program from outside, as a user would: a subprocess or a
# terminal, a server and its clients, a browser, a notebook kernel, the documents' own
# commands, the whole engine under every option at once. `pytest -m integration` runs
# them; `-m "not integration"` is the unit tests of one part each.
INTEGRATION = {
    "test_chat",
    "test_serve",
    "test_serve_dashboard",
    "test_serve_doors",
    "test_serve_fuzz",
    "test_notebooks",
    "test_readme",
    "test_real_model",
    "test_engine_fuzz",
    "test_chunked_prefill",
    "test_docs",
    "test_workshop_rehearsal",
    "test_router",
    "test_clients",
}


# The files that take minutes run first: with `make test`'s processes (pytest-xdist, a
# file per process at a time) no process is left alone with one of them at the end.
LONGEST_FIRST = ["test_notebooks", "test_docs", "test_engine_fuzz", "test_install"]


def pytest_collection_modifyitems(config, items):
    """A test that asks for the real model (the smollm2 fixture) is `slow`, marked or
    not; the files in INTEGRATION are `integration`; without a GPU, `gpu` tests are
    skipped; the files of LONGEST_FIRST run first, the others in their usual order."""

    def module(item):
        return item.module.__name__.rsplit(".", 1)[-1]

    # a stable sort: the order within a file stays
    items.sort(
        key=lambda item: (
            LONGEST_FIRST.index(module(item))
            if module(item) in LONGEST_FIRST
            else len(LONGEST_FIRST)
        )
    )
    skip = pytest.mark.skip(
        reason="needs a CUDA device (run scripts/gpu_check.sh on a GPU machine)"
    )
    no_gpu = not cuda_available()
    for item in items:
        if "smollm2" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
        if module(item) in INTEGRATION:
            item.add_marker(pytest.mark.integration)
        if "gpu" in item.keywords and no_gpu:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from the bundled GGUF (converted on first use), on the CPU.

    Always the GGUF, even where the hub is reachable: the stored transformers outputs
    were
    computed from that file, and its Q4_1 weights differ from the hub's bf16 ones."""
    from minipaged.llm import LLM
    from minipaged.model.offline import offline_default_model

    return LLM(str(offline_default_model()), device="cpu")


@pytest.fixture
def tiny(tmp_path):
    """A function writing a tiny random checkpoint: tiny(tied=False, dtype='bfloat16',
    ...)."""
    from checkpoints import write_checkpoint

    counter = iter(range(1000))
    return lambda **options: write_checkpoint(
        tmp_path / f"ckpt{next(counter)}", **options
    )
