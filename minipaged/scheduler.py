"""The continuous batcher (Orca's iteration-level scheduling over vLLM's paged memory).

Each step, `schedule()` picks the batch and the frames it needs; after the forward pass,
`update()` appends the sampled tokens, forks beams and finishes sequences. The engine and the
simulator call the same two. The policy is told in full at `Scheduler`.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from minipaged import beam
from minipaged.paging import BlockManager, MemoryMoves, check_size
from minipaged.sequence import Request, Sequence, Status


@dataclass(slots=True)
class Scheduled:
    """One sequence in this step's batch: its `num_new_tokens` tokens after `seq.num_computed`
    are computed (all of them but at a prompt chunk that is not its last).
    `samplers` are the sequences that take their next token from its logits (itself, or all n
    samples of a prompt that they still share)."""
    seq: Sequence
    request: Request
    num_new_tokens: int
    samplers: list[Sequence]
    kind: str = "decode"  # or "prefill": the sequence's tokens enter the cache now
    guess_slots: int = 0  # speculative decoding: slots taken for guesses after its last token
    draft: list[int] = field(default_factory=list)  # the guesses checked this step (<= guess_slots)

    def guess(self, draft: list[int]) -> None:
        """Check these guessed tokens in this step's forward, after the last token."""
        assert len(draft) <= self.guess_slots, f"{len(draft)} guesses for {self.guess_slots} slots"
        self.draft = list(draft)
        self.num_new_tokens = 1 + len(draft)


@dataclass(slots=True)
class Batch:
    """What one step runs, and the memory moves to make before it runs."""
    scheduled: list[Scheduled] = field(default_factory=list)
    padding: list[tuple[Request, Sequence]] = field(default_factory=list)  # static: finished rows, computed anyway
    moves: MemoryMoves = field(default_factory=MemoryMoves)  # swaps and copy-on-write, before the forward
    preempted: list[tuple[str, str]] = field(default_factory=list)  # (request_id, "recompute"/"swap")
    cached_tokens: int = 0                                     # prefix-cache hits admitted

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


@dataclass(frozen=True, slots=True)
class BatchingPolicy:
    """How batches form: each field is one thing Orca changed about FasterTransformer's batches."""
    name: str
    joins_running_batch: bool  # may a request join while others run (else: only an empty batch)?
    reserves_whole_run: bool   # does admission take every frame the run could need, up front?
    keeps_finished_rows: bool  # do finished sequences stay in the batch as padding until it ends?


CONTINUOUS = BatchingPolicy("continuous", joins_running_batch=True, reserves_whole_run=False,
                            keeps_finished_rows=False)
STATIC = BatchingPolicy("static", joins_running_batch=False, reserves_whole_run=True,
                        keeps_finished_rows=True)
POLICIES = {p.name: p for p in (CONTINUOUS, STATIC)}
WAITING_ORDERS = ("fcfs", "sjf", "aging", "priority")  # first come first served; shortest job first; SJF
# with aging; vLLM's `priority=` per request (lower first)
ADMISSIONS = ("greedy", "working-set")  # admit while prompts fit; or while working sets (frames + growth) fit


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 0      # tokens per step; 0: 512 with chunked prefill, else max(4096, max_model_len)
    preemption_mode: str = "recompute"   # or "swap"
    watermark: float = 0.01              # fraction of frames admission leaves free
    max_model_len: int = 2048            # the longest a sequence may grow
    policy: str = "continuous"           # or "static": the pre-Orca baseline
    chunked_prefill: bool = False        # split prompts to fit max_num_batched_tokens per step
    scheduling_policy: str = "fcfs"      # waiting-queue order: "fcfs", "sjf" or "aging" (WAITING_ORDERS)
    aging_rate: float = 8.0              # "aging": job-size tokens forgiven per step waited
    admission: str = "greedy"            # or "working-set": running sequences' growth is counted too (ADMISSIONS)
    admission_window: int = 16           # "working-set": steps of growth counted (Denning's window)
    num_speculative_tokens: int = 0      # slots for guesses after each decode (speculative decoding)

    def __post_init__(self):
        if self.scheduling_policy not in WAITING_ORDERS:
            raise ValueError(f"scheduling_policy must be one of {WAITING_ORDERS}, got {self.scheduling_policy!r}")
        if not isinstance(self.aging_rate, (int, float)) or not self.aging_rate > 0:
            raise ValueError(f"aging_rate must be a number > 0 (tokens per step waited), got {self.aging_rate!r}")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {ADMISSIONS}, got {self.admission!r}")
        check_size("admission_window", self.admission_window, minimum=1)
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"scheduler must be one of {sorted(POLICIES)}, got {self.policy!r}")
        if self.chunked_prefill and self.policy == "static":
            raise ValueError("enable_chunked_prefill needs scheduler='continuous': a static batch "
                             "is formed once, so there are no running decodes to share steps with")
        if not isinstance(self.watermark, (int, float)) or not 0 <= self.watermark < 1:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {self.watermark!r}")
        check_size("max_num_seqs", self.max_num_seqs, minimum=1)
        check_size("num_speculative_tokens", self.num_speculative_tokens, minimum=0)
        if self.num_speculative_tokens and self.policy == "static":
            raise ValueError("speculative decoding needs scheduler='continuous': a static batch keeps "
                             "finished rows as padding and never rolls a row back")
        check_size("max_num_batched_tokens", self.max_num_batched_tokens, minimum=0)
        if not self.max_num_batched_tokens:
            self.max_num_batched_tokens = 512 if self.chunked_prefill else max(4096, self.max_model_len)
        if self.max_num_batched_tokens < self.max_model_len and not self.chunked_prefill:
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens} is below max_model_len="
                             f"{self.max_model_len}: a long prompt could never be prefilled (unless "
                             "enable_chunked_prefill=True)")


class Scheduler:
    """Batching over a BlockManager. Three queues, first come first served: `waiting` (not
    yet in memory), `running` (frames on the device) and `swapped` (frames in host memory).
    Each `schedule()`, in this order:

    1. Running requests each get a slot for their next token. When frames run out, the most
       recently admitted request is preempted: by *recompute* (its frames are freed and it goes
       back to the front of `waiting`, to be prefilled again later) or by *swap* (its frames
       are copied to host memory and it waits in `swapped`).
    2. If nobody was preempted, swapped requests come back first, oldest first.
    3. If nobody is swapped out, waiting requests are admitted while their frames fit (keeping
       a small watermark of free frames so running sequences can grow), within `max_num_seqs`
       sequences and `max_num_batched_tokens` tokens per step. Which waiting request goes
       next is `scheduling_policy`'s choice (`_next_waiting`). With `admission="working-set"`
       a request is admitted only while every running sequence's *working set* fits too: its
       frames now plus the frames it will take in the next `admission_window` steps (Denning's
       load control, against thrashing: see `_growth`).

    Prefill and decode share a step: a newly admitted prompt joins the running decodes at once.
    With `chunked_prefill`, decodes go first and a prompt takes what is left of the token budget,
    a chunk per step; while a prompt is part-computed nobody else is admitted (a prefix-cache hit
    on its blocks would read K and V not written yet) and it is never preempted. A contiguous
    allocator (paging.contiguous) reserves each request's chunk at admission. Under the `STATIC`
    policy a batch forms only when the last one is done, reserves its whole run's memory up
    front, and keeps its finished sequences as padding rows until its longest member finishes.
    """

    def __init__(self, config: SchedulerConfig, blocks: BlockManager):
        self.config, self.blocks, self.policy = config, blocks, POLICIES[config.policy]
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.padding: list[tuple[Request, Sequence]] = []  # static: finished rows of the batch
        self.prefilling: dict[Request, list[tuple[Sequence, list[Sequence]]]] = {}  # (seq, samplers) left
        self.watermark_frames = int(config.watermark * blocks.num_frames)
        self.seq_ids = itertools.count()  # new sequences' ids: a request's samples, beams' forks
        self.steps = 0                    # schedule() calls so far: the clock waits are counted on
        self.arrived: dict[Request, int] = {}  # waiting request -> the step it arrived at
        self.priorities: dict[Request, int] = {}  # "priority": request -> its priority (lower first)

    def add(self, request: Request, priority: int = 0) -> None:
        self.waiting.append(request)
        self.arrived[request] = self.steps
        self.priorities[request] = priority

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self) -> Batch:
        batch, self.steps = Batch(), self.steps + 1
        self._reserve_decode_slots(batch)
        if not batch.preempted:
            self._swap_in(batch)
        for request in list(self.prefilling):
            self._schedule_prefill(request, batch)
        if (not batch.preempted and not self.swapped and not self.prefilling
                and (self.policy.joins_running_batch or not self.running)):
            self._admit(batch)
        batch.padding = list(self.padding)
        if self.config.num_speculative_tokens:
            self._reserve_guesses(batch)
        return batch

    def new_seq_id(self) -> int:
        return next(self.seq_ids)

    def update(self, batch: Batch, tokens: dict[Sequence, int], stopped=frozenset(),
               beams: dict[Request, beam.BeamStep] | None = None,
               accepted: dict[Sequence, list[int]] | None = None) -> list[Request]:
        """After the forward pass: every scheduled sequence's new tokens now have K and V in the
        cache; each sampler appends its accepted guesses (speculative decoding: the rest are
        rolled back) and its token (a beam search applies its BeamStep instead), and finishes if
        it is in `stopped` (eos, a stop string) or at its length limit. Returns the requests
        that finished, in the order they ran."""
        request_of, accepted = {}, accepted or {}
        for scheduled in batch.scheduled:
            scheduled.seq.num_computed += scheduled.num_new_tokens  # (a prompt chunk samples nothing)
            if scheduled.guess_slots:
                self.blocks.settle_guesses(scheduled.seq.seq_id, accepted.get(scheduled.seq, []))
            for seq in scheduled.samplers:  # forked samples share the prompt's cache
                seq.num_computed = len(scheduled.seq.token_ids)
                request_of[seq] = scheduled.request
        for seq, token in tokens.items():
            seq.num_computed += len(accepted.get(seq, ()))  # accepted guesses have their K and V
            seq.token_ids += [*accepted.get(seq, ()), token]
            request = request_of[seq]
            if seq in stopped:
                self._finish_seq(request, seq, "stop")
            elif len(seq.output_ids) >= request.params.max_tokens or len(seq.token_ids) >= self.config.max_model_len:
                self._finish_seq(request, seq, "length")
        for request, step in (beams or {}).items():
            self._apply_beam_step(request, step)
        finished = [r for r in dict.fromkeys(s.request for s in batch.scheduled) if not r.live]
        for request in finished:
            self.finish(request)
        return finished

    def abort(self, request: Request) -> None:
        """Stop a request now, wherever it is, and free its frames."""
        for seq in request.live:
            self._finish_seq(request, seq, "abort")
        self.finish(request)

    def finish(self, request: Request) -> None:
        """A request whose sequences are all finished (or aborted) leaves its queue. A static
        batch ends with its last request: then its padding rows leave too."""
        for queue in (self.waiting, self.running, self.swapped):
            if request in queue:
                queue.remove(request)
        self.prefilling.pop(request, None)
        self.arrived.pop(request, None)
        self.priorities.pop(request, None)
        request.status = Status.FINISHED
        if not self.running:
            for _, seq in self.padding:
                self._free_seq(seq)
            self.padding.clear()

    # ---- sequences: fork, finish, free ----------------------------------------------------
    def _fork(self, parent: Sequence, child: Sequence) -> Sequence:
        """fork(): the child maps all of the parent's frames (ref counts +1); the first write
        into a shared frame copies it. Samples fork at admission, beams when they branch."""
        self.blocks.fork(parent.seq_id, child.seq_id)
        child.num_computed = parent.num_computed
        return child

    def _apply_beam_step(self, request: Request, step: beam.BeamStep) -> None:
        """Apply one step of beam search (minipaged.beam): fork, extend and drop beams."""
        p = request.params
        for c in step.done:
            request.done_beams.append(Sequence(-1, c.parent.token_ids + [c.token], c.parent.prompt_len,
                                               cumulative_logprob=c.score, finish_reason="stop"))
        for seq in step.drop:
            seq.finish_reason = "pruned"
            self._free_seq(seq)
        live = []
        for c in step.fork + step.extend:  # children fork before their parent appends
            seq = c.parent
            if c in step.fork:
                seq = self._fork(c.parent, Sequence(self.new_seq_id(), list(c.parent.token_ids),
                                                    c.parent.prompt_len))
            seq.token_ids.append(c.token)
            seq.cumulative_logprob = c.score
            live.append(seq)
        request.seqs = live
        for i, seq in enumerate(live):
            seq.index = i
        max_output_len = min(p.max_tokens, self.config.max_model_len - len(request.prompt_token_ids))
        if beam.is_over(live, request.done_beams, p.beam_width, max_output_len):
            for seq in live:
                at_limit = len(seq.output_ids) >= max_output_len
                self._finish_seq(request, seq, "length" if at_limit else "pruned")
                if at_limit:
                    request.done_beams.append(seq)

    def _finish_seq(self, request: Request, seq: Sequence, reason: str) -> None:
        """A sequence is done: its frames go back at once (static: at the end of its batch)."""
        seq.finish_reason = reason
        if self.policy.keeps_finished_rows and self.blocks.has(seq.seq_id):
            self.padding.append((request, seq))
        else:
            self._free_seq(seq)

    def _free_seq(self, seq: Sequence) -> None:
        """Release a sequence's frames now (a pruned beam, the end of a batch, an abort)."""
        if self.blocks.has(seq.seq_id):
            self.blocks.free(seq.seq_id, seq.num_computed)

    # ---- the three phases ---------------------------------------------------------------
    def _reserve_decode_slots(self, batch: Batch) -> None:
        """Every live sequence of every running request gets a slot for its next token,
        preempting the most recently admitted requests while the frames do not suffice."""
        queue, self.running = deque(self.running), []
        while queue:
            request = queue.popleft()
            if request in self.prefilling:  # its prompt's frames are mapped: it needs no slot
                self.running.append(request)
                continue
            while not self.blocks.can_append_slots(*[s.seq_id for s in request.live]):
                victim = self._victim(request, queue)
                if victim is not request:
                    queue.remove(victim)
                self._preempt(victim, batch)
                if victim is request:
                    break
            else:
                self._schedule_decode(request, batch)

    def _victim(self, request: Request, queue: deque[Request]) -> Request:
        """Whom to preempt so that `request` can grow: the most recently admitted of those not
        yet scheduled this step (never a part-computed prompt), or `request` itself; under
        "priority", the least urgent of them (the largest priority value), latest admitted first."""
        candidates = [request] + [r for r in queue if r not in self.prefilling]  # (in admission order)
        if self.config.scheduling_policy != "priority":
            return candidates[-1]
        return max(reversed(candidates), key=lambda r: self.priorities.get(r, 0))  # max keeps the first of equals

    def _reserve_guesses(self, batch: Batch) -> None:
        """Speculative decoding: each decode gets slots for up to k guesses after its last
        token, within the step's token budget, the frames free now (a guess never preempts
        anyone) and what the sequence may still emit (the accepted guesses and one token more)."""
        budget = self.config.max_num_batched_tokens - batch.num_tokens
        for s in batch.scheduled:
            if s.kind != "decode" or s.request.beam_search or budget <= 0:
                continue
            seq, p = s.seq, s.request.params
            room = min(self.config.num_speculative_tokens, budget, p.max_tokens - len(seq.output_ids) - 1,
                       self.config.max_model_len - len(seq.token_ids) - 1)
            if room > 0:
                s.guess_slots, cows = self.blocks.append_guess_slots(seq.seq_id, room)
                batch.moves.copies += cows
                budget -= s.guess_slots

    def _swap_in(self, batch: Batch) -> None:
        while self.swapped:
            request = self.swapped[0]
            ids = [s.seq_id for s in request.live]
            if (not self.blocks.can_swap_in(*ids)
                    or self._num_running_seqs() + request.width > self.config.max_num_seqs):
                return
            self.swapped.popleft()
            batch.moves.swap_in += self.blocks.swap_in(*ids)
            self._schedule_decode(request, batch)  # its next token was sampled before it left

    def _admit(self, batch: Batch) -> None:
        budget, promised = self.blocks.num_free_frames, 0
        if self.waiting and self._counts_growth():  # working sets: the running ones' growth is promised
            promised = sum(self._growth(r) for r in self.running)
        while self.waiting:
            request = self._next_waiting()
            mapped = self._to_map(request)
            alone = not self.running  # a request that fits an idle engine is always admitted
            tokens = 1 if self.config.chunked_prefill else sum(len(s.token_ids) for s in mapped)
            if not alone and (self._num_running_seqs() + request.width > self.config.max_num_seqs
                              or batch.num_tokens + tokens > self.config.max_num_batched_tokens):
                return
            keep_free = 0 if alone or self.policy.reserves_whole_run else self.watermark_frames
            frames = self._frames_to_admit(request, mapped)
            growth = self._growth(request) if self._counts_growth() and not alone else 0
            if promised + frames + growth > budget - keep_free or not self.blocks.can_reserve(frames // len(mapped)):
                return
            promised += frames + growth
            self.waiting.remove(request)
            self._allocate(request, mapped, batch)
            if self.prefilling:  # a part-computed prompt: nobody may hit its blocks yet
                return

    def _counts_growth(self) -> bool:
        """Does admission count working sets? (A static batch reserves its whole run anyway.)"""
        return self.config.admission == "working-set" and not self.policy.reserves_whole_run

    def _growth(self, request: Request) -> int:
        """The frames a request's sequences will take in the next `admission_window` steps: one
        token a step each, up to its final length (prompt + max_tokens, what is known). Its
        working set is its frames now plus these: every step's attention reads all its frames,
        so none of them can be left out of memory. A contiguous chunk has its room reserved: 0."""
        final = self._final_len(request)
        length = max((len(s.token_ids) for s in request.live), default=final)
        grown = min(length + self.config.admission_window, final)
        return request.width * (self.blocks.frames_to_admit(grown, final) - self.blocks.frames_to_admit(length, final))

    def _next_waiting(self) -> Request:
        """The waiting request admission tries next (if it does not fit, nobody else is tried).
        Under `priority` (vLLM's), the smallest `priority=` given to `add_request`, ties in queue
        order (requests preempted by recompute first, then the oldest). Otherwise requests
        preempted by recompute come first, in their order, whatever the policy; then `fcfs` takes
        the oldest; `sjf` the smallest job (prompt + max_tokens tokens, what is known before it
        runs); `aging` the smallest job after forgiving `aging_rate` tokens per step waited.
        Aging bounds starvation: a job of S tokens waits only for requests that arrived fewer
        than (S - 1) / aging_rate steps after it (and those before it). Ties go to the oldest."""
        policy = self.config.scheduling_policy
        if policy == "priority":
            return min(self.waiting, key=lambda r: self.priorities.get(r, 0))  # min keeps the first of equals
        if policy == "fcfs" or any(s.output_ids for s in self.waiting[0].seqs):  # (preempted: at the front)
            return self.waiting[0]
        rate = self.config.aging_rate if policy == "aging" else 0.0

        def priority(request: Request) -> float:
            size = len(request.prompt_token_ids) + request.params.max_tokens
            return size - rate * (self.steps - self.arrived[request])

        return min(self.waiting, key=priority)  # min keeps the first (oldest) of equals

    # ---- the steps they share -------------------------------------------------------------
    def _schedule_decode(self, request: Request, batch: Batch) -> None:
        """One new slot per live sequence for its last sampled token (copying a shared frame
        first where needed); the request runs this step."""
        for seq in request.live:
            _, cow = self.blocks.append_slot(seq.seq_id, seq.token_ids[-1])
            if cow:
                batch.moves.copies.append(cow)
            batch.scheduled.append(Scheduled(seq, request, 1, [seq]))
        request.status = Status.RUNNING
        self.running.append(request)

    def _to_map(self, request: Request) -> list[Sequence]:
        """The sequences admission maps into frames: a fresh request with n > 1 samples maps
        one, and the others fork() from it; after a recompute, each live one is mapped."""
        live = request.live
        fresh = len(live) > 1 and not any(s.output_ids for s in live)
        return live[:1] if fresh else live

    def _frames_to_admit(self, request: Request, mapped: list[Sequence]) -> int:
        """Frames admission counts: the prompts' now (continuous: sequences grow later and are
        preempted if they must), or the worst case of the whole run (static: nobody is
        preempted, so every sequence's reservation is taken at once). A contiguous allocator
        counts the chunk it reserves either way."""
        p = request.params
        final_len = self._final_len(request)
        if not self.policy.reserves_whole_run:
            return sum(self.blocks.frames_to_admit(len(s.token_ids), final_len) for s in mapped)
        return max(p.n, p.beam_width) * self.blocks.frames_to_admit(final_len, final_len)

    def _final_len(self, request: Request) -> int:
        """The longest the request's sequences can grow (a contiguous allocator reserves for it)."""
        return min(len(request.prompt_token_ids) + request.params.max_tokens, self.config.max_model_len)

    def _allocate(self, request: Request, mapped: list[Sequence], batch: Batch) -> None:
        """Map the sequences (prefix-cache hits reused), fork the rest of a fresh request's
        samples (they share the prompt's frames and sample from the same logits), and schedule
        the tokens not yet in the cache (or their first chunk)."""
        first, live = mapped[0], request.live
        for seq in mapped:
            seq.num_computed = self.blocks.allocate(seq.seq_id, seq.token_ids, self._final_len(request))
            batch.cached_tokens += seq.num_computed
        for seq in live[len(mapped):]:
            self._fork(first, seq)
        if not first.output_ids:  # first admission: later ones find generated tokens cached too
            request.num_cached_tokens = first.num_computed
        request.status = Status.RUNNING
        self.running.append(request)
        self.prefilling[request] = [(seq, live if len(mapped) < len(live) else [seq]) for seq in mapped]
        self._schedule_prefill(request, batch)

    def _schedule_prefill(self, request: Request, batch: Batch) -> None:
        """Schedule the request's prompt tokens not yet computed: all of them, or with chunked
        prefill what this step's token budget leaves (the samplers run at the last chunk). The
        several sequences of a recomputed request are prefilled in one step: they sample together."""
        pending = self.prefilling[request]
        chunked = self.config.chunked_prefill and len(pending) == 1
        while pending:
            seq, samplers = pending[0]
            left = len(seq.token_ids) - seq.num_computed
            n = min(left, self.config.max_num_batched_tokens - batch.num_tokens) if chunked else left
            if n < 1:
                return
            batch.scheduled.append(Scheduled(seq, request, n, samplers if n == left else [], "prefill"))
            if n < left:
                return
            pending.pop(0)
        del self.prefilling[request]

    def _preempt(self, request: Request, batch: Batch) -> None:
        """Take a running request's frames away: to host memory (swap; recompute when the host
        pool is full too) or for good (recompute). The caller drops it from `running`."""
        ids = [s.seq_id for s in request.live]
        mode = self.config.preemption_mode
        if mode == "swap" and self.blocks.can_swap_out(*ids):  # (contiguous: never, no host pool)
            batch.moves.swap_out += self.blocks.swap_out(*ids)
            request.status = Status.SWAPPED
            self.swapped.append(request)
        else:
            mode = "recompute"
            for seq in request.live:
                self.blocks.free(seq.seq_id)
                seq.num_computed = 0
            request.status = Status.WAITING
            self.waiting.appendleft(request)
        batch.preempted.append((request.request_id, mode))

    def _num_running_seqs(self) -> int:
        return sum(r.width for r in self.running)


__all__ = ["Scheduler", "SchedulerConfig", "BatchingPolicy", "CONTINUOUS", "STATIC", "POLICIES", "WAITING_ORDERS", "ADMISSIONS",
           "Sequence", "Request", "Batch", "Scheduled", "Status"]
