"""The NumPy reference against a dense float64 oracle over unpaged K/V, and the cache
writes.

The batches come from minipaged.attention.testing: frames in random order, frames shared
by two sequences, -1 padding, and NaN in every slot that no sequence owns."""

import numpy as np
import pytest

from minipaged.attention import get_attention, reference
from minipaged.attention.testing import dense_attention, edge_context_lens, random_batch


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("q_per_kv", [1, 3, 8])
def test_decode_equals_dense_attention(seed, q_per_kv):
    rng = np.random.default_rng(seed)
    block_size = int(rng.choice([8, 16, 32]))
    batch = random_batch(
        rng,
        edge_context_lens(rng, block_size),
        num_kv_heads=2,
        q_per_kv=q_per_kv,
        head_dim=64,
        block_size=block_size,
    )
    out = reference.decode(*batch.args())
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, dense_attention(batch), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_prefill_equals_dense_attention(seed):
    """Whole prompts, prompts after a prefix-cache hit, chunks: the queries are the last
    query_len of context_len tokens."""
    rng = np.random.default_rng(seed)
    block_size = int(rng.choice([8, 16, 32]))
    context_lens = [1, block_size + 1, 3 * block_size + 2, 45]
    query_lens = [1, block_size + 1, block_size + 2, 7]
    batch = random_batch(
        rng,
        context_lens,
        query_lens,
        num_kv_heads=2,
        q_per_kv=3,
        head_dim=128,
        block_size=block_size,
    )
    out = reference.prefill(*batch.args(prefill=True))
    np.testing.assert_allclose(out, dense_attention(batch), atol=1e-5, rtol=1e-5)


def test_decode_in_fp16_computes_in_fp32_and_returns_fp16():
    rng = np.random.default_rng(0)
    batch = random_batch(
        rng,
        [3, 40],
        num_kv_heads=1,
        q_per_kv=3,
        head_dim=64,
        block_size=16,
        dtype=np.float16,
    )
    out = reference.decode(*batch.args())
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, dense_attention(batch), atol=2e-3, rtol=2e-3)


def test_write_kv_puts_each_token_in_its_slot_and_skips_padding():
    rng = np.random.default_rng(0)
    k_cache, v_cache = np.zeros((2, 6, 4, 2, 8), np.float32)  # 6 frames of 4 slots
    k, v = rng.standard_normal((2, 3, 2, 8)).astype(np.float32)  # 3 new tokens
    reference.write_kv(k, v, k_cache, v_cache, np.array([9, -1, 20], np.int32))
    np.testing.assert_array_equal(k_cache[2, 1], k[0])  # slot 9 = frame 2, offset 1
    np.testing.assert_array_equal(v_cache[5, 0], v[2])  # slot 20 = frame 5, offset 0
    assert np.count_nonzero(k_cache) == np.count_nonzero(k[[0, 2]])


def test_copy_blocks_copies_src_frames_over_dst_frames():
    rng = np.random.default_rng(0)
    k_cache, v_cache = rng.standard_normal((2, 5, 4, 2, 8)).astype(np.float32)
    before_k, before_v = k_cache.copy(), v_cache.copy()
    reference.copy_blocks(k_cache, v_cache, [(0, 3), (2, 4)])
    np.testing.assert_array_equal(k_cache[[3, 4]], before_k[[0, 2]])
    np.testing.assert_array_equal(v_cache[[3, 4]], before_v[[0, 2]])
    np.testing.assert_array_equal(k_cache[:3], before_k[:3])


def test_an_unknown_device_is_refused():
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        get_attention("tpu")
