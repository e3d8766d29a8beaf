"""Lab 4's cases: a file as a participant writes it from the hints, and the catalogue of
plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = """
from collections import deque
from minipaged import scheduler


class Scheduler(scheduler.Scheduler):
    def _reserve_decode_slots(self, batch):
        queue, self.running = deque(self.running), []
        while queue:
            request = queue.popleft()
            while not self.blocks.can_append_slots(*[s.seq_id for s in request.live]):
                victim = queue.pop() if queue else request
                self._preempt(victim, batch)
                if victim is request:
                    break
            else:
                self._schedule_decode(request, batch)

    def _admit(self, batch):
        free, promised = self.blocks.num_free_frames, 0
        for request in list(self.waiting):
            mapped = self._to_map(request)
            frames = self._frames_to_admit(request, mapped)
            alone = not self.running
            keep = 0 if alone else self.watermark_frames
            tokens = sum(len(s.token_ids) for s in mapped)
            if not alone and (self._num_running_seqs() + request.width \
> self.config.max_num_seqs
                              or batch.num_tokens + tokens \
> self.config.max_num_batched_tokens):
                return
            if promised + frames > free - keep:
                return
            promised += frames
            self.waiting.remove(request)
            self._allocate(request, mapped, batch)
"""

PREEMPTS = (
    "when frames run out, the newest requests are preempted, newest first, and the"
    " older ones run"
)
ADMITS = (
    "waiting requests are admitted first come, first served, while their frames fit"
)

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that
# must catch it)
MISTAKES = [
    (
        "no frame check at admission",
        "            if promised + frames > free - keep:\n                return\n",
        "",
        "admission never takes more frames than are free",
    ),
    (
        "forgets the frames admitted earlier in this step",
        "            promised += frames\n",
        "",
        "admission never takes more frames than are free",
    ),
    (
        "reads num_free_frames inside the loop, so admitted frames count twice",
        (
            "        free, promised = self.blocks.num_free_frames, 0\n        for"
            " request in list(self.waiting):\n"
        ),
        (
            "        promised = 0\n        for request in list(self.waiting):\n"
            "            free = self.blocks.num_free_frames\n"
        ),
        ADMITS,
    ),
    (
        "skips a request that does not fit, so later ones overtake it",
        "            if promised + frames > free - keep:\n                return\n",
        "            if promised + frames > free - keep:\n                continue\n",
        ADMITS,
    ),
    (
        "ignores the watermark",
        "keep = 0 if alone else self.watermark_frames",
        "keep = 0",
        "admission leaves the watermark free for running sequences to grow",
    ),
    (
        "keeps the watermark even when nothing runs",
        "keep = 0 if alone else self.watermark_frames",
        "keep = self.watermark_frames",
        "an idle engine admits a request that needs every frame",
    ),
    (
        "ignores max_num_seqs",
        "self._num_running_seqs() + request.width > self.config.max_num_seqs",
        "False",
        "at most max_num_seqs sequences run at once",
    ),
    (
        "counts requests, not sequences, against max_num_seqs",
        "self._num_running_seqs() + request.width > self.config.max_num_seqs",
        "len(self.running) + 1 > self.config.max_num_seqs",
        "at most max_num_seqs sequences run at once",
    ),
    (
        "ignores max_num_batched_tokens",
        "batch.num_tokens + tokens > self.config.max_num_batched_tokens",
        "False",
        "a step computes at most max_num_batched_tokens tokens",
    ),
    (
        "counts the request's tokens, not the step's",
        "batch.num_tokens + tokens > self.config.max_num_batched_tokens",
        "tokens > self.config.max_num_batched_tokens",
        "a step computes at most max_num_batched_tokens tokens",
    ),
    (
        "appends to self.running again after _schedule_decode did",
        "                self._schedule_decode(request, batch)\n",
        (
            "                self._schedule_decode(request, batch)\n               "
            " self.running.append(request)\n"
        ),
        "every running sequence gets a slot for its next token each step",
    ),
    (
        "forgets to schedule the decode",
        "                self._schedule_decode(request, batch)\n",
        "                self.running.append(request)\n",
        "every running sequence gets a slot for its next token each step",
    ),
    (
        "preempts the oldest other request, not the newest",
        "victim = queue.pop() if queue else request",
        "victim = queue.popleft() if queue else request",
        PREEMPTS,
    ),
    (
        "preempts the request itself first",
        "victim = queue.pop() if queue else request",
        "victim = request",
        PREEMPTS,
    ),
    (
        "preempts once per request, without checking again that the slots fit",
        (
            "            while not self.blocks.can_append_slots(*[s.seq_id for s in"
            " request.live]):\n                victim = queue.pop() if queue else"
            " request\n                self._preempt(victim, batch)\n                if"
            " victim is request:\n                    break\n            else:\n       "
            "         self._schedule_decode(request, batch)\n"
        ),
        (
            "            if not self.blocks.can_append_slots(*[s.seq_id for s in"
            " request.live]):\n                victim = queue.pop() if queue else"
            " request\n                self._preempt(victim, batch)\n                if"
            " victim is request:\n                    continue\n           "
            " self._schedule_decode(request, batch)\n"
        ),
        PREEMPTS,
    ),
    (
        "_admit hands its work to the engine's own (super())",
        "        free, promised = self.blocks.num_free_frames, 0\n",
        (
            "        return super()._admit(batch)\n        free, promised ="
            " self.blocks.num_free_frames, 0\n"
        ),
        ADMITS,
    ),
]

# the line that opens a method body: the loop, crash and exit tests put a statement
# after it
BREAK_AT = "    def _reserve_decode_slots(self, batch):\n"
