"""The engine: `LLMEngine.add_request` / `step()`, and `LLM`, the vLLM-shaped front door.

The whole path of a request, one step at a time: prompt -> tokenizer (chat template) ->
`Request` in the scheduler's waiting queue -> each `step()`: the scheduler picks this step's
batch and the frames it needs -> the runner computes logits over the paged KV cache -> the
sampler (or beam search) picks tokens -> finished sequences free their frames -> a
`StepReport` of what happened, and `RequestOutput`s for finished requests.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from tqdm import tqdm

from minipaged import beam
from minipaged.backend import default_dtype, fit_blas_threads, resolve_device
from minipaged.model import Model
from minipaged.outputs import CompletionOutput, RequestOutput, StepReport, rejected
from minipaged.paging import (ALLOCATORS, SWAP_SPACE, KVCache, bytes_per_frame, check_size, default_kv_memory,
                              make_block_manager)
from minipaged.runner import ModelRunner
from minipaged.sampling import SamplingParams, int_list, make_generator, sample
from minipaged.scheduler import POLICIES, Batch, Request, Scheduler, SchedulerConfig, Sequence, Status
from minipaged.model.tokenizer import IncrementalDetokenizer, Tokenizer
from minipaged.model.weights import DEFAULT_MODEL, resolve_model


@dataclass(slots=True)
class EngineConfig:
    block_size: int = 16
    num_blocks: int = 0                 # 0: as many as kv_cache_memory holds
    kv_cache_memory: int = 0            # bytes; 0: 512 MiB on a CPU, half the free GPU memory
    swap_space: int = 0                 # host frames for preemption by swap; 0: up to 4 GiB worth
    max_model_len: int = 0              # 0: the model's, capped by what the KV cache holds
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 0     # 0: max(4096, max_model_len)
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"
    scheduler: str = "continuous"       # or "static": the pre-Orca baseline
    watermark: float = 0.01
    allocator: str = "paged"            # or "contiguous-max" / "-pow2" / "-oracle": Orca's baselines
    enable_chunked_prefill: bool = False  # prompts in chunks within max_num_batched_tokens per step

    def __post_init__(self):
        for name in ("block_size", "max_num_seqs"):
            check_size(name, getattr(self, name), minimum=1)
        for name in ("num_blocks", "kv_cache_memory", "swap_space", "max_model_len", "max_num_batched_tokens"):
            check_size(name, getattr(self, name), minimum=0)
        for name in ("enable_prefix_caching", "enable_chunked_prefill"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"allocator must be one of {ALLOCATORS}, got {self.allocator!r}")
        if self.enable_chunked_prefill and self.scheduler == "static":
            raise ValueError("enable_chunked_prefill needs scheduler='continuous': a static batch "
                             "is formed once, so there are no running decodes to share steps with")
        if not isinstance(self.watermark, (int, float)) or not 0 <= self.watermark < 1:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {self.watermark!r}")
        if self.scheduler not in POLICIES:
            raise ValueError(f"scheduler must be one of {sorted(POLICIES)}, got {self.scheduler!r}")


class LLMEngine:
    """Requests in, one step at a time, outputs out."""

    def __init__(self, model: Model, tokenizer: Tokenizer, config: EngineConfig | None = None,
                 eos_token_ids=()):
        self.model, self.tokenizer = model, tokenizer
        self.config = config = config or EngineConfig()
        c = model.config
        frame_bytes = bytes_per_frame(c.num_layers, c.num_kv_heads, c.head_dim, config.block_size, model.dtype)
        num_blocks = config.num_blocks or default_kv_memory(model.device, config.kv_cache_memory) // frame_bytes
        host_frames = config.swap_space or min(num_blocks, SWAP_SPACE // frame_bytes)
        max_model_len = min(config.max_model_len or c.max_position_embeddings, c.max_position_embeddings)
        self.blocks = make_block_manager(config.allocator, config.scheduler, num_blocks, config.block_size,
                                         min(max_model_len, num_blocks * config.block_size), host_frames,
                                         config.enable_prefix_caching)
        if self.blocks.num_frames < 1:
            raise ValueError("the KV cache holds no frame: give more kv_cache_memory or num_blocks")
        self.max_model_len = min(max_model_len, self.blocks.num_frames * self.blocks.block_size)
        self.kv = KVCache(c.num_layers, self.blocks.num_frames, c.num_kv_heads, c.head_dim,
                          self.blocks.block_size, host_frames, model.dtype, model.device)
        chunked = config.enable_chunked_prefill
        budget = config.max_num_batched_tokens or (512 if chunked else max(4096, self.max_model_len))
        if budget < self.max_model_len and not chunked:
            raise ValueError(f"max_num_batched_tokens={budget} is below max_model_len={self.max_model_len}: "
                             "a long prompt could never be prefilled (unless enable_chunked_prefill=True)")
        self.scheduler = Scheduler(SchedulerConfig(config.max_num_seqs, budget, config.preemption_mode,
                                                   config.watermark, self.max_model_len, config.scheduler,
                                                   chunked), self.blocks)
        self.runner = ModelRunner(model, self.kv)
        self.eos_token_ids = set(eos_token_ids or c.eos_token_ids)
        self.requests: dict[str, Request] = {}
        self.seq_ids = itertools.count()
        self.step_count = 0

    # ---- the API --------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt, params: SamplingParams | None = None) -> None:
        """Queue a request: prompt is a string or {"prompt_token_ids": [...]}. A bad request
        raises ValueError saying what was wrong, and nothing is queued."""
        params = SamplingParams() if params is None else params
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use; ids must be unique")
        try:
            text, ids = self._check_request(prompt, params)
        except ValueError as error:
            raise ValueError(f"request {request_id!r}: {error}") from None
        seqs = [Sequence(next(self.seq_ids), list(ids), len(ids), index=i, generator=make_generator(params, i),
                         detokenizer=IncrementalDetokenizer(self.tokenizer))
                for i in range(1 if params.beam_width > 1 else params.n)]
        self.requests[request_id] = Request(request_id, text, list(ids), params, seqs, arrival=self.step_count)
        self.scheduler.add(self.requests[request_id])

    def abort_request(self, request_id: str) -> RequestOutput:
        """Stop a request now and free its frames; its output so far, finish_reason "abort"."""
        if request_id not in self.requests:
            raise KeyError(f"no request {request_id!r} is waiting or running (finished requests "
                           "are forgotten; ids are case-sensitive)")
        request = self.requests[request_id]
        for seq in request.live:
            self._finish_seq(request, seq, "abort")
        return self._finish(request)

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
        self.runner.move(batch.moves)
        new_text, finished = {}, []
        if batch.scheduled:
            logits = self.runner.step(*self._inputs(batch))
            finished = self._sample(batch, logits, new_text)
        self.step_count += 1
        return StepReport(
            step=self.step_count - 1,
            ran=[(s.request.request_id, s.seq.index, s.kind, s.num_new_tokens) for s in batch.scheduled],
            frames_taken=self.blocks.frames_taken - taken, frames_freed=self.blocks.frames_released - released,
            free_frames=self.blocks.num_free_frames, copies=len(batch.moves.copies),
            swapped_out=len(batch.moves.swap_out), swapped_in=len(batch.moves.swap_in),
            cached_tokens=batch.cached_tokens, preempted=batch.preempted, finished=finished,
            new_text=new_text, seconds=time.perf_counter() - start,
            padded=[(request.request_id, seq.index) for request, seq in batch.padding])

    # ---- inside a step -----------------------------------------------------------------------
    def _inputs(self, batch: Batch):
        """Each row's new tokens and the paging arrays; padding rows (static batching) compute
        their last cached token again and write nothing."""
        rows, padding = batch.scheduled, [seq for _, seq in batch.padding]
        ends = [s.seq.num_computed + s.num_new_tokens for s in rows]  # a prompt chunk ends early
        tokens = [s.seq.token_ids[end - s.num_new_tokens:end] for s, end in zip(rows, ends)]
        tokens += [[seq.token_ids[seq.num_computed - 1]] for seq in padding]
        arrays = self.blocks.step_arrays([s.seq.seq_id for s in rows], [s.num_new_tokens for s in rows],
                                         [seq.seq_id for seq in padding], ends)
        return tokens, arrays

    def _sample(self, batch: Batch, logits: np.ndarray, new_text: dict) -> list[RequestOutput]:
        """Pick each sequence's next token (or the next beams); finish what is done."""
        rows, beams = [], {}
        for scheduled, row in zip(batch.scheduled, logits):
            scheduled.seq.num_computed += scheduled.num_new_tokens  # (a prompt chunk samples nothing)
            for seq in scheduled.samplers:  # forked samples share the prompt's cache
                seq.num_computed = len(scheduled.seq.token_ids)
                if scheduled.request.beam_search:
                    beams.setdefault(scheduled.request, []).append((seq, row))
                else:
                    rows.append((scheduled.request, seq, row))
        tokens = sample(np.stack([row for *_, row in rows]), [r.params for r, *_ in rows],
                        [seq.generator for _, seq, _ in rows]) if rows else []
        for (request, seq, _), token in zip(rows, tokens):
            text = self._append(request, seq, token)
            if seq.index == 0 and text:
                new_text[request.request_id] = text
        for request, pairs in beams.items():
            self._beam_step(request, pairs)
        finished = []
        for request in dict.fromkeys(s.request for s in batch.scheduled):
            if not request.live:
                finished.append(self._finish(request))
                if request.beam_search and finished[-1].outputs:  # beams are revised until the end
                    new_text[request.request_id] = finished[-1].outputs[0].text
        return finished

    def _append(self, request: Request, seq: Sequence, token: int) -> str:
        """Add a sampled token and decide whether the sequence is finished. Returns the text it
        releases: text that could still become a stop string is held back until decided."""
        seq.token_ids.append(token)
        p = request.params
        reason = None
        if self._ends(token, p):
            reason = "stop"
        else:
            seq.text += seq.detokenizer.add(token)
            found = [seq.text.index(s) for s in p.stop if s in seq.text]
            if found:
                seq.text, reason = seq.text[:min(found)], "stop"
        if reason is None and (len(seq.output_ids) >= p.max_tokens or len(seq.token_ids) >= self.max_model_len):
            reason = "length"
        if reason:
            self._finish_seq(request, seq, reason)
        end = len(seq.text) if seq.finished else len(seq.text) - held_back(seq.text, p.stop)
        new, seq.released = seq.text[seq.released:end], end
        return new

    def _ends(self, token: int, params: SamplingParams) -> bool:
        return (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids

    def _beam_step(self, request: Request, pairs: list[tuple[Sequence, np.ndarray]]) -> None:
        """Apply one step of beam search (minipaged.beam): fork, extend and drop beams."""
        p = request.params
        update = beam.step(pairs, p.beam_width, lambda token: self._ends(token, p))
        for c in update.done:
            request.done_beams.append(Sequence(-1, c.parent.token_ids + [c.token], c.parent.prompt_len,
                                               cumulative_logprob=c.score, finish_reason="stop"))
        for seq in update.drop:
            seq.finish_reason = "pruned"
            self.scheduler.free_seq(seq)
        live = []
        for c in update.fork + update.extend:  # children fork before their parent appends
            seq = c.parent
            if c in update.fork:
                seq = Sequence(next(self.seq_ids), list(c.parent.token_ids), c.parent.prompt_len,
                               num_computed=c.parent.num_computed)
                self.blocks.fork(c.parent.seq_id, seq.seq_id)
            seq.token_ids.append(c.token)
            seq.cumulative_logprob = c.score
            live.append(seq)
        request.seqs = live
        for i, seq in enumerate(live):
            seq.index = i
        max_output_len = min(p.max_tokens, self.max_model_len - len(request.prompt_token_ids))
        if beam.is_over(live, request.done_beams, p.beam_width, max_output_len):
            for seq in live:
                at_limit = len(seq.output_ids) >= max_output_len
                self._finish_seq(request, seq, "length" if at_limit else "pruned")
                if at_limit:
                    request.done_beams.append(seq)

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
        if num_seqs > 1 and not self.blocks.can_fork:
            raise ValueError(f"n={params.n}, beam_width={params.beam_width}: allocator={self.config.allocator!r} "
                             "cannot share frames between sequences; use allocator='paged'")
        needed = num_seqs * self.blocks.frames_to_admit(length, length)
        if needed > self.blocks.num_frames:
            raise ValueError(f"it needs {needed} frames of {self.blocks.block_size} tokens (prompt {prompt_len} "
                             f"+ max_tokens {params.max_tokens}, {num_seqs} sequences) but the KV pool has "
                             f"{self.blocks.num_frames}; give more kv_cache_memory or ask for less")

    def _finish_seq(self, request: Request, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        self.scheduler.finish_seq(request, seq)

    def _finish(self, request: Request) -> RequestOutput:
        """A request whose sequences are all finished leaves the engine; its output."""
        self.scheduler.finish(request)
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


class LLM:
    """A model ready to generate: `LLM()` loads SmolLM2-135M-Instruct on the best device.

    Keyword arguments after `dtype` configure the engine (see EngineConfig): block_size,
    kv_cache_memory or num_blocks, max_model_len, max_num_seqs, enable_prefix_caching,
    preemption_mode ("recompute" or "swap"), scheduler ("continuous" or "static"), allocator
    ("paged" or "contiguous-max/pow2/oracle"), enable_chunked_prefill, max_num_batched_tokens.

    `generate`, `stream` and requests added to `llm.engine` by hand may interleave: whoever
    steps the engine puts every finished output in `unclaimed`, and each caller takes its own."""

    def __init__(self, model: str | None = None, device: str | None = None,
                 dtype: str | None = None, **engine_options):
        start = time.perf_counter()
        self.device = resolve_device(device)
        self.dtype = dtype or default_dtype(self.device)
        self.folder = resolve_model(model)
        self.model_name = str(model or DEFAULT_MODEL)
        self.tokenizer = Tokenizer(self.folder)
        self.model = Model.from_folder(self.folder, self.device, self.dtype)
        eos = set(self.model.config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.engine = LLMEngine(self.model, self.tokenizer, EngineConfig(**engine_options), eos)
        if self.device == "cpu":  # on a shared machine, BLAS threads that wait on each other are slow
            fit_blas_threads(samples=3)
        self.load_seconds = time.perf_counter() - start
        self._ids = itertools.count()
        self.unclaimed: dict[str, RequestOutput] = {}  # finished outputs not yet collected

    @property
    def eos_token_ids(self) -> set[int]:
        return self.engine.eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids) -> None:
        self.engine.eos_token_ids = set(ids)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def new_engine(self, **options) -> LLMEngine:
        """A fresh LLMEngine over this model and tokenizer, with its own KV cache and queues:
        `llm.new_engine(num_blocks=24, block_size=8)` takes the options of EngineConfig."""
        return LLMEngine(self.model, self.tokenizer, EngineConfig(**options), self.eos_token_ids)

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Complete each prompt (a string or {"prompt_token_ids": [...]}), all in one engine run.
        A bad prompt gets an output with `error` set and finish_reason "rejected"; the rest run.
        Interrupted (Ctrl-C), it aborts its own requests, so the engine is left as it was."""
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params_list)} SamplingParams")
        order = [self._new_id("generate") for _ in prompts]
        try:
            for request_id, prompt, p in zip(order, prompts, params_list):
                try:
                    self.engine.add_request(request_id, prompt, p)
                except ValueError as error:
                    self.unclaimed[request_id] = rejected(request_id, prompt, error)
            pending = [r for r in order if r not in self.unclaimed]
            with tqdm(total=len(pending), desc="generating", unit="req", disable=not use_tqdm) as bar:
                for _ in self._run_until(pending):
                    bar.update(sum(r in self.unclaimed for r in pending) - bar.n)
            return [self.unclaimed.pop(r) for r in order]
        finally:
            for request_id in order:
                self._forget(request_id)

    def chat(self, messages, params: SamplingParams | None = None,
             use_tqdm: bool = False) -> RequestOutput | list[RequestOutput]:
        """Answer one conversation (a list of {"role", "content"}), or a list of them."""
        single = bool(messages) and isinstance(messages[0], dict)
        conversations = [messages] if single else messages
        prompts = [{"prompt_token_ids": self.tokenizer.encode_chat(c)} for c in conversations]
        outputs = self.generate(prompts, params, use_tqdm=use_tqdm)
        return outputs[0] if single else outputs

    def stream(self, prompt, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the text of one request's first sequence piece by piece as it is generated
        (text that could still turn out to be a stop string waits until it is decided; beam
        search yields its best text at the end). Closing the iterator early (or Ctrl-C) aborts
        the request and frees its frames; `last_output` then holds its RequestOutput."""
        request_id = self._new_id("stream")
        self.engine.add_request(request_id, prompt, params)
        self.last_output, sent = None, ""
        try:
            for _ in self._run_until([request_id]):
                text = self.engine.text_so_far(request_id) if request_id in self.engine.requests else sent
                if len(text) > len(sent):
                    yield text[len(sent):]
                    sent = text
            self.last_output = self.unclaimed.pop(request_id)
            if self.last_output.outputs and len(self.last_output.outputs[0].text) > len(sent):
                yield self.last_output.outputs[0].text[len(sent):]
        finally:
            self.last_output = self._forget(request_id) or self.last_output

    # ---- several callers, one engine ----------------------------------------------------------
    def _run_until(self, request_ids: list[str]) -> Iterator[None]:
        """Step the engine until these requests are finished. Every finished output goes to
        `unclaimed`, where its caller (generate, stream, or a user of `engine`) collects it."""
        while not all(r in self.unclaimed for r in request_ids):
            for output in self.engine.step().finished:
                self.unclaimed[output.request_id] = output
            yield

    def _new_id(self, kind: str) -> str:
        """A request id nobody holds: users may name their own requests "generate-0" too."""
        request_id = f"{kind}-{next(self._ids)}"
        while request_id in self.engine.requests or request_id in self.unclaimed:
            request_id = f"{kind}-{next(self._ids)}"
        return request_id

    def _forget(self, request_id: str) -> RequestOutput | None:
        """Abort a request of ours that still runs (an interrupted call), or drop its output
        that nobody collected; returns that output."""
        if request_id in self.engine.requests:
            return self.engine.abort_request(request_id)
        return self.unclaimed.pop(request_id, None)
