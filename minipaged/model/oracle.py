"""The oracle: a plain contiguous KV cache, as inference engines kept it before paging.

Simple and obviously right, so it stays the specification every later optimisation
(paging, batching, sharing, preemption) must reproduce token for token
(`greedy_generate`).
"""

from __future__ import annotations

import math

from minipaged.backend import array_module


class ContiguousKVCache:
    """K and V of shape (layers, num_seqs, max_len, kv_heads, head_dim): one slab per
    sequence, reserved up front whether it is used or not.

    Call `begin_step(rows, query_lens)` before each forward pass: the pass's tokens are
    `query_lens[i]` new tokens of the sequence in slab `rows[i]`, in that order. The
    model then calls this object once per layer with the new q, k, v.
    """

    def __init__(self, config, num_seqs: int, max_len: int, xp, dtype):
        shape = (
            config.num_layers,
            num_seqs,
            max_len,
            config.num_kv_heads,
            config.head_dim,
        )
        self.k = xp.zeros(shape, dtype=dtype)
        self.v = xp.zeros(shape, dtype=dtype)
        self.max_len = max_len
        self.lengths = [0] * num_seqs  # tokens stored per slab
        self.step: list[tuple[int, int, int]] = []  # (row, first position, new tokens)

    def begin_step(self, rows: list[int], query_lens: list[int]) -> list[int]:
        """Declare this pass's tokens; returns their positions, flattened."""
        self.step, positions = [], []
        for row, n in zip(rows, query_lens):
            start = self.lengths[row]
            if start + n > self.max_len:
                raise ValueError(
                    f"sequence in slab {row} would hold {start + n} tokens; "
                    f"this cache reserved {self.max_len} per sequence"
                )
            self.step.append((row, start, n))
            self.lengths[row] = start + n
            positions.extend(range(start, start + n))
        return positions

    def __call__(self, layer: int, q, k, v):
        out = array_module(q).empty_like(q)  # (T, heads, head_dim)
        t = 0
        for row, start, n in self.step:
            end = start + n
            self.k[layer, row, start:end] = k[t : t + n]
            self.v[layer, row, start:end] = v[t : t + n]
            out[t : t + n] = causal_attention(
                q[t : t + n], self.k[layer, row, :end], self.v[layer, row, :end], start
            )
            t += n
        return out


def causal_attention(q, k, v, q_start: int):
    """Softmax(q k^T / sqrt(d)) v for one sequence, query i at position q_start + i.

    q: (n, heads, head_dim); k, v: (L, kv_heads, head_dim) with L = q_start + n.
    Query head h reads KV head h // (heads // kv_heads) (grouped-query attention).
    """
    xp = array_module(q)
    n, H, D = q.shape
    L, KVH, _ = k.shape
    G = H // KVH
    # (KVH, G, n, D)
    qg = q.reshape(n, KVH, G, D).transpose(1, 2, 0, 3).astype(xp.float32)
    kt = k.transpose(1, 2, 0)[:, None].astype(xp.float32)  # (KVH, 1, D, L)
    scores = (qg @ kt) * (1.0 / math.sqrt(D))  # (KVH, G, n, L)
    # (n, L) causal
    visible = xp.arange(L)[None, :] <= (q_start + xp.arange(n))[:, None]
    scores = xp.where(visible, scores, -xp.inf)
    scores = xp.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = scores / scores.sum(axis=-1, keepdims=True)
    out = probs @ v.transpose(1, 0, 2)[:, None].astype(xp.float32)  # (KVH, G, n, D)
    return out.transpose(2, 0, 1, 3).reshape(n, H, D).astype(q.dtype)


def greedy_generate(
    model,
    prompt_ids: list[int],
    max_tokens: int,
    stop_token_ids=(),
    max_len: int | None = None,
) -> list[int]:
    """Greedy tokens for one prompt, run alone with a contiguous cache: the oracle, what
    the equivalence tests compare the engine's tokens against."""
    xp = model.xp
    max_len = max_len or len(prompt_ids) + max_tokens
    cache = ContiguousKVCache(model.config, 1, max_len, xp, model.dtype)
    tokens, out = list(prompt_ids), []
    while len(out) < max_tokens and len(tokens) < max_len:
        new = tokens if not out else tokens[-1:]
        positions = cache.begin_step([0], [len(new)])
        logits = model.forward(new, positions, cache, logits_indices=[len(new) - 1])
        token = int(logits[0].argmax())
        tokens.append(token)
        out.append(token)
        if token in stop_token_ids:
            break
    return out
