"""A draft model with no second checkpoint: the model's own first layers, its final norm
and LM head.

The first L layers compute the same K and V as the full model, so the draft reads the
target's paged cache and writes its guesses' K and V into the guess slots (the target
overwrites them).
"""

from __future__ import annotations

import copy

from minipaged.runner import ModelRunner, step_inputs


class DraftLayers:
    """Guesses greedily, one token per forward of the first `num_layers` layers, for all
    speculating rows of a batch at once (k forwards for k guesses)."""

    def __init__(self, runner: ModelRunner, num_layers: int):
        self.runner = runner
        # shares every weight; only the layer list is shorter
        self.model = copy.copy(runner.model)
        self.model.layers = runner.model.layers[:num_layers]

    def propose(self, rows) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in rows]
        while True:
            active = [i for i, s in enumerate(rows) if len(drafts[i]) < s.extra_slots]
            if not active:
                return drafts
            # the last one is computed
            ids = [rows[i].seq.token_ids + drafts[i] for i in active]
            inputs = step_inputs(
                self.runner.blocks,
                [rows[i].seq.seq_id for i in active],
                [1] * len(active),
                [len(t) for t in ids],
                token_ids=[t[-1:] for t in ids],
            )
            logits = self.runner.run(inputs, model=self.model)  # (len(active), vocab)
            for i, token in zip(active, logits.argmax(axis=-1).tolist()):
                drafts[i].append(int(token))
