"""The kernels on a real GPU (minipaged.attention.cuda) against the NumPy reference: every
decode version on many shapes, prefill, write_kv, copy_blocks. Skipped without a CUDA device;
scripts/gpu_check.sh runs them on a GPU machine."""

import numpy as np
import pytest

from minipaged.attention import kernels, reference
from minipaged.attention.testing import assert_matches, edge_context_lens, random_batch
from minipaged.backend import cuda_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device and CuPy")]

# (block_size, q_per_kv, head_dim, dtype): as in the emulated tests, with SmolLM2's (16, 3, 64,
# fp16) and Llama 3 8B's (16, 4, 128, fp16) shapes, and GQA groups from 1 to 8
CASES = [(8, 1, 64, np.float32), (16, 3, 64, np.float32), (32, 8, 128, np.float32),
         (16, 4, 128, np.float32), (16, 3, 64, np.float16), (16, 4, 128, np.float16),
         (32, 2, 64, np.float16), (8, 5, 128, np.float16), (16, 6, 64, np.float16),
         (32, 7, 128, np.float16)]


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
    batch = random_batch(rng, edge_context_lens(rng, block_size, long=80), num_kv_heads=2,
                         q_per_kv=q_per_kv, head_dim=head_dim, block_size=block_size, dtype=dtype)
    for partition_size in (kernels.PARTITION_SIZE, 3 * block_size - 5):
        out = cuda.decode(*batch.args(cupy), version=version, partition_size=partition_size)
        assert_matches(out, reference.decode(*batch.args()))


def test_default_version_matches_reference(gpu):
    cupy, cuda = gpu
    rng = np.random.default_rng(0)
    for context_lens in ([3000, 2500], [5, 700] * 40):       # few long ones (v6), many (v5)
        batch = random_batch(rng, context_lens, num_kv_heads=3, q_per_kv=3, head_dim=64,
                             block_size=16, dtype=np.float16)
        assert_matches(cuda.decode(*batch.args(cupy)), reference.decode(*batch.args()))


@pytest.mark.parametrize("case", range(len(CASES)))
def test_prefill_matches_reference(gpu, case):
    """Whole prompts, one-token prompts, prompts after a prefix-cache hit, chunks."""
    cupy, cuda = gpu
    block_size, q_per_kv, head_dim, dtype = CASES[case]
    rng = np.random.default_rng(case)
    context_lens = [300, 1, 3 * block_size + 2, 200, 77]
    query_lens = [300, 1, block_size + 2, 33, 77]
    batch = random_batch(rng, context_lens, query_lens, num_kv_heads=2, q_per_kv=q_per_kv,
                         head_dim=head_dim, block_size=block_size, dtype=dtype)
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
