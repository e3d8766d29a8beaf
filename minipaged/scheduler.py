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

`StaticScheduler` is the pre-Orca baseline: a batch is formed once, over the static allocator,
and runs until its longest member finishes; nobody joins in between.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from minipaged.paging import BlockManager, CowPair, StaticBlockManager
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
    num_cached_tokens: int = 0      # prompt tokens found in the prefix cache
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
    copies: list[CowPair] = field(default_factory=list)          # copy-on-write (src, dst)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device, host) frames
    swap_in: list[tuple[int, int]] = field(default_factory=list)   # (host, device) frames
    preempted: list[tuple[str, str]] = field(default_factory=list)  # (request_id, mode)
    cached_tokens: int = 0                                      # prefix-cache hits admitted

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    preemption_mode: str = "recompute"   # or "swap"
    watermark: float = 0.01              # fraction of frames admission leaves free

    def __post_init__(self):
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be at least 1")


class Scheduler:
    """Continuous batching over a BlockManager (see the module docstring for the policy)."""

    def __init__(self, config: SchedulerConfig, blocks: BlockManager):
        self.config, self.blocks = config, blocks
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.watermark_frames = int(config.watermark * blocks.device.num_blocks)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self) -> Batch:
        batch = Batch()
        self._reserve_decode_slots(batch)
        if not batch.preempted:
            self._swap_in(batch)
        if not batch.preempted and not self.swapped:
            self._admit(batch)
        return batch

    def finish(self, request: Request) -> None:
        """Remove a finished (or aborted) request from its queue and free its frames."""
        for queue in (self.waiting, self.running, self.swapped):
            if request in queue:
                queue.remove(request)
        for seq in request.seqs:
            self.free_seq(seq)
        request.status = Status.FINISHED

    def free_seq(self, seq: Sequence) -> None:
        if seq.seq_id in self.blocks.tables:
            self.blocks.free(seq.seq_id)

    def seq_finished(self, seq: Sequence) -> None:
        """A sequence of a running request is done: its frames go back at once."""
        self.free_seq(seq)

    # ---- the three phases ---------------------------------------------------------------
    def _reserve_decode_slots(self, batch: Batch) -> None:
        """Every live sequence of every running request gets a slot for its next token."""
        queue, kept = deque(self.running), []
        while queue:
            request = queue.popleft()
            ids = [s.seq_id for s in request.live]
            while not self.blocks.can_append_slots(*ids):
                victim = queue.pop() if queue else request  # the most recently admitted
                self._preempt(victim, batch)
                if victim is request:
                    break
            else:
                for seq in request.live:
                    _, cow = self.blocks.append_slot(seq.seq_id, seq.token_ids[-1])
                    if cow:
                        batch.copies.append(cow)
                    batch.scheduled.append(Scheduled(seq, request, 1, [seq]))
                kept.append(request)
        self.running = kept

    def _swap_in(self, batch: Batch) -> None:
        while self.swapped:
            request = self.swapped[0]
            ids = [s.seq_id for s in request.live]
            if (not self.blocks.can_swap_in(*ids)
                    or len(self._running_seqs()) + len(ids) > self.config.max_num_seqs):
                return
            self.swapped.popleft()
            batch.swap_in += self.blocks.swap_in(*ids)
            for seq in request.live:  # its next token was sampled before it left
                _, cow = self.blocks.append_slot(seq.seq_id, seq.token_ids[-1])
                if cow:
                    batch.copies.append(cow)
                batch.scheduled.append(Scheduled(seq, request, 1, [seq]))
            request.status = Status.RUNNING
            self.running.append(request)

    def _admit(self, batch: Batch) -> None:
        while self.waiting:
            request = self.waiting[0]
            live = request.live
            new_tokens = sum(len(s.token_ids) for s in live)  # an upper bound: hits lower it
            frames = sum(-(-len(s.token_ids) // self.blocks.block_size) for s in live)
            alone = not self.running  # a request that fits an idle engine is always admitted
            if not alone and (len(self._running_seqs()) + len(live) > self.config.max_num_seqs
                              or batch.num_tokens + new_tokens > self.config.max_num_batched_tokens):
                return
            if frames > self.blocks.num_free_frames - (0 if alone else self.watermark_frames):
                return
            self.waiting.popleft()
            self._allocate(request, batch)
            request.status = Status.RUNNING
            self.running.append(request)

    def _allocate(self, request: Request, batch: Batch) -> None:
        """Map a request's sequences into frames (prefix-cache hits reused) and schedule the
        tokens not yet in the cache. A fresh request with n > 1 samples maps one sequence and
        fork()s the others from it: they share the prompt's frames, and take their first token
        from the same logits."""
        fresh = all(s.num_computed == 0 and len(s.token_ids) == request.seqs[0].prompt_len
                    for s in request.seqs) and len(request.seqs) > 1
        first, *rest = request.live
        for seq in ([first] if fresh else request.live):
            hits = self.blocks.allocate(seq.seq_id, seq.token_ids)
            seq.num_computed = hits
            batch.cached_tokens += hits
            samplers = request.live if fresh else [seq]
            batch.scheduled.append(Scheduled(seq, request, len(seq.token_ids) - hits, samplers, "prefill"))
        if fresh:
            for seq in rest:
                self.blocks.fork(first.seq_id, seq.seq_id)
                seq.num_computed = first.num_computed
        if request.num_cached_tokens == 0:
            request.num_cached_tokens = first.num_computed

    def _preempt(self, request: Request, batch: Batch) -> None:
        """Take a running request's frames away: to host memory (swap; recompute when the host
        pool is full too) or for good (recompute). The caller drops it from `running`."""
        ids = [s.seq_id for s in request.live]
        mode = self.config.preemption_mode
        if mode == "swap" and self.blocks.host.num_free >= len(self._frames_of(ids)):
            batch.swap_out += self.blocks.swap_out(*ids)
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

    def _running_seqs(self) -> list[Sequence]:
        return [s for r in self.running for s in r.live]

    def _frames_of(self, ids) -> set[int]:
        return {f for i in ids for f in self.blocks.block_table(i)}


class StaticScheduler(Scheduler):
    """The pre-Orca baseline: fill a batch while reserved memory lasts (max_model_len slots per
    sequence, the StaticBlockManager), run it until its longest member finishes, then the next.

    Finished members stay in the batch as padding, as in a fixed-shape batch: they are computed
    (the engine feeds them a pad token) but produce nothing, which is the waste Orca removed."""

    def __init__(self, config: SchedulerConfig, blocks: StaticBlockManager):
        super().__init__(config, blocks)
        self.watermark_frames = 0
        self.batch: list[Request] = []

    def schedule(self) -> Batch:
        batch = Batch()
        if all(r.status is Status.FINISHED for r in self.batch):
            self.batch = []
            self._admit(batch)
            self.batch = list(self.running)
            return batch
        for request in self.batch:
            for seq in request.seqs:  # finished ones too: they are padding in a fixed batch
                if not seq.finished:
                    self.blocks.append_slot(seq.seq_id, seq.token_ids[-1])
                batch.scheduled.append(Scheduled(seq, request, 1, [] if seq.finished else [seq]))
        return batch

    def seq_finished(self, seq: Sequence) -> None:
        """Nothing yet: a finished member stays in the fixed batch as a padding row."""

    def finish(self, request: Request) -> None:
        """Keep a finished request's frames until the whole batch is done (padding rows)."""
        request.status = Status.FINISHED
        if all(r.status is Status.FINISHED for r in self.batch):
            for r in self.batch:
                self.running.remove(r)
                for seq in r.seqs:
                    self.free_seq(seq)


__all__ = ["Scheduler", "StaticScheduler", "SchedulerConfig", "Sequence", "Request", "Batch",
           "Scheduled", "Status"]
