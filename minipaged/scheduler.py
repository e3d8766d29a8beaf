"""The continuous batcher (Orca's iteration-level scheduling over vLLM's paged memory).

Each step, `schedule()` picks the batch and the frames it needs; after the forward pass,
`update()` appends the sampled tokens, forks beams and finishes sequences. The engine
and the simulator call the same two. Every choice an idea changes is asked of a policy
(policies/).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from minipaged import beam, policies
from minipaged.paging import BlockManager, MemoryMoves, check_size
from minipaged.policies import ADMISSIONS, WAITING_ORDERS, PolicyError, checks
from minipaged.sequence import Request, Sequence, Status


@dataclass(slots=True)
class Scheduled:
    """One sequence in this step's batch: its `num_new_tokens` tokens after
    `seq.num_computed` are computed (all of them but at a prompt chunk that is not its
    last). `samplers` are the sequences that take their next token from its logits
    (itself, or all n samples of a prompt that they still share)."""

    seq: Sequence
    request: Request
    num_new_tokens: int
    samplers: list[Sequence]
    kind: str = "decode"  # or "prefill": the sequence's tokens enter the cache now
    # the lookahead's slots after its next token (tokens it may run too)
    extra_slots: int = 0


@dataclass(slots=True)
class Batch:
    """What one step runs, and the memory moves to make before it runs."""

    scheduled: list[Scheduled] = field(default_factory=list)
    # static: finished rows, computed anyway
    padding: list[tuple[Request, Sequence]] = field(default_factory=list)
    # swaps and copy-on-write, before the forward
    moves: MemoryMoves = field(default_factory=MemoryMoves)
    # (request_id, "recompute"/"swap")
    preempted: list[tuple[str, str]] = field(default_factory=list)
    cached_tokens: int = 0  # prefix-cache hits admitted

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    # decode rows per step while several clients run (each client's first row
    # always); 0: every running row
    max_decode_rows: int = 0
    # tokens per step; 0: 512 with chunked prefill, else max(4096, max_model_len)
    max_num_batched_tokens: int = 0
    preemption_mode: str = "recompute"  # or "swap"
    watermark: float = 0.01  # fraction of frames admission leaves free
    max_model_len: int = 2048  # the longest a sequence may grow
    # or "static": the pre-Orca baseline (policies/batching.py)
    batching: str = "continuous"
    # split prompts to fit max_num_batched_tokens per step
    chunked_prefill: bool = False
    # the seams (policies/): a name of WAITING_ORDERS / ADMISSIONS, a "module:Class"
    # path, or an object
    scheduling_policy: object = "fcfs"  # the waiting order (vLLM's name for the option)
    admission: object = "greedy"  # may a request join now
    # whom to preempt; None: the waiting order's, else the newest
    preemption_victim: object = None
    aging_rate: float = 8.0  # a setting of the waiting order that reads it
    admission_window: int = 16  # a setting of the admission that reads it

    def __post_init__(self):
        policies.scheduler_policies(self)  # a bad name or setting, now
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(
                "preemption_mode must be 'recompute' or 'swap', got"
                f" {self.preemption_mode!r}"
            )
        if self.batching not in policies.SEAMS["scheduler"]:
            raise ValueError(
                f"scheduler must be one of {sorted(policies.SEAMS['scheduler'])}, got"
                f" {self.batching!r}"
            )
        if not isinstance(self.watermark, (int, float)) or not 0 <= self.watermark < 1:
            raise ValueError(
                f"watermark must be a fraction in [0, 1), got {self.watermark!r}"
            )
        check_size("max_num_seqs", self.max_num_seqs, minimum=1)
        check_size("max_decode_rows", self.max_decode_rows, minimum=0)
        check_size("max_num_batched_tokens", self.max_num_batched_tokens, minimum=0)
        if not self.max_num_batched_tokens:
            self.max_num_batched_tokens = max(4096, self.max_model_len)
            if self.chunked_prefill:
                self.max_num_batched_tokens = 512
        policies.check_options(
            batching=self.batching,
            chunked_prefill=self.chunked_prefill,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            max_decode_rows=self.max_decode_rows,
        )


class Scheduler:
    """Batching over a BlockManager. Three queues: `waiting` (not yet in memory),
    `running` (frames on the device) and `swapped` (frames in host memory). Each
    `schedule()`:

    1. Running requests each get a slot for their next token (with `max_decode_rows`,
       while several clients' requests run: each client's first, then the waiting
       order's choice within the bound; the others keep their frames and sit the step
       out). When frames run out, a
       request is preempted (`victim`'s choice; by default the most recently admitted):
       by *recompute* (its frames are freed and it goes back to the front of `waiting`,
       to be prefilled again) or by *swap* (its frames are copied to host memory and it
       waits in `swapped`).
    2. If nobody was preempted, swapped requests come back first, oldest first.
    3. If nobody is swapped out, waiting requests are admitted in `order`'s choice while
       they fit (`_fits`): their frames, keeping a small watermark free so running
       sequences can grow, and what `admission` promises to growth; within
       `max_num_seqs` sequences and `max_num_batched_tokens` tokens per step.
    4. A `lookahead` may give decode rows slots for extra tokens, checked by the same
       forward.

    Prefill and decode share a step: a newly admitted prompt joins the running decodes
    at once. With `chunked_prefill`, decodes go first and a prompt takes what is left of
    the token budget, a chunk per step; while a prompt is part-computed nobody else is
    admitted (a prefix-cache hit on its blocks would read K and V not written yet) and
    it is never preempted. `batching` (policies/batching.py) says whether requests join
    a running batch, whether admission reserves the whole run, and whether finished rows
    stay as padding.
    """

    def __init__(self, config: SchedulerConfig, blocks: BlockManager, lookahead=None):
        self.config = config
        self.blocks = blocks
        self.lookahead = lookahead
        self.batching = policies.SEAMS["scheduler"][config.batching]
        self.order, self.admission, self.victim = policies.scheduler_policies(config)
        self.policy_errors: list[PolicyError] = []  # failed answers, defaults used
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        # static: finished rows of the batch
        self.padding: list[tuple[Request, Sequence]] = []
        # (seq, samplers) left
        self.prefilling: dict[Request, list[tuple[Sequence, list[Sequence]]]] = {}
        self.watermark_frames = int(config.watermark * blocks.num_frames)
        # new sequences' ids: a request's samples, beams' forks
        self.seq_ids = itertools.count()
        self.steps = 0  # schedule() calls so far: the time waits are counted in

    def add(self, request: Request, priority: int = 0) -> None:
        request.arrival = self.steps
        request.priority = priority
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self) -> Batch:
        """This step's batch, whole: who runs, their tokens, and the memory moves to
        make first."""
        batch = Batch()
        self.steps += 1
        self._reserve_decode_slots(batch)
        if not batch.preempted:
            self._swap_in(batch)
        for request in list(self.prefilling):
            self._schedule_prefill(request, batch)
        if (
            not batch.preempted
            and not self.swapped
            and not self.prefilling
            and (self.batching.joins_running_batch or not self.running)
        ):
            self._admit(batch)
        batch.padding = list(self.padding)
        if self.lookahead is not None:
            self.lookahead.reserve(
                batch,
                self.config.max_num_batched_tokens - batch.num_tokens,
                self.config.max_model_len,
            )
        # the tier's stores and loads, in order
        batch.moves.tier = self.blocks.take_tier_moves()
        return batch

    def new_seq_id(self) -> int:
        return next(self.seq_ids)

    def update(
        self,
        batch: Batch,
        sampled: dict[Sequence, int],
        *,
        accepted: dict[Sequence, list[int]] | None = None,
        stopped=frozenset(),
        beams: dict[Request, beam.BeamStep] | None = None,
    ) -> list[Request]:
        """After the forward pass: every scheduled sequence's new tokens now have K
        and V in the cache. Each sampler appends its `accepted` extra tokens (the
        lookahead's, computed this step) and its `sampled` token, and finishes if it
        is in `stopped` (eos, a stop string) or at its length limit; a beam search
        applies its BeamStep instead. Returns the requests that finished, in the
        order they ran."""
        if accepted is None:
            accepted = {}
        request_of = self._mark_computed(batch, accepted)
        for seq, token in sampled.items():
            kept = accepted.get(seq, [])
            self._append(request_of[seq], seq, kept, token, seq in stopped)
        for request, beam_step in (beams or {}).items():
            beam.apply(request, beam_step, self, self.config.max_model_len)
        finished = []
        for row in batch.scheduled:
            if not row.request.live and row.request not in finished:
                finished.append(row.request)
        for request in finished:
            self.finish(request)
        return finished

    def _mark_computed(self, batch: Batch, accepted: dict) -> dict:
        """Each row's new tokens are computed (a prompt chunk samples nothing), and the
        waiting order hears what each row was served. Returns each sampler's request."""
        request_of = {}
        for row in batch.scheduled:
            row.seq.num_computed += row.num_new_tokens
            kept = len(accepted.get(row.seq, ()))
            num_tokens = row.num_new_tokens + kept
            checks.served(self.order, row, num_tokens, self.policy_errors)
            for seq in row.samplers:
                # the samplers of a prompt share its frames: what row.seq holds is
                # computed for each of them (row.seq itself among them)
                seq.num_computed = len(row.seq.token_ids)
                request_of[seq] = row.request
        return request_of

    def _append(self, request, seq, accepted, token: int, stopped: bool) -> None:
        """A sampler takes its accepted extra tokens (their K and V are in the cache)
        and its sampled token; it finishes at a stop or at its length limit."""
        seq.num_computed += len(accepted)
        seq.token_ids.extend(accepted)
        seq.token_ids.append(token)
        if stopped:
            self.finish_seq(request, seq, "stop")
        elif len(seq.output_ids) >= request.params.max_tokens:
            self.finish_seq(request, seq, "length")
        elif len(seq.token_ids) >= self.config.max_model_len:
            self.finish_seq(request, seq, "length")

    def abort(self, request: Request) -> None:
        """Stop a request now, wherever it is, and free its frames."""
        for seq in request.live:
            self.finish_seq(request, seq, "abort")
        self.finish(request)

    def finish(self, request: Request) -> None:
        """A request whose sequences are all finished (or aborted) leaves its queue. A
        static batch ends with its last request: then its padding rows leave too."""
        for queue in (self.waiting, self.running, self.swapped):
            if request in queue:
                queue.remove(request)
        self.prefilling.pop(request, None)
        request.status = Status.FINISHED
        if not self.running:
            for _, seq in self.padding:
                self.free_seq(seq)
            self.padding.clear()

    def worst_case_frames(self, prompt_len: int, params) -> int:
        """The most frames a request can hold at once: every sample or beam with its own
        copy of
        prompt and output, as after a recompute (what must fit the pool, even alone)."""
        final_len = min(prompt_len + params.max_tokens, self.config.max_model_len)
        return max(params.n, params.beam_width) * self.blocks.frames_to_admit(
            final_len, final_len
        )

    # ---- sequences: fork, finish, free -----------------------------------------------
    def _fork(self, parent: Sequence, child: Sequence) -> Sequence:
        """fork(): the child maps all of the parent's frames (ref counts +1); the first
        write into a shared frame copies it. Samples fork at admission, beams when they
        branch.
        """
        self.blocks.fork(parent.seq_id, child.seq_id)
        child.num_computed = parent.num_computed
        return child

    def fork_seq(self, parent: Sequence) -> Sequence:
        """A new sequence forked from `parent`, with its tokens so far (a beam that
        branches)."""
        return self._fork(
            parent,
            Sequence(self.new_seq_id(), list(parent.token_ids), parent.prompt_len),
        )

    def finish_seq(self, request: Request, seq: Sequence, reason: str) -> None:
        """A sequence is done: its frames go back at once (static: at the end of its
        batch)."""
        seq.finish_reason = reason
        if self.batching.keeps_finished_rows and self.blocks.has(seq.seq_id):
            self.padding.append((request, seq))
        else:
            self.free_seq(seq)

    def free_seq(self, seq: Sequence) -> None:
        """Release a sequence's frames now (a pruned beam, the end of a batch, an
        abort)."""
        if self.blocks.has(seq.seq_id):
            self.blocks.free(seq.seq_id, seq.num_computed)

    # ---- the three phases ------------------------------------------------------------
    def _reserve_decode_slots(self, batch: Batch) -> None:
        """Every live sequence of every running request gets a slot for its next token,
        preempting the victim's choice while the frames do not suffice: among this
        request and those not yet scheduled this step (never a part-computed prompt), in
        admission order.
        """
        queue = deque(self.running)
        self.running = []
        resting = self._resting(queue)
        while queue:
            request = queue.popleft()
            # its prompt's frames are mapped, or it sits out: it needs no slot
            if request in self.prefilling or request in resting:
                self.running.append(request)
                continue
            while not self.blocks.can_append_slots(*[s.seq_id for s in request.live]):
                candidates = [request]
                candidates += [r for r in queue if r not in self.prefilling]
                victim = checks.victim(self.victim, candidates, self.policy_errors)
                if victim is not request:
                    queue.remove(victim)
                self._preempt(victim, batch)
                if victim is request:
                    break
            else:
                self._schedule_decode(request, batch)

    def _resting(self, running) -> set[Request]:
        """The running requests that sit this step out. While requests of several
        clients run and their rows exceed max_decode_rows, the waiting order ranks
        them; each client's first decodes, then the others in rank while the rows stay
        within the bound. The rest wait with their frames.
        """
        limit = self.config.max_decode_rows
        ready = [r for r in running if r not in self.prefilling]
        clients = {r.client for r in ready}
        rows = sum(r.width for r in ready)
        if not limit or rows <= limit or len(clients) < 2:
            return set()
        ranked = checks.rank(self.order, ready, self.steps, self.policy_errors)
        first = {}
        for request in ranked:
            first.setdefault(request.client, request)
        taken = sum(r.width for r in first.values())
        resting = set()
        for request in ranked:
            if first[request.client] is request:
                continue
            if taken + request.width > limit:
                resting.add(request)
            else:
                taken += request.width
        return resting

    def _swap_in(self, batch: Batch) -> None:
        while self.swapped:
            request = self.swapped[0]
            ids = [s.seq_id for s in request.live]
            if (
                not self.blocks.can_swap_in(*ids)
                or self._num_running_seqs() + request.width > self.config.max_num_seqs
            ):
                return
            self.swapped.popleft()
            batch.moves.swap_in += self.blocks.swap_in(*ids)
            # its next token was sampled before it left
            self._schedule_decode(request, batch)

    def _admit(self, batch: Batch) -> None:
        """Admit waiting requests, the waiting order's choice first, while each one
        fits; the first that does not stops admission (nobody overtakes it). The frames
        the admission
        policy promises to the running requests' growth are not free to take."""
        if not self.waiting:
            return
        free = self.blocks.num_free_frames - sum(self._growth(r) for r in self.running)
        while self.waiting:
            request = checks.pick(
                self.order, self.waiting, self.steps, self.policy_errors
            )
            mapped = self._to_map(request)
            frames = self._frames_to_admit(request, mapped)
            growth = 0
            if self.running:
                growth = self._growth(request)
            if not self._fits(request, mapped, frames, free - growth, batch):
                return
            free -= frames + growth
            self.waiting.remove(request)
            self._allocate(request, mapped, batch)
            if self.prefilling:  # a part-computed prompt: nobody may hit its blocks yet
                return

    def _fits(
        self,
        request: Request,
        mapped: list[Sequence],
        frames: int,
        free: int,
        batch: Batch,
    ) -> bool:
        """May this request join now: its sequences within max_num_seqs, its prompt
        tokens within the step's budget, its frames within the free frames less the
        watermark (and in one piece, for a contiguous allocator). A request that fits
        an idle engine is always admitted, limits and watermark aside, or it would
        wait forever."""
        keep_free = 0
        if self.running:
            if not self._within_limits(request, mapped, batch):
                return False
            if not self.batching.reserves_whole_run:
                keep_free = self.watermark_frames
        if frames > free - keep_free:
            return False
        return self.blocks.can_reserve(frames // len(mapped))

    def _within_limits(self, request, mapped: list[Sequence], batch: Batch) -> bool:
        """Its sequences within max_num_seqs, its prompt within the step's tokens."""
        tokens = sum(len(s.token_ids) for s in mapped)
        if self.config.chunked_prefill:
            tokens = 1  # a chunk of what the step leaves
        seqs = self._num_running_seqs() + request.width
        if seqs > self.config.max_num_seqs:
            return False
        return batch.num_tokens + tokens <= self.config.max_num_batched_tokens

    def _growth(self, request: Request) -> int:
        """The frames admission promises to a request's growth (a whole-run reservation
        has none left)."""
        if self.batching.reserves_whole_run:
            return 0
        final_len = self._final_len(request)
        return checks.growth(
            self.admission, request, self.blocks, final_len, self.policy_errors
        )

    def take_policy_errors(self) -> list[PolicyError]:
        """The policies' failures since the last call (paging's replacement too);
        each decision was taken by the seam's default instead."""
        errors = self.policy_errors
        for policy, what in self.blocks.take_policy_errors():
            errors.append(PolicyError("prefix_cache_policy", policy, what))
        self.policy_errors = []
        return errors

    # ---- the steps they share --------------------------------------------------------
    def _schedule_decode(self, request: Request, batch: Batch) -> None:
        """One new slot per live sequence for its last sampled token (copying a shared
        frame first where needed); the request runs this step."""
        for seq in request.live:
            _, cow = self.blocks.append_slot(seq.seq_id, seq.token_ids[-1])
            if cow:
                batch.moves.copies.append(cow)
            batch.scheduled.append(Scheduled(seq, request, 1, [seq]))
        request.status = Status.RUNNING
        self.running.append(request)

    def _to_map(self, request: Request) -> list[Sequence]:
        """The sequences admission maps into frames: a fresh request with n > 1 samples
        maps one, and the others fork() from it; after a recompute, each live one is
        mapped.
        """
        live = request.live
        fresh = len(live) > 1 and not any(s.output_ids for s in live)
        if fresh:
            return live[:1]
        return live

    def _frames_to_admit(self, request: Request, mapped: list[Sequence]) -> int:
        """Frames admission counts: the prompts' now (continuous: sequences grow later
        and are preempted if they must), or the worst case of the whole run (static:
        nobody is preempted, so every sequence's reservation is taken at once). A
        contiguous allocator counts the chunk it reserves either way."""
        if self.batching.reserves_whole_run:
            return self.worst_case_frames(len(request.prompt_token_ids), request.params)
        return sum(
            self.blocks.frames_to_admit(len(s.token_ids), self._final_len(request))
            for s in mapped
        )

    def _final_len(self, request: Request) -> int:
        """The longest the request's sequences can grow (a contiguous allocator reserves
        for it)."""
        return min(
            len(request.prompt_token_ids) + request.params.max_tokens,
            self.config.max_model_len,
        )

    def _allocate(self, request: Request, mapped: list[Sequence], batch: Batch) -> None:
        """Map the sequences (prefix-cache hits reused), fork the rest of a fresh
        request's samples (they share the prompt's frames and sample from the same
        logits), and schedule the tokens not yet in the cache (or their first chunk)."""
        first = mapped[0]
        live = request.live
        for seq in mapped:
            seq.num_computed = self.blocks.allocate(
                seq.seq_id,
                seq.token_ids,
                self._final_len(request),
                read_cache=not request.params.skip_reading_prefix_cache,
            )
            batch.cached_tokens += seq.num_computed
        for seq in live[len(mapped) :]:
            self._fork(first, seq)
        # first admission: later ones find generated tokens cached too
        if not first.output_ids:
            request.num_cached_tokens = first.num_computed
        request.status = Status.RUNNING
        self.running.append(request)
        if len(mapped) < len(live):  # one prompt, sampled by all
            self.prefilling[request] = [(first, live)]
        else:  # each sequence its own prompt and sampler
            self.prefilling[request] = [(seq, [seq]) for seq in mapped]
        self._schedule_prefill(request, batch)

    def _schedule_prefill(self, request: Request, batch: Batch) -> None:
        """Schedule the request's prompt tokens not yet computed: all of them, or with
        chunked prefill what this step's token budget leaves (the samplers run at the
        last chunk). The several sequences of a recomputed request are prefilled in one
        step: they sample together.
        """
        pending = self.prefilling[request]
        chunked = self.config.chunked_prefill and len(pending) == 1
        while pending:
            seq, samplers = pending[0]
            left = len(seq.token_ids) - seq.num_computed
            n = left
            if chunked:
                budget = self.config.max_num_batched_tokens - batch.num_tokens
                n = min(left, budget)
            if n < 1:
                return
            if n < left:  # a chunk: its samplers run at the last one
                row = Scheduled(seq, request, n, [], "prefill")
                batch.scheduled.append(row)
                return
            batch.scheduled.append(Scheduled(seq, request, n, samplers, "prefill"))
            pending.pop(0)
        del self.prefilling[request]

    def _preempt(self, request: Request, batch: Batch) -> None:
        """Take a running request's frames away: to host memory (swap; recompute when
        the host pool is full too) or for good (recompute). The caller drops it from
        `running`.
        """
        ids = [s.seq_id for s in request.live]
        mode = self.config.preemption_mode
        # (a contiguous allocator never can: it has no host pool)
        if mode == "swap" and self.blocks.can_swap_out(*ids):
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


__all__ = [
    "Scheduler",
    "SchedulerConfig",
    "WAITING_ORDERS",
    "ADMISSIONS",
    "Sequence",
    "Request",
    "Batch",
    "Scheduled",
    "Status",
]
