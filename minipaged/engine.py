"""The engine: `add_request` queues a request, `step()` runs one step of all of them.

One step: the scheduler picks the batch -> the runner makes its memory moves and
prepares the flat inputs -> the model computes logits -> each row's new tokens are
picked and cut at a stop -> `Scheduler.update` appends them and finishes sequences ->
a `StepReport` of what happened.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

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
from minipaged.policies import CheckedConstraint, PolicyError
from minipaged.runner import ModelRunner
from minipaged.sampling import (
    SamplingParams,
    held_rows,
    int_list,
    make_generator,
    sample,
)
from minipaged.scheduler import (
    Batch,
    Request,
    Scheduled,
    Scheduler,
    Sequence,
    Status,
)


@dataclass(slots=True)
class RowLogits:
    """One scheduled row's logits after the forward pass."""

    row: Scheduled
    logits: np.ndarray  # (rows, vocab): its last token's, then each extra token's


@dataclass(slots=True)
class NewTokens:
    """A sequence's new tokens this step, before the scheduler appends them."""

    request: Request
    emitted: list[int]  # extra tokens the model agreed with, then one of its own
    logits: np.ndarray  # (rows, vocab): the logits they came from
    kept: list[int] | None = None  # emitted up to a stop (_cut_at_stops)
    stopped: bool = False  # its text ended (eos, a stop token or string)

    @property
    def accepted(self) -> list[int]:
        """The extra tokens it keeps: their K and V were computed this step."""
        return self.kept[:-1]

    @property
    def sampled(self) -> int:
        """The token it sampled from the model, after the accepted ones."""
        return self.kept[-1]


class LLMEngine:
    """Requests in, one step at a time, outputs out."""

    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer,
        config: EngineConfig | None = None,
        eos_token_ids=(),
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        self._build_memory()
        self.runner = ModelRunner(model, self.kv, self.blocks)
        # extra tokens per row (EngineConfig.lookahead), or None
        self.lookahead = self.config.lookahead(self.runner, self.blocks)
        self.scheduler = Scheduler(
            self.config.scheduler_config(self.max_model_len),
            self.blocks,
            self.lookahead,
        )
        self.eos_token_ids = set(eos_token_ids or model.config.eos_token_ids)
        # structured output's compiler, built for the first request that asks
        self.constraints = None
        self.constraint_errors: list[PolicyError] = []  # this step's failures
        self.requests: dict[str, Request] = {}
        self.step_count = 0

    def _build_memory(self) -> None:
        """The block manager (frames, page tables) and the KV cache arrays they index:
        as many frames as the KV memory holds, a host pool for swap."""
        config = self.config
        c = self.model.config
        dtype = kv_storage_dtype(config.kv_cache_dtype, self.model.dtype)
        frame = (c.num_layers, c.num_kv_heads, c.head_dim, config.block_size, dtype)
        memory = default_kv_memory(self.model.device, config.kv_cache_memory)
        num_blocks = config.num_blocks or num_blocks_for_memory(memory, *frame)
        swap_frames = min(num_blocks, num_blocks_for_memory(SWAP_SPACE, *frame))
        longest = min(
            config.max_model_len or c.max_position_embeddings,
            c.max_position_embeddings,
        )
        self.blocks = config.block_manager(
            num_blocks,
            min(longest, num_blocks * config.block_size),
            config.swap_space or swap_frames,
        )
        pool_tokens = self.blocks.num_frames * self.blocks.block_size
        self.max_model_len = min(longest, pool_tokens)
        self.kv = self._kv_cache(dtype)

    def _kv_cache(self, dtype) -> KVCache:
        """The K and V arrays of every frame the block manager hands out."""
        c = self.model.config
        return KVCache(
            num_layers=c.num_layers,
            num_blocks=self.blocks.num_frames,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            block_size=self.blocks.block_size,
            num_host_blocks=self.blocks.num_host_frames,
            dtype=dtype,
            device=self.model.device,
            num_tier_blocks=self.blocks.num_tier_frames,
            tier_path=self.config.kv_offload_path,
        )

    # ---- the API ---------------------------------------------------------------
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
        server among clients. A bad request raises ValueError saying what was wrong,
        and nothing is queued."""
        if params is None:
            params = SamplingParams()
        self._check_ids(request_id, client)
        try:
            text, ids = self._check_request(prompt, params, priority)
            constraint = self._compile(params.structured_outputs)
        except ValueError as error:
            raise ValueError(f"request {request_id!r}: {error}") from None
        num_seqs = params.n
        if params.beam_width > 1:
            num_seqs = 1  # beams fork when they branch
        seqs = [self._new_sequence(ids, params, i, constraint) for i in range(num_seqs)]
        request = Request(
            request_id, text, list(ids), params, seqs, client=client or ""
        )
        self.requests[request_id] = request
        self.scheduler.add(request, priority)

    def _new_sequence(self, ids, params, index: int, constraint) -> Sequence:
        """Sample `index` of a request: its own generator, text and constraint."""
        if constraint is not None:
            constraint = constraint.fork()  # each sequence walks its own
        return Sequence(
            self.scheduler.new_seq_id(),
            list(ids),
            len(ids),
            index=index,
            generator=make_generator(params, index),
            detokenizer=IncrementalDetokenizer(self.tokenizer),
            constraint=constraint,
        )

    def _compile(self, spec):
        """A request's structured-output constraint, compiled once, or None."""
        if spec is None:
            return None
        backend = self.constrainer()
        try:
            constraint = backend.compile(spec)
        except ValueError:
            raise  # the spec's own fault, said by the backend
        except Exception as error:
            raise ValueError(
                f"structured_outputs_backend {policies.describe(backend)}: compile()"
                f" raised {type(error).__name__}: {error}"
            ) from None
        vocab_size = self.model.config.vocab_size
        return CheckedConstraint(constraint, backend, vocab_size, self.eos_token_ids)

    def constrainer(self):
        """The compiler of SamplingParams.structured_outputs
        (EngineConfig.constrainer), built once."""
        if self.constraints is None:
            self.constraints = self.config.constrainer(
                self.tokenizer, self.model.config.vocab_size, self.eos_token_ids
            )
        return self.constraints

    def abort_request(self, request_id: str) -> RequestOutput:
        """Stop a request now and free its frames; its output so far,
        finish_reason "abort"."""
        if request_id not in self.requests:
            raise KeyError(
                f"no request {request_id!r} is waiting or running (finished "
                "requests are forgotten; ids are case-sensitive)"
            )
        request = self.requests.pop(request_id)
        self.scheduler.abort(request)
        return self._output(request)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def text_so_far(self, request_id: str) -> str:
        """The text its first sequence has released so far (beam search: none
        until the end)."""
        request = self.requests[request_id]
        if request.beam_search:
            return ""
        return request.seqs[0].released_text

    def step(self) -> StepReport:
        """Schedule, move memory, run the model once, sample, and finish what is
        done."""
        start = time.perf_counter()
        before = (self.blocks.frames_taken, self.blocks.frames_released)
        batch = self.scheduler.schedule()
        if not batch.scheduled and self.has_unfinished_requests():
            raise RuntimeError(
                "the scheduler could not schedule any request (this is a bug: "
                "requests that can never fit are rejected by add_request)"
            )
        self.runner.move(batch.moves)
        extra = {}  # sequence -> the extra tokens it runs after its next one
        rows = []
        finished = []
        if batch.scheduled:
            extra, rows, finished = self._run(batch)
        self.step_count += 1
        report = StepReport.of(
            step=self.step_count - 1,
            batch=batch,
            extra=extra,
            rows=rows,
            finished=finished,
            blocks=self.blocks,
            before=before,
            start=start,
        )
        self._raise_policy_errors(report)
        return report

    def _raise_policy_errors(self, report: StepReport) -> None:
        """A policy that failed this step (its seam's default stood in, or its
        request was cut short) is raised now, with the step's report: the step ran,
        and the next one works."""
        errors = self.scheduler.take_policy_errors() + self.constraint_errors
        self.constraint_errors = []
        if errors:
            errors[0].report = report
            for other in errors[1:]:
                errors[0].request_ids += other.request_ids
            raise errors[0]

    # ---- inside a step ---------------------------------------------------------
    def _run(self, batch: Batch):
        """Run the batch: the forward pass, then its new tokens into the scheduler.
        Returns the extra tokens run, an ExtraRow per row that ran some, and the
        outputs of the requests that finished."""
        # on a shared CPU: as many BLAS threads as cores are free
        self.model.follow_machine_load()
        extra = {}
        if self.lookahead is not None:
            extra = self.lookahead.propose(batch)
        inputs = self.runner.prepare(batch, extra)
        logits = self.runner.run(inputs)  # (sum(inputs.num_logits), vocab)
        rows = self._split_logits(batch, logits, inputs.num_logits)
        new_tokens = self._pick_tokens(rows, extra)
        self._cut_at_stops(new_tokens)
        if self.lookahead is not None:
            self._settle_lookahead(batch, new_tokens)
        beam_steps = self._beam_steps(rows)
        done = self._update_scheduler(batch, new_tokens, beam_steps)
        self._release_text(new_tokens)
        self._collect_constraint_failures(new_tokens)
        extra_rows = self._extra_rows(batch, extra, new_tokens)
        return extra, extra_rows, [self._finish(request) for request in done]

    def _split_logits(self, batch: Batch, logits, num_logits) -> list[RowLogits]:
        """Each scheduled row's own logits (num_logits[i] rows each, in order), its
        prompt logprobs taken out: what is left is its last token's, then its extra
        tokens'. A static batch's padding rows come last and are dropped."""
        ends = np.cumsum(num_logits)[:-1]
        rows = []
        for row, row_logits in zip(batch.scheduled, np.split(logits, ends)):
            start = row.seq.num_computed
            row_logits = row.request.take_prompt_logprobs(start, row_logits)
            rows.append(RowLogits(row, row_logits))
        return rows

    def _pick_tokens(
        self, rows: list[RowLogits], extra: dict
    ) -> dict[Sequence, NewTokens]:
        """Each sampler's new tokens: for a row that ran extra tokens, the ones the
        lookahead emits; else one token sampled from its last logits (the forked
        samples of one prompt share its row). Beams choose apart (_beam_steps)."""
        new_tokens = {}
        to_sample = []  # (row's logits, sequence)
        for row_logits in rows:
            row = row_logits.row
            if row.seq in extra:
                new_tokens[row.seq] = self._emit(row_logits, extra[row.seq])
            elif not row.request.beam_search:
                for seq in row.samplers:
                    to_sample.append((row_logits, seq))
        tokens = self._sample(to_sample)
        for (row_logits, seq), token in zip(to_sample, tokens):
            request = row_logits.row.request
            new_tokens[seq] = NewTokens(request, [token], row_logits.logits)
        return new_tokens

    def _emit(self, row_logits: RowLogits, extra_tokens: list[int]) -> NewTokens:
        """The tokens the lookahead emits for a row that ran extra tokens, each
        checked against the row's constraint, if it has one."""
        row = row_logits.row
        logits = row_logits.logits
        held = held_rows(logits, row.seq.constraint, extra_tokens)
        tokens = self.lookahead.emit(row, extra_tokens, held)
        return NewTokens(row.request, tokens, logits)

    def _sample(self, to_sample: list[tuple[RowLogits, Sequence]]) -> list[int]:
        """One token for each (row, sequence): the sampler over their last logits,
        every sequence with its own generator, at its own position."""
        if not to_sample:
            return []
        logits = np.stack([row.logits[-1] for row, _ in to_sample])  # (n, vocab)
        params = [row.row.request.params for row, _ in to_sample]
        seqs = [seq for _, seq in to_sample]
        generators = [seq.generator.at(len(seq.token_ids)) for seq in seqs]
        tokens = sample(logits, params, generators, seqs, self.eos_token_ids)
        return [int(token) for token in tokens]

    def _beam_steps(self, rows: list[RowLogits]) -> dict[Request, beam.BeamStep]:
        """Each beam search's next beams, from its live beams' last logits."""
        candidates = {}  # request -> [(beam, its last logits)]
        for row_logits in rows:
            row = row_logits.row
            if not row.request.beam_search:
                continue
            for seq in row.samplers:
                pair = (seq, row_logits.logits[-1])
                candidates.setdefault(row.request, []).append(pair)
        steps = {}
        for request, pairs in candidates.items():
            params = request.params
            ends = functools.partial(params.ends, eos_token_ids=self.eos_token_ids)
            steps[request] = beam.step(pairs, params.beam_width, ends)
        return steps

    def _cut_at_stops(self, new_tokens: dict[Sequence, NewTokens]) -> None:
        """Each sequence's new tokens up to the first that ends its text (eos, a
        stop token, or a stop string), its text added as it goes."""
        for seq, new in new_tokens.items():
            kept, stopped = seq.keep_until_stop(
                new.emitted, new.request.params, self.eos_token_ids, new.logits
            )
            new.kept = kept
            new.stopped = stopped

    def _settle_lookahead(self, batch: Batch, new_tokens) -> None:
        """A row's extra slots now hold the extra tokens it keeps; the rest roll
        back."""
        for row in batch.scheduled:
            if row.extra_slots:
                self.lookahead.settle(row, new_tokens[row.seq].accepted)

    def _update_scheduler(self, batch: Batch, new_tokens, beam_steps) -> list:
        """The scheduler appends every sequence's tokens (a beam search applies its
        step) and finishes what is done; the requests that finished."""
        sampled = {seq: new.sampled for seq, new in new_tokens.items()}
        accepted = {seq: new.accepted for seq, new in new_tokens.items()}
        stopped = {seq for seq, new in new_tokens.items() if new.stopped}
        return self.scheduler.update(
            batch,
            sampled,
            accepted=accepted,
            stopped=stopped,
            beams=beam_steps,
        )

    def _collect_constraint_failures(self, new_tokens) -> None:
        """A sequence whose constraint failed this step took an end token: its
        request is cut short, with the backend's error (_raise_policy_errors)."""
        for seq, new in new_tokens.items():
            failure = getattr(seq.constraint, "failure", None)
            if failure is None or failure.reported:
                continue
            failure.reported = True
            failure.request_ids.append(new.request.request_id)
            self.constraint_errors.append(failure)

    def _release_text(self, new_tokens: dict[Sequence, NewTokens]) -> None:
        """Hand out each sequence's new text, but an end that may become a stop."""
        for seq, new in new_tokens.items():
            seq.release(new.request.params.stop)

    def _extra_rows(self, batch: Batch, extra: dict, new_tokens) -> list[ExtraRow]:
        """An ExtraRow for each row that ran extra tokens: how many, emitted, kept."""
        rows = []
        for row in batch.scheduled:
            if row.seq not in extra:
                continue
            new = new_tokens[row.seq]
            rows.append(
                ExtraRow(
                    request_id=row.request.request_id,
                    index=row.seq.index,
                    extra=len(extra[row.seq]),
                    emitted=len(new.emitted),
                    kept=len(new.accepted),
                )
            )
        return rows

    # ---- requests in and out ---------------------------------------------------
    def _check_ids(self, request_id, client) -> None:
        """A request's id is a new non-empty string; its client, if named, one too."""
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

    def _check_request(
        self, prompt, params, priority: int = 0
    ) -> tuple[str | None, list[int]]:
        """Validate one request (ValueError naming what is wrong); its prompt text
        and ids."""
        if not isinstance(params, SamplingParams):
            raise ValueError(
                f"params must be SamplingParams, got {type(params).__name__}"
            )
        params.validate()
        text, ids = self._prompt_ids(prompt)
        self._check_vocabulary(ids, params)
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

    def _check_vocabulary(self, ids: list[int], params: SamplingParams) -> None:
        """Every token id a request names is one of this model's."""
        vocab = self.model.config.vocab_size
        named = {
            "prompt token id": ids,
            "stop_token_ids entry": params.stop_token_ids,
            "logit_bias key": params.logit_bias,
        }
        for name, values in named.items():
            bad = [t for t in values if not 0 <= t < vocab]
            if bad:
                raise ValueError(
                    f"{name} {bad[0]} is out of vocabulary (this model's ids are"
                    f" 0..{vocab - 1})"
                )

    def _prompt_ids(self, prompt) -> tuple[str | None, list[int]]:
        """A prompt's text (None when only ids were given) and token ids."""
        if isinstance(prompt, str):
            text = check_text(prompt, "prompt")
            ids = self.tokenizer.encode(prompt)
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
        """Refuse a request that could not fit even alone in the KV pool, in the
        worst case (Scheduler.worst_case_frames: every sample or beam with its own
        copy, as after a recompute)."""
        num_seqs = max(params.n, params.beam_width)
        asked = f"n={params.n}, beam_width={params.beam_width}"
        max_num_seqs = self.scheduler.config.max_num_seqs
        if num_seqs > max_num_seqs:
            raise ValueError(
                f"{asked}: it runs {num_seqs} sequences at once but max_num_seqs"
                f" is {max_num_seqs}"
            )
        if num_seqs > 1 and not self.blocks.can_fork:
            raise ValueError(
                f"{asked}: allocator={self.config.allocator!r} cannot share frames"
                " between sequences; use allocator='paged'"
            )
        needed = self.scheduler.worst_case_frames(prompt_len, params)
        if needed > self.blocks.num_frames:
            raise ValueError(
                f"it needs {needed} frames of {self.blocks.block_size} tokens"
                f" (prompt {prompt_len} + max_tokens {params.max_tokens},"
                f" {num_seqs} sequences) but the KV pool has"
                f" {self.blocks.num_frames}; give more kv_cache_memory or ask for"
                " less"
            )

    def _finish(self, request: Request) -> RequestOutput:
        """A request whose sequences are all finished leaves the engine; its output."""
        del self.requests[request.request_id]
        return self._output(request)

    def _output(self, request: Request) -> RequestOutput:
        """A request's output so far (a beam search's: its best beams)."""
        if request.beam_search:
            outputs = beam.outputs(request, self.tokenizer.decode)
        else:
            outputs = [seq.completion(request.params) for seq in request.seqs]
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
