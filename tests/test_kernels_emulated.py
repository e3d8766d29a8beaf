"""The CUDA kernels themselves, run on the CPU through cuda/emulate/cuda_shim.h, against the
NumPy reference: every decode version, prefill, write_kv and copy_blocks.

Caches hold NaN in every slot no sequence owns and in a frame on either side, so a kernel that
reads past a context or through a -1 entry of a block table fails here."""

import numpy as np
import pytest

from minipaged.attention import emulated, kernels, reference
from minipaged.attention.testing import assert_matches, edge_context_lens, random_batch

# (block_size, q_per_kv, head_dim, dtype): every block size, GQA 1/3/8, both head sizes and
# dtypes; fp16 makes each 16-byte load 8 elements wide, so it changes the lane layout.
CASES = [(8, 1, 64, np.float32), (16, 3, 64, np.float32), (32, 8, 128, np.float32),
         (16, 1, 128, np.float32), (8, 3, 128, np.float32), (32, 3, 64, np.float16),
         (8, 8, 64, np.float16), (16, 3, 128, np.float16)]


def decode_both(batch, **options):
    return emulated.decode(*batch.args(), **options), reference.decode(*batch.args())


@pytest.mark.parametrize("version", kernels.VERSIONS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_decode_matches_reference(version, case):
    block_size, q_per_kv, head_dim, dtype = CASES[case]
    rng = np.random.default_rng(100 * case + version)
    batch = random_batch(rng, edge_context_lens(rng, block_size), num_kv_heads=2,
                         q_per_kv=q_per_kv, head_dim=head_dim, block_size=block_size, dtype=dtype)
    # v6 with partitions that end inside frames, several per sequence
    out, expected = decode_both(batch, version=version, partition_size=2 * block_size - 3)
    assert_matches(out, expected)


@pytest.mark.parametrize("partition_size", [1, 7, 32, kernels.PARTITION_SIZE])
def test_v6_merges_any_number_of_partitions(partition_size):
    rng = np.random.default_rng(partition_size)
    batch = random_batch(rng, [70, 33, 1], num_kv_heads=1, q_per_kv=3, head_dim=64, block_size=16)
    out, expected = decode_both(batch, version=6, partition_size=partition_size)
    assert_matches(out, expected)


def test_default_version_follows_the_rule():
    rng = np.random.default_rng(0)
    batch = random_batch(rng, [1500, 20], num_kv_heads=1, q_per_kv=3, head_dim=64, block_size=32)
    out, expected = decode_both(batch)               # 2 blocks of v5 < 132 SMs, > 2 partitions: v6
    assert_matches(out, expected)


def test_pick_version():
    assert kernels.pick_version(64, 8, 4, 4096, num_sms=132) == 5        # the GPU is full
    assert kernels.pick_version(2, 8, 4, 4096, num_sms=132) == 6         # few sequences, long
    assert kernels.pick_version(2, 8, 4, 512, num_sms=132) == 5          # short: no split
    assert kernels.pick_version(2, 1, 16, 4096, num_sms=132) == 4        # group > 8 heads


@pytest.mark.parametrize("case", range(0, len(CASES), 2))
def test_prefill_matches_reference(case):
    """A whole prompt, a one-token prompt, a prompt after a prefix-cache hit that starts inside
    a frame, and a chunk of a longer prompt whose keys span several shared-memory tiles."""
    block_size, q_per_kv, head_dim, dtype = CASES[case]
    rng = np.random.default_rng(case)
    context_lens = [2 * block_size + 5, 1, 3 * block_size + 2, 75]
    query_lens = [2 * block_size + 5, 1, block_size + 2, 9]
    batch = random_batch(rng, context_lens, query_lens, num_kv_heads=2, q_per_kv=q_per_kv,
                         head_dim=head_dim, block_size=block_size, dtype=dtype, share_prefix=False)
    args = batch.args(prefill=True)
    assert_matches(emulated.prefill(*args), reference.prefill(*args))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_write_kv_matches_reference(dtype):
    rng = np.random.default_rng(0)
    k_cache, v_cache = rng.standard_normal((2, 9, 16, 2, 64)).astype(dtype)
    caches = [(k_cache.copy(), v_cache.copy()) for _ in range(2)]     # one for each side
    k, v = rng.standard_normal((2, 20, 2, 64)).astype(dtype)
    slot_mapping = rng.permutation(9 * 16)[:20].astype(np.int32)
    slot_mapping[[3, 11]] = -1                                          # padding tokens
    emulated.write_kv(k, v, *caches[0], slot_mapping)
    reference.write_kv(k, v, *caches[1], slot_mapping)
    np.testing.assert_array_equal(caches[0], caches[1])
    assert not np.array_equal(caches[0][0], k_cache)                    # something was written


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_copy_blocks_matches_reference(dtype):
    rng = np.random.default_rng(0)
    k_cache, v_cache = rng.standard_normal((2, 9, 8, 3, 128)).astype(dtype)
    caches = [(k_cache.copy(), v_cache.copy()) for _ in range(2)]
    pairs = np.array([(4, 0), (4, 7), (1, 2)], np.int32)                # one src, two copies
    emulated.copy_blocks(*caches[0], pairs)
    reference.copy_blocks(*caches[1], pairs)
    np.testing.assert_array_equal(caches[0], caches[1])
    assert not np.array_equal(caches[0][0], k_cache)


def test_mistakes_are_explained():
    rng = np.random.default_rng(0)
    batch = random_batch(rng, [5], num_kv_heads=1, q_per_kv=16, head_dim=64, block_size=8)
    args = batch.args()
    with pytest.raises(ValueError, match="5 and 6 take up to 8"):
        emulated.decode(*args, version=5)
    with pytest.raises(ValueError, match="q is float16 but the cache is float32"):
        emulated.decode(batch.q.astype(np.float16), *args[1:])
    with pytest.raises(RuntimeError, match="the arguments passed do not match"):
        emulated.LAUNCHER.launch("write_kv<float>", (1,), (128,), (batch.k_cache,))


def test_the_emulator_runs_threads_in_a_shuffled_order_so_a_missing_barrier_shows(tmp_path):
    source = tmp_path / "neighbours.cu"
    source.write_text("""
    template <typename T>
    __global__ void neighbours(T* out, int launch, int barrier) {
        __shared__ T values[64];
        values[threadIdx.x] = 100 * launch + threadIdx.x;
        if (barrier) __syncthreads();
        out[threadIdx.x] = values[(threadIdx.x + 1) % 64];   // a neighbour's value
    }""")
    compiled = emulated.library(source, ("neighbours<float>",))
    for launch, barrier in enumerate((1, 0, 1)):
        out = np.full(64, -1, np.float32)
        emulated.launch_on(compiled, "neighbours<float>", (1,), (64,),
                           (out, np.int32(launch), np.int32(barrier)))
        expected = 100 * launch + (np.arange(64) + 1) % 64
        assert np.array_equal(out, expected) == bool(barrier)


def test_the_emulator_reports_a_shuffle_that_part_of_a_warp_skips(tmp_path):
    source = tmp_path / "divergent.cu"
    source.write_text("""
    template <typename T>
    __global__ void divergent(T* x) {
        if (threadIdx.x < 16) x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 1);
    }""")
    compiled = emulated.library(source, ("divergent<float>",))
    with pytest.raises(RuntimeError, match="deadlock"):
        emulated.launch_on(compiled, "divergent<float>", (1,), (32,), (np.zeros(32, np.float32),))
