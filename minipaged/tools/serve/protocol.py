"""The OpenAI request and response shapes, as vLLM's server takes and gives them.

Checked here, before the engine loop: bad JSON, a wrong type or range, a field of vLLM's
that minipaged lacks yet (`NOT_YET`) are an `APIError` (a 400 in OpenAI's JSON, naming
the field); an unknown field is ignored, as vLLM ignores it (`ignored`). The models make
/openapi.json too.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from minipaged.engine import check_text
from minipaged.sampling import MAX_STOP_LEN, MAX_STOP_STRINGS, SamplingParams
from minipaged.tools.serve import tools

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    429: "RateLimitError",
    503: "ServiceUnavailableError",
    500: "InternalServerError",
}
# no request field nests deeper than 5; a body nested deeper is refused before it is
# read
MAX_DEPTH = 16
MAX_DIGITS = 30  # no request field takes a longer integer (a seed is at most 19 digits)
# vLLM's max_logprobs: the most likeliest tokens a request may ask for beside each token
MAX_LOGPROBS = 20


class APIError(Exception):
    """An error the client gets as {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.headers = headers  # sent with the answer (a 429's Retry-After)

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": ERROR_TYPES.get(self.status, "APIError"),
                "param": self.param,
                "code": self.status,
            }
        }


class Strict(BaseModel):
    # strict: "5" is not an int, 1.5 is not an int, 1 is not a bool; NaN and infinities
    # are not numbers. Unknown fields are kept aside (model_extra) and ignored, as
    # OpenAI's and vLLM's servers ignore them: clients send store, metadata,
    # service_tier, ...
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


def _whole(value):
    """1.0 is the integer 1: JSON has one kind of number, and JSON Schema calls 1.0 an
    integer."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def Int(**bounds):
    """An integer field, within bounds (Field's ge, le): Int(ge=1) is n's type."""
    return Annotated[int, Field(**bounds), BeforeValidator(_whole)]


def _unsigned(seed: int) -> int:
    """vLLM takes any int64 seed; the engine's random streams want one >= 0: -1 becomes
    2**64 - 1
    (one to one, and a seed >= 0 stays itself, so it draws what LLM.generate draws)."""
    return seed % 2**64


TokenId = Int(ge=0)
Text = Annotated[str, Field(min_length=1)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_LEN)]


class StreamOptions(Strict):
    # current vLLM's default, and OpenAI's: stream_options={} asks for none
    include_usage: bool = False
    # vLLM's extension: the usage so far in every chunk
    continuous_usage_stats: bool = False


class SamplingFields(Strict):
    """What completions and chat completions share. Fields and defaults follow
    vllm/entrypoints/openai/protocol.py, with vLLM's extensions `top_k`, `ignore_eos`
    and `stop_token_ids`; the bounds are OpenAI's. The server's /openapi.json adds its
    own: the model it serves, n up to its max_num_seqs, max_tokens up to its limit."""

    model: str | None = None
    n: Int(ge=1) = 1
    max_tokens: Int(ge=1) | None = Field(
        None,
        description=(
            "default: the server's --default-max-tokens "
            "(chat) or 16 (completions), less if the context or the KV pool is smaller"
        ),
    )
    max_completion_tokens: Int(ge=1) | None = Field(
        None, description="the same as max_tokens"
    )
    temperature: float = Field(1.0, ge=0, le=2, description="0: greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: Int(ge=-1) = Field(
        -1, description="vLLM's extension; 0 and -1 both mean all tokens"
    )
    seed: (
        Annotated[Int(ge=-(2**63), le=2**63 - 1), AfterValidator(_unsigned)] | None
    ) = Field(None, description="any int64, as vLLM takes it")
    stop: (
        StopString
        | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)]
        | Literal[""]
        | None
    ) = None
    stop_token_ids: list[TokenId] | None = None  # vLLM's extension
    ignore_eos: bool = False  # vLLM's extension
    priority: Int(ge=-(2**31), le=2**31 - 1) = Field(
        0,
        description=(
            "vLLM's extension: the request's place in "
            "the queue under --scheduling-policy priority, lower first"
        ),
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    truncate_prompt_tokens: Int(ge=-1) | None = Field(
        None,
        description=(
            "vLLM's extension: keep the prompt's last k tokens (-1: max_model_len)"
        ),
    )
    truncation_side: Literal["left", "right"] | None = Field(
        None,
        description=(
            "vLLM's extension: where "
            "truncate_prompt_tokens cuts: left (the default) "
            "keeps the last k tokens, right the first k"
        ),
    )
    return_token_ids: bool | None = Field(
        None,
        description=(
            "vLLM's extension: the prompt's and each choice's token ids beside the text"
        ),
    )
    return_tokens_as_token_ids: bool | None = Field(
        None, description="vLLM's extension: logprobs name each token 'token_id:{id}'"
    )
    # the controls of the logits (sampling.adjust), vLLM's names, defaults and bounds
    presence_penalty: float = Field(
        0.0,
        ge=-2,
        le=2,
        description="subtracted once from a token already in the output",
    )
    frequency_penalty: float = Field(
        0.0, ge=-2, le=2, description="subtracted per time a token is in the output"
    )
    repetition_penalty: float | None = Field(
        None,
        gt=0,
        description=(
            "vLLM's extension: divides a positive logit "
            "(multiplies a negative one) of each token in prompt or output; 1: off"
        ),
    )
    min_p: float | None = Field(
        None,
        ge=0,
        le=1,
        description=(
            "vLLM's extension: drop tokens less likely than min_p times the likeliest"
        ),
    )
    min_tokens: Int(ge=0) = Field(
        0, description="vLLM's extension: no end-of-sequence or stop token before"
    )
    logit_bias: dict[str, float] | None = Field(
        None,
        description=(
            "token id -> added to its logit (clamped to [-100, 100], as vLLM does)"
        ),
    )
    prompt_logprobs: Int(ge=0, le=MAX_LOGPROBS) | None = Field(
        None,
        description=(
            "vLLM's extension: the logprob of "
            "each prompt token, and this many likeliest"
        ),
    )
    # structured output (minipaged/tools/serve/tools.py reads them into one
    # StructuredOutputsParams)
    structured_outputs: dict | None = Field(
        None,
        description=(
            "vLLM's: one of {json: schema}, {regex: ...}, "
            "{choice: [...]}, {json_object: true}; the answer is held to it"
        ),
    )
    response_format: dict | None = Field(
        None,
        description=(
            'OpenAI\'s: {"type": "text" | "json_object" | '
            '"json_schema", "json_schema": {"name": ..., "schema": {...}}}'
        ),
    )
    guided_json: dict | str | None = Field(
        None, description="older vLLM's structured_outputs.json"
    )
    guided_regex: str | None = Field(
        None, description="older vLLM's structured_outputs.regex"
    )
    guided_choice: list[str] | None = Field(
        None, description="older vLLM's structured_outputs.choice"
    )
    guided_grammar: str | None = Field(
        None, description="older vLLM's structured_outputs.grammar (refused)"
    )

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's SamplingParams (ValueError naming the field when a value is out
        of range)."""
        return SamplingParams(
            n=self.n,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=-1 if self.top_k == 0 else self.top_k,
            max_tokens=max_tokens,
            stop=self.stop or [],
            stop_token_ids=self.stop_token_ids or [],
            ignore_eos=self.ignore_eos,
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=(
                1.0 if self.repetition_penalty is None else self.repetition_penalty
            ),
            min_p=self.min_p or 0.0,
            min_tokens=self.min_tokens,
            logit_bias=self.token_bias(),
            logprobs=self.num_logprobs,
            prompt_logprobs=self.num_prompt_logprobs,
            structured_outputs=self.structure(),
        )

    def structure(self):
        """The StructuredOutputsParams this request asks for, or None (BadStructure: a
        400)."""
        return tools.spec_of(self)

    def token_bias(self) -> dict[int, float]:
        """logit_bias with token ids for keys, each bias clamped to [-100, 100] as vLLM
        does."""
        try:
            return {
                int(token): min(100.0, max(-100.0, bias))
                for token, bias in (self.logit_bias or {}).items()
            }
        except ValueError:
            raise APIError(
                400,
                "logit_bias keys must be token ids (integers written as strings), got "
                f"{list(self.logit_bias)!r:.80}",
                "logit_bias",
            ) from None

    @property
    def num_logprobs(self) -> int | None:
        """SamplingParams.logprobs: how many likeliest tokens beside each output token
        (None: no logprobs)."""
        return None

    @property
    def num_prompt_logprobs(self) -> int | None:
        return self.prompt_logprobs

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
    max_tokens: Int(ge=0) | None = Field(
        None,
        description=(
            "default 16, less if the context or the KV pool is smaller; 0 with echo"
            " scores the prompt (its logprobs with logprobs or prompt_logprobs) and"
            " generates nothing, as vLLM does"
        ),
    )
    max_completion_tokens: Int(ge=0) | None = Field(
        None, description="the same as max_tokens"
    )
    prompt: (
        Text
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Text], Field(min_length=1)]
        | Annotated[
            list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)
        ]
    )
    echo: bool = Field(
        False, description="the answer's text (and logprobs) start with the prompt's"
    )
    logprobs: Int(ge=0, le=MAX_LOGPROBS) | None = Field(
        None,
        description=(
            "each output token's logprob and this "
            "many likeliest (OpenAI allows 5, vLLM 20)"
        ),
    )
    suffix: str | None = None
    best_of: Int() | None = None
    add_special_tokens: bool = Field(
        True,
        description="vLLM's extension: the tokenizer adds its BOS to a text prompt",
    )

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def num_prompt_logprobs(self) -> int | None:
        """vLLM's: echo with logprobs asks for the prompt's too (the answer starts with
        the prompt)."""
        return (
            self.logprobs
            if self.prompt_logprobs is None and self.echo
            else self.prompt_logprobs
        )

    @property
    def scoring(self) -> bool:
        """max_tokens=0: the prompt is scored (with echo), nothing is generated."""
        return self.asked_max_tokens[0] == 0

    def prompts(self) -> list[str | list[int]]:
        """One prompt or a batch of them: a string, token ids, or a list of either."""
        p = self.prompt
        return [p] if isinstance(p, str) or isinstance(p[0], int) else list(p)


class ContentPart(Strict):
    type: Literal["text"] = Field(description="minipaged takes text only")
    text: str


# vLLM hands each to the chat template as it is
Role = Literal["system", "user", "assistant", "developer", "tool"]


class ChatMessage(Strict):
    role: Role
    # an assistant's earlier calls, shown to the template
    tool_calls: list[dict] | None = None
    # required (null: tool calls only)
    content: str | Annotated[list[ContentPart], Field(min_length=1)] | None
    name: str | None = None
    tool_call_id: str | None = None  # a tool's answer: to which call

    @field_validator("content")
    @classmethod
    def _content_or_calls(cls, content, info):
        if content is None and not info.data.get("tool_calls"):
            raise ValueError(
                "content must be text (null only in an assistant message with"
                " tool_calls)"
            )
        return content

    def text(self) -> str:
        if self.content is None:
            return ""
        return (
            self.content
            if isinstance(self.content, str)
            else "".join(part.text for part in self.content)
        )

    def for_template(self) -> dict:
        """The message as the chat template reads it (with its tool calls, if any)."""
        extra = {
            name: getattr(self, name)
            for name in ("tool_calls", "tool_call_id")
            if getattr(self, name)
        }
        return {"role": self.role, "content": self.text()} | extra


class Conversation(Strict):
    """The messages and how the chat template renders them (chat completions and
    /tokenize)."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    add_generation_prompt: bool = Field(
        True, description="vLLM's extension: end with the assistant's turn opened"
    )
    continue_final_message: bool = Field(
        False,
        description=(
            "vLLM's extension: leave the last message open, "
            "for the model to continue (add_generation_prompt must be false)"
        ),
    )
    add_special_tokens: bool = Field(
        False, description="vLLM's extension: a BOS on top of the template's"
    )
    tools: list[dict] | None = Field(
        None,
        description=(
            'OpenAI\'s: [{"type": "function", "function": {"name": '
            '..., "parameters": {...}}}]'
        ),
    )
    tool_choice: str | dict | None = Field(
        None,
        description=(
            '"none", "auto" (the default with tools), '
            '"required", or {"type": "function", "function": {"name": ...}}'
        ),
    )
    parallel_tool_calls: bool | None = Field(
        None,
        description='OpenAI\'s: false holds tool_choice "required" to one call',
    )

    @property
    def tool_plan(self) -> tools.ToolPlan:
        """What tools and tool_choice ask (BadStructure: a 400 naming the field)."""
        return tools.ToolPlan(self.tools, self.tool_choice, self.parallel_tool_calls)

    def conversation(self) -> list[dict]:
        return [m.for_template() for m in self.messages]


class ChatCompletionRequest(Conversation, SamplingFields):
    logprobs: bool = Field(
        False, description="each output token's logprob (choices[i].logprobs.content)"
    )
    top_logprobs: Int(ge=0, le=MAX_LOGPROBS) | None = Field(
        None,
        description="and this many likeliest tokens at each position (needs logprobs)",
    )
    echo: bool = Field(
        False,
        description=(
            "vLLM's extension: the answer starts with the last message's "
            "content when that message has the answer's role"
        ),
    )

    def structure(self):
        """A named function or "required" holds the answer to its schema; else as
        SamplingFields."""
        plan = self.tool_plan
        if plan.holds and tools.spec_of(self) is not None:
            raise tools.BadStructure(
                "tool_choice",
                f"tool_choice {self.tool_choice!r} holds the answer to the tools'"
                " schema: it cannot be given with another format (response_format,"
                " structured_outputs)",
            )
        return plan.spec() if plan.holds else tools.spec_of(self)

    @property
    def role(self) -> str:
        """The answer's role, as vLLM gives it: the assistant's, or (no generation
        prompt) the last message's."""
        return "assistant" if self.add_generation_prompt else self.messages[-1].role

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class TokenizeRequest(Strict):
    """POST /tokenize with a prompt (vLLM's TokenizeCompletionRequest)."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = Field(
        False, description="also each token's string"
    )


class TokenizeChatRequest(Conversation):
    """POST /tokenize with messages, rendered by the chat template (vLLM's
    TokenizeChatRequest)."""

    model: str | None = None
    return_token_strs: bool | None = Field(
        False, description="also each token's string"
    )


class DetokenizeRequest(Strict):
    model: str | None = None
    tokens: list[TokenId]


# ---- reading a body ------------------------------------------------------------------


class HugeNumber:
    """An integer of more than MAX_DIGITS digits in a body: refused, naming its field,
    without ever converting it (Python refuses past 4,300 digits, and nothing here takes
    one that long).
    """

    def __init__(self, digits: str):
        self.digits = len(digits.lstrip("-"))


def decode(raw: bytes):
    """A body's JSON (an APIError if it is not JSON, or nested too deeply for Python to
    read)."""
    try:
        return json.loads(
            raw, parse_int=lambda s: int(s) if len(s) <= MAX_DIGITS else HugeNumber(s)
        )
    except RecursionError:
        raise APIError(
            400,
            "the request body is nested too deeply (no field nests more than "
            f"{MAX_DEPTH} levels)",
        ) from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise APIError(400, f"the request body is not valid JSON: {error}") from None


def parse(model: type[Strict], body) -> Strict:
    """Validate a decoded JSON body; the first problem becomes an APIError naming its
    field (OpenAI's way: `messages[0].content`)."""
    if not isinstance(body, dict):
        raise APIError(
            400, f"the request body must be a JSON object, got {type(body).__name__}"
        )
    check_values(body)
    if issubclass(model, SamplingFields):
        refuse_what_is_not_yet_here(body)
    if (
        issubclass(model, CompletionRequest)
        and "prompt" in body
        and body["prompt"] in (None, "", [])
    ):
        raise APIError(
            400,
            "Either prompt or prompt_embeds must be provided and non-empty.",
            "prompt",
        )  # vLLM's
    try:
        request = model.model_validate(body)
    except ValidationError as error:
        # the deepest problem: in a union (a string or a list of parts) the member that
        # matched longest
        first = max(error.errors(), key=lambda e: len(e["loc"]))
        where = field_name(first["loc"])
        if first["type"] == "missing":
            raise APIError(400, f"Missing required parameter: {where}", where) from None
        if first["type"] in TYPES:  # "logprobs": "true" is a string, not JSON's true
            message = (
                f"{where} must be {TYPES[first['type']]}, got {kind_of(first['input'])}"
            )
            raise APIError(400, message, where) from None
        raise APIError(
            400, f"{where}: {first['msg']}, got {first['input']!r:.60}", where
        ) from None
    if (
        isinstance(request, Conversation)
        and request.continue_final_message
        and request.add_generation_prompt
    ):
        raise APIError(
            400,
            "Cannot set both `continue_final_message` and `add_generation_prompt` to"
            " True.",
            "continue_final_message",
        )
    if getattr(request, "suffix", None):
        raise APIError(
            400, "suffix is not supported by minipaged; leave it out", "suffix"
        )
    if isinstance(request, SamplingFields):
        check_logprobs(request)
    best_of = getattr(request, "best_of", None)
    if best_of is not None and best_of != request.n:
        raise APIError(400, "best_of is not supported by minipaged (use n)", "best_of")
    return request


TYPES = {
    "bool_type": "true or false (a JSON boolean)",
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
}


def kind_of(value) -> str:
    """What a client sent, for an error: "the string 'true'", "the number 5"."""
    kinds = {
        str: "the string",
        bool: "the boolean",
        int: "the number",
        float: "the number",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }
    kind = kinds.get(type(value), type(value).__name__)
    return (
        kind
        if value is None or isinstance(value, (list, dict))
        else f"{kind} {value!r:.60}"
    )


# vLLM's fields that minipaged lacks: (their neutral values, why); any other value is a
# 400
NOT_YET = {
    "structural_tag": (
        (None,),
        (
            "structural tags (text around held JSON) are not built; use response_format"
            " or structured_outputs"
        ),
    ),
    **{
        name: (neutral, "OpenAI's legacy function calls: use tools and tool_choice")
        for name, neutral in (
            ("functions", (None, [])),
            ("function_call", (None, "none")),
        )
    },
    "allowed_token_ids": (
        (None,),
        (
            "a list of allowed tokens is not built; structured_outputs.choice or .regex"
            " holds the answer to a set of texts"
        ),
    ),
    "bad_words": (
        (None, []),
        "banned words are not built; logit_bias with -100 bans a token",
    ),
    "use_beam_search": (
        (None, False),
        (
            "the server samples; beam search is LLM.generate's "
            "(SamplingParams(beam_width=...))"
        ),
    ),
    "include_stop_str_in_output": (
        (None, False),
        "a stop string is always cut from the text",
    ),
    "skip_special_tokens": (
        (None, True),
        "special tokens are always left out of the text",
    ),
    "logits_processors": ((None, []), "the server loads no logits processors"),
    "prompt_embeds": ((None, []), "a prompt is text or token ids"),
    "cache_salt": (
        (None,),
        (
            "the prefix cache is shared by every request (--no-enable-prefix-caching"
            " shares nothing)"
        ),
    ),
    "chat_template": ((None,), "the model's own chat template renders every chat"),
}


def refuse_what_is_not_yet_here(body: dict) -> None:
    """vLLM's fields that minipaged lacks are a 400 naming the field and why (an answer
    that silently ignored them would mislead); an unknown field is ignored, as vLLM
    ignores it.
    `stream_options` without `stream: true` is vLLM's 400, in vLLM's words."""
    for name, (neutral, why) in NOT_YET.items():
        if name in body and body[name] not in neutral:
            raise APIError(
                400,
                f"{name} is not supported by minipaged yet: {why}; leave it out",
                name,
            )
    if body.get("stream_options") and not body.get("stream"):
        raise APIError(
            400,
            "Stream options can only be defined when `stream=True`.",
            "stream_options",
        )


def ignored(request: BaseModel, where: str = "") -> list[str]:
    """The unknown fields of a checked request, which it ignores ("store",
    "messages[].tool_call_id")."""
    names = [f"{where}{name}" for name in request.model_extra or {}]
    for name in type(request).model_fields:
        value = getattr(request, name)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, BaseModel):
                names += ignored(
                    item, f"{where}{name}{'[]' if isinstance(value, list) else ''}."
                )
    return list(dict.fromkeys(names))


def check_logprobs(request: SamplingFields) -> None:
    """vLLM's rules for logprobs and echo: top_logprobs needs logprobs (chat); prompt
    logprobs never stream (vLLM's)."""
    if getattr(request, "top_logprobs", None) and not request.logprobs:
        raise APIError(
            400,
            "when using `top_logprobs`, `logprobs` must be set to true.",
            "top_logprobs",
        )
    if request.stream and request.num_prompt_logprobs is not None:
        name = "prompt_logprobs" if request.prompt_logprobs is not None else "echo"
        raise APIError(
            400,
            f"`prompt_logprobs` are not available when `stream=True` ({name} asks for"
            " them).",
            name,
        )


def check_values(value, where: tuple = ()) -> None:
    """Before the fields are read, what no field may hold: text that is not Unicode (a
    lone surrogate such as "\\ud800", which JSON escapes allow and a tokenizer cannot
    take), an integer of more than MAX_DIGITS digits, nesting deeper than MAX_DEPTH."""
    if len(where) > MAX_DEPTH:
        raise APIError(
            400,
            f"{field_name(where)}: the request body nests more than {MAX_DEPTH} levels",
            field_name(where),
        )
    if isinstance(value, str):
        try:
            check_text(value, field_name(where))
        except ValueError as error:
            raise APIError(400, str(error), field_name(where)) from None
    elif isinstance(value, HugeNumber):
        raise APIError(
            400,
            f"{field_name(where)}: a number of {value.digits} digits is out of range",
            field_name(where),
        )
    elif isinstance(value, dict):
        for key, item in value.items():
            check_values(key, where)
            check_values(item, (*where, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_values(item, (*where, i))


def field_name(loc) -> str:
    """('messages', 0, 'content') -> 'messages[0].content'; the union members pydantic
    names on the way ('str', 'list[constrained-int]') are not part of it."""
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        elif not (
            part in ("str", "int", "float", "bool")
            or part.startswith("constrained-")
            or "[" in part
        ):
            name += f".{part}" if name else part
    return name or "body"


# ---- responses -----------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_choice(
    index: int, text: str, finish_reason: str | None, stop_reason=None
) -> dict:
    """stop_reason (vLLM's): the stop string or stop token id that ended the text, else
    None."""
    return {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }


def chat_choice(
    index: int,
    text: str,
    finish_reason: str | None,
    stop_reason=None,
    role: str = "assistant",
) -> dict:
    return {
        "index": index,
        "message": {"role": role, "content": text},
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }


def chat_delta(
    index: int, delta: dict, finish_reason: str | None, stop_reason=None
) -> dict:
    return {
        "index": index,
        "delta": delta,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }


def envelope(
    response_id: str, kind: str, model: str, choices: list, created: int | None = None
) -> dict:
    return {
        "id": response_id,
        "object": kind,
        "created": created or int(time.time()),
        "model": model,
        "choices": choices,
    }


# ---- response shapes, for the OpenAPI schema (the dicts above are what is sent) ------

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


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """choices[i].logprobs of a chat answer (serve/logprobs.py)."""

    content: list[TokenLogprob] | None


class CompletionLogprobs(BaseModel):
    """choices[i].logprobs of a completion (serve/logprobs.py): four lists, one entry
    per token."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptLogprob(BaseModel):
    """vLLM's Logprob of a prompt token (prompt_logprobs: per token, token id ->
    this)."""

    logprob: float
    rank: int
    decoded_token: str | None


PromptLogprobs = list[dict[str, PromptLogprob] | None] | None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason
    stop_reason: int | str | None = Field(
        description=(
            "the stop string or stop token id that ended the text, "
            "else null (eos, length)"
        )
    )
    token_ids: list[int] | None = Field(None, description="with return_token_ids")
    prompt_token_ids: list[int] | None = Field(
        None, description="with return_token_ids"
    )
    prompt_logprobs: PromptLogprobs = Field(
        None, description="with prompt_logprobs, or echo with logprobs"
    )


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    # the assistant's, or with add_generation_prompt false the last message's
    role: Role
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason
    stop_reason: int | str | None = Field(
        description=(
            "the stop string or stop token id that ended the text, "
            "else null (eos, length)"
        )
    )
    token_ids: list[int] | None = Field(None, description="with return_token_ids")


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = Field(
        None, description="with return_token_ids"
    )
    prompt_logprobs: PromptLogprobs = Field(
        None, description="with prompt_logprobs (vLLM's extension)"
    )


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


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = Field(None, description="with return_token_strs")


class DetokenizeResponse(BaseModel):
    prompt: str


class TokenizerInfoResponse(BaseModel):
    """tokenizer_config.json as the server read it, with its chat template (vLLM's
    /tokenizer_info)."""

    model_config = ConfigDict(extra="allow")
    tokenizer_class: str


class VersionResponse(BaseModel):
    version: str
