"""Lab 8: working-set admission (meeting 10, thrashing). You write one number: the frames a
request will take in the next `window` tokens. The scheduler promises that growth to everyone
running before it admits anyone else, so a burst no longer makes the sequences evict each other.

Grade it (then it serves the model):  python -m minipaged.lab check 8 my_working_set.py
Hints, one step at a time:            python -m minipaged.lab hint 8
"""

from __future__ import annotations

from minipaged import policies


class WorkingSet(policies.WorkingSet):
    """The engine's admission seam (policies/protocols.py, Admission). Set up for you:

        self.window        tokens of growth counted (admission_window), checked >= 1 by __init__
    and what growth is given:
        request.live       the request's unfinished Sequences (len(seq.token_ids): its tokens now)
        request.width      how many sequences it runs at once (its live samples)
        blocks             the BlockManager: blocks.frames_to_admit(num_tokens, final_len) is the
                           frames a sequence of num_tokens holds (paging: ceil(num_tokens /
                           block_size); a contiguous allocator answers its whole reserved chunk)
        final_len          the longest the request's sequences can grow (prompt + max_tokens)
    """

    def growth(self, request, blocks, final_len: int) -> int:
        """Frames to promise the request's sequences for their growth (0: only what fits now)."""
        raise NotImplementedError("lab 8: write WorkingSet.growth (stuck? python -m minipaged.lab hint 8)")
