"""The continuous batcher: at every step, decide which sequences run and how many tokens each.

Iteration-level scheduling (Orca, OSDI 2022) over paged memory (vLLM, SOSP 2023). Three queues,
first come first served: `waiting` (not yet in memory), `running` (frames on the device) and
`swapped` (frames in host memory). Each `schedule()` call, in this order:

1. Running requests each get a slot for their next token. When frames run out, the most
   recently admitted request is preempted: by *recompute* (its frames are freed and it goes
   back to the front of `waiting`; its prompt and generated tokens are prefilled again later)
   or by *swap* (its frames are copied to host memory and it waits in `swapped`).
2. If nobody was preempted, swapped requests come back first, oldest first.
3. If nobody is swapped out, waiting requests are admitted while their frames fit (keeping a
   small watermark of free frames so running sequences can grow), within `max_num_seqs`
   sequences and `max_num_batched_tokens` tokens per step.

Prefill and decode are mixed in one step: the runner flattens all sequences' new tokens into
one batch anyway, so a newly admitted prompt joins the running decodes at once instead of
making them wait a step (no chunked prefill: a prompt is computed in one step, which is why
`max_num_batched_tokens` must be at least `max_model_len`).

The same scheduler runs the pre-Orca baseline under the `STATIC` policy: a batch is formed
only when the last one is done, reserves its whole run's memory up front, and its finished
sequences stay in it as padding rows until its longest member finishes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from minipaged.paging import BlockManager, MemoryMoves
from minipaged.sampling import SamplingParams


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """One continuation of a prompt. The KV of token_ids[:num_computed] is in the cache."""
    seq_id: int
    token_ids: list[int]
    prompt_len: int
    index: int = 0                # which sample / beam of its request
    num_computed: int = 0
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    generator: object = None      # the sampler's random stream
    detokenizer: object = None    # the engine's incremental detokenizer
    text: str = ""
    released: int = 0             # characters of `text` handed out (the rest may start a stop string)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True, eq=False)
class Request:
    """A user's request: a prompt and its sequences (n samples, or the live beams)."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    arrival: int = 0
    status: Status = Status.WAITING
    num_cached_tokens: int = 0      # prompt tokens found in the prefix cache at first admission
    done_beams: list[Sequence] = field(default_factory=list)  # finished beam hypotheses

    @property
    def live(self) -> list[Sequence]:
        return [s for s in self.seqs if not s.finished]

    @property
    def beam_search(self) -> bool:
        return self.params.beam_width > 1


@dataclass(slots=True)
class Scheduled:
    """One sequence in this step's batch: its last `num_new_tokens` tokens are computed.
    `samplers` are the sequences that take their next token from its logits (itself, or all n
    samples of a prompt that they still share)."""
    seq: Sequence
    request: Request
    num_new_tokens: int
    samplers: list[Sequence]
    kind: str = "decode"  # or "prefill": the sequence's tokens enter the cache now


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


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    preemption_mode: str = "recompute"   # or "swap"
    watermark: float = 0.01              # fraction of frames admission leaves free
    max_model_len: int = 2048            # the longest a sequence may grow
    policy: str = "continuous"           # or "static": the pre-Orca baseline

    def __post_init__(self):
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"scheduler must be one of {sorted(POLICIES)}, got {self.policy!r}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be at least 1")


class Scheduler:
    """Batching over a BlockManager (see the module docstring for the policy)."""

    def __init__(self, config: SchedulerConfig, blocks: BlockManager):
        self.config, self.blocks, self.policy = config, blocks, POLICIES[config.policy]
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.padding: list[tuple[Request, Sequence]] = []  # static: finished rows of the batch
        self.watermark_frames = int(config.watermark * blocks.num_frames)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self) -> Batch:
        batch = Batch()
        self._reserve_decode_slots(batch)
        if not batch.preempted:
            self._swap_in(batch)
        if not batch.preempted and not self.swapped and (self.policy.joins_running_batch or not self.running):
            self._admit(batch)
        batch.padding = list(self.padding)
        return batch

    def finish_seq(self, request: Request, seq: Sequence) -> None:
        """A sequence is done: its frames go back at once (static: at the end of its batch)."""
        if self.policy.keeps_finished_rows and self.blocks.has(seq.seq_id):
            self.padding.append((request, seq))
        else:
            self.free_seq(seq)

    def free_seq(self, seq: Sequence) -> None:
        """Release a sequence's frames now (a pruned beam, or the end of a batch)."""
        if self.blocks.has(seq.seq_id):
            self.blocks.free(seq.seq_id)

    def finish(self, request: Request) -> None:
        """A request whose sequences are all finished (or aborted) leaves its queue. A static
        batch ends with its last request: then its padding rows leave too."""
        for queue in (self.waiting, self.running, self.swapped):
            if request in queue:
                queue.remove(request)
        request.status = Status.FINISHED
        if not self.running:
            for _, seq in self.padding:
                self.free_seq(seq)
            self.padding.clear()

    # ---- the three phases ---------------------------------------------------------------
    def _reserve_decode_slots(self, batch: Batch) -> None:
        """Every live sequence of every running request gets a slot for its next token,
        preempting the most recently admitted requests while the frames do not suffice."""
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

    def _swap_in(self, batch: Batch) -> None:
        while self.swapped:
            request = self.swapped[0]
            ids = [s.seq_id for s in request.live]
            if (not self.blocks.can_swap_in(*ids)
                    or self._num_running_seqs() + len(ids) > self.config.max_num_seqs):
                return
            self.swapped.popleft()
            batch.moves.swap_in += self.blocks.swap_in(*ids)
            self._schedule_decode(request, batch)  # its next token was sampled before it left

    def _admit(self, batch: Batch) -> None:
        budget, promised = self.blocks.num_free_frames, 0
        while self.waiting:
            request = self.waiting[0]
            mapped = self._to_map(request)
            alone = not self.running  # a request that fits an idle engine is always admitted
            if not alone and (self._num_running_seqs() + len(request.live) > self.config.max_num_seqs
                              or batch.num_tokens + sum(len(s.token_ids) for s in mapped)
                              > self.config.max_num_batched_tokens):
                return
            keep_free = 0 if alone or self.policy.reserves_whole_run else self.watermark_frames
            if promised + self._frames_to_admit(request, mapped) > budget - keep_free:
                return
            promised += self._frames_to_admit(request, mapped)
            self.waiting.popleft()
            self._allocate(request, mapped, batch)

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
        preempted, so every sequence's reservation is taken at once)."""
        if not self.policy.reserves_whole_run:
            return sum(self.blocks.frames_for(len(s.token_ids)) for s in mapped)
        p = request.params
        final_len = min(len(request.prompt_token_ids) + p.max_tokens, self.config.max_model_len)
        return max(p.n, p.beam_width) * self.blocks.frames_for(final_len)

    def _allocate(self, request: Request, mapped: list[Sequence], batch: Batch) -> None:
        """Map the sequences (prefix-cache hits reused), fork the rest of a fresh request's
        samples (they share the prompt's frames and sample from the same logits), and schedule
        the tokens not yet in the cache."""
        first, live = mapped[0], request.live
        for seq in mapped:
            seq.num_computed = self.blocks.allocate(seq.seq_id, seq.token_ids)
            batch.cached_tokens += seq.num_computed
            samplers = live if len(mapped) < len(live) else [seq]
            batch.scheduled.append(Scheduled(seq, request, len(seq.token_ids) - seq.num_computed,
                                             samplers, "prefill"))
        for seq in live[len(mapped):]:
            self.blocks.fork(first.seq_id, seq.seq_id)
            seq.num_computed = first.num_computed
        if not first.output_ids:  # first admission: later ones find generated tokens cached too
            request.num_cached_tokens = first.num_computed
        request.status = Status.RUNNING
        self.running.append(request)

    def _preempt(self, request: Request, batch: Batch) -> None:
        """Take a running request's frames away: to host memory (swap; recompute when the host
        pool is full too) or for good (recompute). The caller drops it from `running`."""
        ids = [s.seq_id for s in request.live]
        mode = self.config.preemption_mode
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
        return sum(len(r.live) for r in self.running)


__all__ = ["Scheduler", "SchedulerConfig", "BatchingPolicy", "CONTINUOUS", "STATIC", "POLICIES",
           "Sequence", "Request", "Batch", "Scheduled", "Status"]
