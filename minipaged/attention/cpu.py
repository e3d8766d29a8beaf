"""Paged attention shaped for a CPU, what `get_attention("cpu")` returns: the
reference's contract and results (tests/test_attention_cpu.py holds them equal), with a
decode that attends one sequence at a time over exactly its own frames. prefill,
write_kv and copy_blocks are the reference's.
"""

from __future__ import annotations

import numpy as np

from minipaged.attention.reference import copy_blocks, gather, prefill, write_kv
from minipaged.backend import cdiv

__all__ = ["copy_blocks", "decode", "prefill", "write_kv"]

# Why decode is not the reference's on a CPU (measured in
# bench/results/2026-12-05-cpu-2core-attention/): the reference gathers every
# sequence's K and V into one array as long as the longest context, then multiplies
# `group` query rows by each KV head's keys, one small product per (sequence, KV head).
# At 16 sequences of 100-768 tokens that is 9 MB of K and 9 MB of V copied per layer,
# half of it padding, into arrays the allocator maps afresh at every layer, and 96
# products too small for BLAS to run well. Here each sequence's keys are copied once,
# exactly its context (under 1 MB: it stays in the cache for the values' turn), and its
# query heads are one product with them.


def decode(
    q,
    k_cache,
    v_cache,
    block_tables,
    context_lens,
    scale,
    k_scales=None,
    v_scales=None,
    codec=None,
) -> np.ndarray:
    """reference.decode's result, one sequence at a time: q (num_seqs, num_heads,
    head_dim) -> (num_seqs, num_heads, head_dim); a sequence with an empty context gets
    zeros."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    queries = spread_queries(q.astype(np.float32) * scale, num_kv_heads)
    tables, lens = np.asarray(block_tables), np.asarray(context_lens)
    heads = np.arange(num_kv_heads)
    out = np.zeros((num_seqs, num_kv_heads, group, head_dim), np.float32)

    for i in range(num_seqs):
        n = int(lens[i])
        if n == 0:
            continue
        keys = context_rows(k_cache, tables[i], n, k_scales, codec)
        values = context_rows(v_cache, tables[i], n, v_scales, codec)
        # (n, num_heads): each query head against the keys of every KV head, the
        # other heads' parts of its column being zeros
        weights = keys @ queries[i]
        weights -= weights.max(axis=0)
        np.exp(weights, out=weights)
        # (kvh * hd, num_heads): each head's weighted sum of every KV head's values,
        # of which its own KV head's part is kept. values.T @ weights, not
        # weights.T @ values: OpenBLAS takes 3x as long for the same product with 9 rows
        mixed = (values.T @ weights).reshape(
            num_kv_heads, head_dim, num_kv_heads, group
        )
        # (kvh, hd, group) / (kvh, 1, group)
        sums = weights.sum(axis=0).reshape(num_kv_heads, 1, group)
        out[i] = (mixed[heads, :, heads] / sums).transpose(0, 2, 1)

    return out.reshape(num_seqs, num_heads, head_dim).astype(q.dtype, copy=False)


def spread_queries(q, num_kv_heads: int) -> np.ndarray:
    """q (num_seqs, num_heads, head_dim) as (num_seqs, kvh * head_dim, num_heads): the
    column of query head h holds its query in the rows of its KV head h // group and
    zeros elsewhere, so that `keys @ columns` gives every head's logits in one product.
    """
    num_seqs, num_heads, head_dim = q.shape
    group = num_heads // num_kv_heads
    heads = np.arange(num_kv_heads)
    spread = np.zeros(
        (num_seqs, num_kv_heads, head_dim, num_kv_heads, group), np.float32
    )
    # (kvh, num_seqs, head_dim, group) on both sides
    spread[:, heads, :, heads, :] = q.reshape(
        num_seqs, num_kv_heads, group, head_dim
    ).transpose(1, 0, 3, 2)
    return spread.reshape(num_seqs, num_kv_heads * head_dim, num_heads)


def context_rows(cache, table, n: int, scales=None, codec=None) -> np.ndarray:
    """The K (or V) of a sequence's first n positions, read through its block table:
    float32 (n, kvh * head_dim), an 8-bit cache's codes decoded (reference.gather)."""
    width = cache.shape[2] * cache.shape[3]
    if scales is not None:
        return gather(cache, table[None], [n], n, scales, codec).reshape(n, width)
    frames = table[: cdiv(n, cache.shape[1])]
    rows = cache[frames].reshape(-1, width)[:n]
    return rows.astype(np.float32, copy=False)
