"""`LLM`, the front door (vLLM's shape): load a model, then `generate`, `chat` or
`stream`.

It owns one LLMEngine and steps it until its callers' requests are done; generate,
stream and requests added to `llm.engine` by hand may interleave, each caller collecting
its own outputs.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections.abc import Iterator

from tqdm import tqdm

from minipaged import policies
from minipaged.backend import default_dtype, resolve_device
from minipaged.engine import EngineConfig, LLMEngine
from minipaged.model import DEFAULT_MODEL, Model, Tokenizer, resolve_model
from minipaged.model.cpu import fit_blas_threads
from minipaged.outputs import RequestOutput, rejected
from minipaged.sampling import SamplingParams


class LLM:
    """A model ready to generate: `LLM()` loads SmolLM2-135M-Instruct on the best
    device.

    Keyword arguments after `dtype` configure the engine (see EngineConfig): block_size,
    kv_cache_memory or num_blocks, kv_cache_dtype ("auto", or 8-bit "int8" / "fp8"),
    max_model_len, max_num_seqs, max_decode_rows (while several clients run; 0: no
    bound), enable_prefix_caching, preemption_mode ("recompute" or
    "swap"), scheduler ("continuous" or "static"), allocator ("paged" or
    "contiguous-max/pow2/oracle"), enable_chunked_prefill, max_num_batched_tokens.

    `generate`, `stream` and requests added to `llm.engine` by hand may interleave:
    whoever steps the engine puts every finished output in `unclaimed`, and each caller
    takes its own.
    """

    def __init__(
        self,
        model: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        **engine_options,
    ):
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
        self.engine = LLMEngine(
            self.model, self.tokenizer, EngineConfig(**engine_options), eos
        )
        # on a shared machine, BLAS threads that wait on each other are slow
        if self.device == "cpu":
            fit_blas_threads(samples=3)
        self.load_seconds = time.perf_counter() - start
        self._ids = itertools.count()
        # finished outputs not yet collected
        self.unclaimed: dict[str, RequestOutput] = {}

    @property
    def eos_token_ids(self) -> set[int]:
        return self.engine.eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids) -> None:
        self.engine.eos_token_ids = set(ids)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def use_cores(self, choice: str | int = "fit") -> tuple[int, str]:
        """On a CPU, for a long-running process (the server, the benchmarks): the cores
        to use ("fit", "all" or a count: model/cpu.py's use_cores), and helper processes
        on the cores beyond the first (model/team.py) that compute their share of every
        product and of this engine's attention, over the weights and KV cache in
        memory shared with them. Returns (cores in use now, what splits the work, in a
        few words)."""
        from minipaged.attention import cpu as cpu_attention
        from minipaged.model import cpu

        threads, how = self.model.use_cores(
            choice, kv=self.engine.kv, attention=cpu_attention.__name__
        )
        attention = self.engine.runner.attention
        if cpu.helpers_now() and attention.impl is cpu_attention:
            attention.impl = cpu.SplitAttention(cpu_attention)
        return threads, how

    def new_engine(self, **options) -> LLMEngine:
        """A fresh LLMEngine over this model and tokenizer, with its own KV cache and
        queues: `llm.new_engine(num_blocks=24, block_size=8)` takes the options of
        EngineConfig.
        """
        return LLMEngine(
            self.model, self.tokenizer, EngineConfig(**options), self.eos_token_ids
        )

    def generate(
        self,
        prompts,
        params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Complete each prompt (a string or {"prompt_token_ids": [...]}), all in one
        engine run. A bad prompt gets an output with `error` set and finish_reason
        "rejected"; the rest run. Interrupted (Ctrl-C), it aborts its own requests, so
        the engine is left as it was.
        """
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(
                f"got {len(prompts)} prompts but {len(params_list)} SamplingParams"
            )
        order = [self._new_id("generate") for _ in prompts]
        try:
            for request_id, prompt, p in zip(order, prompts, params_list):
                try:
                    self.engine.add_request(request_id, prompt, p)
                except ValueError as error:
                    self.unclaimed[request_id] = rejected(request_id, prompt, error)
            pending = [r for r in order if r not in self.unclaimed]
            with tqdm(
                total=len(pending), desc="generating", unit="req", disable=not use_tqdm
            ) as bar:
                for _ in self._run_until(pending):
                    bar.update(sum(r in self.unclaimed for r in pending) - bar.n)
            return [self.unclaimed.pop(r) for r in order]
        finally:
            for request_id in order:
                self._forget(request_id)

    def chat(
        self, messages, params: SamplingParams | None = None, use_tqdm: bool = False
    ) -> RequestOutput | list[RequestOutput]:
        """Answer one conversation (a list of {"role", "content"}), or a list of
        them."""
        single = bool(messages) and isinstance(messages[0], dict)
        conversations = [messages] if single else messages
        prompts = [
            {"prompt_token_ids": self.tokenizer.encode_chat(c)} for c in conversations
        ]
        outputs = self.generate(prompts, params, use_tqdm=use_tqdm)
        return outputs[0] if single else outputs

    def stream(self, prompt, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the text of one request's first sequence piece by piece as it is
        generated (text that could still turn out to be a stop string waits until it is
        decided; beam search yields its best text at the end). Closing the iterator
        early (or Ctrl-C) aborts
        the request and frees its frames; `last_output` then holds its RequestOutput."""
        request_id = self._new_id("stream")
        self.engine.add_request(request_id, prompt, params)
        self.last_output, sent = None, ""
        try:
            for _ in self._run_until([request_id]):
                text = (
                    self.engine.text_so_far(request_id)
                    if request_id in self.engine.requests
                    else sent
                )
                if len(text) > len(sent):
                    yield text[len(sent) :]
                    sent = text
            self.last_output = self.unclaimed.pop(request_id)
            if self.last_output.outputs and len(self.last_output.outputs[0].text) > len(
                sent
            ):
                yield self.last_output.outputs[0].text[len(sent) :]
        finally:
            self.last_output = self._forget(request_id) or self.last_output

    # ---- several callers, one engine -------------------------------------------------
    def _run_until(self, request_ids: list[str]) -> Iterator[None]:
        """Step the engine until these requests are finished. Every finished output goes
        to `unclaimed`, where its caller (generate, stream, or a user of `engine`)
        collects it.
        """
        while not all(r in self.unclaimed for r in request_ids):
            for output in self.engine.step().finished:
                self.unclaimed[output.request_id] = output
            yield

    def _new_id(self, kind: str) -> str:
        """A request id nobody holds: users may name their own requests "generate-0"
        too."""
        request_id = f"{kind}-{next(self._ids)}"
        while request_id in self.engine.requests or request_id in self.unclaimed:
            request_id = f"{kind}-{next(self._ids)}"
        return request_id

    def _forget(self, request_id: str) -> RequestOutput | None:
        """Abort a request of ours that still runs (an interrupted call), or drop its
        output that nobody collected; returns that output."""
        if request_id in self.engine.requests:
            return self.engine.abort_request(request_id)
        return self.unclaimed.pop(request_id, None)


def policy(option: str):
    """An argparse `type=` for a seam's option (minipaged.policies): a policy's name or
    a "module:Class" path, built at once, so a typo or a missing module is argparse's
    one line and exit code 2 before any work starts. `.metavar` lists the names."""

    def parse(text: str) -> str:
        try:
            policies.make(option, text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return text

    parse.__name__ = option
    parse.metavar = "{" + ",".join(policies.SEAMS[option]) + ",module:Class}"
    return parse


def number(
    kind=int,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    infinity: bool = False,
):
    """An argparse `type=` for a numeric option: a finite `kind` (int or float) within
    [minimum, maximum] (and > above), else argparse's one-line error and exit code 2,
    before any work starts: `parser.add_argument("--port", type=number(int, 1, 65535))`.
    `infinity=True` also takes inf (for a value where it means something, e.g. a rate
    "all at once"); nan never. The bounds stay readable on the type (`.kind`,
    `.minimum`, ...) for tests and help.
    """

    def parse(text: str):
        # a 5,000-digit value is one short line
        shown = text if len(text) <= 40 else text[:37] + "..."
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{shown!r} is not {'a whole number' if kind is int else 'a number'}"
            ) from None
        if isinstance(value, float) and (
            math.isnan(value) or math.isinf(value) and not infinity
        ):
            raise argparse.ArgumentTypeError(f"{shown!r} is not a finite number")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(
                f"{shown} is below the smallest allowed value, {minimum:g}"
            )
        if above is not None and value <= above:
            raise argparse.ArgumentTypeError(f"{shown} must be greater than {above:g}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(
                f"{shown} is above the largest allowed value, {maximum:g}"
            )
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    parse.kind, parse.minimum, parse.maximum, parse.above, parse.infinity = (
        kind,
        minimum,
        maximum,
        above,
        infinity,
    )
    return parse


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, its errors in one line: `PROG: error: MESSAGE` on stderr and
    exit code 2, without the usage lines argparse prints above it (--help has them).
    Every minipaged command line uses it (add_subparsers makes its subcommands of the
    same class); an error found after parsing (no such model, two options that do not
    fit) goes through `parser.error(message)` too, so it reads the same."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")
