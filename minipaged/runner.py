"""The model runner: one forward step of many sequences over the paged KV cache.

On the path of a request this sits between the scheduler and the model. The scheduler chose the
sequences and how many new tokens each brings; the block manager gave those tokens slots. Here
the step becomes flat arrays (token ids, positions, slot_mapping, block_tables, context_lens),
the step's memory moves (swaps, copy-on-write) are made first, and the model runs with `PagedAttention` in every
layer. The model never sees an allocator, only these arrays.
"""

from __future__ import annotations

import math

import numpy as np

from minipaged.attention import get_attention
from minipaged.backend import to_numpy
from minipaged.model import Model
from minipaged.paging import KVCache, MemoryMoves, StepArrays


class PagedAttention:
    """The `attention` the model calls in each layer: write the new K and V into their slots,
    then attend through the block tables (decode kernel when every sequence brings one token,
    the prefill path when some bring more)."""

    def __init__(self, kv_cache: KVCache, impl, head_dim: int):
        self.kv, self.impl, self.scale = kv_cache, impl, 1.0 / math.sqrt(head_dim)

    def set_step(self, arrays: StepArrays, query_lens: list[int]) -> None:
        xp = self.kv.xp
        self.slot_mapping = xp.asarray(arrays.slot_mapping)     # (num_tokens,)
        self.block_tables = xp.asarray(arrays.block_tables)     # (num_seqs, max_blocks)
        self.context_lens = xp.asarray(arrays.context_lens)     # (num_seqs,)
        self.query_start_loc = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
        self.decode_only = all(n == 1 for n in query_lens)

    def __call__(self, layer: int, q, k, v):
        k_cache, v_cache = self.kv.k[layer], self.kv.v[layer]  # (num_blocks, block_size, kvh, hd)
        self.impl.write_kv(k, v, k_cache, v_cache, self.slot_mapping)
        if self.decode_only:
            return self.impl.decode(q, k_cache, v_cache, self.block_tables, self.context_lens, self.scale)
        # query_start_loc stays on the host: the kernel sizes its grid from it without a sync
        return self.impl.prefill(q, k_cache, v_cache, self.block_tables, self.context_lens,
                                 self.query_start_loc, self.scale)


class ModelRunner:
    """Runs the model over a paged KVCache; `attention` defaults to the device's implementation."""

    def __init__(self, model: Model, kv_cache: KVCache, attention=None):
        self.model, self.kv = model, kv_cache
        impl = attention or get_attention(model.device)
        self.attention = PagedAttention(kv_cache, impl, model.config.head_dim)

    def move(self, moves: MemoryMoves) -> None:
        """Make a step's memory moves (swaps, then copy-on-write with the attention
        implementation's copy_blocks kernel) before any of its K or V is written."""
        self.kv.apply(moves, self.attention.impl.copy_blocks)

    def step(self, new_tokens: list[list[int]], arrays: StepArrays) -> np.ndarray:
        """Logits (num_seqs, vocab) of each sequence's last token.

        new_tokens[i] are the last len(new_tokens[i]) tokens of sequence i's context_lens[i]
        (a whole uncached prompt at prefill, one token at decode); `arrays` come from
        BlockManager.step_arrays (padding rows, if any, follow the real ones)."""
        query_lens = [len(t) for t in new_tokens]
        positions = np.concatenate([np.arange(c - n, c) for c, n in zip(arrays.context_lens, query_lens)])
        last_rows = np.cumsum(query_lens) - 1                   # (num_seqs,) row of each last token
        self.attention.set_step(arrays, query_lens)
        flat = [t for tokens in new_tokens for t in tokens]     # (num_tokens,)
        return to_numpy(self.model.forward(flat, positions, self.attention, logits_indices=last_rows))
