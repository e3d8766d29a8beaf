"""Lab 4: the continuous batcher. You write one step's two decisions: every running request gets
a slot for its next token, preempting the newest ones when frames run out; then waiting requests
are admitted while their frames fit. The engine's Scheduler gives you everything else.

Grade it (then it serves the model):  python -m minipaged.lab check 4 my_batcher.py
Stuck? The next hint, one at a time:  python -m minipaged.lab hint 4
"""

from __future__ import annotations

from minipaged import scheduler
from minipaged.scheduler import Batch


class Scheduler(scheduler.Scheduler):
    """Each schedule() calls _reserve_decode_slots(batch), then (if nobody was preempted and
    nobody is swapped out) _admit(batch). What you can use:

        self.running         list of running Requests, oldest admitted first
        self.waiting         deque of waiting Requests, first come first
        self.blocks          the BlockManager: can_append_slots(*seq_ids), num_free_frames
        self.config          max_num_seqs, max_num_batched_tokens (per step)
        self.watermark_frames  frames admission leaves free, so running sequences can grow
        request.live         a Request's unfinished Sequences (seq.seq_id, seq.token_ids)
        request.width        how many sequences it runs at once (n samples)
        batch.num_tokens     tokens the batch computes so far
    and these steps, written for you:
        self._schedule_decode(request, batch)   give each live sequence its next slot; it runs
                                                (it appends the request to self.running itself)
        self._preempt(request, batch)           free its frames, back to the front of waiting
        self._to_map(request)                   the sequences admission maps into frames
        self._frames_to_admit(request, mapped)  the frames those take
        self._allocate(request, mapped, batch)  map them, fork the samples, schedule the prompt
        self._num_running_seqs()                sequences of the running requests
    (self.prefilling stays empty here: chunked prefill is not part of this lab.)
    """

    def _reserve_decode_slots(self, batch: Batch) -> None:
        """Every running request, oldest first, gets a slot for the next token of each of its
        live sequences. When the free frames do not suffice, preempt the most recently admitted
        running request not yet given its slots this step (this one itself when it is the last)
        and check again: one preemption may not free enough. Rebuild self.running with the
        requests that run this step: start it empty; self._schedule_decode(request, batch)
        appends the request to it, so do not append it again."""
        raise NotImplementedError("lab 4: write _reserve_decode_slots (stuck? python -m minipaged.lab hint 4)")

    def _admit(self, batch: Batch) -> None:
        """Admit waiting requests, first come first served, while each one fits: its sequences
        within max_num_seqs, its prompt tokens within max_num_batched_tokens for this step, and
        its frames within the free frames minus the watermark. The first request that does not
        fit stops admission (nobody overtakes it). A request that fits an idle engine (nothing
        running) is always admitted, watermark and limits aside, or it would wait forever.
        Read self.blocks.num_free_frames once, before the loop, and count against it the frames
        admitted so far this step: self._allocate takes them at once, so reading it again in the
        loop and subtracting them too would count them twice."""
        raise NotImplementedError("lab 4: write _admit (stuck? python -m minipaged.lab hint 4)")
