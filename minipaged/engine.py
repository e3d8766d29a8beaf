"""The engine: `add_request` queues a request, `step()` runs one step of all of them.

One step: the scheduler picks the batch -> the runner makes its memory moves and prepares the
flat inputs -> the model computes logits -> the sampler (or beam search) picks tokens ->
`Scheduler.update` appends them and finishes sequences -> a `StepReport` of what happened.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from minipaged import beam
from minipaged.model import IncrementalDetokenizer, Model, Tokenizer
from minipaged.outputs import CompletionOutput, RequestOutput, StepReport
from minipaged.paging import (ALLOCATORS, SWAP_SPACE, KVCache, check_size, default_kv_memory, make_block_manager,
                              make_policy, num_blocks_for_memory)
from minipaged.runner import ModelRunner
from minipaged.sampling import SamplingParams, int_list, make_generator, sample, verify
from minipaged.scheduler import Batch, Request, Scheduled, Scheduler, SchedulerConfig, Sequence, Status
from minipaged.speculative import DraftLayers, NgramProposer, SpeculativeConfig


@dataclass(slots=True)
class EngineConfig:
    block_size: int = 16
    num_blocks: int = 0                 # 0: as many as kv_cache_memory holds
    kv_cache_memory: int = 0            # bytes; 0: 512 MiB on a CPU, half the free GPU memory
    swap_space: int = 0                 # host frames for preemption by swap; 0: up to 4 GiB worth
    max_model_len: int = 0              # 0: the model's, capped by what the KV cache holds
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 0     # 0: max(4096, max_model_len); 512 with chunked prefill
    enable_prefix_caching: bool = True
    prefix_cache_policy: str = "lru"    # which parked cached frame goes first: "fifo", "clock", "random"
    kv_offload_frames: int = 0          # the drum: host frames keeping evicted prefix-cache blocks; 0: off
    kv_offload_path: str | None = None  # a file for those frames (numpy.memmap); None: host memory
    scheduling_policy: str = "fcfs"     # waiting-queue order: "sjf" (shortest job first), "aging", "priority"
    aging_rate: float = 8.0             # "aging": job-size tokens forgiven per step waited
    admission: str = "greedy"           # or "working-set": admit while running sequences' growth fits too
    admission_window: int = 16          # "working-set": steps of growth counted
    preemption_mode: str = "recompute"
    scheduler: str = "continuous"       # or "static": the pre-Orca baseline
    watermark: float = 0.01
    allocator: str = "paged"            # or "contiguous-max" / "-pow2" / "-oracle": Orca's baselines
    enable_chunked_prefill: bool = False  # prompts in chunks within max_num_batched_tokens per step
    speculative_config: dict | SpeculativeConfig | None = None  # vLLM's: {"method": "ngram", ...}

    def __post_init__(self):
        """Every option, before any memory is sized (the scheduler's by SchedulerConfig)."""
        check_size("block_size", self.block_size, minimum=1)
        for name in ("num_blocks", "kv_cache_memory", "swap_space", "max_model_len"):
            check_size(name, getattr(self, name), minimum=0)
        for name in ("enable_prefix_caching", "enable_chunked_prefill"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        make_policy(self.prefix_cache_policy)  # a ValueError naming the policies, for a bad name
        self._check_offload()
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"allocator must be one of {ALLOCATORS}, got {self.allocator!r}")
        if self.speculative_config is not None:
            self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)
            if self.allocator != "paged":
                raise ValueError(f"speculative decoding rolls page tables back: it needs allocator='paged', "
                                 f"not {self.allocator!r}")
        self.scheduler_config(max_model_len=0)  # checks the scheduler's options now

    def _check_offload(self) -> None:
        """kv_offload_frames keeps the prefix cache's evicted blocks: it needs the cache, on paged memory."""
        check_size("kv_offload_frames", self.kv_offload_frames, minimum=0)
        if self.kv_offload_path is not None and not isinstance(self.kv_offload_path, (str, os.PathLike)):
            raise ValueError(f"kv_offload_path must be a file path or None, got {self.kv_offload_path!r}")
        if self.kv_offload_path is not None and not self.kv_offload_frames:
            raise ValueError("kv_offload_path needs kv_offload_frames > 0: the file holds the tier's frames")
        if self.kv_offload_frames and not self.enable_prefix_caching:
            raise ValueError("kv_offload_frames keeps the prefix cache's evicted blocks: it needs "
                             "enable_prefix_caching=True")
        if self.kv_offload_frames and (self.allocator != "paged" or self.scheduler != "continuous"):
            raise ValueError(f"kv_offload_frames needs allocator='paged' and scheduler='continuous' (their "
                             f"prefix cache), not {self.allocator!r} and {self.scheduler!r}")

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        """The scheduler's options (max_model_len is the engine's, known once memory is sized)."""
        return SchedulerConfig(max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                               preemption_mode=self.preemption_mode, watermark=self.watermark,
                               max_model_len=max_model_len, policy=self.scheduler,
                               chunked_prefill=self.enable_chunked_prefill, scheduling_policy=self.scheduling_policy,
                               aging_rate=self.aging_rate, admission=self.admission,
                               admission_window=self.admission_window,
                               num_speculative_tokens=self.num_speculative_tokens)

    @property
    def num_speculative_tokens(self) -> int:
        return self.speculative_config.num_speculative_tokens if self.speculative_config else 0


class LLMEngine:
    """Requests in, one step at a time, outputs out."""

    def __init__(self, model: Model, tokenizer: Tokenizer, config: EngineConfig | None = None,
                 eos_token_ids=()):
        self.model, self.tokenizer = model, tokenizer
        self.config = config = config or EngineConfig()
        c = model.config
        sizes = (c.num_layers, c.num_kv_heads, c.head_dim, config.block_size, model.dtype)  # of one frame
        memory = default_kv_memory(model.device, config.kv_cache_memory)
        num_blocks = config.num_blocks or num_blocks_for_memory(memory, *sizes)
        host_frames = config.swap_space or min(num_blocks, num_blocks_for_memory(SWAP_SPACE, *sizes))
        max_model_len = min(config.max_model_len or c.max_position_embeddings, c.max_position_embeddings)
        self.blocks = make_block_manager(config.allocator, config.scheduler, num_blocks, config.block_size,
                                         min(max_model_len, num_blocks * config.block_size), host_frames,
                                         config.enable_prefix_caching, config.prefix_cache_policy)
        if config.kv_offload_frames:
            self.blocks.add_tier(config.kv_offload_frames)  # the drum behind the prefix cache
        self.max_model_len = min(max_model_len, self.blocks.num_frames * self.blocks.block_size)
        self.kv = KVCache(c.num_layers, self.blocks.num_frames, c.num_kv_heads, c.head_dim,  # the chosen
                          self.blocks.block_size, self.blocks.num_host_frames, model.dtype, model.device,  # frames
                          self.blocks.num_tier_frames, config.kv_offload_path)
        self.scheduler = Scheduler(config.scheduler_config(self.max_model_len), self.blocks)
        self.runner = ModelRunner(model, self.kv, self.blocks)
        self.proposer = self._make_proposer(config.speculative_config)
        self.eos_token_ids = set(eos_token_ids or c.eos_token_ids)
        self.requests: dict[str, Request] = {}
        self.step_count = 0
        self.num_guessed = self.num_accepted = 0  # speculative decoding: guesses checked, and right

    def _make_proposer(self, spec: SpeculativeConfig | None):
        """The proposer of speculative decoding, or None without it."""
        if spec is None:
            return None
        if spec.method == "ngram":
            return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
        num_layers = self.model.config.num_layers
        draft_layers = spec.num_draft_layers or max(1, num_layers // 4)
        if draft_layers >= num_layers:
            raise ValueError(f"num_draft_layers={draft_layers}, but the model has {num_layers} layers: "
                             "a draft must be smaller than the model it guesses for")
        return DraftLayers(self.runner, draft_layers)

    # ---- the API --------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt, params: SamplingParams | None = None, priority: int = 0) -> None:
        """Queue a request: prompt is a string or {"prompt_token_ids": [...]}; `priority` (vLLM's:
        lower runs first) needs scheduling_policy="priority". A bad request raises ValueError
        saying what was wrong, and nothing is queued."""
        params = SamplingParams() if params is None else params
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use; ids must be unique")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be a whole number (lower runs first), got {priority!r}")
        if priority and self.scheduler.config.scheduling_policy != "priority":
            raise ValueError(f"priority={priority} needs scheduling_policy='priority' (it is "
                             f"{self.scheduler.config.scheduling_policy!r})")
        try:
            text, ids = self._check_request(prompt, params)
        except ValueError as error:
            raise ValueError(f"request {request_id!r}: {error}") from None
        seqs = [Sequence(self.scheduler.new_seq_id(), list(ids), len(ids), index=i, generator=make_generator(params, i),
                         detokenizer=IncrementalDetokenizer(self.tokenizer))
                for i in range(1 if params.beam_width > 1 else params.n)]
        self.requests[request_id] = Request(request_id, text, list(ids), params, seqs)
        self.scheduler.add(self.requests[request_id], priority)

    def abort_request(self, request_id: str) -> RequestOutput:
        """Stop a request now and free its frames; its output so far, finish_reason "abort"."""
        if request_id not in self.requests:
            raise KeyError(f"no request {request_id!r} is waiting or running (finished requests "
                           "are forgotten; ids are case-sensitive)")
        request = self.requests.pop(request_id)
        self.scheduler.abort(request)
        return self._output(request)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def text_so_far(self, request_id: str) -> str:
        """The text its first sequence has released so far (beam search: none until the end)."""
        request = self.requests[request_id]
        return "" if request.beam_search else request.seqs[0].released_text

    def step(self) -> StepReport:
        """Schedule, move memory, run the model once, sample, and finish what is done."""
        start, taken, released = time.perf_counter(), self.blocks.frames_taken, self.blocks.frames_released
        batch = self.scheduler.schedule()
        if not batch.scheduled and self.has_unfinished_requests():
            raise RuntimeError("the scheduler could not schedule any request (this is a bug: "
                               "requests that can never fit are rejected by add_request)")
        batch.moves.tier = self.blocks.take_tier_moves()  # the drum's stores and loads, in order
        self.runner.move(batch.moves)
        finished, guesses, guessed, accepted = [], [], self.num_guessed, self.num_accepted
        if batch.scheduled:
            self._guess(batch)
            logits = self.runner.run(self.runner.prepare(batch))     # (num_seqs + guesses, vocab)
            done, guesses = self._sample_and_update(batch, logits)
            finished = [self._finish(r) for r in done]
        self.step_count += 1
        return StepReport(
            step=self.step_count - 1,
            ran=[(s.request.request_id, s.seq.index, s.kind, s.num_new_tokens) for s in batch.scheduled],
            frames_taken=self.blocks.frames_taken - taken, frames_freed=self.blocks.frames_released - released,
            free_frames=self.blocks.num_free_frames, copies=len(batch.moves.copies),
            swapped_out=len(batch.moves.swap_out), swapped_in=len(batch.moves.swap_in),
            cached_tokens=batch.cached_tokens, preempted=batch.preempted, finished=finished,
            seconds=time.perf_counter() - start,
            padded=[(request.request_id, seq.index) for request, seq in batch.padding],
            guessed=self.num_guessed - guessed, accepted=self.num_accepted - accepted, guesses=guesses)

    # ---- inside a step -----------------------------------------------------------------------
    def _guess(self, batch: Batch) -> None:
        """Speculative decoding: the proposer guesses the tokens after each decode that has
        guess slots; the forward then checks them beside the rest of the batch."""
        rows = [s for s in batch.scheduled if s.guess_slots]
        if rows and self.proposer is not None:
            for scheduled, draft in zip(rows, self.proposer.propose(rows)):
                scheduled.guess(draft)
                self.num_guessed += len(draft)

    def _sample_and_update(self, batch: Batch, logits: np.ndarray) -> tuple[list[Request], list]:
        """Pick each sampler's next token (or the next beams; or check guesses), decide which
        text stops, and let the scheduler apply it all; returns the requests that finished, and
        per speculating row (request_id, seq index, guessed, kept) for the StepReport."""
        rows, beams, checked, at = [], {}, [], 0
        for scheduled in batch.scheduled:  # each row's logits: its last token's, then its guesses'
            block, at = logits[at:at + 1 + len(scheduled.draft)], at + 1 + len(scheduled.draft)
            if scheduled.draft:
                checked.append((scheduled, block))
            for seq in [] if scheduled.draft else scheduled.samplers:  # forked samples share logits
                if scheduled.request.beam_search:
                    beams.setdefault(scheduled.request, []).append((seq, block[-1]))
                else:
                    rows.append((scheduled.request, seq, block[-1]))
        picked = sample(np.stack([row for *_, row in rows]), [r.params for r, *_ in rows],
                        [seq.generator for _, seq, _ in rows]) if rows else []
        tokens = {seq: int(token) for (_, seq, _), token in zip(rows, picked)}
        stopped = {seq for (request, seq, _), token in zip(rows, picked) if self._stops(request.params, seq, token)}
        accepted = self._verify(checked, tokens, stopped)
        steps = {request: beam.step(pairs, request.params.beam_width, lambda t, p=request.params: self._ends(t, p))
                 for request, pairs in beams.items()}
        finished = self.scheduler.update(batch, tokens, stopped, steps, accepted)
        for request, seq in [(r, s) for r, s, _ in rows] + [(s.request, s.seq) for s, _ in checked]:
            # text that could still become a stop string waits
            seq.released = len(seq.text) if seq.finished else len(seq.text) - held_back(seq.text, request.params.stop)
        guesses = [(s.request.request_id, s.seq.index, len(s.draft), len(accepted[s.seq])) for s, _ in checked]
        return finished, guesses

    def _verify(self, checked: list[tuple[Scheduled, np.ndarray]], tokens: dict, stopped: set) -> dict:
        """Check each row's guesses against its logits (sampling.verify): the emitted tokens are
        the accepted guesses and one token of the model's; a stop among them cuts the run there,
        as it would have one token at a time. Fills tokens and stopped; returns the accepted."""
        accepted = {}
        for scheduled, block in checked:
            seq, params = scheduled.seq, scheduled.request.params
            emitted = verify(block, scheduled.draft, params, seq.generator)  # (block: (1 + guesses, vocab))
            self.num_accepted += len(emitted) - 1
            kept = []
            for token in emitted:
                kept.append(token)
                if self._stops(params, seq, token):
                    stopped.add(seq)
                    break
            tokens[seq], accepted[seq] = kept[-1], kept[:-1]
        return accepted

    def _stops(self, p: SamplingParams, seq: Sequence, token: int) -> bool:
        """Does this token end the sequence's text: eos, a stop token, or a stop string now in
        its text (cut off there)? Adds the token's text to seq.text."""
        if self._ends(token, p):
            return True
        new = seq.detokenizer.add(token)
        seq.text += new
        # a stop string that appears now ends in the new text: look only where it could start
        start = max(0, len(seq.text) - len(new) - max(map(len, p.stop), default=1) + 1)
        found = [i for stop in p.stop if (i := seq.text.find(stop, start)) >= 0]
        if found:
            seq.text = seq.text[:min(found)]
        return bool(found)

    def _ends(self, token: int, params: SamplingParams) -> bool:
        return (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids

    # ---- requests in and out -------------------------------------------------------------------
    def _check_request(self, prompt, params) -> tuple[str | None, list[int]]:
        """Validate one request (ValueError naming what is wrong); its prompt text and ids."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        params.validate()
        text, ids = self._prompt_ids(prompt)
        vocab = self.model.config.vocab_size
        for name, values in (("prompt token id", ids), ("stop_token_ids entry", params.stop_token_ids)):
            bad = [t for t in values if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"{name} {bad[0]} is outside this model's vocabulary (0..{vocab - 1})")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens; this model's max_model_len is "
                             f"{self.max_model_len} (and one token must be generated)")
        self._check_fits(len(ids), params)
        if params.beam_width > 1 and self.proposer is not None:
            raise ValueError(f"beam search (beam_width={params.beam_width}) cannot run with speculative_config: "
                             "beams fork at every token, guesses need one sequence; use n instead")
        return text, ids

    def _prompt_ids(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            text, ids = check_text(prompt, "prompt"), self.tokenizer.encode(prompt)
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text = prompt.get("prompt")
            if text is not None:
                check_text(text, "prompt")
            ids = int_list(prompt["prompt_token_ids"], "prompt_token_ids")
        else:
            raise ValueError(f"a prompt must be a string or {{'prompt_token_ids': [...]}}, got {prompt!r:.80}")
        if not ids:
            raise ValueError("prompt is empty: give at least one token")
        return text, ids

    def _check_fits(self, prompt_len: int, params: SamplingParams) -> None:
        """Refuse a request that could not fit even alone in the KV pool, in the worst case
        (every sample or beam with its own copy of prompt and output, as after a recompute)."""
        length = min(prompt_len + params.max_tokens, self.max_model_len)
        num_seqs = max(params.n, params.beam_width)
        if num_seqs > self.scheduler.config.max_num_seqs:
            raise ValueError(f"n={params.n}, beam_width={params.beam_width}: it runs {num_seqs} sequences at once "
                             f"but max_num_seqs is {self.scheduler.config.max_num_seqs}")
        if num_seqs > 1 and not self.blocks.can_fork:
            raise ValueError(f"n={params.n}, beam_width={params.beam_width}: allocator={self.config.allocator!r} "
                             "cannot share frames between sequences; use allocator='paged'")
        needed = num_seqs * self.blocks.frames_to_admit(length, length)
        if needed > self.blocks.num_frames:
            raise ValueError(f"it needs {needed} frames of {self.blocks.block_size} tokens (prompt {prompt_len} "
                             f"+ max_tokens {params.max_tokens}, {num_seqs} sequences) but the KV pool has "
                             f"{self.blocks.num_frames}; give more kv_cache_memory or ask for less")

    def _finish(self, request: Request) -> RequestOutput:
        """A request whose sequences are all finished leaves the engine; its output."""
        del self.requests[request.request_id]
        return self._output(request)

    def _output(self, request: Request) -> RequestOutput:
        if request.beam_search:
            aborted = [s for s in request.seqs if s.finish_reason == "abort"]
            best = beam.best(request.done_beams + aborted, request.params.n)
            outputs = [CompletionOutput(i, self.tokenizer.decode(s.output_ids), s.output_ids,
                                        s.finish_reason, s.cumulative_logprob) for i, s in enumerate(best)]
        else:
            outputs = [CompletionOutput(s.index, s.text, s.output_ids, s.finish_reason) for s in request.seqs]
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids, outputs,
                             finished=request.status is Status.FINISHED,
                             num_cached_tokens=request.num_cached_tokens)


def held_back(text: str, stops: list[str]) -> int:
    """How many characters at the end of `text` could be the start of a stop string."""
    return max((k for stop in stops for k in range(min(len(stop) - 1, len(text)), 0, -1)
                if text.endswith(stop[:k])), default=0)


def check_text(text, name: str) -> str:
    """`text` if it is a str that UTF-8 can encode (no lone surrogates), else a ValueError."""
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{name} is not valid text: {error.reason} at character {error.start}") from None
    return text


