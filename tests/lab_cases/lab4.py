"""Lab 4's cases: a file as a participant writes it from the hints, and the catalogue of
plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = '''
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
        while self.waiting:
            request = self.waiting[0]
            mapped = self._to_map(request)
            frames = self._frames_to_admit(request, mapped)
            alone = not self.running
            keep = 0 if alone else self.watermark_frames
            tokens = sum(len(s.token_ids) for s in mapped)
            if not alone and (self._num_running_seqs() + request.width > self.config.max_num_seqs
                              or batch.num_tokens + tokens > self.config.max_num_batched_tokens):
                return
            if promised + frames > free - keep:
                return
            promised += frames
            self.waiting.popleft()
            self._allocate(request, mapped, batch)
'''

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that must catch it)
MISTAKES = [
    ('FILL', '            if promised + frames > free - keep:\n                return\n', '', 'admission never takes more frames than are free'),
    ('FILL', 'victim = queue.pop() if queue else request', 'victim = request', 'when frames run out, the newest request is preempted and the older ones run'),
    ('FILL', 'self._num_running_seqs() + request.width > self.config.max_num_seqs', 'False', 'at most max_num_seqs sequences run at once'),
]

# the line that opens a method body: the loop, crash and exit tests put a statement after it
BREAK_AT = '    def _reserve_decode_slots(self, batch):\n'
