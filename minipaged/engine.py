"""`LLM`: load a model, then `generate`, `chat` or `stream` (vLLM's API, so users can move on).

The whole path of a request in one file: prompt -> tokenizer (chat template) -> token ids ->
one prefill pass for all prompts -> decode steps, one token per live sequence per step ->
sampler -> text. This first engine runs each `generate` call as one static batch over a
contiguous cache; the paged cache and the continuous batcher replace that inside, not here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
from tqdm.auto import tqdm

from minipaged.backend import default_dtype, resolve_device, to_numpy
from minipaged.model import Model
from minipaged.reference import ContiguousKVCache
from minipaged.sampling import SamplingParams, make_generator, sample
from minipaged.tokenizer import IncrementalDetokenizer, Tokenizer
from minipaged.weights import DEFAULT_MODEL, resolve_model


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" (eos, stop token or string), "length", "rejected"


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    error: str | None = None  # why the request was rejected; the others still ran


@dataclass(slots=True)
class Sequence:
    """One generated continuation: a prompt's tokens plus what has been sampled so far."""
    request: int
    index: int
    token_ids: list[int]
    prompt_len: int
    params: SamplingParams
    generator: object
    detokenizer: IncrementalDetokenizer
    row: int = 0  # its slab in the contiguous cache
    finish_reason: str | None = None
    text: str = ""

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]


@dataclass(slots=True)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    error: str | None = None
    seqs: list[Sequence] = field(default_factory=list)


class LLM:
    """A model ready to generate: `LLM()` loads SmolLM2-135M-Instruct on the best device."""

    def __init__(self, model: str | None = None, device: str | None = None,
                 dtype: str | None = None, max_model_len: int | None = None,
                 progress: bool = True):
        start = time.perf_counter()
        self.device = resolve_device(device)
        self.dtype = dtype or default_dtype(self.device)
        self.folder = resolve_model(model)
        self.model_name = model or DEFAULT_MODEL
        self.tokenizer = Tokenizer(self.folder)
        self.model = Model.from_folder(self.folder, self.device, self.dtype)
        config = self.model.config
        self.max_model_len = min(max_model_len or config.max_position_embeddings,
                                 config.max_position_embeddings)
        self.eos_token_ids = set(config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)
        self.load_seconds = time.perf_counter() - start

    # ---- public API ---------------------------------------------------------------------
    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Complete each prompt (a string or {"prompt_token_ids": [...]})."""
        requests = self._make_requests(prompts, params)
        live = sum(len(r.seqs) for r in requests if r.error is None)
        with tqdm(total=live, desc="generating", unit="seq", disable=not use_tqdm) as bar:
            for finished in self._run(requests):
                bar.update(len(finished))
        return [self._output(r) for r in requests]

    def chat(self, messages, params: SamplingParams | None = None,
             use_tqdm: bool = False) -> RequestOutput | list[RequestOutput]:
        """Answer one conversation (a list of {"role", "content"}), or a list of them."""
        single = bool(messages) and isinstance(messages[0], dict)
        conversations = [messages] if single else messages
        prompts = [{"prompt_token_ids": self.tokenizer.encode_chat(c)} for c in conversations]
        outputs = self.generate(prompts, params, use_tqdm=use_tqdm)
        return outputs[0] if single else outputs

    def stream(self, prompt, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the answer's text piece by piece as tokens are generated (n must be 1)."""
        requests = self._make_requests([prompt], params)
        if requests[0].error:
            raise ValueError(requests[0].error)
        if len(requests[0].seqs) != 1:
            raise ValueError("stream() follows one sequence; use n=1")
        seq = requests[0].seqs[0]
        shown = 0
        for _ in self._run(requests):
            if len(seq.text) > shown:
                yield seq.text[shown:]
                shown = len(seq.text)

    # ---- inside -------------------------------------------------------------------------
    def _make_requests(self, prompts, params) -> list[Request]:
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        params = params or SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params_list)} SamplingParams")
        requests = []
        for i, (prompt, p) in enumerate(zip(prompts, params_list)):
            text, ids, error = self._prompt_ids(prompt)
            request = Request(str(i), text, ids, p, error)
            if error is None:
                request.seqs = [Sequence(i, j, list(ids), len(ids), p, make_generator(p, j),
                                         IncrementalDetokenizer(self.tokenizer)) for j in range(p.n)]
            requests.append(request)
        return requests

    def _prompt_ids(self, prompt) -> tuple[str | None, list[int], str | None]:
        """(text, token ids, error): a bad prompt is rejected with a reason, not raised."""
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, ids = prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
        else:
            return None, [], f"a prompt must be a string or {{'prompt_token_ids': [...]}}, got {prompt!r:.80}"
        vocab = self.model.config.vocab_size
        if not ids:
            return text, ids, "prompt is empty: give at least one token"
        if any(not 0 <= t < vocab for t in ids):
            bad = next(t for t in ids if not 0 <= t < vocab)
            return text, ids, f"prompt token id {bad} is outside this model's vocabulary (0..{vocab - 1})"
        if len(ids) >= self.max_model_len:
            return text, ids, (f"prompt has {len(ids)} tokens; this model's max_model_len is "
                               f"{self.max_model_len} (and at least one token must be generated)")
        return text, ids, None

    def _run(self, requests: list[Request]) -> Iterator[list[Sequence]]:
        """Prefill all prompts in one pass, then decode the batch until every sequence ends.

        Yields after every step the sequences that finished in it (often none)."""
        live = [r for r in requests if r.error is None]
        seqs = [s for r in live for s in r.seqs]
        if not seqs:
            return
        for row, seq in enumerate(seqs):
            seq.row = row
        max_len = min(self.max_model_len, max(s.prompt_len + s.params.max_tokens for s in seqs))
        cache = ContiguousKVCache(self.model.config, len(seqs), max_len, self.model.xp, self.dtype)

        # prefill: the first sample of each request; parallel samples copy its cache slab
        firsts = [r.seqs[0] for r in live]
        logits = self._forward(cache, firsts, [s.token_ids for s in firsts])
        for r in live:
            for s in r.seqs[1:]:
                cache.copy_sequence(r.seqs[0].row, s.row)
        per_seq = [logits[i] for i, r in enumerate(live) for _ in r.seqs]
        yield self._append(seqs, per_seq)

        while running := [s for s in seqs if s.finish_reason is None]:
            logits = self._forward(cache, running, [s.token_ids[-1:] for s in running])
            yield self._append(running, list(logits))

    def _forward(self, cache, seqs, new_tokens):
        positions = cache.begin_step([s.row for s in seqs], [len(t) for t in new_tokens])
        flat = [t for tokens in new_tokens for t in tokens]
        last_rows = [sum(len(t) for t in new_tokens[:i + 1]) - 1 for i in range(len(seqs))]
        return to_numpy(self.model.forward(flat, positions, cache, logits_indices=last_rows))

    def _append(self, seqs: list[Sequence], logits) -> list[Sequence]:
        """Sample one token per sequence, append it, and decide who is finished."""
        tokens = sample(np.stack(logits), [s.params for s in seqs], [s.generator for s in seqs])
        finished = []
        for seq, token in zip(seqs, tokens):
            seq.token_ids.append(token)
            seq.finish_reason = self._check_stop(seq, token)
            if seq.finish_reason:
                finished.append(seq)
        return finished

    def _check_stop(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
            return "stop"
        seq.text += seq.detokenizer.add(token)
        for stop in p.stop:
            if stop in seq.text:
                seq.text = seq.text[:seq.text.index(stop)]
                return "stop"
        if len(seq.output_ids) >= p.max_tokens or len(seq.token_ids) >= self.max_model_len:
            return "length"
        return None

    def _output(self, r: Request) -> RequestOutput:
        if r.error:
            return RequestOutput(r.request_id, r.prompt, r.prompt_token_ids,
                                 [CompletionOutput(0, "", [], "rejected")], error=r.error)
        outputs = [CompletionOutput(s.index, s.text, s.output_ids, s.finish_reason) for s in r.seqs]
        return RequestOutput(r.request_id, r.prompt, r.prompt_token_ids, outputs)
