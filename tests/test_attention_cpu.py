"""The CPU's attention (minipaged/attention/cpu.py) gives the reference's results: its
decode, over exactly each sequence's frames in three passes (logits, one softmax for
the batch, values), against reference.decode on scattered frames, grouped-query
shapes, empty contexts, sequences whose logits lie far apart, 8-bit caches and a codec
of the caller's."""

import numpy as np
import pytest

from minipaged.attention import codecs, cpu, get_attention, reference


def scattered(rng, num_heads, num_kv_heads, lens, block_size=4, head_dim=8):
    """q and float32 caches whose sequences own shuffled frames, the unused slots NaN
    (what a frame freed by another sequence may hold), and their block tables."""
    frames_of = [-(-n // block_size) for n in lens]
    num_blocks = sum(frames_of) + 3
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = np.full(shape, np.nan, np.float32)
    v_cache = np.full(shape, np.nan, np.float32)
    order = rng.permutation(num_blocks)
    tables = np.full((len(lens), max(frames_of) + 1), -1, np.int32)
    taken = 0
    for i, n in enumerate(lens):
        tables[i, : frames_of[i]] = order[taken : taken + frames_of[i]]
        taken += frames_of[i]
        for p in range(n):
            frame, offset = tables[i, p // block_size], p % block_size
            k_cache[frame, offset] = rng.standard_normal((num_kv_heads, head_dim))
            v_cache[frame, offset] = rng.standard_normal((num_kv_heads, head_dim))
    q = rng.standard_normal((len(lens), num_heads, head_dim)).astype(np.float32)
    return q, k_cache, v_cache, tables, np.array(lens, np.int32)


def slots_of(tables, lens, block_size=4):
    """The slots (frame * block_size + offset) of every sequence's positions, in
    order."""
    return np.array(
        [
            tables[i, p // block_size] * block_size + p % block_size
            for i, n in enumerate(lens)
            for p in range(n)
        ],
        np.int32,
    )


@pytest.mark.parametrize(
    "num_heads, num_kv_heads", [(9, 3), (4, 4), (8, 2), (4, 1)]
)  # SmolLM2-135M's 9/3, no grouping, groups of 4, one KV head
def test_decode_equals_the_reference(num_heads, num_kv_heads):
    rng = np.random.default_rng(num_heads * 10 + num_kv_heads)
    args = scattered(rng, num_heads, num_kv_heads, [1, 7, 4, 13, 30])
    want = reference.decode(*args, 0.3)
    got = cpu.decode(*args, 0.3)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_sequence_with_an_empty_context_gets_zeros_and_the_others_theirs():
    rng = np.random.default_rng(1)
    q, k_cache, v_cache, tables, lens = scattered(rng, 6, 2, [5, 1, 9])
    lens[1] = 0
    got = cpu.decode(q, k_cache, v_cache, tables, lens, 0.5)
    np.testing.assert_array_equal(got[1], 0)
    with np.errstate(invalid="ignore"):  # the reference's empty row: 0 / 0
        want = reference.decode(q, k_cache, v_cache, tables, lens, 0.5)
    np.testing.assert_allclose(got[[0, 2]], want[[0, 2]], rtol=1e-5, atol=1e-6)


def test_empty_contexts_first_between_and_last_leave_the_others_theirs():
    """The batch's one softmax splits its logits at the sequences with a context; the
    empty ones, wherever they sit, take no positions and get zeros."""
    rng = np.random.default_rng(5)
    q, k_cache, v_cache, tables, lens = scattered(rng, 9, 3, [4, 9, 1, 6, 2, 3])
    lens[[0, 2, 3, 5]] = 0
    got = cpu.decode(q, k_cache, v_cache, tables, lens, 0.5)
    np.testing.assert_array_equal(got[[0, 2, 3, 5]], 0)
    with np.errstate(invalid="ignore"):
        want = reference.decode(q, k_cache, v_cache, tables, lens, 0.5)
    np.testing.assert_allclose(got[[1, 4]], want[[1, 4]], rtol=1e-5, atol=1e-6)
    none = np.zeros_like(lens)
    np.testing.assert_array_equal(cpu.decode(q, k_cache, v_cache, tables, none, 0.5), 0)


def test_each_sequence_subtracts_its_own_largest_logit():
    """Logits of one sequence in the hundreds beside another's near zero: a maximum
    shared by the batch would turn the second's exponentials to 0 / 0."""
    rng = np.random.default_rng(6)
    q, k_cache, v_cache, tables, lens = scattered(rng, 9, 3, [12, 5, 20])
    q[0] *= 60.0
    got = cpu.decode(q, k_cache, v_cache, tables, lens, 1.0)
    want = reference.decode(q, k_cache, v_cache, tables, lens, 1.0)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_float16_queries_and_caches_come_back_float16():
    rng = np.random.default_rng(2)
    q, k_cache, v_cache, tables, lens = scattered(rng, 4, 2, [3, 11])
    half = [a.astype(np.float16) for a in (q, k_cache, v_cache)]
    got = cpu.decode(half[0], half[1], half[2], tables, lens, 0.25)
    want = reference.decode(half[0], half[1], half[2], tables, lens, 0.25)
    assert got.dtype == np.float16
    np.testing.assert_allclose(
        got.astype(np.float32), want.astype(np.float32), atol=2e-3
    )


def coded(k_full, v_full, tables, lens, dtype):
    """8-bit caches of `dtype` holding the sequences' K and V as the built-in codec
    codes them: (k_cache, v_cache, k_scales, v_scales)."""
    kvh, head_dim = k_full.shape[2:]
    slots = slots_of(tables, lens)
    caches = []
    for full in (k_full, v_full):
        cache = np.zeros(full.shape, dtype)
        scales = np.zeros(full.shape[:3], np.float16)
        reference.write_coded(
            full.reshape(-1, kvh, head_dim)[slots], cache, scales, slots
        )
        caches.append((cache, scales))
    (k_cache, k_scales), (v_cache, v_scales) = caches
    return k_cache, v_cache, k_scales, v_scales


@pytest.mark.parametrize("code", ["int8", "fp8"])
def test_8bit_caches_decode_as_the_reference_does(code):
    rng = np.random.default_rng(3)
    q, k_full, v_full, tables, lens = scattered(rng, 9, 3, [6, 17, 2])
    k_cache, v_cache, k_scales, v_scales = coded(
        k_full, v_full, tables, lens, codecs.CODECS[code].dtype
    )
    scales = dict(k_scales=k_scales, v_scales=v_scales)
    want = reference.decode(q, k_cache, v_cache, tables, lens, 0.3, **scales)
    got = cpu.decode(q, k_cache, v_cache, tables, lens, 0.3, **scales)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # the codes were read, not the full-precision values: near them, not equal
    full = reference.decode(q, k_full, v_full, tables, lens, 0.3)
    assert 0 < np.abs(got - full).max() < 0.1


def test_a_callers_codec_is_used_to_decode():
    """A codec passed in (a KVCache's own) decodes the codes, not the dtype's."""

    class Halved(codecs.Int8):
        def decode(self, codes, scale):
            return super().decode(codes, scale) / 2

    rng = np.random.default_rng(4)
    q, k_full, v_full, tables, lens = scattered(rng, 4, 2, [5, 8])
    caches = coded(k_full, v_full, tables, lens, np.int8)
    args = (q, *caches[:2], tables, lens, 0.3, *caches[2:])
    plain = cpu.decode(*args)
    halved = cpu.decode(*args, codec=Halved())
    np.testing.assert_allclose(
        halved, reference.decode(*args, codec=Halved()), rtol=1e-5, atol=1e-6
    )
    assert np.abs(halved - plain).max() > 1e-3


def prefill_args(rng, num_heads, num_kv_heads, lens, queries, dtype=np.float32):
    """Caches as `scattered` makes them, and a step's queries: the last queries[i]
    positions of sequence i (one: a decode row; all: a whole prompt; between: a prompt
    after its cached prefix)."""
    _, k_cache, v_cache, tables, lens = scattered(rng, num_heads, num_kv_heads, lens)
    head_dim = k_cache.shape[3]
    q = rng.standard_normal((sum(queries), num_heads, head_dim)).astype(dtype)
    starts = np.concatenate([[0], np.cumsum(queries)]).astype(np.int32)
    return q, k_cache.astype(dtype), v_cache.astype(dtype), tables, lens, starts


@pytest.mark.parametrize("block", [4, 128])  # blocks of 4 queries cross many blocks
@pytest.mark.parametrize("num_heads, num_kv_heads", [(9, 3), (4, 4), (8, 2)])
def test_prefill_equals_the_reference(monkeypatch, block, num_heads, num_kv_heads):
    """Whole prompts, a prompt after a cached prefix, and decode rows in one step."""
    monkeypatch.setattr(cpu, "PREFILL_BLOCK", block)
    rng = np.random.default_rng(num_heads + block)
    args = prefill_args(
        rng, num_heads, num_kv_heads, [13, 1, 30, 9, 7, 22], [13, 1, 11, 1, 7, 1]
    )
    want = reference.prefill(*args, 0.3)
    got = cpu.prefill(*args, 0.3)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_prefill_of_float16_and_8bit_caches_as_the_reference_does():
    rng = np.random.default_rng(8)
    half = prefill_args(rng, 4, 2, [10, 3], [10, 1], np.float16)
    np.testing.assert_allclose(
        cpu.prefill(*half, 0.25).astype(np.float32),
        reference.prefill(*half, 0.25).astype(np.float32),
        atol=2e-3,
    )
    q, k_full, v_full, tables, lens, starts = prefill_args(
        rng, 9, 3, [6, 17, 2], [6, 5, 1]
    )
    k_cache, v_cache, k_scales, v_scales = coded(k_full, v_full, tables, lens, np.int8)
    scales = dict(k_scales=k_scales, v_scales=v_scales)
    args = (q, k_cache, v_cache, tables, lens, starts, 0.3)
    np.testing.assert_allclose(
        cpu.prefill(*args, **scales),
        reference.prefill(*args, **scales),
        rtol=1e-5,
        atol=1e-6,
    )


def test_the_cpu_gets_this_module_with_the_references_copy_blocks():
    assert get_attention("cpu") is cpu
    assert cpu.copy_blocks is reference.copy_blocks
    for name in ("decode", "prefill", "write_kv"):
        assert getattr(cpu, name) is not getattr(reference, name)


@pytest.mark.parametrize(
    "slots",
    [[9, 3, 20], [9, -1, 20], [-1, -1, -1], [], [23]],
    ids=["all kept", "one skipped", "none kept", "no tokens", "the last slot"],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_write_kv_fills_the_cache_as_the_reference_does(slots, dtype):
    """Every slot kept (a decode step: the CPU's shorter way), some skipped (-1), none,
    and an 8-bit cache with its scales: the same caches as reference.write_kv's."""
    rng = np.random.default_rng(0)
    k, v = rng.standard_normal((2, len(slots), 2, 8)).astype(np.float32)
    caches = []
    for write_kv in (cpu.write_kv, reference.write_kv):
        k_cache, v_cache = np.zeros((2, 6, 4, 2, 8), dtype)  # 6 frames of 4 slots
        scales = {}
        if dtype == np.int8:
            k_scales, v_scales = np.zeros((2, 6, 4, 2), np.float16)
            scales = dict(k_scales=k_scales, v_scales=v_scales)
        write_kv(k, v, k_cache, v_cache, np.array(slots, np.int32), **scales)
        caches.append((k_cache, v_cache, *scales.values()))
    for got, want in zip(*caches):
        np.testing.assert_array_equal(got, want)
    assert np.count_nonzero(caches[0][0]) == np.count_nonzero(
        k[[i for i, slot in enumerate(slots) if slot >= 0]]
    )
