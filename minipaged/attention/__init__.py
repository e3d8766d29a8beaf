"""Paged attention, called by every attention layer of the model: K/V read from
scattered frames through a block table. One contract (see `get_attention`), four
modules with the same four functions: `reference` (NumPy, the specification), `cpu` (its
results, decode shaped for a CPU; the choice there), `cuda` (cuda/*.cu through CuPy; the
choice on a GPU) and `emulated` (the same kernels compiled for the CPU).
"""

from __future__ import annotations

from types import ModuleType


def get_attention(device: str) -> ModuleType:
    """The implementation the model uses on a device: `cuda` for "cuda", `cpu` for
    "cpu". Every implementation is a module with the same four functions:

    write_kv(k, v, k_cache, v_cache, slot_mapping)            # in place
        k, v: (num_tokens, num_kv_heads, head_dim); slot_mapping: int32 (num_tokens,),
        slot = frame * block_size + offset, -1 = skip this token
        k_cache, v_cache: (num_blocks, block_size, num_kv_heads, head_dim), one layer
    decode(q, k_cache, v_cache, block_tables, context_lens, scale) -> out
        q: (num_seqs, num_heads, head_dim), one query token per sequence (the last one)
        block_tables: int32 (num_seqs, max_blocks_per_seq), padded with -1
        context_lens: int32 (num_seqs,), tokens in the cache for each sequence
            (the new one included)
        out: (num_seqs, num_heads, head_dim)
        cuda and emulated also take version=1..6 (default: kernels.pick_version) and
        partition_size (v6's, default 512)
    prefill(q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale)
        -> out
        q: (num_tokens, num_heads, head_dim); sequence i owns rows
        query_start_loc[i]:query_start_loc[i+1], its last query_len tokens of
        context_lens[i];
        causal: a query at position p sees keys at positions 0..p
    copy_blocks(k_cache, v_cache, pairs)       # in place, pairs: (src, dst) frames

    Query head h reads KV head h // (num_heads // num_kv_heads). Arrays are NumPy for
    `reference`, `cpu` and `emulated`, CuPy for `cuda`; q and the caches share one dtype
    (float32 or float16; the kernels take head_dim 64 or 128).
    """
    if device == "cuda":
        from . import cuda

        return cuda
    if device == "cpu":
        from . import cpu

        return cpu
    raise ValueError(f"unknown device {device!r}; choose 'cpu' or 'cuda'")
