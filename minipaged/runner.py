"""The model runner: one forward step of many sequences over the paged KV cache.

`prepare(batch)` turns the scheduler's batch into the step's flat arrays (token ids,
positions, slot_mapping, block_tables, context_lens), asking the block manager only for
each sequence's page table and slots; `run` makes the model compute logits. The model
never sees an allocator.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from minipaged.attention import get_attention
from minipaged.backend import to_numpy
from minipaged.model import Model
from minipaged.paging import BlockManager, KVCache, MemoryMoves


@dataclass(slots=True)
class StepInputs:
    """Everything one forward step reads, flat: row i of the step is one sequence."""

    # (num_tokens,) every row's new tokens, one row after another
    token_ids: list[int]
    # (num_tokens,) each new token's position in its sequence
    positions: np.ndarray
    # (num_tokens,) int32: where each new token's K and V go (-1: nowhere)
    slot_mapping: np.ndarray
    # (num_seqs, max_blocks) int32: each row's page table, padded with -1
    block_tables: np.ndarray
    # (num_seqs,) int32: tokens each row attends to
    context_lens: np.ndarray
    # (num_seqs,) new tokens of each row
    query_lens: list[int]
    # (num_seqs,) trailing tokens of each row with logits (None: 1 each)
    num_logits: list[int] | None = None


def step_inputs(
    blocks: BlockManager,
    seq_ids: list,
    num_new_tokens: list[int],
    context_lens: list[int] | None = None,
    writes: list[bool] | None = None,
    token_ids: list[list[int]] | None = None,
) -> StepInputs:
    """Flat inputs of one step: row i computes the last num_new_tokens[i] of the
    first context_lens[i] tokens of sequence seq_ids[i] (default: all it holds; a
    prompt chunk stops short). A row with writes[i] False (a static batch's padding)
    is computed but gets slot -1. token_ids[i] are row i's new tokens."""
    if not context_lens:
        context_lens = [blocks.num_tokens(seq_id) for seq_id in seq_ids]
    positions = []
    slots = []
    for i, seq_id in enumerate(seq_ids):
        end = context_lens[i]
        start = end - num_new_tokens[i]
        positions += range(start, end)
        slots += row_slots(blocks, seq_id, start, end, writes is None or writes[i])
    flat_token_ids = list(itertools.chain.from_iterable(token_ids or []))
    return StepInputs(
        token_ids=flat_token_ids,
        positions=np.array(positions, dtype=np.int64),
        slot_mapping=np.array(slots, dtype=np.int32),
        block_tables=padded_block_tables(blocks, seq_ids),
        context_lens=np.array(context_lens, dtype=np.int32),
        query_lens=list(num_new_tokens),
    )


def row_slots(blocks: BlockManager, seq_id, start: int, end: int, writes: bool):
    """The slots of a sequence's tokens start..end, where their K and V go; -1
    (nowhere) for each of a row that writes nothing."""
    if not writes:
        return [-1] * (end - start)
    return blocks.slots(seq_id, start, end)


def padded_block_tables(blocks: BlockManager, seq_ids: list) -> np.ndarray:
    """(num_seqs, max_blocks) int32: row i is sequence seq_ids[i]'s page table,
    padded with -1."""
    tables = [blocks.block_table(seq_id) for seq_id in seq_ids]
    width = max((len(table) for table in tables), default=0)
    block_tables = np.full((len(tables), width), -1, dtype=np.int32)
    for i, table in enumerate(tables):
        block_tables[i, : len(table)] = table
    return block_tables


def tokens_between(held: list[int], more: list[int], start: int, end: int):
    """Tokens start..end of a sequence's tokens `held` followed by `more`, without
    copying its whole history."""
    tokens = held[start:end]
    if end > len(held):
        first = max(start - len(held), 0)
        tokens += more[first : end - len(held)]
    return tokens


@dataclass(slots=True)
class Rows:
    """A step's rows as one list per flat input, appended row by row."""

    seq_ids: list[int] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)  # its new tokens
    num_new_tokens: list[int] = field(default_factory=list)
    context_lens: list[int] = field(default_factory=list)  # held once they are in
    writes: list[bool] = field(default_factory=list)  # its K and V go to the cache?
    num_logits: list[int] = field(default_factory=list)

    def add(self, seq_id, tokens, context_len, writes=True, num_logits=1) -> None:
        """A row that computes `tokens`, the last of the context_len it then holds."""
        self.seq_ids.append(seq_id)
        self.token_ids.append(tokens)
        self.num_new_tokens.append(len(tokens))
        self.context_lens.append(context_len)
        self.writes.append(writes)
        self.num_logits.append(num_logits)


class PagedAttention:
    """The `attention` the model calls in each layer: write the new K and V into
    their slots, then attend through the block tables (the decode kernel when every
    sequence brings one token, the prefill path when some bring more)."""

    def __init__(self, kv_cache: KVCache, impl, head_dim: int):
        self.kv = kv_cache
        self.impl = impl
        self.scale = 1.0 / math.sqrt(head_dim)

    def set_step(self, inputs: StepInputs) -> None:
        """Put this step's flat inputs where every layer's call reads them."""
        xp = self.kv.xp
        self.slot_mapping = xp.asarray(inputs.slot_mapping)  # (num_tokens,)
        self.block_tables = xp.asarray(inputs.block_tables)  # (num_seqs, max_blocks)
        self.context_lens = xp.asarray(inputs.context_lens)  # (num_seqs,)
        # stays on the host: the kernel sizes its grid from it without a sync
        starts = np.concatenate([[0], np.cumsum(inputs.query_lens)])
        self.query_start_loc = starts.astype(np.int32)  # (num_seqs + 1,)
        self.decode_only = all(n == 1 for n in inputs.query_lens)

    def __call__(self, layer: int, q, k, v):
        k_cache = self.kv.k[layer]  # (num_blocks, block_size, kvh, hd)
        v_cache = self.kv.v[layer]  # (num_blocks, block_size, kvh, hd)
        scales = self.kv.scales_of(layer)  # {} or an 8-bit cache's k/v_scales
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
        self.model = model
        self.kv = kv_cache
        self.blocks = blocks
        if attention is None:
            attention = get_attention(model.device)
        self.attention = PagedAttention(kv_cache, attention, model.config.head_dim)

    def move(self, moves: MemoryMoves) -> None:
        """Make a step's memory moves (swaps and the tier's stores and loads, then
        copy-on-write with the attention implementation's copy_blocks kernel) before
        any of its K or V is written."""
        self.kv.apply(moves, self.attention.impl.copy_blocks)

    def prepare(self, batch, extra: dict | None = None) -> StepInputs:
        """The flat inputs of a scheduler Batch: each scheduled sequence's new tokens
        (the last with logits, or as many as its request asks: Request.num_logits),
        then its `extra` tokens (sequence -> tokens in its extra slots), each with
        logits; then a static batch's padding rows, which write nothing."""
        if extra is None:
            extra = {}
        rows = Rows()
        for row in batch.scheduled:
            more = extra.get(row.seq, [])
            n = row.num_new_tokens + len(more)
            end = row.seq.num_computed + n
            tokens = tokens_between(row.seq.token_ids, more, end - n, end)
            num_logits = row.request.num_logits(row.num_new_tokens) + len(more)
            rows.add(row.seq.seq_id, tokens, end, num_logits=num_logits)
        for _, seq in batch.padding:  # computed again, written nowhere
            end = seq.num_computed
            rows.add(seq.seq_id, seq.token_ids[end - 1 : end], end, writes=False)
        inputs = step_inputs(
            self.blocks,
            rows.seq_ids,
            rows.num_new_tokens,
            context_lens=rows.context_lens,
            writes=rows.writes,
            token_ids=rows.token_ids,
        )
        inputs.num_logits = rows.num_logits
        return inputs

    def run(self, inputs: StepInputs, model: Model | None = None) -> np.ndarray:
        """Logits (sum(num_logits), vocab): of each row's last token, or its last
        num_logits[i] tokens. `model` runs instead of the runner's (a smaller one
        sharing its weights and cache)."""
        ends = np.cumsum(inputs.query_lens)  # (num_seqs,) one past each row
        if inputs.num_logits is None:
            rows = ends - 1
        else:
            pairs = zip(ends, inputs.num_logits)
            rows = np.concatenate([np.arange(end - n, end) for end, n in pairs])
        if model is None:
            model = self.model
        self.attention.set_step(inputs)
        logits = model.forward(
            inputs.token_ids, inputs.positions, self.attention, logits_indices=rows
        )
        return to_numpy(logits)  # (sum(num_logits), vocab)
