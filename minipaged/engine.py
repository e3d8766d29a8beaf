"""The engine: `add_request` queues a request, `step()` runs one step of all of them.

One step: the scheduler picks the batch -> the runner makes its memory moves and
prepares the flat inputs -> the model computes logits -> the sampler (or beam search)
picks tokens -> `Scheduler.update` appends them and finishes sequences -> a `StepReport`
of what happened.
"""

from __future__ import annotations

import time

import numpy as np

from minipaged import beam, policies
from minipaged.config import EngineConfig
from minipaged.model import IncrementalDetokenizer, Model, Tokenizer
from minipaged.outputs import ExtraRow, RequestOutput, StepReport
from minipaged.paging import (
    SWAP_SPACE,
    KVCache,
    default_kv_memory,
    kv_storage_dtype,
    num_blocks_for_memory,
)
from minipaged.runner import ModelRunner
from minipaged.sampling import (
    SamplingParams,
    held_rows,
    int_list,
    make_generator,
    sample,
)
from minipaged.scheduler import Batch, Request, Scheduler, Sequence, Status


class LLMEngine:
    """Requests in, one step at a time, outputs out."""

    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer,
        config: EngineConfig | None = None,
        eos_token_ids=(),
    ):
        self.model, self.tokenizer = model, tokenizer
        self.config = config = config or EngineConfig()
        c = model.config
        sizes = (
            c.num_layers,
            c.num_kv_heads,
            c.head_dim,
            config.block_size,  # of one frame
            kv_storage_dtype(config.kv_cache_dtype, model.dtype),
        )
        memory = default_kv_memory(model.device, config.kv_cache_memory)
        num_blocks = config.num_blocks or num_blocks_for_memory(memory, *sizes)
        host_frames = config.swap_space or min(
            num_blocks, num_blocks_for_memory(SWAP_SPACE, *sizes)
        )
        max_model_len = min(
            config.max_model_len or c.max_position_embeddings, c.max_position_embeddings
        )
        self.blocks = config.block_manager(
            num_blocks, min(max_model_len, num_blocks * config.block_size), host_frames
        )
        self.max_model_len = min(
            max_model_len, self.blocks.num_frames * self.blocks.block_size
        )
        self.kv = KVCache(
            c.num_layers,
            self.blocks.num_frames,
            c.num_kv_heads,
            c.head_dim,  # the chosen
            self.blocks.block_size,
            self.blocks.num_host_frames,
            sizes[-1],
            model.device,  # frames
            self.blocks.num_tier_frames,
            config.kv_offload_path,
        )
        self.runner = ModelRunner(model, self.kv, self.blocks)
        self.lookahead = config.lookahead(
            self.runner, self.blocks
        )  # extra tokens per row, or None
        self.scheduler = Scheduler(
            config.scheduler_config(self.max_model_len), self.blocks, self.lookahead
        )
        self.eos_token_ids = set(eos_token_ids or c.eos_token_ids)
        self.constraints = (
            None  # structured output's compiler, built for the first request that asks
        )
        self.requests: dict[str, Request] = {}
        self.step_count = 0

    # ---- the API
    # --------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt,
        params: SamplingParams | None = None,
        priority: int = 0,
        client: str | None = None,
    ) -> None:
        """Queue a request: prompt is a string or {"prompt_token_ids": [...]};
        `priority` (vLLM's: lower runs first) needs a waiting order that reads it
        (scheduling_policy); `client` names who asked, for an order that shares the
        server among clients. A bad request raises
        ValueError saying what was wrong, and nothing is queued."""
        params = SamplingParams() if params is None else params
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(
                f"request_id must be a non-empty string, got {request_id!r}"
            )
        if request_id in self.requests:
            raise ValueError(
                f"request id {request_id!r} is already in use; ids must be unique"
            )
        if client is not None and not isinstance(client, str):
            raise ValueError(
                f"client must be a string naming who asked, got {client!r}"
            )
        try:
            text, ids = self._check_request(prompt, params, priority)
            spec = (
                params.structured_outputs
            )  # its constraint, compiled once; each sequence walks its own
            constraint = self.constrainer().compile(spec) if spec is not None else None
        except ValueError as error:
            raise ValueError(f"request {request_id!r}: {error}") from None
        seqs = [
            Sequence(
                self.scheduler.new_seq_id(),
                list(ids),
                len(ids),
                index=i,
                generator=make_generator(params, i),
                detokenizer=IncrementalDetokenizer(self.tokenizer),
                constraint=constraint and constraint.fork(),
            )
            for i in range(1 if params.beam_width > 1 else params.n)
        ]
        self.requests[request_id] = Request(
            request_id, text, list(ids), params, seqs, client=client or ""
        )
        self.scheduler.add(self.requests[request_id], priority)

    def constrainer(self):
        """The compiler of SamplingParams.structured_outputs (EngineConfig.constrainer),
        built once."""
        if self.constraints is None:
            self.constraints = self.config.constrainer(
                self.tokenizer, self.model.config.vocab_size, self.eos_token_ids
            )
        return self.constraints

    def abort_request(self, request_id: str) -> RequestOutput:
        """Stop a request now and free its frames; its output so far, finish_reason
        "abort"."""
        if request_id not in self.requests:
            raise KeyError(
                f"no request {request_id!r} is waiting or running (finished requests "
                "are forgotten; ids are case-sensitive)"
            )
        request = self.requests.pop(request_id)
        self.scheduler.abort(request)
        return self._output(request)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def text_so_far(self, request_id: str) -> str:
        """The text its first sequence has released so far (beam search: none until the
        end)."""
        request = self.requests[request_id]
        return "" if request.beam_search else request.seqs[0].released_text

    def step(self) -> StepReport:
        """Schedule, move memory, run the model once, sample, and finish what is
        done."""
        start, before = (
            time.perf_counter(),
            (
                self.blocks.frames_taken,
                self.blocks.frames_released,
            ),
        )
        batch = self.scheduler.schedule()
        if not batch.scheduled and self.has_unfinished_requests():
            raise RuntimeError(
                "the scheduler could not schedule any request (this is a bug: "
                "requests that can never fit are rejected by add_request)"
            )
        self.runner.move(batch.moves)
        finished, extra, rows = [], {}, []
        if batch.scheduled:
            # on a shared CPU: as many BLAS threads as cores are free
            self.model.follow_machine_load()
            extra = (
                self.lookahead.propose(batch) if self.lookahead is not None else {}
            )  # seq -> extra tokens
            inputs = self.runner.prepare(batch, extra)
            logits = self.runner.run(
                inputs
            )  # (sum(inputs.num_logits), vocab): row after row
            done, rows = self._sample_and_update(
                batch, np.split(logits, np.cumsum(inputs.num_logits)[:-1]), extra
            )
            finished = [self._finish(r) for r in done]
        self.step_count += 1
        return StepReport.of(
            self.step_count - 1,
            batch,
            extra,
            rows,
            finished,
            self.blocks,
            before,
            start,
        )

    # ---- inside a step
    # -----------------------------------------------------------------------
    def _sample_and_update(
        self, batch: Batch, blocks: list[np.ndarray], extra: dict
    ) -> tuple[list[Request], list]:
        """Pick each sampler's next token (or the next beams; or, for a row with extra
        tokens, the lookahead's emitted ones), cut each at a stop, and let the scheduler
        apply it all; returns the requests that finished, and an ExtraRow per row that
        ran extra tokens.
        """
        plain, beams, emitted = [], {}, {}
        for s, block in zip(
            batch.scheduled, blocks
        ):  # each row's logits: its last token's (prompt logprobs:
            block = s.request.take_prompt_logprobs(
                s.seq.num_computed, block
            )  # every one's), its extra tokens'
            if (
                s.seq in extra
            ):  # each extra token checked against the row's constraint, if it has one
                held = held_rows(block, s.seq.constraint, extra[s.seq])
                emitted[s.seq] = (
                    s.request,
                    self.lookahead.emit(s, extra[s.seq], held),
                    block,
                )
            for seq in (
                [] if s.seq in extra else s.samplers
            ):  # forked samples share logits
                if s.request.beam_search:
                    beams.setdefault(s.request, []).append((seq, block[-1]))
                else:
                    plain.append((s.request, seq, block))
        picked = (
            sample(
                np.stack([block[-1] for *_, block in plain]),
                [r.params for r, *_ in plain],
                [seq.generator.at(len(seq.token_ids)) for _, seq, _ in plain],
                [seq for _, seq, _ in plain],
                self.eos_token_ids,
            )
            if plain
            else []
        )
        emitted.update(
            {
                seq: (request, [int(token)], block)
                for (request, seq, block), token in zip(plain, picked)
            }
        )
        kept, stopped = (
            {},
            set(),
        )  # each one's tokens up to the first that ends its text
        for seq, (request, tokens, block) in emitted.items():
            kept[seq], stop = seq.keep_until_stop(
                tokens, request.params, self.eos_token_ids, block
            )
            if stop:
                stopped.add(seq)
        for s in batch.scheduled:
            if (
                s.extra_slots
            ):  # its slots hold the extra tokens kept; the rest roll back
                self.lookahead.settle(s, kept[s.seq][:-1])
        ends = self.eos_token_ids
        steps = {
            request: beam.step(
                pairs,
                request.params.beam_width,
                lambda t, p=request.params: p.ends(t, ends),
            )
            for request, pairs in beams.items()
        }
        finished = self.scheduler.update(
            batch,
            {seq: t[-1] for seq, t in kept.items()},
            stopped,
            steps,
            {seq: t[:-1] for seq, t in kept.items()},
        )
        for seq, (request, *_) in emitted.items():
            seq.release(request.params.stop)
        return finished, [
            ExtraRow(
                s.request.request_id,
                s.seq.index,
                len(extra[s.seq]),
                len(emitted[s.seq][1]),
                len(kept[s.seq]) - 1,
            )
            for s in batch.scheduled
            if s.seq in extra
        ]

    # ---- requests in and out
    # -------------------------------------------------------------------
    def _check_request(
        self, prompt, params, priority: int = 0
    ) -> tuple[str | None, list[int]]:
        """Validate one request (ValueError naming what is wrong); its prompt text and
        ids."""
        if not isinstance(params, SamplingParams):
            raise ValueError(
                f"params must be SamplingParams, got {type(params).__name__}"
            )
        params.validate()
        text, ids = self._prompt_ids(prompt)
        vocab = self.model.config.vocab_size
        for name, values in (
            ("prompt token id", ids),
            ("stop_token_ids entry", params.stop_token_ids),
            ("logit_bias key", params.logit_bias),
        ):
            bad = [t for t in values if not 0 <= t < vocab]
            if bad:
                raise ValueError(
                    f"{name} {bad[0]} is out of vocabulary (this model's ids are"
                    f" 0..{vocab - 1})"
                )
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens; this model's max_model_len is "
                f"{self.max_model_len} (and one token must be generated)"
            )
        self._check_fits(len(ids), params)
        policies.check_request(
            self.scheduler.order, self.lookahead, priority, params.beam_width
        )
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
            raise ValueError(
                "a prompt must be a string or {'prompt_token_ids': [...]}, got"
                f" {prompt!r:.80}"
            )
        if not ids:
            raise ValueError("prompt is empty: give at least one token")
        return text, ids

    def _check_fits(self, prompt_len: int, params: SamplingParams) -> None:
        """Refuse a request that could not fit even alone in the KV pool, in the worst
        case (Scheduler.worst_case_frames: every sample or beam with its own copy, as
        after a recompute).
        """
        num_seqs = max(params.n, params.beam_width)
        if num_seqs > self.scheduler.config.max_num_seqs:
            raise ValueError(
                f"n={params.n}, beam_width={params.beam_width}: it runs {num_seqs}"
                " sequences at once but max_num_seqs is"
                f" {self.scheduler.config.max_num_seqs}"
            )
        if num_seqs > 1 and not self.blocks.can_fork:
            raise ValueError(
                f"n={params.n}, beam_width={params.beam_width}:"
                f" allocator={self.config.allocator!r} cannot share frames between"
                " sequences; use allocator='paged'"
            )
        needed = self.scheduler.worst_case_frames(prompt_len, params)
        if needed > self.blocks.num_frames:
            raise ValueError(
                f"it needs {needed} frames of {self.blocks.block_size} tokens (prompt"
                f" {prompt_len} + max_tokens {params.max_tokens}, {num_seqs} sequences)"
                f" but the KV pool has {self.blocks.num_frames}; give more"
                " kv_cache_memory or ask for less"
            )

    def _finish(self, request: Request) -> RequestOutput:
        """A request whose sequences are all finished leaves the engine; its output."""
        del self.requests[request.request_id]
        return self._output(request)

    def _output(self, request: Request) -> RequestOutput:
        outputs = (
            beam.outputs(request, self.tokenizer.decode)
            if request.beam_search
            else [s.completion(request.params) for s in request.seqs]
        )
        return RequestOutput(
            request.request_id,
            request.prompt,
            request.prompt_token_ids,
            outputs,
            finished=request.status is Status.FINISHED,
            num_cached_tokens=request.num_cached_tokens,
            prompt_logprobs=request.prompt_logprobs,
        )


def check_text(text, name: str) -> str:
    """`text` if it is a str that UTF-8 can encode (no lone surrogates), else a
    ValueError."""
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{name} is not valid text: {error.reason} at character {error.start}"
        ) from None
    return text
