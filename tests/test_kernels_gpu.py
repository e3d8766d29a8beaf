"""The kernels on a real GPU (minipaged.attention.cuda) against the NumPy reference:
every decode version on many shapes, prefill, write_kv, copy_blocks, and over an 8-bit
cache (kv_cache_dtype "int8") write_kv_int8, paged_prefill_int8, decode v7 and
copy_blocks of codes.
Skipped without a CUDA device; scripts/gpu_check.sh runs them on a GPU machine."""

import numpy as np
import pytest

# the 8-bit cases of the CPU emulation
from test_kernels_emulated import (
    coded_cache,
    rows_to_code,
)

from minipaged.attention import kernels, reference
from minipaged.attention.testing import assert_matches, edge_context_lens, random_batch
from minipaged.backend import cuda_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device and CuPy"),
]

# (block_size, q_per_kv, head_dim, dtype): as in the emulated tests, with SmolLM2's (16,
# 3, 64, fp16) and Llama 3 8B's (16, 4, 128, fp16) shapes, and GQA groups from 1 to 8
CASES = [
    (8, 1, 64, np.float32),
    (16, 3, 64, np.float32),
    (32, 8, 128, np.float32),
    (16, 4, 128, np.float32),
    (16, 3, 64, np.float16),
    (16, 4, 128, np.float16),
    (32, 2, 64, np.float16),
    (8, 5, 128, np.float16),
    (16, 6, 64, np.float16),
    (32, 7, 128, np.float16),
]


@pytest.fixture(scope="module")
def gpu():
    import cupy

    from minipaged.attention import cuda

    return cupy, cuda


@pytest.mark.parametrize("version", kernels.VERSIONS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_decode_matches_reference(gpu, version, case):
    cupy, cuda = gpu
    block_size, q_per_kv, head_dim, dtype = CASES[case]
    rng = np.random.default_rng(100 * case + version)
    batch = random_batch(
        rng,
        edge_context_lens(rng, block_size, long=80),
        num_kv_heads=2,
        q_per_kv=q_per_kv,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
    )
    for partition_size in (kernels.PARTITION_SIZE, 3 * block_size - 5):
        out = cuda.decode(
            *batch.args(cupy), version=version, partition_size=partition_size
        )
        assert_matches(out, reference.decode(*batch.args()))


def test_default_version_matches_reference(gpu):
    cupy, cuda = gpu
    rng = np.random.default_rng(0)
    for context_lens in ([3000, 2500], [5, 700] * 40):  # few long ones (v6), many (v5)
        batch = random_batch(
            rng,
            context_lens,
            num_kv_heads=3,
            q_per_kv=3,
            head_dim=64,
            block_size=16,
            dtype=np.float16,
        )
        assert_matches(cuda.decode(*batch.args(cupy)), reference.decode(*batch.args()))


@pytest.mark.parametrize("case", range(len(CASES)))
def test_prefill_matches_reference(gpu, case):
    """Whole prompts, one-token prompts, prompts after a prefix-cache hit, chunks."""
    cupy, cuda = gpu
    block_size, q_per_kv, head_dim, dtype = CASES[case]
    rng = np.random.default_rng(case)
    context_lens = [300, 1, 3 * block_size + 2, 200, 77]
    query_lens = [300, 1, block_size + 2, 33, 77]
    batch = random_batch(
        rng,
        context_lens,
        query_lens,
        num_kv_heads=2,
        q_per_kv=q_per_kv,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
    )
    out = cuda.prefill(*batch.args(cupy, prefill=True))
    assert_matches(out, reference.prefill(*batch.args(prefill=True)))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_cache_ops_match_reference(gpu, dtype):
    cupy, cuda = gpu
    rng = np.random.default_rng(0)
    k_cache, v_cache = rng.standard_normal((2, 40, 16, 3, 64)).astype(dtype)
    k, v = rng.standard_normal((2, 50, 3, 64)).astype(dtype)
    slot_mapping = rng.permutation(40 * 16)[:50].astype(np.int32)
    slot_mapping[::7] = -1
    pairs = np.array([(3, 0), (3, 9), (17, 5)], np.int32)
    on_gpu = cupy.asarray(k_cache), cupy.asarray(v_cache)
    cuda.write_kv(cupy.asarray(k), cupy.asarray(v), *on_gpu, cupy.asarray(slot_mapping))
    cuda.copy_blocks(*on_gpu, cupy.asarray(pairs))
    reference.write_kv(k, v, k_cache, v_cache, slot_mapping)
    reference.copy_blocks(k_cache, v_cache, pairs)
    np.testing.assert_array_equal(on_gpu[0].get(), k_cache)
    np.testing.assert_array_equal(on_gpu[1].get(), v_cache)


# ---- an 8-bit cache: the kernels through cuda.LAUNCHER, which takes the scales and the
# codec ----


@pytest.mark.parametrize(
    "dtype, head_dim, num_kv_heads",
    [(np.float32, 64, 3), (np.float16, 128, 8), (np.float16, 64, 1)],
)
def test_write_kv_int8_codes_as_the_reference_bit_for_bit(
    gpu, dtype, head_dim, num_kv_heads
):
    """On the GPU too (IEEE division, -ftz, rintf): the very codes and scales of
    write_coded."""
    cupy, cuda = gpu
    rng = np.random.default_rng(head_dim)
    k, v = (rows_to_code(rng, 300, num_kv_heads, head_dim, dtype) for _ in range(2))
    shape = (40, 16, num_kv_heads, head_dim)
    slot_mapping = rng.permutation(40 * 16)[:300].astype(np.int32)
    slot_mapping[5::11] = -1
    codes = [np.full(shape, 99, np.int8) for _ in range(2)]
    scales = [np.full(shape[:3], np.nan, np.float16) for _ in range(2)]
    on_gpu = [cupy.asarray(a) for a in (*codes, *scales)]
    cuda.LAUNCHER.write_kv(
        cupy.asarray(k),
        cupy.asarray(v),
        *on_gpu[:2],
        cupy.asarray(slot_mapping),
        *on_gpu[2:],
        codec="int8",
    )
    reference.write_kv(k, v, *codes, slot_mapping, *scales)
    for gpu_array, expected in zip(on_gpu, (*codes, *scales)):
        np.testing.assert_array_equal(gpu_array.get(), expected)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_prefill_int8_and_decode_v7_match_the_8bit_reference(gpu, case):
    """The prefill cases over an int8 cache, then v7 on each sequence's last query."""
    cupy, cuda = gpu
    block_size, q_per_kv, head_dim, dtype = CASES[case]
    rng = np.random.default_rng(case)
    context_lens = [300, 1, 3 * block_size + 2, 200, 77]
    query_lens = [300, 1, block_size + 2, 33, 77]
    batch = random_batch(
        rng,
        context_lens,
        query_lens,
        num_kv_heads=2,
        q_per_kv=q_per_kv,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
    )
    codes, scales = coded_cache(batch)
    tables = (batch.block_tables, batch.context_lens)
    on_gpu = {name: cupy.asarray(a) for name, a in scales.items()}
    out = cuda.LAUNCHER.prefill(
        *(cupy.asarray(a) for a in (batch.q, *codes, *tables, batch.query_start_loc)),
        batch.scale,
        **on_gpu,
    )
    assert_matches(
        out,
        reference.prefill(
            batch.q, *codes, *tables, batch.query_start_loc, batch.scale, **scales
        ),
    )
    last = batch.query_start_loc[1:] - 1  # each sequence's last query
    out = cuda.LAUNCHER.decode(
        *(cupy.asarray(a) for a in (batch.q[last], *codes, *tables)),
        batch.scale,
        **on_gpu,
        codec="int8",
    )
    assert_matches(
        out, reference.decode(batch.q[last], *codes, *tables, batch.scale, **scales)
    )


def test_copy_blocks_copies_int8_codes(gpu):
    """Copy-on-write in an 8-bit cache: copy_blocks<signed char> copies the codes as
    bytes."""
    cupy, cuda = gpu
    rng = np.random.default_rng(0)
    codes = rng.integers(-127, 128, (2, 12, 16, 3, 64)).astype(np.int8)
    on_gpu = cupy.asarray(codes[0]), cupy.asarray(codes[1])
    pairs = np.array([(3, 0), (3, 9), (7, 5)], np.int32)
    cuda.LAUNCHER.copy_blocks(*on_gpu, cupy.asarray(pairs))
    reference.copy_blocks(codes[0], codes[1], pairs)
    np.testing.assert_array_equal(on_gpu[0].get(), codes[0])
    np.testing.assert_array_equal(on_gpu[1].get(), codes[1])
