"""Lab 9: speculative decoding (meeting 8, speculative execution, and undoing it). You write the
n-gram proposer, which guesses the next tokens from the sequence's own past, and the page table's
rollback, which gives back the slots of the guesses the model rejected.

Grade it (then it serves the model):  python -m minipaged.lab check 9 my_speculation.py
Hints, one step at a time:            python -m minipaged.lab hint 9
"""

from __future__ import annotations

from minipaged import paging


def ngram_propose(token_ids: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the last n tokens, for the
    longest n from max_n down to min_n that occurs; [] when none does.

    The last n tokens themselves are not an earlier occurrence: a match must start before them
    and leave at least one token after it. Example: token_ids [1, 2, 3, 8, 1, 2], k 2, n 2:
    [1, 2] came at 0, and 3, 8 followed it, so the guess is [3, 8]."""
    raise NotImplementedError("lab 9: write ngram_propose (stuck? python -m minipaged.lab hint 9)")


class BlockTable(paging.BlockTable):
    """The page table of one sequence (labs 1-2). Its state, a dataclass:

        self.allocator     the BlockAllocator: block_size, free(frame) (one table fewer maps it)
        self.frames        logical block i of the sequence lives in frame self.frames[i]
        self.token_ids     the tokens whose K and V it holds
        self.guesses       slots after token_ids held for guessed tokens, not checked yet
        self.num_tokens    len(self.token_ids) + self.guesses: the slots in use
        self.block_hashes  one name per full block of token_ids (the prefix cache's, lab 3)
    The engine's settle_guesses(accepted) calls your truncate to drop the rejected guesses, and
    the block manager's rollback(seq_id, num_tokens) calls it to drop any tail. (In this lab the
    prefix cache is off: self.allocator.prefix_cache is None. The engine's own truncate also
    tells the prefix cache to forget a cached block it cut short.)"""

    def truncate(self, num_tokens: int) -> None:
        """Rollback: keep the first `num_tokens` slots and drop the rest (guesses first, then
        tokens); frames left empty go back to the allocator, blocks no longer full lose their name."""
        raise NotImplementedError("lab 9: write BlockTable.truncate (stuck? python -m minipaged.lab hint 9)")
