"""Speculative decoding on the step's lookahead seam: everything speculation adds to a
step.

In `schedule()`, each decode row gets slots for up to k guesses; before the forward the
proposer fills them; the forward computes logits at the last token and at every guess;
after it, the guesses are checked (sampling.verify) and the page table is rolled back
past the first wrong one.
"""

from __future__ import annotations

import numpy as np

from minipaged.sampling import verify
from minipaged.speculative.config import SpeculativeConfig
from minipaged.speculative.draft import DraftLayers
from minipaged.speculative.ngram import NgramProposer


class SpeculativeDecoding:
    """A proposer's guesses, `num_speculative_tokens` at most per row, checked in the
    batch."""

    def __init__(self, proposer, num_speculative_tokens: int, blocks):
        self.proposer, self.k, self.blocks = proposer, num_speculative_tokens, blocks
        self.num_guessed = self.num_accepted = 0  # guesses checked so far, and right

    def reserve(self, batch, budget: int, max_model_len: int) -> None:
        """Each decode gets slots for up to k guesses after its last token, within the
        step's token budget, the frames free now (a guess never preempts anyone) and
        what the sequence may still emit (the accepted guesses and one token more). A
        request whose logits its penalties, logit_bias or min_tokens adjust gets no
        guesses (as vLLM v1 first did): each guess would move the counts they read, so
        it decodes one token a step, by the sampler.
        """
        for s in batch.scheduled:
            if (
                s.kind != "decode"
                or s.request.beam_search
                or s.request.params.adjusts_logits
                or budget <= 0
            ):
                continue
            seq, p = s.seq, s.request.params
            room = min(
                self.k,
                budget,
                p.max_tokens - len(seq.output_ids) - 1,
                max_model_len - len(seq.token_ids) - 1,
            )
            if room > 0:
                s.extra_slots, cows = self.blocks.append_guess_slots(seq.seq_id, room)
                batch.moves.copies += cows
                budget -= s.extra_slots

    def propose(self, batch) -> dict:
        """After the step's memory moves, before its forward: sequence -> its guesses
        (at most
        its slots; a draft model reads the cache, so the moves must be made)."""
        rows = [s for s in batch.scheduled if s.extra_slots]
        guesses = (
            dict(zip((s.seq for s in rows), self.proposer.propose(rows)))
            if rows
            else {}
        )
        self.num_guessed += sum(map(len, guesses.values()))
        return {seq: list(g) for seq, g in guesses.items() if g}

    def emit(self, row, guesses: list[int], logits: np.ndarray) -> list[int]:
        """The tokens a row emits: the guesses the model agrees with, then one of the
        model's. logits (1 + len(guesses), vocab): at the last token, then at each
        guess; the token at position i draws from the sequence's stream for position i
        (seeded: batch-independent).
        """
        seq, at = row.seq, len(row.seq.token_ids)
        emitted = verify(
            logits,
            guesses,
            row.request.params,
            [seq.generator.at(at + i) for i in range(len(logits))],
        )
        self.num_accepted += len(emitted) - 1
        return emitted

    def settle(self, row, kept: list[int]) -> None:
        """The row's guess slots hold `kept` (the guesses kept, before any stop); the
        rest roll back."""
        self.blocks.settle_guesses(row.seq.seq_id, kept)


def make_lookahead(config: SpeculativeConfig | None, runner, blocks):
    """The step's lookahead for `speculative_config` (None without it): the proposer it
    names (prompt lookup, or the model's own first layers) guessing for
    SpeculativeDecoding.
    """
    if config is None:
        return None
    if config.method == "ngram":
        proposer = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    else:
        num_layers = runner.model.config.num_layers
        draft_layers = config.num_draft_layers or max(1, num_layers // 4)
        if draft_layers >= num_layers:
            raise ValueError(
                f"num_draft_layers={draft_layers}, but the model has {num_layers}"
                " layers: a draft must be smaller than the model it guesses for"
            )
        proposer = DraftLayers(runner, draft_layers)
    return SpeculativeDecoding(proposer, config.num_speculative_tokens, blocks)
