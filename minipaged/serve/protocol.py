"""The OpenAI request and response shapes, as vLLM's server takes and gives them.

Requests are checked here, before they reach the engine loop: a body that is not JSON text, a
wrong type, a value out of range or an unknown field is an `APIError` (HTTP 400 and OpenAI's
error JSON, naming the field). The same models make the server's schema, /openapi.json.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from minipaged.engine import check_text
from minipaged.sampling import MAX_STOP_LEN, MAX_STOP_STRINGS, SamplingParams

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               405: "MethodNotAllowedError", 413: "RequestTooLargeError", 429: "RateLimitError",
               503: "ServiceUnavailableError", 500: "InternalServerError"}
MAX_DEPTH = 16   # no request field nests deeper than 5; a body nested deeper is refused before it is read
MAX_DIGITS = 30  # no request field takes a longer integer (a seed is at most 19 digits)


class APIError(Exception):
    """An error the client gets as {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.headers = headers  # sent with the answer (a 429's Retry-After)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "APIError"),
                          "param": self.param, "code": self.status}}


class Strict(BaseModel):
    # strict: "5" is not an int, 1.5 is not an int, 1 is not a bool; NaN and infinities are not
    # numbers; unknown fields are refused
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


def _whole(value):
    """1.0 is the integer 1: JSON has one kind of number, and JSON Schema calls 1.0 an integer."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def Int(**bounds):
    """An integer field, within bounds (Field's ge, le): Int(ge=1) is n's type."""
    return Annotated[int, Field(**bounds), BeforeValidator(_whole)]


TokenId = Int(ge=0)
Text = Annotated[str, Field(min_length=1)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_LEN)]


class StreamOptions(Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(Strict):
    """What completions and chat completions share. Fields and defaults follow
    vllm/entrypoints/openai/protocol.py, with vLLM's extensions `top_k`, `ignore_eos` and
    `stop_token_ids`; the bounds are OpenAI's. The server's /openapi.json adds its own: the
    model it serves, n up to its max_num_seqs, max_tokens up to its limit."""
    model: str | None = None
    n: Int(ge=1) = 1
    max_tokens: Int(ge=1) | None = Field(None, description="default: the server's --default-max-tokens "
                                   "(chat) or 16 (completions), less if the context or the KV pool is smaller")
    max_completion_tokens: Int(ge=1) | None = Field(None, description="the same as max_tokens")
    temperature: float = Field(1.0, ge=0, le=2, description="0: greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: Int(ge=-1) = Field(-1, description="vLLM's extension; 0 and -1 both mean all tokens")
    seed: Int(ge=0, le=2**63 - 1) | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | Literal[""] | None = None
    stop_token_ids: list[TokenId] | None = None  # vLLM's extension
    ignore_eos: bool = False                     # vLLM's extension
    priority: Int(ge=-2**31, le=2**31 - 1) = Field(0, description="vLLM's extension: the request's place in "
                                                   "the queue under --scheduling-policy priority, lower first")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # accepted at their neutral values, so that clients sending them explicitly work
    presence_penalty: float = Field(0.0, description="0 only: minipaged has no penalties")
    frequency_penalty: float = Field(0.0, description="0 only: minipaged has no penalties")
    logit_bias: dict[str, float] | None = Field(None, description="empty only")

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's SamplingParams (ValueError naming the field when a value is out of range)."""
        unsupported = [name for name in ("presence_penalty", "frequency_penalty", "logit_bias")
                       if getattr(self, name)]
        if unsupported:
            raise APIError(400, f"{unsupported[0]} is not supported by minipaged; leave it out", unsupported[0])
        return SamplingParams(n=self.n, temperature=self.temperature, top_p=self.top_p,
                              top_k=-1 if self.top_k == 0 else self.top_k, max_tokens=max_tokens,
                              stop=self.stop or [], stop_token_ids=self.stop_token_ids or [],
                              ignore_eos=self.ignore_eos, seed=self.seed)

    @property
    def asked_max_tokens(self) -> tuple[int | None, str]:
        """(max_tokens the client asked for, or None; the field it came in)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: Text | Annotated[list[TokenId], Field(min_length=1)] | Annotated[list[Text], Field(min_length=1)] \
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
    echo: bool = False
    logprobs: Int() | None = None
    suffix: str | None = None
    best_of: Int() | None = None

    def prompts(self) -> list[str | list[int]]:
        """One prompt or a batch of them: a string, token ids, or a list of either."""
        p = self.prompt
        return [p] if isinstance(p, str) or isinstance(p[0], int) else list(p)


class ContentPart(Strict):
    type: Literal["text"] = Field(description="minipaged takes text only")
    text: str


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant"]
    content: str | Annotated[list[ContentPart], Field(min_length=1)]  # required, as OpenAI's API has it
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    logprobs: bool = False
    top_logprobs: Int() | None = None
    add_generation_prompt: bool = True  # vLLM's extension

    def conversation(self) -> list[dict]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]


# ---- reading a body --------------------------------------------------------------------------

class HugeNumber:
    """An integer of more than MAX_DIGITS digits in a body: refused, naming its field, without
    ever converting it (Python refuses past 4,300 digits, and nothing here takes one that long)."""

    def __init__(self, digits: str):
        self.digits = len(digits.lstrip("-"))


def decode(raw: bytes):
    """A body's JSON (an APIError if it is not JSON, or nested too deeply for Python to read)."""
    try:
        return json.loads(raw, parse_int=lambda s: int(s) if len(s) <= MAX_DIGITS else HugeNumber(s))
    except RecursionError:
        raise APIError(400, f"the request body is nested too deeply (no field nests more than "
                       f"{MAX_DEPTH} levels)") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise APIError(400, f"the request body is not valid JSON: {error}") from None


def parse(model: type[Strict], body) -> Strict:
    """Validate a decoded JSON body; the first problem becomes an APIError naming its field
    (OpenAI's way: `messages[0].content`)."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    check_values(body)
    try:
        request = model.model_validate(body)
    except ValidationError as error:
        # the deepest problem: in a union (a string or a list of parts) the member that matched longest
        first = max(error.errors(), key=lambda e: len(e["loc"]))
        where = field_name(first["loc"])
        if first["type"] == "extra_forbidden":
            raise APIError(400, f"Unrecognized request argument supplied: {where}", where) from None
        if first["type"] == "missing":
            raise APIError(400, f"Missing required parameter: {where}", where) from None
        raise APIError(400, f"{where}: {first['msg']}, got {first['input']!r:.60}", where) from None
    for name in ("logprobs", "top_logprobs", "suffix", "echo"):
        if getattr(request, name, None):
            raise APIError(400, f"{name} is not supported by minipaged; leave it out", name)
    best_of = getattr(request, "best_of", None)
    if best_of is not None and best_of != request.n:
        raise APIError(400, "best_of is not supported by minipaged (use n)", "best_of")
    return request


def check_values(value, where: tuple = ()) -> None:
    """Before the fields are read, what no field may hold: text that is not Unicode (a lone
    surrogate such as "\\ud800", which JSON escapes allow and a tokenizer cannot take), an
    integer of more than MAX_DIGITS digits, nesting deeper than MAX_DEPTH."""
    if len(where) > MAX_DEPTH:
        raise APIError(400, f"{field_name(where)}: the request body nests more than {MAX_DEPTH} levels",
                       field_name(where))
    if isinstance(value, str):
        try:
            check_text(value, field_name(where))
        except ValueError as error:
            raise APIError(400, str(error), field_name(where)) from None
    elif isinstance(value, HugeNumber):
        raise APIError(400, f"{field_name(where)}: a number of {value.digits} digits is out of range",
                       field_name(where))
    elif isinstance(value, dict):
        for key, item in value.items():
            check_values(key, where)
            check_values(item, (*where, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_values(item, (*where, i))


def field_name(loc) -> str:
    """('messages', 0, 'content') -> 'messages[0].content'; the union members pydantic names on
    the way ('str', 'list[constrained-int]') are not part of it."""
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        elif not (part in ("str", "int", "float", "bool") or part.startswith("constrained-") or "[" in part):
            name += f".{part}" if name else part
    return name or "body"


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


# ---- response shapes, for the OpenAPI schema (the dicts above are what is sent) ---------------

FinishReason = Literal["stop", "length", "abort"] | None


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(BaseModel):
    """Every error, as OpenAI's API gives it."""
    error: ErrorInfo


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None
    finish_reason: FinishReason
    stop_reason: None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: FinishReason
    stop_reason: None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Model(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: None
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]
