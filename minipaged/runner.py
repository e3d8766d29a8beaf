"""The model runner: one forward step of many sequences over the paged KV cache.

`prepare(batch)` turns the scheduler's batch into the step's flat arrays (token ids,
positions, slot_mapping, block_tables, context_lens), asking the block manager only for
each sequence's page table and slots; `run` makes the model compute logits. The model
never sees an allocator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from minipaged.attention import get_attention
from minipaged.backend import to_numpy
from minipaged.model import Model
from minipaged.paging import BlockManager, KVCache, MemoryMoves


@dataclass(slots=True)
class StepInputs:
    """Everything one forward step reads, flat: row i of the step is one sequence."""

    token_ids: list[int]  # (num_tokens,) every row's new tokens, one row after another
    positions: np.ndarray  # (num_tokens,) each new token's position in its sequence
    slot_mapping: (
        np.ndarray
    )  # (num_tokens,) int32: where each new token's K and V go (-1: nowhere)
    block_tables: np.ndarray  # (num_seqs, max_blocks) int32, padded with -1
    context_lens: np.ndarray  # (num_seqs,) int32: tokens each row attends to
    query_lens: list[int]  # (num_seqs,) new tokens of each row
    num_logits: list[int] | None = (
        None  # (num_seqs,) trailing tokens of each row with logits (None: 1 each)
    )


def step_inputs(
    blocks: BlockManager,
    seq_ids: list,
    num_new_tokens: list[int],
    context_lens: list[int] | None = None,
    writes: list[bool] | None = None,
    token_ids: list[list[int]] | None = None,
) -> StepInputs:
    """Flat inputs of one step: row i computes the last num_new_tokens[i] of the first
    context_lens[i] tokens of sequence seq_ids[i] (default: all it holds; a prompt chunk
    stops short). A row with writes[i] False (a static batch's padding) is computed but
    gets slot -1.
    """
    ends = context_lens or [blocks.num_tokens(s) for s in seq_ids]
    writes = writes or [True] * len(seq_ids)
    tables = [blocks.block_table(s) for s in seq_ids]
    block_tables = np.full(
        (len(tables), max(map(len, tables), default=0)), -1, dtype=np.int32
    )
    slots = []
    for i, (seq_id, n, end, table) in enumerate(
        zip(seq_ids, num_new_tokens, ends, tables, strict=True)
    ):
        block_tables[i, : len(table)] = table
        slots += blocks.slots(seq_id, end - n, end) if writes[i] else [-1] * n
    positions = [p for n, end in zip(num_new_tokens, ends) for p in range(end - n, end)]
    return StepInputs(
        [t for tokens in token_ids or [] for t in tokens],
        np.array(positions, dtype=np.int64),
        np.array(slots, dtype=np.int32),
        block_tables,
        np.array(ends, dtype=np.int32),
        list(num_new_tokens),
    )


class PagedAttention:
    """The `attention` the model calls in each layer: write the new K and V into their
    slots, then attend through the block tables (decode kernel when every sequence
    brings one token,
    the prefill path when some bring more)."""

    def __init__(self, kv_cache: KVCache, impl, head_dim: int):
        self.kv, self.impl, self.scale = kv_cache, impl, 1.0 / math.sqrt(head_dim)

    def set_step(self, inputs: StepInputs) -> None:
        xp = self.kv.xp
        self.slot_mapping = xp.asarray(inputs.slot_mapping)  # (num_tokens,)
        self.block_tables = xp.asarray(inputs.block_tables)  # (num_seqs, max_blocks)
        self.context_lens = xp.asarray(inputs.context_lens)  # (num_seqs,)
        self.query_start_loc = np.concatenate(
            [[0], np.cumsum(inputs.query_lens)]
        ).astype(np.int32)
        self.decode_only = all(n == 1 for n in inputs.query_lens)

    def __call__(self, layer: int, q, k, v):
        k_cache, v_cache = (
            self.kv.k[layer],
            self.kv.v[layer],
        )  # (num_blocks, block_size, kvh, hd)
        scales = self.kv.scales_of(layer)  # {} or an 8-bit cache's k_scales, v_scales
        self.impl.write_kv(k, v, k_cache, v_cache, self.slot_mapping, **scales)
        if self.decode_only:
            return self.impl.decode(
                q,
                k_cache,
                v_cache,
                self.block_tables,
                self.context_lens,
                self.scale,
                **scales,
            )
        # query_start_loc stays on the host: the kernel sizes its grid from it without a
        # sync
        return self.impl.prefill(
            q,
            k_cache,
            v_cache,
            self.block_tables,
            self.context_lens,
            self.query_start_loc,
            self.scale,
            **scales,
        )


class ModelRunner:
    """Runs the model over a paged KVCache; `attention` defaults to the device's
    implementation."""

    def __init__(
        self, model: Model, kv_cache: KVCache, blocks: BlockManager, attention=None
    ):
        self.model, self.kv, self.blocks = model, kv_cache, blocks
        impl = attention or get_attention(model.device)
        self.attention = PagedAttention(kv_cache, impl, model.config.head_dim)

    def move(self, moves: MemoryMoves) -> None:
        """Make a step's memory moves (swaps and the tier's stores and loads, then
        copy-on-write with the attention implementation's copy_blocks kernel) before any
        of its K or V is written.
        """
        self.kv.apply(moves, self.attention.impl.copy_blocks)

    def prepare(self, batch, extra: dict | None = None) -> StepInputs:
        """The flat inputs of a scheduler Batch: each scheduled sequence's new tokens
        (the last with logits, or as many as its request asks: Request.num_logits), then
        its `extra` tokens (sequence -> tokens in its extra slots), each with logits;
        then a static batch's padding rows, which write nothing.
        """
        extra, rows = extra or {}, []
        for s in (
            batch.scheduled
        ):  # (token ids, seq id, new tokens, tokens it then holds, writes K and V?)
            more = extra.get(s.seq, [])
            n = s.num_new_tokens + len(more)
            rows.append(
                (s.seq.token_ids + more, s.seq.seq_id, n, s.seq.num_computed + n, True)
            )
        rows += [
            (seq.token_ids, seq.seq_id, 1, seq.num_computed, False)
            for _, seq in batch.padding
        ]
        tokens, seq_ids, lens, ends, writes = zip(*rows)
        inputs = step_inputs(
            self.blocks,
            list(seq_ids),
            list(lens),
            list(ends),
            list(writes),
            [ids[end - n : end] for ids, _, n, end, _ in rows],
        )
        inputs.num_logits = [
            s.request.num_logits(s.num_new_tokens) + len(extra.get(s.seq, []))
            for s in batch.scheduled
        ] + [1] * len(batch.padding)
        return inputs

    def run(self, inputs: StepInputs, model: Model | None = None) -> np.ndarray:
        """Logits (sum(num_logits), vocab): of each row's last token, or its last
        num_logits[i] tokens. `model` runs instead of the runner's (a smaller one
        sharing its weights and cache).
        """
        ends = np.cumsum(inputs.query_lens)  # (num_seqs,) one past each row
        rows = (
            ends - 1
            if inputs.num_logits is None
            else np.concatenate(
                [np.arange(end - n, end) for end, n in zip(ends, inputs.num_logits)]
            )
        )
        self.attention.set_step(inputs)
        return to_numpy(
            (model or self.model).forward(
                inputs.token_ids, inputs.positions, self.attention, logits_indices=rows
            )
        )
