"""The n-gram proposer (prompt lookup): no second model, only the sequence's own tokens.

If the last n tokens appeared before, the tokens that followed them then are guessed to
follow again: right when the output copies its input (rewriting, summarising, editing
code).
"""

from __future__ import annotations


def ngram_propose(token_ids: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the last n tokens,
    for the longest n from max_n down to min_n that occurs; [] when none does."""
    length = len(token_ids)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = token_ids[length - n :]
        for start in range(length - n - 1, -1, -1):  # the latest match first
            if token_ids[start : start + n] == suffix:
                return token_ids[start + n : start + n + k]
    return []


class NgramProposer:
    """Guesses for each speculating row of a batch (at most its guess slots)."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, rows) -> list[list[int]]:
        return [
            ngram_propose(s.seq.token_ids, s.extra_slots, self.min_n, self.max_n)
            for s in rows
        ]
