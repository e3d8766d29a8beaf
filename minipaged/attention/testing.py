"""Random paged batches and a dense oracle, for the attention tests (CPU and GPU): off
the path of a request, this is what the kernels are checked with. `random_batch` lays
out K/V the way the engine would; `dense_attention` computes the same attention in
float64 with no paging.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backend import cdiv, to_numpy


@dataclass(slots=True)
class AttentionCase:
    q: np.ndarray  # (num_tokens, num_heads, head_dim): decode has one per sequence
    k_cache: np.ndarray  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: np.ndarray
    block_tables: np.ndarray  # int32 (num_seqs, max_blocks), padded with -1
    context_lens: np.ndarray  # int32 (num_seqs,)
    # int32 (num_seqs + 1,): sequence i's queries are rows [i]:[i+1]
    query_start_loc: np.ndarray
    # per sequence (context_len, num_kv_heads, head_dim), unpaged
    keys: list[np.ndarray]
    values: list[np.ndarray]
    scale: float

    def args(self, xp=np, prefill: bool = False) -> tuple:
        """The arguments of decode (or prefill) in the module xp (numpy or cupy); on a
        device the caches keep the poisoned frame on either side."""

        def move(cache):
            return (
                xp.asarray(cache.base)[1:-1]
                if cache.base is not None
                else xp.asarray(cache)
            )

        args = (
            xp.asarray(self.q),
            move(self.k_cache),
            move(self.v_cache),
            xp.asarray(self.block_tables),
            xp.asarray(self.context_lens),
        )
        if prefill:
            return (*args, xp.asarray(self.query_start_loc), self.scale)
        return (*args, self.scale)


def random_batch(
    rng: np.random.Generator,
    context_lens,
    query_lens=None,
    *,
    num_kv_heads: int,
    q_per_kv: int,
    head_dim: int,
    block_size: int,
    dtype=np.float32,
    share_prefix: bool = True,
    poison: bool = True,
    pad_blocks: int = 2,
) -> AttentionCase:
    """A batch of sequences with these context lengths; query_lens None means decode
    (one query each). Frames are taken in a random order; block tables are padded with
    -1. With share_prefix, sequence 1 maps the full blocks it has in common with
    sequence 0 to the same frames (as after fork()), and its K/V there are sequence 0's.
    With `poison`, every slot no sequence owns holds NaN, and so do a frame before and a
    frame after the cache: a kernel that
    reads outside a sequence's tokens, or through a -1 entry, returns NaN."""
    context_lens = [int(n) for n in context_lens]
    query_lens = (
        [1] * len(context_lens) if query_lens is None else [int(n) for n in query_lens]
    )
    kv_shape = (num_kv_heads, head_dim)
    keys = [rng.standard_normal((n, *kv_shape)).astype(dtype) for n in context_lens]
    values = [rng.standard_normal((n, *kv_shape)).astype(dtype) for n in context_lens]
    pages = [cdiv(n, block_size) for n in context_lens]
    shared = (
        min(context_lens[:2]) // block_size
        if share_prefix and len(context_lens) > 1
        else 0
    )
    if shared:  # sequence 1's shared prefix
        for kv in (keys, values):
            kv[1][: shared * block_size] = kv[0][: shared * block_size]

    num_frames = sum(pages) - shared + 3  # a few frames nobody owns
    frame_ids = iter(rng.permutation(num_frames))
    block_tables = np.full(
        (len(context_lens), max(pages, default=0) + pad_blocks), -1, np.int32
    )
    for i, n in enumerate(pages):
        first = shared if i == 1 else 0  # seq 1 starts with seq 0's frames
        block_tables[i, :first] = block_tables[0, :first]
        block_tables[i, first:n] = [next(frame_ids) for _ in range(first, n)]

    fill = np.nan if poison else 0.0
    buffers = [
        np.full((num_frames + 2, block_size, *kv_shape), fill, dtype) for _ in range(2)
    ]
    k_cache, v_cache = (b[1:-1] for b in buffers)  # a poisoned frame on each side
    for i, n in enumerate(context_lens):
        positions = np.arange(n)
        frames = block_tables[i, positions // block_size]
        k_cache[frames, positions % block_size] = keys[i]
        v_cache[frames, positions % block_size] = values[i]

    num_heads = num_kv_heads * q_per_kv
    q = rng.standard_normal((sum(query_lens), num_heads, head_dim)).astype(dtype)
    return AttentionCase(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        context_lens=np.array(context_lens, np.int32),
        query_start_loc=np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32),
        keys=keys,
        values=values,
        scale=1.0 / np.sqrt(head_dim),
    )


def edge_context_lens(
    rng: np.random.Generator, block_size: int, long: int = 7
) -> list[int]:
    """Context lengths around the block edges: 1, block_size - 1, block_size, block_size
    + 1, after two long ones of up to `long` blocks (so that sequences 0 and 1 share
      full frames).
    """
    first, second = rng.integers(4 * block_size, long * block_size, size=2)
    return [int(first), int(second), 1, block_size - 1, block_size, block_size + 1]


def dense_attention(batch: AttentionCase) -> np.ndarray:
    """The oracle: attention in float64 over each sequence's unpaged K/V, one head at a
    time. The query at row r of a sequence with L queries and C tokens sits at position
    C - L + r.
    """
    out = np.empty(batch.q.shape, np.float64)
    num_heads, num_kv_heads = batch.q.shape[1], batch.keys[0].shape[1]
    for i, context_len in enumerate(batch.context_lens):
        start, end = batch.query_start_loc[i], batch.query_start_loc[i + 1]
        for r in range(end - start):
            seen = context_len - (end - start) + r + 1  # it sees positions 0..seen-1
            for h in range(num_heads):
                kv_head = h // (num_heads // num_kv_heads)
                k = batch.keys[i][:seen, kv_head].astype(np.float64)  # (seen, head_dim)
                v = batch.values[i][:seen, kv_head].astype(np.float64)
                logits = k @ batch.q[start + r, h].astype(np.float64) * batch.scale
                p = np.exp(logits - logits.max())
                out[start + r, h] = p @ v / p.sum()
    return out


def assert_matches(out, expected: np.ndarray) -> None:
    """A kernel's output (NumPy or CuPy) equals the reference's: within 1e-5 in fp32; in
    fp16,
    where both round fp32 results to fp16, within about a unit in the last place."""
    out = to_numpy(out)
    assert out.dtype == expected.dtype and np.isfinite(out).all()
    tolerance = 1e-5 if out.dtype == np.float32 else 2e-3
    np.testing.assert_allclose(
        out.astype(np.float32),
        expected.astype(np.float32),
        atol=tolerance,
        rtol=tolerance,
    )
