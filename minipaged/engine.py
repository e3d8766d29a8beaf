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
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
from tqdm import tqdm

from minipaged.backend import default_dtype, resolve_device
from minipaged.model import Model
from minipaged.paging import BlockManager, KVCache, StaticBlockManager, bytes_per_frame
from minipaged.runner import ModelRunner
from minipaged.sampling import SamplingParams, log_softmax, make_generator, most_likely, sample
from minipaged.scheduler import (Batch, Request, Scheduler, SchedulerConfig, Sequence,
                                 StaticScheduler, Status)
from minipaged.tokenizer import IncrementalDetokenizer, Tokenizer
from minipaged.weights import DEFAULT_MODEL, resolve_model


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" (eos, stop token/string), "length", "abort", "rejected"
    cumulative_logprob: float | None = None  # beam search only


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None    # why the request was rejected; the others still ran


@dataclass(slots=True)
class StepReport:
    """What one step did: print it for a line, collect them for a timeline picture."""
    step: int
    ran: list[tuple[str, int, str, int]]   # (request_id, seq index, "prefill"/"decode", tokens)
    frames_taken: int
    frames_freed: int
    free_frames: int
    copies: int                            # copy-on-write frame copies
    swapped_out: int                       # frames moved to host memory
    swapped_in: int
    cached_tokens: int                     # prompt tokens found in the prefix cache
    preempted: list[tuple[str, str]]       # (request_id, "recompute" / "swap")
    finished: list[RequestOutput]
    new_text: dict[str, str]               # request_id -> text of its first sequence this step
    seconds: float
    padded: list[tuple[str, int]] = field(default_factory=list)  # static batching: finished rows still computed

    @property
    def padding(self) -> int:
        return len(self.padded)

    @property
    def num_tokens(self) -> int:
        return sum(n for *_, n in self.ran)

    def __str__(self) -> str:
        kinds = {"prefill": 0, "decode": 0}
        for _, _, kind, _ in self.ran:
            kinds[kind] += 1
        parts = [f"step {self.step}: {kinds['prefill']} prefill + {kinds['decode']} decode "
                 f"({self.num_tokens} tokens, {1000 * self.seconds:.0f} ms)",
                 f"frames +{self.frames_taken} -{self.frames_freed} ({self.free_frames} free)"]
        extras = [(self.copies, "copy-on-write"), (self.cached_tokens, "cached tokens"),
                  (self.swapped_out, "frames swapped out"), (self.swapped_in, "frames swapped in")]
        parts += [f"{n} {what}" for n, what in extras if n]
        parts += [f"preempted {rid} ({mode})" for rid, mode in self.preempted]
        parts += [f"finished {o.request_id}" for o in self.finished]
        return ", ".join(parts)


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


class LLMEngine:
    """Requests in, one step at a time, outputs out."""

    def __init__(self, model: Model, tokenizer: Tokenizer, config: EngineConfig | None = None,
                 eos_token_ids=()):
        self.model, self.tokenizer = model, tokenizer
        self.config = config = config or EngineConfig()
        c = model.config
        frame_bytes = bytes_per_frame(c.num_layers, c.num_kv_heads, c.head_dim, config.block_size, model.dtype)
        num_blocks = config.num_blocks or default_kv_memory(model.device, config.kv_cache_memory) // frame_bytes
        max_len = config.max_model_len or c.max_position_embeddings
        if config.scheduler == "static":
            self.max_model_len = max_len
            self.blocks = StaticBlockManager(num_blocks * config.block_size, max_len)
            num_blocks, block_size = self.blocks.device.num_blocks, max_len
        else:
            self.max_model_len = min(max_len, c.max_position_embeddings, num_blocks * config.block_size)
            host_frames = config.swap_space or min(num_blocks, SWAP_SPACE // frame_bytes)
            self.blocks = BlockManager(num_blocks, config.block_size, host_frames,
                                       config.enable_prefix_caching)
            block_size = config.block_size
        if num_blocks < 1:
            raise ValueError("the KV cache holds no frame: give more kv_cache_memory or num_blocks")
        self.kv = KVCache(c.num_layers, num_blocks, c.num_kv_heads, c.head_dim, block_size,
                          self.blocks.host.num_blocks, model.dtype, model.device)
        budget = config.max_num_batched_tokens or max(4096, self.max_model_len)
        if budget < self.max_model_len:
            raise ValueError(f"max_num_batched_tokens={budget} is below max_model_len={self.max_model_len}: "
                             "a long prompt could never be prefilled (minipaged has no chunked prefill)")
        scheduler_config = SchedulerConfig(config.max_num_seqs, budget, config.preemption_mode, config.watermark)
        if config.scheduler not in ("continuous", "static"):
            raise ValueError(f"scheduler must be 'continuous' or 'static', got {config.scheduler!r}")
        scheduler_class = StaticScheduler if config.scheduler == "static" else Scheduler
        self.scheduler = scheduler_class(scheduler_config, self.blocks)
        self.runner = ModelRunner(model, self.kv)
        self.eos_token_ids = set(eos_token_ids or c.eos_token_ids)
        self.requests: dict[str, Request] = {}
        self.seq_ids = itertools.count()
        self.step_count = 0

    # ---- the API --------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt, params: SamplingParams | None = None) -> None:
        """Queue a request: prompt is a string or {"prompt_token_ids": [...]}. A bad request
        raises ValueError saying what was wrong; nothing else is affected."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"request {request_id!r}: params must be SamplingParams, got {type(params).__name__}")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use; ids must be unique")
        text, ids = self._prompt_ids(request_id, prompt)
        self._check_fits(request_id, len(ids), params)
        num_seqs = 1 if params.beam_width > 1 else params.n
        seqs = [Sequence(next(self.seq_ids), list(ids), len(ids), index=i,
                         generator=make_generator(params, i),
                         detokenizer=IncrementalDetokenizer(self.tokenizer)) for i in range(num_seqs)]
        request = Request(str(request_id), text, list(ids), params, seqs, arrival=self.step_count)
        self.requests[request.request_id] = request
        self.scheduler.add(request)

    def abort_request(self, request_id: str) -> RequestOutput:
        """Stop a request now and free its frames; its output so far, finish_reason "abort"."""
        if request_id not in self.requests:
            raise KeyError(f"no request {request_id!r} is waiting or running (finished requests "
                           "are forgotten; ids are case-sensitive)")
        request = self.requests.pop(request_id)
        for seq in request.live:
            seq.finish_reason = "abort"
        self.scheduler.finish(request)
        return self._output(request)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> StepReport:
        """Schedule, move memory, run the model once, sample, and finish what is done."""
        start = time.perf_counter()
        allocated, released = self.blocks.device.num_allocated, self.blocks.device.num_released
        batch = self.scheduler.schedule()
        if not batch.scheduled and self.has_unfinished_requests():
            raise RuntimeError("the scheduler could not schedule any request (this is a bug: "
                               "requests that can never fit are rejected by add_request)")
        self.kv.swap_out(batch.swap_out)  # before the frames they leave are reused
        self.kv.swap_in(batch.swap_in)
        new_text, finished = {}, []
        if batch.scheduled:
            new_tokens = [s.seq.token_ids[len(s.seq.token_ids) - s.num_new_tokens:] for s in batch.scheduled]
            arrays = self.blocks.step_arrays([s.seq.seq_id for s in batch.scheduled],
                                             [s.num_new_tokens for s in batch.scheduled])
            logits = self.runner.step(new_tokens, arrays, batch.copies)
            finished = self._process(batch, logits, new_text)
        self.step_count += 1
        return StepReport(
            step=self.step_count - 1,
            ran=[(s.request.request_id, s.seq.index, s.kind, s.num_new_tokens)
                 for s in batch.scheduled if s.samplers],
            frames_taken=self.blocks.device.num_allocated - allocated,
            frames_freed=self.blocks.device.num_released - released,
            free_frames=self.blocks.num_free_frames, copies=len(batch.copies),
            swapped_out=len(batch.swap_out), swapped_in=len(batch.swap_in),
            cached_tokens=batch.cached_tokens, preempted=batch.preempted, finished=finished,
            new_text=new_text, seconds=time.perf_counter() - start,
            padded=[(s.request.request_id, s.seq.index) for s in batch.scheduled if not s.samplers])

    # ---- inside a step -----------------------------------------------------------------------
    def _process(self, batch: Batch, logits: np.ndarray, new_text: dict) -> list[RequestOutput]:
        """Pick each sequence's next token; finish what is done. Returns finished outputs."""
        beams: dict[Request, list[tuple[Sequence, np.ndarray]]] = {}
        rows, samplers = [], []  # (sequence, its request) for every row to sample from
        for scheduled, row in zip(batch.scheduled, logits):
            scheduled.seq.num_computed = len(scheduled.seq.token_ids)
            for seq in scheduled.samplers:
                seq.num_computed = scheduled.seq.num_computed  # forked samples share the prompt
                if scheduled.request.beam_search:
                    beams.setdefault(scheduled.request, []).append((seq, row))
                else:
                    rows.append(row)
                    samplers.append((seq, scheduled.request))
        tokens = sample(np.stack(rows), [r.params for _, r in samplers],
                        [s.generator for s, _ in samplers]) if rows else []
        touched = {}
        for (seq, request), token in zip(samplers, tokens):
            text = self._append(request, seq, token)
            if seq.index == 0 and text:
                new_text[request.request_id] = text
            touched[request.request_id] = request
        for request, pairs in beams.items():
            self._beam_step(request, pairs)
            touched[request.request_id] = request
        finished = []
        for request in touched.values():
            if not request.live and request.status is not Status.FINISHED:
                self.scheduler.finish(request)
                del self.requests[request.request_id]
                finished.append(self._output(request))
        return finished

    def _append(self, request: Request, seq: Sequence, token: int) -> str:
        """Add a sampled token; decide whether the sequence is finished. Returns new text."""
        seq.token_ids.append(token)
        p = request.params
        if (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
            self._finish_seq(seq, "stop")
            return ""
        before = len(seq.text)
        seq.text += seq.detokenizer.add(token)
        for stop in p.stop:
            if stop in seq.text:
                seq.text = seq.text[:seq.text.index(stop)]
                self._finish_seq(seq, "stop")
        if not seq.finished and (len(seq.output_ids) >= p.max_tokens
                                 or len(seq.token_ids) >= self.max_model_len):
            self._finish_seq(seq, "length")
        return seq.text[before:]

    def _finish_seq(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        self.scheduler.seq_finished(seq)

    def _beam_step(self, request: Request, pairs: list[tuple[Sequence, np.ndarray]]) -> None:
        """Keep the beam_width best continuations of all live beams.

        Each beam proposes its 2 * width most likely next tokens, scored by cumulative log
        probability; the best `width` that do not end the text become the new beams. A beam
        with several children is fork()ed (they share its frames; the first write copies the
        partial last block); a beam with none is dropped and its frames freed. Candidates ending
        in eos are kept as finished hypotheses, scored by log probability per output token.
        """
        p, width = request.params, request.params.beam_width
        candidates = []
        for seq, row in pairs:
            logprobs = log_softmax(row[None])[0]
            for token in most_likely(logprobs, 2 * width):
                candidates.append((seq.cumulative_logprob + logprobs[token], seq, int(token)))
        candidates.sort(key=lambda c: -c[0])
        children: dict[Sequence, list[tuple[float, int]]] = {}
        kept = 0
        for score, parent, token in candidates:
            if kept == width:
                break
            ends = (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids
            if ends:
                done = Sequence(-1, parent.token_ids + [token], parent.prompt_len, cumulative_logprob=score,
                                finish_reason="stop")
                request.done_beams.append(done)
            else:
                children.setdefault(parent, []).append((score, token))
                kept += 1
        live = []
        for parent, _ in pairs:
            kids = children.get(parent, [])
            if not kids:
                parent.finish_reason = "pruned"
                self.scheduler.free_seq(parent)
            for score, token in kids[1:]:  # fork before the parent appends its own token
                child = Sequence(next(self.seq_ids), list(parent.token_ids), parent.prompt_len,
                                 num_computed=parent.num_computed, cumulative_logprob=score)
                self.blocks.fork(parent.seq_id, child.seq_id)
                child.token_ids.append(token)
                live.append(child)
            if kids:
                parent.cumulative_logprob = kids[0][0]
                parent.token_ids.append(kids[0][1])
                live.append(parent)
        request.seqs = live
        for i, seq in enumerate(live):
            seq.index = i
        out_len = len(live[0].output_ids) if live else 0
        best_live = max((s.cumulative_logprob for s in live), default=-np.inf) / max(out_len, 1)
        done = sorted(request.done_beams, key=beam_score, reverse=True)[:width]
        if out_len >= p.max_tokens or (len(done) >= width and best_live <= beam_score(done[-1])):
            for seq in live:
                seq.finish_reason = "length" if out_len >= p.max_tokens else "pruned"
                if seq.finish_reason == "length":
                    request.done_beams.append(seq)
                self.scheduler.free_seq(seq)

    # ---- requests in and out -------------------------------------------------------------------
    def _prompt_ids(self, request_id, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, ids = prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
        else:
            raise ValueError(f"request {request_id!r}: a prompt must be a string or "
                             f"{{'prompt_token_ids': [...]}}, got {prompt!r:.80}")
        vocab = self.model.config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if not ids:
            raise ValueError(f"request {request_id!r}: prompt is empty: give at least one token")
        if bad:
            raise ValueError(f"request {request_id!r}: prompt token id {bad[0]} is outside this "
                             f"model's vocabulary (0..{vocab - 1})")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"request {request_id!r}: prompt has {len(ids)} tokens; this model's "
                             f"max_model_len is {self.max_model_len} (and one token must be generated)")
        return text, ids

    def _check_fits(self, request_id, prompt_len: int, params: SamplingParams) -> None:
        """Refuse a request that could not fit even alone in the KV pool, in the worst case
        (every sample or beam with its own copy of prompt and output, as after a recompute)."""
        block_size = self.blocks.block_size
        length = min(prompt_len + params.max_tokens, self.max_model_len)
        needed = max(params.n, params.beam_width) * -(-length // block_size)
        if needed > self.blocks.device.num_blocks:
            raise ValueError(f"request {request_id!r} needs {needed} frames of {block_size} tokens "
                             f"(prompt {prompt_len} + max_tokens {params.max_tokens}, "
                             f"{max(params.n, params.beam_width)} sequences) but the KV pool has "
                             f"{self.blocks.device.num_blocks}; give more kv_cache_memory or ask for less")

    def _output(self, request: Request) -> RequestOutput:
        if request.beam_search:
            best = sorted(request.done_beams, key=beam_score, reverse=True)[:request.params.n]
            outputs = [CompletionOutput(i, self.tokenizer.decode(s.output_ids), s.output_ids,
                                        s.finish_reason, s.cumulative_logprob) for i, s in enumerate(best)]
        else:
            outputs = [CompletionOutput(s.index, s.text, s.output_ids, s.finish_reason) for s in request.seqs]
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids, outputs,
                             finished=request.status is Status.FINISHED,
                             num_cached_tokens=request.num_cached_tokens)


SWAP_SPACE = 4 * 2**30  # default bytes of host memory for swapped-out frames


def beam_score(seq: Sequence) -> float:
    """Cumulative log probability per generated token (length penalty 1)."""
    return seq.cumulative_logprob / max(len(seq.output_ids), 1)


def default_kv_memory(device: str, requested: int) -> int:
    """Bytes for the KV cache: as asked, else 512 MiB on a CPU, half the free memory on a GPU."""
    if requested:
        return requested
    if device == "cuda":
        import cupy
        free, _ = cupy.cuda.runtime.memGetInfo()
        return free // 2
    return 512 * 2**20


class LLM:
    """A model ready to generate: `LLM()` loads SmolLM2-135M-Instruct on the best device.

    Keyword arguments after `dtype` configure the engine (see EngineConfig): block_size,
    kv_cache_memory or num_blocks, max_model_len, max_num_seqs, enable_prefix_caching,
    preemption_mode ("recompute" or "swap"), scheduler ("continuous" or "static")."""

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
        self.load_seconds = time.perf_counter() - start
        self._ids = itertools.count()

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
        A bad prompt gets an output with `error` set and finish_reason "rejected"; the rest run."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        params = params or SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params_list)} SamplingParams")
        results: dict[str, RequestOutput] = {}
        order = [f"gen-{next(self._ids)}" for _ in prompts]
        for request_id, prompt, p in zip(order, prompts, params_list):
            try:
                self.engine.add_request(request_id, prompt, p)
            except ValueError as error:
                ids = prompt.get("prompt_token_ids", []) if isinstance(prompt, dict) else []
                results[request_id] = RequestOutput(request_id, prompt if isinstance(prompt, str) else None,
                                                    list(ids), [CompletionOutput(0, "", [], "rejected")],
                                                    error=str(error))
        with tqdm(total=len(prompts) - len(results), desc="generating", unit="req", disable=not use_tqdm) as bar:
            while len(results) < len(order):
                for output in self.engine.step().finished:
                    results[output.request_id] = output
                    bar.update(1)
        return [results[r] for r in order]

    def chat(self, messages, params: SamplingParams | None = None,
             use_tqdm: bool = False) -> RequestOutput | list[RequestOutput]:
        """Answer one conversation (a list of {"role", "content"}), or a list of them."""
        single = bool(messages) and isinstance(messages[0], dict)
        conversations = [messages] if single else messages
        prompts = [{"prompt_token_ids": self.tokenizer.encode_chat(c)} for c in conversations]
        outputs = self.generate(prompts, params, use_tqdm=use_tqdm)
        return outputs[0] if single else outputs

    def stream(self, prompt, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the text of one request's first sequence piece by piece as it is generated.
        Closing the iterator early (or Ctrl-C) aborts the request and frees its frames."""
        request_id = f"stream-{next(self._ids)}"
        self.engine.add_request(request_id, prompt, params)
        self.last_output = None
        try:
            while True:
                report = self.engine.step()
                if request_id in report.new_text:
                    yield report.new_text[request_id]
                for output in report.finished:
                    if output.request_id == request_id:
                        self.last_output = output
                        return
        finally:
            if request_id in self.engine.requests:
                self.last_output = self.engine.abort_request(request_id)
