"""Paged attention in NumPy: the executable specification the kernels are tested
against, whose prefill a CPU runs (minipaged.attention.cpu). K/V are gathered through
the block tables into contiguous arrays (`gather`), then attention is the usual
softmax(q k^T * scale) v (`attend`). An 8-bit cache (kv_cache_dtype "int8", "fp8" or a
codec) is coded in write_kv, decoded in gather.
"""

from __future__ import annotations

import numpy as np

# CODE_MAX and FP8_VALUES are re-exported for the notebooks and tests
from minipaged.attention.codecs import (  # noqa: F401
    CODE_MAX,
    FP8_VALUES,
    SCALE_MAX,
    codec_for,
)
from minipaged.backend import cdiv

# ---- 8-bit codes: value ~ code * scale (the codecs: minipaged.attention.codecs) ----
# An 8-bit cache stores codes, int8 (-127..127) or fp8 e4m3 bit
# patterns in uint8, and a float16 scale per (slot, KV head), for K and for V apart:
# scales (num_blocks, block_size, kvh). Which codec codes them is the cache's (`codec=`,
# from KVCache.scales_of), else the built-in one of its dtype. The names below are the
# codecs' own, kept for the notebooks and tests that use them.


def encode(x, scale, dtype) -> np.ndarray:
    """x (..., kvh, hd) / scale (..., kvh) as 8-bit codes of `dtype` with its built-in
    codec (int8: rounded; uint8: the nearest e4m3 value's bit pattern). A scale of 0
    codes 0.
    """
    return codec_for(dtype).encode(x, scale)


def decode_codes(codes, scale, codec=None) -> np.ndarray:
    """codes (..., kvh, hd) back to float32 values with their scales (..., kvh)."""
    return codec_for(codes.dtype, codec).decode(codes, scale)


def write_coded(rows, cache, scales, slots, codec=None) -> None:
    """Code rows (tokens, kvh, hd) into their slots of an 8-bit cache, each (row, head)
    with its own float16 scale (the codec's scale_of: its largest |value| / its largest
    code), at most float16's largest finite value (SCALE_MAX, whatever codec: a scale
    stored as inf would decode codes 0 to NaN).
    """
    codec = codec_for(cache.dtype, codec)
    rows = rows.astype(np.float32, copy=False)
    # (tokens, kvh) float16
    scale = np.minimum(codec.scale_of(rows), SCALE_MAX).astype(np.float16)
    scales.reshape(-1, scales.shape[-1])[slots] = scale
    cache.reshape(-1, *cache.shape[2:])[slots] = codec.encode(rows, scale)


# ---- the contract --------------------------------------------------------------------


def write_kv(
    k, v, k_cache, v_cache, slot_mapping, k_scales=None, v_scales=None, codec=None
) -> None:
    """Store each new token's K and V rows in its slot = frame * block_size + offset; -1
    skips. Read as (num_blocks * block_size, kvh, hd), a view of the contiguous cache,
    row `slot` is that slot. With scales (an 8-bit cache), the rows are coded
    (write_coded) by `codec` (None: the built-in one of the cache's dtype)."""
    slots = np.asarray(slot_mapping)
    keep = slots >= 0
    if k_scales is not None:
        write_coded(np.asarray(k)[keep], k_cache, k_scales, slots[keep], codec)
        write_coded(np.asarray(v)[keep], v_cache, v_scales, slots[keep], codec)
        return
    # (kept tokens, kvh, hd)
    k_cache.reshape(-1, *k_cache.shape[2:])[slots[keep]] = k[keep]
    v_cache.reshape(-1, *v_cache.shape[2:])[slots[keep]] = v[keep]


def copy_blocks(k_cache, v_cache, pairs) -> None:
    """Copy-on-write: for each (src, dst) pair, frame dst becomes a copy of frame
    src."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    k_cache[pairs[:, 1]] = k_cache[pairs[:, 0]]
    v_cache[pairs[:, 1]] = v_cache[pairs[:, 0]]


def gather(
    cache, block_tables, context_lens, num_positions: int, scales=None, codec=None
) -> np.ndarray:
    """K (or V) of positions 0..num_positions-1 of each sequence, read through the block
    tables: float32 (num_seqs, num_positions, num_kv_heads, head_dim), zero past each
    context (the slots there may hold anything, even NaN). Whole frames are copied, one
    index per frame: a copy per position costs 3-4x as much in NumPy. An 8-bit cache's
    frames are decoded with their scales (num_blocks, block_size, kvh) as they are read,
    by `codec` (None: the dtype's).
    """
    num_seqs, block_size = len(context_lens), cache.shape[1]
    # (num_seqs, frames)
    frames = np.asarray(block_tables)[:, : cdiv(num_positions, block_size)]
    # a frame bigger than the context: only its start
    used = cache[:, : min(block_size, num_positions)]
    rows = used[np.maximum(frames, 0)]  # -1 padding: any frame, zeroed below
    if scales is not None:  # (num_seqs, frames, block_size, kvh)
        rows = decode_codes(
            rows, scales[:, : rows.shape[2]][np.maximum(frames, 0)], codec
        )
    # (num_seqs, positions, kvh, hd)
    rows = rows.reshape(num_seqs, -1, *cache.shape[2:])[:, :num_positions]
    rows = rows.astype(np.float32, copy=False)
    # rows is a copy: zero in place
    rows[np.arange(num_positions) >= np.asarray(context_lens)[:, None]] = 0
    return rows


def attend(q, keys, values, visible, scale) -> np.ndarray:
    """softmax(q k^T * scale) v over the visible positions, for a batch of sequences.
    q (S, queries, num_heads, hd); keys, values (S, positions, kvh, hd); visible (S,
    queries, positions) bool. Query head h uses KV head h // (num_heads // kvh): the
    `group` query heads of one KV head are stacked as rows of one product, (group *
    queries, hd) @ (hd, positions).
    """
    num_seqs, num_queries, num_heads, head_dim = q.shape
    num_kv_heads = keys.shape[2]
    group = num_heads // num_kv_heads
    q = q.astype(np.float32).reshape(
        num_seqs, num_queries, num_kv_heads, group, head_dim
    )
    q = q.transpose(0, 2, 3, 1, 4).reshape(
        num_seqs, num_kv_heads, group * num_queries, head_dim
    )
    k = keys.transpose(0, 2, 3, 1)  # (S, kvh, hd, positions), a view
    v = values.transpose(0, 2, 1, 3)  # (S, kvh, positions, hd), a view
    logits = (q @ k).reshape(num_seqs, num_kv_heads, group, num_queries, -1) * scale
    # (S, kvh, group, queries, positions)
    logits = np.where(visible[:, None, None], logits, -np.inf)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    out = p.reshape(num_seqs, num_kv_heads, group * num_queries, -1) @ v
    out = out.reshape(p.shape[:-1] + (head_dim,)) / p.sum(axis=-1, keepdims=True)
    return out.transpose(0, 3, 1, 2, 4).reshape(
        num_seqs, num_queries, num_heads, head_dim
    )


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
    """One query per sequence, the last of its context_lens[i] tokens: it sees them all.
    q (num_seqs, num_heads, head_dim) -> (num_seqs, num_heads, head_dim)."""
    context_lens = np.asarray(context_lens)
    num_positions = int(context_lens.max(initial=0))
    keys = gather(k_cache, block_tables, context_lens, num_positions, k_scales, codec)
    values = gather(v_cache, block_tables, context_lens, num_positions, v_scales, codec)
    # (S, 1, positions)
    visible = np.arange(num_positions) < context_lens[:, None, None]
    return attend(q[:, None], keys, values, visible, scale)[:, 0].astype(q.dtype)


def prefill(
    q,
    k_cache,
    v_cache,
    block_tables,
    context_lens,
    query_start_loc,
    scale,
    k_scales=None,
    v_scales=None,
    codec=None,
) -> np.ndarray:
    """Many queries per sequence: rows query_start_loc[i]:query_start_loc[i+1] of q are
    the last query_len of sequence i's context_lens[i] tokens; the query at position p
    sees 0..p (causal). q (num_tokens, num_heads, head_dim) -> the same shape."""
    out = np.empty_like(q)
    for i, context_len in enumerate(np.asarray(context_lens)):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        table = np.asarray(block_tables)[i : i + 1]
        # (1, context_len, kvh, hd)
        keys = gather(k_cache, table, [context_len], context_len, k_scales, codec)
        values = gather(v_cache, table, [context_len], context_len, v_scales, codec)
        # of the queries
        positions = context_len - (end - start) + np.arange(end - start)
        visible = np.arange(context_len) <= positions[:, None]  # (queries, context_len)
        out[start:end] = attend(q[None, start:end], keys, values, visible[None], scale)[
            0
        ]
    return out
