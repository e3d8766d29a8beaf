"""The OpenAI request and response shapes, as vLLM's server takes and gives them.

Requests are checked here, before they reach the engine loop: a wrong type, an unknown field or
an unsupported option is an `APIError` (HTTP 400 and OpenAI's error JSON, naming the field).
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, ValidationError

from minipaged.sampling import SamplingParams

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               413: "RequestTooLargeError", 503: "ServiceUnavailableError", 500: "InternalServerError"}


class APIError(Exception):
    """An error the client gets as {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "APIError"),
                          "param": self.param, "code": self.status}}


class Strict(BaseModel):
    # strict: "5" is not an int, 1.0 is not an int, 1 is not a bool; unknown fields are refused
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(Strict):
    """What completions and chat completions share. Fields and defaults follow
    vllm/entrypoints/openai/protocol.py, with vLLM's extensions `top_k`, `ignore_eos` and
    `stop_token_ids`."""
    model: str | None = None
    n: int = 1
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1               # vLLM's extension; 0 and -1 both mean all tokens
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM's extension
    ignore_eos: bool = False                  # vLLM's extension
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # accepted at their neutral values, so that clients sending them explicitly work
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """The engine's SamplingParams (ValueError naming the field when a value is out of range)."""
        unsupported = [name for name in ("presence_penalty", "frequency_penalty", "logit_bias")
                       if getattr(self, name)]
        if unsupported:
            raise APIError(400, f"{unsupported[0]} is not supported by minipaged; leave it out", unsupported[0])
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return SamplingParams(n=self.n, temperature=self.temperature, top_p=self.top_p,
                              top_k=-1 if self.top_k == 0 else self.top_k,
                              max_tokens=default_max_tokens if max_tokens is None else max_tokens,
                              stop=self.stop or [], stop_token_ids=self.stop_token_ids or [],
                              ignore_eos=self.ignore_eos, seed=self.seed)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    def prompts(self) -> list[str | list[int]]:
        """One prompt or a batch of them: a string, token ids, or a list of either."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        if not p:
            raise APIError(400, "prompt is empty: give a string or a list of token ids", "prompt")
        return list(p)


class ContentPart(Strict):
    type: str
    text: str | None = None


class ChatMessage(Strict):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self, i: int) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise APIError(400, f"messages[{i}]: only text content is supported, got a part of "
                               f"type {part.type!r}", f"messages.{i}.content")
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True  # vLLM's extension

    def conversation(self) -> list[dict]:
        if not self.messages:
            raise APIError(400, "messages is empty: give at least one message", "messages")
        return [{"role": m.role, "content": m.text(i)} for i, m in enumerate(self.messages)]


def parse(model: type[Strict], body) -> Strict:
    """Validate a parsed JSON body; the first problem becomes an APIError naming its field."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        request = model.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"] if not _is_type_name(part))
        if first["type"] == "extra_forbidden":
            raise APIError(400, f"Unrecognized request argument supplied: {where}", where) from None
        if first["type"] == "missing":
            raise APIError(400, f"{where} is required", where) from None
        raise APIError(400, f"{where}: {first['msg']}, got {first['input']!r:.60}", where) from None
    for name in ("logprobs", "top_logprobs", "suffix", "echo"):
        if getattr(request, name, None):
            raise APIError(400, f"{name} is not supported by minipaged; leave it out", name)
    best_of = getattr(request, "best_of", None)
    if best_of is not None and best_of != request.n:
        raise APIError(400, "best_of is not supported by minipaged (use n)", "best_of")
    return request


def _is_type_name(part) -> bool:
    """pydantic names the union member it tried ('str', 'list[int]'): not part of the field."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part)


# ---- responses -------------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_choice(index: int, text: str, finish_reason: str | None) -> dict:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason,
            "stop_reason": None}


def chat_choice(index: int, text: str, finish_reason: str | None) -> dict:
    return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": None,
            "finish_reason": finish_reason, "stop_reason": None}


def chat_delta(index: int, delta: dict, finish_reason: str | None) -> dict:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def envelope(response_id: str, kind: str, model: str, choices: list, created: int | None = None) -> dict:
    return {"id": response_id, "object": kind, "created": created or int(time.time()), "model": model,
            "choices": choices}
