"""Paged attention shaped for a CPU, what `get_attention("cpu")` returns: the
reference's contract and results (tests/test_attention_cpu.py holds them equal), with a
decode that reads exactly each sequence's own frames, in three passes over the batch,
and a prefill that attends a prompt's queries in blocks. copy_blocks is the
reference's, and write_kv too but where every slot is kept (fewer calls).
"""

from __future__ import annotations

import numpy as np

from minipaged.attention import reference
from minipaged.attention.reference import copy_blocks, gather
from minipaged.backend import cdiv

__all__ = ["copy_blocks", "decode", "prefill", "write_kv"]

# Why decode is not the reference's on a CPU (measured in
# bench/results/2026-12-05-cpu-2core-attention/): the reference gathers every
# sequence's K and V into one array as long as the longest context, then multiplies
# `group` query rows by each KV head's keys, one small product per (sequence, KV head).
# At 16 sequences of 100-768 tokens that is 9 MB of K and 9 MB of V copied per layer,
# half of it padding, into arrays the allocator maps afresh at every layer, and 96
# products too small for BLAS to run well. Here each sequence's keys are copied once,
# exactly its context (under 1 MB: it stays in the cache while it is used), and every
# KV head's query heads meet its keys in one batched product (one call, a product per
# KV head inside NumPy).
#
# Three passes (bench/results/2026-12-05-cpu-2core-attention-rows/): every sequence's
# logits into one array, one softmax over all of them, every sequence's weighted
# values. Per sequence there are then two copies and two products; the softmax's
# small calls, a dozen per sequence before, are a handful for the whole batch, and
# run along rows of (heads, positions), 3x faster than down the columns of
# (positions, heads). Tried and dropped: the sequences split between two threads
# (12% faster steps at contexts of 350 and more, slower below 300: the small calls
# hand the interpreter's lock to and fro), one copy of all sequences' frames (it
# leaves the cache), and sequences padded into one batched product (faster only where
# their contexts are equal).
#
# Every call counts in a decode step (bench/results/2026-12-05-cpu-2core-batch1/):
# between two layers the weights stream through the caches, and each NumPy call then
# costs 3-8 us. So the plan is plain Python, and the query heads are no longer spread
# over every KV head's rows, zeros elsewhere, for one (positions, kvh * head_dim)
# product: that took a copy and 3x the flops. After a 32 MB read, one layer of one
# sequence of 100 positions took 113-115 us that way and takes 66-71 us now; 32
# sequences of 300-700 positions 4.0-4.1 ms, now 3.7-3.8 ms (attention.py there).


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
    """reference.decode's result over exactly each sequence's frames: q (num_seqs,
    num_heads, head_dim) -> (num_seqs, num_heads, head_dim); a sequence with an empty
    context gets zeros."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    tables = np.asarray(block_tables)
    # (sequence, where its positions start in `logits`, how many) for each sequence
    # with a context
    spans, total = [], 0
    for i, n in enumerate(np.asarray(context_lens).tolist()):
        if n:
            spans.append((i, total, n))
            total += n
    if not spans:
        return np.zeros_like(q)
    starts = [start for _, start, _ in spans]
    # (num_seqs, kvh, group, head_dim): query head h is row h % group of KV head
    # h // group
    queries = q.astype(np.float32, copy=False) * scale
    queries = queries.reshape(num_seqs, num_kv_heads, group, head_dim)

    # 1. (kvh, group, positions): each KV head's query heads against its keys
    logits = np.empty((num_kv_heads, group, total), np.float32)
    for i, start, n in spans:
        keys = context_rows(k_cache, tables[i], n, k_scales, codec)
        keys = keys.reshape(n, num_kv_heads, head_dim).transpose(1, 2, 0)
        np.matmul(queries[i], keys, out=logits[:, :, start : start + n])

    # 2. the softmax of each sequence's logits, on (num_heads, positions)
    weights = logits.reshape(num_heads, total)
    if len(spans) == 1:  # the same numbers as below: a maximum is exact
        weights -= weights.max(axis=1, keepdims=True)
    else:
        counts = [n for _, _, n in spans]
        peaks = np.maximum.reduceat(weights, starts, axis=1)
        weights -= np.repeat(peaks, counts, axis=1)
    np.exp(weights, out=weights)
    # (sequences with a context, num_heads): each head's sum of its weights
    sums = np.add.reduceat(weights, starts, axis=1).T

    # 3. (kvh, group, head_dim): each KV head's query heads' weighted values (`logits`
    # holds the weights now: step 2 worked on it in place, through `weights`)
    out = np.empty((len(spans), num_kv_heads, group, head_dim), np.float32)
    for row, (i, start, n) in enumerate(spans):
        values = context_rows(v_cache, tables[i], n, v_scales, codec)
        values = values.reshape(n, num_kv_heads, head_dim).transpose(1, 0, 2)
        np.matmul(logits[:, :, start : start + n], values, out=out[row])

    out = out.reshape(len(spans), num_heads, head_dim)
    out /= sums[..., None]
    if len(spans) < num_seqs:
        full = np.zeros((num_seqs, num_heads, head_dim), np.float32)
        full[[i for i, _, _ in spans]] = out
        out = full
    return out.astype(q.dtype, copy=False)


# Why prefill is not the reference's on a CPU
# (bench/results/2026-12-05-cpu-2core-prefill/): the reference attends all of a
# prompt's queries at once, so a 512-token prompt's logits are (3 KV heads, 3 x 512
# rows, 512 positions), 9 MB, written, masked, shifted and exponentiated into fresh
# arrays in every layer: 40% of the prompt's step. Here the queries go in blocks of
# PREFILL_BLOCK, each against only the positions it can see, one KV head at a time; a
# block's logits (under 2 MB) stay in the cache, and the causal mask is a triangle
# added to the block's last columns. The rows of a step that bring one token each (the
# decodes beside a prompt) take decode's three passes.

# queries of a prompt attended together: 128 x 3 query heads x 1024 positions of
# float32 logits stay under 2 MB
PREFILL_BLOCK = 128


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
    """reference.prefill's result: rows query_start_loc[i]:query_start_loc[i+1] of q
    are the last ones of sequence i's context_lens[i] positions, each seeing the
    positions up to its own. q (num_tokens, num_heads, head_dim) -> the same shape."""
    starts, lens = np.asarray(query_start_loc), np.asarray(context_lens)
    tables = np.asarray(block_tables)
    counts = np.diff(starts)
    # an 8-bit cache's scales and codec, passed on as they came
    coded = dict(k_scales=k_scales, v_scales=v_scales, codec=codec)
    out = np.empty(q.shape, np.float32)
    # the step's decodes: one query each, the last position of its sequence
    single = np.flatnonzero(counts == 1)
    if len(single):
        rows = starts[single]
        out[rows] = decode(
            q[rows], k_cache, v_cache, tables[single], lens[single], scale, **coded
        )
    for i in np.flatnonzero(counts > 1).tolist():
        rows = slice(starts[i], starts[i + 1])
        out[rows] = causal(
            q[rows], k_cache, v_cache, tables[i], int(lens[i]), scale, **coded
        )
    return out.astype(q.dtype, copy=False)


def causal(
    q, k_cache, v_cache, table, n: int, scale, k_scales=None, v_scales=None, codec=None
) -> np.ndarray:
    """One sequence's queries q (num_queries, num_heads, head_dim), its last num_queries
    of n positions, each seeing the positions up to its own: float32, the same shape."""
    num_queries, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    keys = context_rows(k_cache, table, n, k_scales, codec)  # (n, kvh * head_dim)
    values = context_rows(v_cache, table, n, v_scales, codec)
    # (kvh, num_queries * group, head_dim): each KV head's query heads, query by query
    queries = (
        (q.astype(np.float32) * scale)
        .reshape(num_queries, num_kv_heads, group, head_dim)
        .transpose(1, 0, 2, 3)
        .reshape(num_kv_heads, num_queries * group, head_dim)
    )
    out = np.empty_like(queries)
    first = n - num_queries  # the position of the first query

    for lo in range(0, num_queries, PREFILL_BLOCK):
        hi = min(lo + PREFILL_BLOCK, num_queries)
        seen = first + hi  # the block sees positions 0..seen-1, its last query all
        # query lo + j sees up to position first + lo + j: in the block's last
        # hi - lo columns, those right of the diagonal are hidden
        hidden = np.triu(np.full((hi - lo, hi - lo), -np.inf, np.float32), k=1)
        hidden = np.repeat(hidden, group, axis=0)  # a row per (query, head)
        rows = slice(lo * group, hi * group)
        for h in range(num_kv_heads):
            heads = slice(h * head_dim, (h + 1) * head_dim)
            logits = queries[h, rows] @ keys[:seen, heads].T
            logits[:, seen - (hi - lo) :] += hidden
            logits -= logits.max(axis=1, keepdims=True)
            np.exp(logits, out=logits)
            sums = logits.sum(axis=1, keepdims=True)
            np.matmul(logits, values[:seen, heads], out=out[h, rows])
            out[h, rows] /= sums

    return (
        out.reshape(num_kv_heads, num_queries, group, head_dim)
        .transpose(1, 0, 2, 3)
        .reshape(num_queries, num_heads, head_dim)
    )


def write_kv(
    k, v, k_cache, v_cache, slot_mapping, k_scales=None, v_scales=None, codec=None
) -> None:
    """reference.write_kv: each new token's K and V rows into its slot; -1 skips. Where
    no slot is skipped and the cache is float (a decode step's case), two copies and a
    check, not the reference's mask and its four selections."""
    slots = np.asarray(slot_mapping)
    if k_scales is None and len(slots) and slots.min() >= 0:
        k_cache.reshape(-1, *k_cache.shape[2:])[slots] = k
        v_cache.reshape(-1, *v_cache.shape[2:])[slots] = v
        return
    reference.write_kv(k, v, k_cache, v_cache, slots, k_scales, v_scales, codec)


def context_rows(cache, table, n: int, scales=None, codec=None) -> np.ndarray:
    """The K (or V) of a sequence's first n positions, read through its block table:
    float32 (n, kvh * head_dim), an 8-bit cache's codes decoded (reference.gather)."""
    width = cache.shape[2] * cache.shape[3]
    if scales is not None:
        return gather(cache, table[None], [n], n, scales, codec).reshape(n, width)
    frames = table[: cdiv(n, cache.shape[1])]
    rows = cache[frames].reshape(-1, width)[:n]
    return rows.astype(np.float32, copy=False)
