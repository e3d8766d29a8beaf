"""Issue 28, three defects at the seams, each reproduced by a test first: two engines
(or two KVCaches) on one kv_offload_path, which truncated the first one's live tier
file; a kv_offload_path that is no regular file in a writable folder (/dev/null: "No
such device"); and `python -m minipaged.bench fragmentation --svg
/missing-folder/fig.svg`, which ended in a traceback.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# the drum tests' tiny model, their `llm` fixture, which the tests below take as an
# argument (ruff's F811 there), and their serve()
from test_drum import llm, serve  # noqa: F401

from minipaged.paging import KVCache, MemoryMoves
from minipaged.tools.bench import cli as bench_cli

SHAPE = dict(
    num_layers=1,
    num_kv_heads=1,
    head_dim=2,
    block_size=2,
    dtype="float32",
    device="cpu",
)
ROOT = Path(__file__).resolve().parent.parent


def tier_cache(path, frames: int = 3) -> KVCache:
    return KVCache(num_blocks=2, num_tier_blocks=frames, tier_path=path, **SHAPE)


def store(kv: KVCache, value: float) -> None:
    """Device frame 0 holds `value` everywhere; copy it to tier frame 0."""
    kv.data[:, :, 0] = value
    kv.apply(MemoryMoves(tier=[("store", 0, 0)]), copy_blocks=None)


def load(kv: KVCache) -> np.ndarray:
    """Tier frame 0 copied back into device frame 1."""
    kv.apply(MemoryMoves(tier=[("load", 0, 1)]), copy_blocks=None)
    return kv.data[:, :, 1]


# ---- 1. one owner per tier file ------------------------------------------------------


def in_use(path) -> str:
    return re.escape(f"kv_offload_path={str(path)!r} is already in use")


def test_a_second_kv_cache_on_a_live_tier_file_is_refused_the_first_keeps_its_frames(
    tmp_path,
):
    path = tmp_path / "drum.bin"
    first = tier_cache(path)
    store(first, 7.0)
    # the same size (its frames read back zeros), a smaller one (SIGBUS)
    for frames in (
        3,
        1,
    ):
        with pytest.raises(ValueError, match=in_use(path)) as error:
            tier_cache(path, frames)
        assert "another kv_offload_path" in str(
            error.value
        ) and "engine.kv.close()" in str(error.value)
    np.testing.assert_array_equal(load(first), 7.0)  # its file was left alone
    assert path.stat().st_size == first.tier.nbytes
    with pytest.raises(ValueError, match=in_use(path)):  # the same file by another name
        tier_cache(tmp_path / "." / "drum.bin")


def test_a_closed_or_collected_kv_cache_gives_its_tier_file_back(tmp_path):
    path = tmp_path / "drum.bin"
    first = tier_cache(path)
    store(first, 1.0)
    first.close()
    first.close()  # twice: nothing more
    with pytest.raises(RuntimeError, match="closed"):
        load(first)
    second = tier_cache(path)  # closed: the path is free again, in this process
    store(second, 2.0)
    np.testing.assert_array_equal(load(second), 2.0)
    del second  # dropped: given back when collected
    third = tier_cache(path)
    # in a reference cycle, collected only by the garbage collector
    third.itself = third
    del third
    fourth = tier_cache(path)
    store(fourth, 4.0)
    np.testing.assert_array_equal(load(fourth), 4.0)
    fourth.close()
    gc.collect()


@pytest.mark.skipif(
    importlib.util.find_spec("fcntl") is None,
    reason="no fcntl (Windows): the lock is this process's only",
)
def test_another_process_cannot_take_a_live_tier_file(tmp_path):
    path = tmp_path / "drum.bin"
    script = (
        "import sys\nfrom minipaged.paging import KVCache\nKVCache(num_layers=1,"
        " num_blocks=2, num_kv_heads=1, head_dim=2, block_size=2, dtype='float32',"
        " device='cpu', num_tier_blocks=1, tier_path=sys.argv[1])\nprint('took it')"
    )

    def other_process():
        return subprocess.run(
            [sys.executable, "-c", script, str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )

    first = tier_cache(path)
    store(first, 5.0)
    refused = other_process()
    assert refused.returncode != 0 and "took it" not in refused.stdout
    assert (
        "ValueError" in refused.stderr and "in use by another process" in refused.stderr
    ), refused.stderr
    np.testing.assert_array_equal(load(first), 5.0)
    first.close()
    taken = other_process()
    assert taken.returncode == 0 and "took it" in taken.stdout, taken.stderr


def test_two_engines_on_one_kv_offload_path(llm, tmp_path):  # noqa: F811
    """The notebook's second engine on the same file is refused; the first keeps serving
    the same greedy tokens from its tier; deleted (or its KV cache closed), it lets a
    new engine have it.
    """
    path = str(tmp_path / "drum.bin")
    options = dict(num_blocks=24, block_size=4, kv_offload_frames=16)
    expected = serve(llm.new_engine(**options))[0]
    first = llm.new_engine(**options, kv_offload_path=path)
    with pytest.raises(ValueError, match=in_use(path)):
        llm.new_engine(**options, kv_offload_path=path)
    assert serve(first)[0] == expected and first.blocks.tier_hits > 0
    del first
    second = llm.new_engine(**options, kv_offload_path=path)
    second.kv.close()
    third = llm.new_engine(**options, kv_offload_path=path)
    assert serve(third)[0] == expected and third.blocks.tier_hits > 0
    third.kv.close()


# ---- 2. a kv_offload_path that cannot hold a tier ------------------------------------


def bad_paths(tmp_path) -> dict[str, tuple[str, str]]:
    """name -> (path, what the message says)."""
    (tmp_path / "a-file").write_text("x")
    return {
        "device": ("/dev/null", "is not a regular file"),
        "missing folder": (str(tmp_path / "missing" / "drum.bin"), "does not exist"),
        "a folder": (str(tmp_path), "is a folder"),
        "under a file": (str(tmp_path / "a-file" / "drum.bin"), "cannot be used"),
        "empty": ("", "kv_offload_path is empty"),
    }


@pytest.mark.parametrize(
    "name", ["device", "missing folder", "a folder", "under a file", "empty"]
)
def test_a_kv_offload_path_that_is_no_regular_file_in_a_folder_is_refused_clearly(
    tmp_path, name
):
    path, says = bad_paths(tmp_path)[name]
    if name == "device" and not os.path.exists(path):
        pytest.skip("no /dev/null here")
    with pytest.raises(ValueError) as error:
        tier_cache(path)
    message = str(error.value)
    assert "kv_offload_path" in message and says in message and path in message, message
    assert (
        name in ("missing folder", "a folder")
        or "regular file path in a writable folder" in message
    ), message


def test_an_unwritable_kv_offload_path_is_refused_clearly(tmp_path, monkeypatch):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        # root (or Windows) writes there anyway: fail as it would
        if os.access(folder, os.W_OK):

            def refuse(*args, **kwargs):
                raise PermissionError(13, "Permission denied")

            monkeypatch.setattr(os, "open", refuse)
        with pytest.raises(ValueError) as error:
            tier_cache(folder / "drum.bin")
    finally:
        monkeypatch.undo()
        folder.chmod(0o700)
    message = str(error.value)
    assert (
        f"kv_offload_path={str(folder / 'drum.bin')!r} cannot be opened for writing"
        in message
    ), message
    assert (
        "Permission denied" in message
        and "regular file path in a writable folder" in message
    )


def test_the_engine_refuses_dev_null_naming_the_option(llm):  # noqa: F811
    if not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null here")
    with pytest.raises(
        ValueError, match=re.escape("kv_offload_path='/dev/null' is not a regular file")
    ):
        llm.new_engine(
            num_blocks=24,
            block_size=4,
            kv_offload_frames=8,
            kv_offload_path="/dev/null",
        )


# ---- 3. bench --svg FILE in a folder that does not exist -----------------------------


def svg_benchmarks() -> list[str]:
    parser = bench_cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "name").choices
    return sorted(
        name for name, p in sub.items() if any(a.dest == "svg" for a in p._actions)
    )


def test_every_benchmark_with_svg_is_found():
    assert {"fragmentation", "latency", "scheduling", "thrashing"} <= set(
        svg_benchmarks()
    )


@pytest.mark.parametrize("name", svg_benchmarks())
@pytest.mark.parametrize("where", ["missing folder", "a folder"])
def test_an_svg_path_that_cannot_be_written_is_refused_before_any_work(
    tmp_path, monkeypatch, capsys, name, where
):
    def work(args):
        raise AssertionError("the benchmark ran before its --svg path was checked")

    monkeypatch.setitem(bench_cli.COMMANDS, name, (work, *bench_cli.COMMANDS[name][1:]))
    path = (
        str(tmp_path / "missing-folder" / "fig.svg")
        if where == "missing folder"
        else str(tmp_path)
    )
    with pytest.raises(SystemExit) as stop:
        bench_cli.main([name, "--svg", path])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"python -m minipaged.bench {name}: error: argument --svg: "
    )
    assert (
        repr(path) in err
        and ("does not exist" if where == "missing folder" else "is a folder") in err
    ), err


def test_bench_fragmentation_svg_in_a_missing_folder_end_to_end(tmp_path):
    path = tmp_path / "missing-folder" / "fig.svg"
    run = subprocess.run(
        [sys.executable, "-m", "minipaged.bench", "fragmentation", "--svg", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr and run.stdout == ""
    assert (
        run.stderr.strip()
        == "python -m minipaged.bench fragmentation: error: argument --svg: the folder "
        f"{str(path.parent)!r} does not exist (for {str(path)!r}); make it first or "
        "give a path in an existing folder"
    )
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "minipaged.bench",
            "fragmentation",
            "--requests",
            "20",
            "--json",
            "--svg",
            str(tmp_path / "fig.svg"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "fig.svg").read_text().startswith("<svg")
