"""Helper processes that split a CPU's products (minipaged/model/team.py): the same
numbers as one core, the weights back in private memory after them, a helper that dies
or cannot start leaves the products to this process, and a helper whose process is
gone stops too."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from minipaged.model import cpu, team

pytestmark = pytest.mark.skipif(
    team.supported() is not None, reason=str(team.supported())
)


def weights(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [
        cpu.PanelWeight(rng.standard_normal(shape).astype(np.float32))
        for shape in shapes
    ]


@pytest.fixture
def two_cores(monkeypatch):
    """The products split in two whatever the machine's load; the team stopped after."""
    monkeypatch.setattr(cpu._cores, "now", 2)
    monkeypatch.setattr(cpu._cores, "period", float("inf"))
    monkeypatch.delenv("MINIPAGED_CPU_HELPERS", raising=False)
    yield
    cpu.stop_team()


def test_a_team_gives_one_cores_numbers(two_cores):
    """Panels split over a helper give exactly the panels of one core, a last narrow
    panel cut off; a GEMM split by rows the GEMM's numbers; rows past a job's chunk go
    in several jobs."""
    ws = weights((40, 100), (24, 67), (16, 96))
    rng = np.random.default_rng(1)
    alone = {}
    for w in ws:
        for rows in (1, 2, 5, 16, 70):
            x = rng.standard_normal((rows, w.shape[0])).astype(np.float32)
            alone[id(w), rows] = (x, w.by_panels(x, cores=1), x @ w.dense())
    assert cpu.start_team(ws, 1).startswith("1 helper process(es) beside this one")
    assert all(w.shared for w in ws) and cpu.helpers_now() == 1
    for w in ws:
        w.gemm_rows = 16
        for rows in (1, 2, 5, 16, 70):
            x, by_panels, by_gemm = alone[id(w), rows]
            got = x @ w
            assert got.shape == (rows, w.shape[1])
            if rows < 16:
                np.testing.assert_array_equal(got, by_panels)
            else:
                np.testing.assert_allclose(got, by_gemm, rtol=1e-6, atol=1e-5)
    w = ws[0]
    small_chunks = cpu._team.product.__func__
    monkey_chunk = team.CHUNK_ROWS
    try:
        team.CHUNK_ROWS = 7
        x, _, by_gemm = alone[id(w), 70]
        got = small_chunks(cpu._team, w, x, 2, team.GEMM)
        np.testing.assert_allclose(got, by_gemm, rtol=1e-6, atol=1e-5)
    finally:
        team.CHUNK_ROWS = monkey_chunk


def test_stopping_the_team_gives_the_weights_back(two_cores):
    """After stop_team the weights are private copies again, equal to what they were,
    and the products go back to this process alone."""
    ws = weights((40, 100))
    before = ws[0].out_rows.copy()
    cpu.start_team(ws, 1)
    pids = cpu._team.pids()
    cpu.stop_team()
    assert not ws[0].shared and ws[0].out_rows.flags.owndata
    np.testing.assert_array_equal(ws[0].out_rows, before)
    assert cpu.helpers_now() == 0
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)
    x = np.ones((3, 40), np.float32)
    np.testing.assert_array_equal(x @ ws[0], ws[0].by_panels(x, cores=1))


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_helper_that_dies_leaves_the_products_to_us(two_cores):
    """Killed between products: the next product warns, names the helper, and is
    still right; the team is gone and later products run here."""
    ws = weights((40, 100))
    cpu.start_team(ws, 1)
    x = np.ones((4, 40), np.float32)
    expected = ws[0].by_panels(x, cores=1)
    proc = cpu._team.procs[0]
    proc.kill()
    proc.wait()
    with pytest.warns(UserWarning, match=r"helper process 1 \(pid \d+\) exited"):
        got = x @ ws[0]
    np.testing.assert_array_equal(got, expected)
    assert cpu.helpers_now() == 0 and not ws[0].shared
    np.testing.assert_array_equal(x @ ws[0], expected)


def test_no_team_where_it_cannot_run_or_is_switched_off(two_cores, monkeypatch):
    """Switched off, on one core, or on a processor without x86's store order: the
    answer says so and the threads stay."""
    ws = weights((40, 100))
    monkeypatch.setenv("MINIPAGED_CPU_HELPERS", "0")
    assert "MINIPAGED_CPU_HELPERS=0" in cpu.start_team(ws, 1)
    monkeypatch.delenv("MINIPAGED_CPU_HELPERS")
    assert cpu.start_team(ws, 0) == "no helper processes (one core)"
    monkeypatch.setattr(team.platform, "machine", lambda: "arm64")
    assert "x86-64's store order" in cpu.start_team(ws, 1)
    assert cpu.helpers_now() == 0 and not ws[0].shared
    with pytest.raises(ValueError, match="at least one helper"):
        team.Team(ws, 0)


def test_a_helper_stops_when_our_process_is_gone(tmp_path):
    """A process that starts a team and dies without stopping it: its helper sees the
    pipe close once it sleeps, and exits."""
    script = textwrap.dedent(
        """
        import os, numpy as np
        from minipaged.model import cpu
        w = cpu.PanelWeight(np.ones((40, 100), np.float32))
        cpu._cores.now = 2
        cpu.start_team([w], 1)
        np.ones((2, 40), np.float32) @ w
        print(cpu._team.pids()[0], flush=True)
        os._exit(0)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10 * team.SPIN + 5
    while os.path.exists(f"/proc/{pid}") and not _zombie(pid):
        assert time.monotonic() < deadline, f"helper {pid} still runs"
        time.sleep(0.05)


def test_a_model_on_a_team_decodes_the_same_tokens(tiny, two_cores, monkeypatch):
    """Model.use_cores starts the team on every projection weight; greedy tokens of a
    few streams are the same as without it."""
    from minipaged import LLM, SamplingParams

    monkeypatch.setenv("MINIPAGED_CPU_PANELS", "1")  # panels whatever this BLAS
    llm = LLM(str(tiny()), device="cpu")
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11]]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    def tokens():
        outputs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False
        )
        return [o.outputs[0].token_ids for o in outputs]

    alone = tokens()
    threads, how = llm.use_cores(2)
    assert how.startswith("1 helper process(es) beside this one")
    assert all(w.shared for w in llm.model.projection_weights())
    assert isinstance(llm.engine.runner.attention.impl, cpu.SplitAttention)
    assert cpu._team.holds(llm.engine.kv.k[0])
    cpu._cores.now = 2
    assert tokens() == alone


def paged_cache(num_seqs=5, blocks=40, block_size=4, kvh=2, head_dim=8, seed=0):
    """A float32 KV cache of 3 layers (a KVCache's `data`), scattered block tables
    and context lengths of 1 to 30 positions, one of them empty."""
    from types import SimpleNamespace

    rng = np.random.default_rng(seed)
    data = rng.standard_normal((2, 3, blocks, block_size, kvh, head_dim))
    kv = SimpleNamespace(data=data.astype(np.float32))
    lens = np.array([30, 1, 0, 17, 9][:num_seqs])
    tables = rng.permutation(blocks)[: num_seqs * 8].reshape(num_seqs, 8)
    q = rng.standard_normal((num_seqs, 2 * kvh, head_dim)).astype(np.float32)
    return kv, q, tables, lens


def test_a_team_attends_a_decode_step_as_one_core_does(two_cores):
    """The KV cache moves into the shared memory; a decode step split between us and a
    helper, each about half the positions, gives exactly the CPU decode's numbers; a
    cache outside that memory is declined (None); stopping gives the cache back."""
    from minipaged.attention import cpu as attention

    kv, q, tables, lens = paged_cache()
    before = kv.data.copy()
    ws = weights((40, 100))
    how = cpu.start_team(ws, 1, kv, "minipaged.attention.cpu")
    assert how.startswith("1 helper process(es) beside this one")
    assert not kv.data.flags.owndata
    np.testing.assert_array_equal(kv.data, before)
    for layer in range(3):
        k_cache, v_cache = kv.data[0, layer], kv.data[1, layer]
        alone = attention.decode(q, k_cache, v_cache, tables, lens, 0.3)
        split = cpu._team.attend(
            q, k_cache, v_cache, tables, lens, 0.3, 2, attention.decode, None
        )
        np.testing.assert_array_equal(split, alone)
    assert (
        cpu._team.attend(
            q, before[0, 0], before[1, 0], tables, lens, 0.3, 2, attention.decode, None
        )
        is None
    )
    split = cpu.SplitAttention(attention)
    np.testing.assert_array_equal(
        split.decode(q, kv.data[0, 1], kv.data[1, 1], tables, lens, 0.3),
        attention.decode(q, kv.data[0, 1], kv.data[1, 1], tables, lens, 0.3),
    )
    assert cpu.helpers_now() == 1  # the helper took its share, nothing fell back
    cpu.stop_team()
    assert kv.data.flags.owndata
    np.testing.assert_array_equal(kv.data, before)


def test_a_team_attends_a_step_with_prompts_as_one_core_does(two_cores):
    """A step of prompts (their last 12, 3 and 9 positions) and decodes (one each),
    split between us and a helper by queries times positions: exactly the CPU
    prefill's numbers, whichever sequence the cut falls after."""
    from minipaged.attention import cpu as attention

    kv, _, tables, lens = paged_cache()
    queries = np.array([12, 1, 0, 3, 9])
    starts = np.concatenate([[0], np.cumsum(queries)])
    q = np.random.default_rng(2).standard_normal((starts[-1], 4, 8)).astype(np.float32)
    cpu.start_team(weights((40, 100)), 1, kv, "minipaged.attention.cpu")
    split = cpu.SplitAttention(attention)
    for layer in range(3):
        k_cache, v_cache = kv.data[0, layer], kv.data[1, layer]
        alone = attention.prefill(q, k_cache, v_cache, tables, lens, starts, 0.3)
        got = split.prefill(q, k_cache, v_cache, tables, lens, starts, 0.3)
        np.testing.assert_array_equal(got, alone)
        # the cut after each sequence in turn: a helper's share at every offset
        for cut in range(1, 5):
            rows, ours, *call = team.share(q, tables, lens, starts, cut, 5, False)
            assert rows == slice(starts[cut], starts[5])
            theirs = attention.prefill(ours, k_cache, v_cache, *call, 0.3)
            np.testing.assert_array_equal(theirs, alone[rows])
    assert cpu.helpers_now() == 1  # the helper took its share, nothing fell back


def test_a_helper_that_dies_leaves_the_attention_to_us(two_cores):
    """Killed before a decode step: SplitAttention warns, and attends here."""
    from minipaged.attention import cpu as attention

    kv, q, tables, lens = paged_cache()
    cpu.start_team(weights((40, 100)), 1, kv, "minipaged.attention.cpu")
    expected = attention.decode(q, kv.data[0, 2], kv.data[1, 2], tables, lens, 0.3)
    proc = cpu._team.procs[0]
    proc.kill()
    proc.wait()
    with pytest.warns(UserWarning, match="attention goes on here"):
        got = cpu.SplitAttention(attention).decode(
            q, kv.data[0, 2], kv.data[1, 2], tables, lens, 0.3
        )
    np.testing.assert_array_equal(got, expected)
    assert cpu.helpers_now() == 0 and kv.data.flags.owndata


def test_a_fresh_caches_zero_frames_stay_unwritten():
    """copy_written copies the frames that hold something and skips the zero ones (the
    target is fresh shared memory, zeros already): the copy equals the source."""
    source = np.zeros((2, 3, 600, 4, 2, 8), np.float32)  # (K/V, layers, frames, ...)
    source[0, 1, 5] = 1.5
    source[1, 2, 599, 3] = -2.0
    source[1, 0, 300:302] = 7.0
    target = np.zeros_like(source)
    team.copy_written(source, target, rows=256)
    np.testing.assert_array_equal(target, source)


def test_with_helpers_one_row_is_split_as_panels_are():
    """BLAS's own threads would compete with a spinning helper: with a team, one row
    is split by columns as panels are (each core's range by the matrix-vector code,
    team.multiply), and many rows take the GEMM, as without."""
    assert cpu.projection_path(1) == "matrix-vector"
    assert [cpu.projection_path(n, 24, team=True) for n in (1, 2, 23, 24)] == [
        "panels",
        "panels",
        "panels",
        "gemm",
    ]


def _mapped(address: int) -> bool:
    """Does this process map `address` now (/proc/self/maps)?"""
    for line in open("/proc/self/maps"):
        start, end = (int(part, 16) for part in line.split()[0].split("-"))
        if start <= address < end:
            return True
    return False


def _pmd_mapped_kb() -> int:
    """Shared memory this process maps in 2 MB pages, in kB
    (/proc/self/smaps_rollup)."""
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("ShmemPmdMapped:"):
            return int(line.split()[1])
    return 0


def test_the_shared_memory_is_shared_on_a_2mb_boundary_and_unmapped_after_use():
    """map_shared's memory starts at a 2 MB boundary, a second mapping of the file (as a
    helper's) sees what the first wrote, and the mapping goes when the last array on it
    does."""
    import gc

    size = 8 << 20
    fd = os.memfd_create("test-map-shared")
    try:
        os.ftruncate(fd, size)
        memory, other = team.map_shared(fd, size), team.map_shared(fd, size)
        ours, theirs = np.frombuffer(memory, np.uint8), np.frombuffer(other, np.uint8)
        assert ours.ctypes.data % team.HUGE_PAGE == 0
        assert ours.ctypes.data != theirs.ctypes.data
        ours[12345] = 7
        ours[-1] = 9
        assert theirs[12345] == 7 and theirs[-1] == 9
        address = ours.ctypes.data
        view = ours[100:200]  # an array on the memory keeps it mapped
        del memory, ours
        gc.collect()
        assert _mapped(address) and view[0] == 0
        del view
        gc.collect()
        assert not _mapped(address)
    finally:
        os.close(fd)


def test_huge_pages_keep_what_is_written_and_say_whether_they_took():
    """huge_pages leaves the range zeros, readable and writable through every mapping;
    where it says it took, the range is mapped in 2 MB pages."""
    size = 8 << 20
    fd = os.memfd_create("test-huge-pages")
    try:
        os.ftruncate(fd, size)
        memory = team.map_shared(fd, size)
        before = _pmd_mapped_kb()
        took = team.huge_pages(memory, 4096, size)
        pages = np.frombuffer(memory, np.uint8)
        assert not pages.any()
        pages[:] = np.arange(size) % 251
        other = np.frombuffer(team.map_shared(fd, size), np.uint8)
        np.testing.assert_array_equal(other, np.arange(size) % 251)
        if took:
            # 4096: 2 MB pages from the first boundary after it (6 MB of the 8)
            assert _pmd_mapped_kb() - before >= 6 << 10
    finally:
        os.close(fd)


def test_huge_pages_say_no_for_a_mapping_off_a_2mb_boundary():
    """A mapping that does not start at a 2 MB boundary cannot be mapped in 2 MB pages:
    huge_pages says so, and the memory stays as it was."""
    import mmap

    size = 6 << 20
    fd = os.memfd_create("test-huge-pages-off")
    try:
        os.ftruncate(fd, size)
        memory = mmap.mmap(fd, size)
        at = np.frombuffer(memory, np.uint8, 1).ctypes.data
        if at % team.HUGE_PAGE == 0:
            pytest.skip("this mapping happened to start at a 2 MB boundary")
        assert team.huge_pages(memory, 0, size) is False
        assert not np.frombuffer(memory, np.uint8).any()
    finally:
        os.close(fd)
