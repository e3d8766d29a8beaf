"""OpenAI's Responses API (POST /v1/responses), as vLLM serves it, on chat's path.

A Responses request is read into a chat request (instructions, input items, function
call outputs, text.format, function tools); the chat's answer or stream is written back
as a Response or as the Responses events. Responses sent with `store` are kept in
memory, the oldest evicted first, for GET and DELETE /v1/responses/{id}, its
input_items and previous_response_id.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from minipaged.tools.serve.protocol import MAX_LOGPROBS, APIError, Int, Strict

# what vLLM's Responses API leaves out (a 400 naming the field)
BUILT_IN_TOOLS = {
    "web_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "file_search",
    "computer_use_preview",
    "computer_use",
    "code_interpreter",
    "image_generation",
    "local_shell",
    "mcp",
    "shell",
    "apply_patch",
    "custom",
}
# sampling fields of chat that a Responses request may carry (vLLM's extra fields)
PASSED = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "logit_bias",
    "priority",
    "seed",
    "temperature",
    "top_p",
)


class ResponsesRequest(Strict):
    """The fields of POST /v1/responses that this file reads, checked by type (strict,
    as chat's are; unknown fields ignored). The sampling fields are checked on chat's
    path; an item's shape by messages_of."""

    input: str | list[dict] = Field(
        description="a user message, or message, function_call and"
        " function_call_output items"
    )
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: Int(ge=1) | None = None
    stream: bool | None = None
    store: bool | None = Field(None, description="default true: kept for GET")
    background: bool | None = Field(None, description="only false")
    previous_response_id: str | None = None
    tools: list[dict] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict | None = None
    text: dict | None = None
    include: list[str] | None = None
    top_logprobs: Int(ge=0, le=MAX_LOGPROBS) | None = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def refuse_what_vllm_leaves_out(raw: dict) -> None:
    if raw.get("background") and raw.get("store") is False:
        raise APIError(
            400,
            "background can only be used when `store` is true (and this server runs"
            " no background responses: send background=false)",
            "background",
        )
    if raw.get("background"):
        raise APIError(
            400,
            "background mode is not supported: minipaged (as vLLM without its"
            " background store) answers a response while the request is open; send"
            " background=false",
            "background",
        )
    for i, tool in enumerate(raw.get("tools") or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise APIError(
                400,
                f"tools[{i}] has type {kind!r}: only function tools are served here"
                " (built-in web search, file search, computer use, code interpreter"
                " and MCP tools are not)",
                "tools",
            )
    if raw.get("conversation") is not None:
        raise APIError(
            400,
            "conversation is not supported: chain responses with previous_response_id",
            "conversation",
        )


def text_of(content) -> str:
    """A message item's content: a string, or a list of input_text / output_text
    parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(
            400, "a message's content must be text or a list of parts", "input"
        )
    out = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text", "refusal"):
            raise APIError(
                400,
                f"content part of type {kind!r}: minipaged takes text only"
                " (input_text, output_text)",
                "input",
            )
        out.append(part.get("text", part.get("refusal", "")))
    return "".join(out)


def messages_of(items) -> list[dict]:
    """Responses input items as chat messages: a string is one user message; message
    items keep their role; a function_call is an assistant's tool call, its
    function_call_output the tool's answer; reasoning items are dropped."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise APIError(
            400, "input must be a string or a non-empty list of items", "input"
        )
    messages = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise APIError(400, f"input[{i}] must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise APIError(
                    400,
                    f"input[{i}].role must be user, assistant, system or developer,"
                    f" got {role!r}",
                    "input",
                )
            messages.append({"role": role, "content": text_of(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or item.get("id") or new_id("call"),
                "type": "function",
                "function": {
                    "name": item.get("name"),
                    "arguments": item.get("arguments", "{}"),
                },
            }
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            else:
                messages.append(
                    {"role": "assistant", "content": None, "tool_calls": [call]}
                )
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": output
                    if isinstance(output, str)
                    else json.dumps(output),
                }
            )
        elif kind == "reasoning":
            continue
        else:
            raise APIError(
                400,
                f"input[{i}] has type {kind!r}: minipaged takes message, function_call"
                " and function_call_output items",
                "input",
            )
    return messages


def response_format(text) -> dict | None:
    """`text.format` as chat's response_format."""
    fmt = (text or {}).get("format") if isinstance(text, dict) else None
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        return {
            "type": "json_schema",
            "json_schema": {
                "name": fmt.get("name", "answer"),
                "schema": fmt.get("schema") or {"type": "object"},
            },
        }
    raise APIError(
        400,
        'text.format must be {"type": "text"}, {"type": "json_object"} or {"type":'
        f' "json_schema", "name": ..., "schema": {{...}}}}, got {fmt!r:.80}',
        "text",
    )


def chat_tools(tools) -> list | None:
    if not tools:
        return None
    return [
        {
            "type": "function",
            "function": {
                k: t[k] for k in ("name", "description", "parameters") if k in t
            },
        }
        for t in tools
    ]


def chat_tool_choice(choice):
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def chat_request(raw: dict, history: list[dict], stream: bool) -> dict:
    """The chat request a Responses request asks for (history: the messages of its
    previous_response_id)."""
    messages = list(history)
    if raw.get("instructions"):
        messages = [{"role": "system", "content": raw["instructions"]}] + messages
    chat = {
        "messages": messages + messages_of(raw.get("input")),
        "stream": stream,
    }
    if raw.get("model") is not None:
        chat["model"] = raw["model"]
    if raw.get("max_output_tokens") is not None:
        chat["max_tokens"] = raw["max_output_tokens"]
    for name in PASSED:
        if raw.get(name) is not None:
            chat[name] = raw[name]
    if stream:
        chat["stream_options"] = {"include_usage": True}
    fmt = response_format(raw.get("text"))
    if fmt is not None and not forces_a_call(raw):
        chat["response_format"] = fmt
    if raw.get("tools"):
        chat["tools"] = chat_tools(raw["tools"])
    if raw.get("tool_choice") is not None:
        chat["tool_choice"] = chat_tool_choice(raw["tool_choice"])
    if raw.get("parallel_tool_calls") is not None:
        chat["parallel_tool_calls"] = raw["parallel_tool_calls"]
    if wants_logprobs(raw):
        chat["logprobs"] = True
        chat["top_logprobs"] = raw.get("top_logprobs") or 0
    return chat


def forces_a_call(raw: dict) -> bool:
    """tool_choice required or named: the answer is a call's arguments, held to its
    tool's schema, so a text.format has no text to hold (instructor's RESPONSES_TOOLS
    mode sends both; OpenAI answers the call)."""
    choice = raw.get("tool_choice")
    return bool(raw.get("tools")) and (choice == "required" or isinstance(choice, dict))


def wants_logprobs(raw: dict) -> bool:
    """The output text's logprobs: asked by include (OpenAI's way) or by
    top_logprobs."""
    included = "message.output_text.logprobs" in (raw.get("include") or [])
    return included or bool(raw.get("top_logprobs"))


def logprobs_of(chat_logprobs: dict | None) -> list[dict]:
    """Chat's logprobs (per token: token, logprob, bytes, top_logprobs) as an
    output_text part's: the same entries."""
    return list((chat_logprobs or {}).get("content") or [])


def usage(chat_usage: dict | None) -> dict:
    u = chat_usage or {"prompt_tokens": 0, "completion_tokens": 0}
    return {
        "input_tokens": u["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": u["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u["prompt_tokens"] + u["completion_tokens"],
    }


def message_item(
    text: str, status: str = "completed", item_id: str = "", logprobs=()
) -> dict:
    part = {
        "type": "output_text",
        "text": text,
        "annotations": [],
        "logprobs": list(logprobs),
    }
    return {
        "type": "message",
        "id": item_id or new_id("msg"),
        "status": status,
        "role": "assistant",
        "content": [part] if status == "completed" else [],
    }


def call_item(call: dict, status: str = "completed", item_id: str = "") -> dict:
    return {
        "type": "function_call",
        "id": item_id or new_id("fc"),
        "call_id": call.get("id") or new_id("call"),
        "name": call["function"]["name"],
        "arguments": call["function"].get("arguments") or "",
        "status": status,
    }


def items_of(choice: dict) -> list[dict]:
    """A chat answer's choice as Responses output items."""
    message = choice["message"]
    calls = message.get("tool_calls") or []
    items = [call_item(c) for c in calls]
    if message.get("content") or not calls:
        logprobs = logprobs_of(choice.get("logprobs"))
        items.insert(0, message_item(message.get("content") or "", logprobs=logprobs))
    return items


def as_messages(items: list[dict]) -> list[dict]:
    """Output items back as chat messages (the history of a later request)."""
    out = []
    for item in items:
        if item["type"] == "message":
            out.append(
                {
                    "role": "assistant",
                    "content": "".join(p["text"] for p in item["content"]),
                }
            )
        else:
            out.extend(
                messages_of(
                    [
                        {
                            "type": "function_call",
                            "call_id": item["call_id"],
                            "name": item["name"],
                            "arguments": item["arguments"],
                        }
                    ]
                )
            )
    return out


def response(
    raw: dict,
    response_id: str,
    model: str,
    created: int,
    output: list[dict],
    chat_usage: dict | None,
    finish_reason: str | None,
    status: str | None = None,
) -> dict:
    """The Response object, with the request's settings echoed as OpenAI's are."""
    fmt = (raw.get("text") or {}).get("format") or {"type": "text"}
    incomplete = finish_reason == "length"
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status or ("incomplete" if incomplete else "completed"),
        "background": False,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": raw.get("instructions"),
        "max_output_tokens": raw.get("max_output_tokens"),
        "metadata": raw.get("metadata"),
        "model": model,
        "output": output,
        "parallel_tool_calls": raw.get("parallel_tool_calls", True),
        "previous_response_id": raw.get("previous_response_id"),
        "reasoning": None,
        "service_tier": "auto",
        "store": raw.get("store", True),
        "temperature": raw.get("temperature", 1.0),
        "text": {"format": fmt},
        "tool_choice": raw.get("tool_choice", "auto"),
        "tools": raw.get("tools") or [],
        "top_logprobs": raw.get("top_logprobs"),
        "top_p": raw.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": usage(chat_usage) if chat_usage is not None else None,
        "user": raw.get("user"),
    }


@dataclass(slots=True)
class Kept:
    """A stored response: the Response, the conversation that led to it (chat messages,
    for previous_response_id) and its request's input items (for input_items)."""

    response: dict
    messages: list[dict]
    input_items: list[dict]


class Store:
    """Responses sent with store, at most `limit`, the oldest evicted first."""

    def __init__(self, limit: int):
        self.limit, self.kept = limit, OrderedDict()

    def put(self, response_id: str, kept: Kept) -> None:
        self.kept[response_id] = kept
        while len(self.kept) > self.limit:
            self.kept.popitem(last=False)

    def get(self, response_id: str, field: str = "response_id") -> Kept:
        if response_id not in self.kept:
            raise APIError(
                404,
                f"Response with id '{response_id}' not found: this server keeps the"
                f" last {self.limit} responses sent with store=true, in memory (the"
                " oldest are evicted first, a deleted one is gone, and none survives a"
                " restart)",
                field,
            )
        return self.kept[response_id]

    def delete(self, response_id: str) -> dict:
        """DELETE /v1/responses/{id}: OpenAI's answer."""
        self.get(response_id)
        del self.kept[response_id]
        return {"id": response_id, "object": "response.deleted", "deleted": True}


def input_items_of(raw_input) -> list[dict]:
    """A request's input as the items OpenAI lists for it: each with an id and a
    status, a message's content as a list of text parts."""
    if isinstance(raw_input, str):
        raw_input = [{"role": "user", "content": raw_input}]
    items = []
    for raw in raw_input:
        item = dict(raw)
        item.setdefault("type", "message")
        if item["type"] == "message":
            kind = "output_text" if item.get("role") == "assistant" else "input_text"
            text = text_of(item.get("content"))
            item["content"] = [{"type": kind, "text": text}]
        prefix = {"message": "msg", "function_call": "fc"}.get(item["type"], "fco")
        item.setdefault("id", new_id(prefix))
        item.setdefault("status", "completed")
        items.append(item)
    return items


def listing(items: list[dict], query) -> dict:
    """GET /v1/responses/{id}/input_items: OpenAI's cursor page (limit 1-100, default
    20; order desc, the newest first, or asc; after: the id the page starts after)."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise APIError(400, f"order must be asc or desc, got {order!r}", "order")
    limit = query.get("limit", "20")
    if not limit.isdigit() or not 1 <= int(limit) <= 100:
        raise APIError(
            400, f"limit must be a whole number from 1 to 100, got {limit!r}", "limit"
        )
    ordered = items if order == "asc" else items[::-1]
    ids = [item["id"] for item in ordered]
    start = 0
    if "after" in query:
        if query["after"] not in ids:
            raise APIError(
                400,
                f"after={query['after']!r} is not an input item of this response",
                "after",
            )
        start = ids.index(query["after"]) + 1
    page = ordered[start : start + int(limit)]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + len(page) < len(ordered),
    }


class EventStream:
    """Chat chunks in, the Responses event sequence out: response.created and
    .in_progress, then per output item its added, deltas (output_text.delta, or
    function_call_arguments.delta) and done events, and response.completed with the
    whole Response (its status incomplete when cut)."""

    def __init__(self, raw: dict, response_id: str, model: str):
        self.raw, self.id, self.model = raw, response_id, model
        self.created, self.number = int(time.time()), 0
        self.items: list[dict] = []  # output items, the last possibly open
        self.open: dict | None = None
        self.calls: dict[int, dict] = {}  # chat's tool call index -> its item
        self.usage, self.finish_reason = None, None

    def event(self, kind: str, **fields) -> str:
        data = {"type": kind, "sequence_number": self.number} | fields
        self.number += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"

    def snapshot(self, status: str | None = None) -> dict:
        return response(
            self.raw,
            self.id,
            self.model,
            self.created,
            self.items,
            self.usage,
            self.finish_reason,
            status,
        )

    def start(self):
        yield self.event("response.created", response=self.snapshot("in_progress"))
        yield self.event("response.in_progress", response=self.snapshot("in_progress"))

    def _open(self, item: dict):
        self.items.append(item)
        self.open = item
        index = len(self.items) - 1
        added = dict(item, status="in_progress")
        if item["type"] == "message":
            added["content"] = []
        else:
            added["arguments"] = ""
        yield self.event("response.output_item.added", output_index=index, item=added)
        if item["type"] == "message":
            yield self.event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            )

    def _close(self):
        item, self.open = self.open, None
        if item is None:
            return
        index = self.items.index(item)
        if item["type"] == "message":
            part = item["content"][0]
            yield self.event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=part["logprobs"],
            )
            yield self.event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            )
        else:
            yield self.event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
        yield self.event("response.output_item.done", output_index=index, item=item)

    def chunk(self, chunk: dict):
        """The events one chat chunk makes."""
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            if delta.get("content"):
                if self.open is None or self.open["type"] != "message":
                    yield from self._close()
                    yield from self._open(message_item(""))
                    self.open["content"] = [
                        {
                            "type": "output_text",
                            "text": "",
                            "annotations": [],
                            "logprobs": [],
                        }
                    ]
                logprobs = logprobs_of(choice.get("logprobs"))
                self.open["content"][0]["text"] += delta["content"]
                self.open["content"][0]["logprobs"] += logprobs
                yield self.event(
                    "response.output_text.delta",
                    item_id=self.open["id"],
                    output_index=len(self.items) - 1,
                    content_index=0,
                    delta=delta["content"],
                    logprobs=logprobs,
                )
            for call in delta.get("tool_calls") or []:
                pieces = (call.get("function") or {}).get("arguments") or ""
                if call.get("id"):
                    yield from self._close()
                    item = call_item(
                        {"id": call["id"], "function": dict(call["function"])}
                    )
                    item["arguments"] = ""
                    self.calls[call.get("index", 0)] = item
                    yield from self._open(item)
                item = self.calls.get(call.get("index", 0))
                if item is not None and pieces:
                    item["arguments"] += pieces
                    yield self.event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=self.items.index(item),
                        delta=pieces,
                    )

    def finish(self):
        """The last event is response.completed, its response's status "incomplete"
        when the answer was cut (vLLM's sequence; OpenAI's own API sends
        response.incomplete then)."""
        yield from self._close()
        yield self.event("response.completed", response=self.snapshot())


# /openapi.json: the Responses routes, their answers as schemas
RESPONSE = {
    "type": "object",
    "required": ["id", "object", "created_at", "status", "model", "output"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "response"},
        "created_at": {"type": "integer"},
        "status": {"enum": ["completed", "incomplete", "in_progress"]},
        "model": {"type": "string"},
        "output": {"type": "array", "items": {"type": "object"}},
        "usage": {"type": ["object", "null"]},
    },
}
DELETED = {
    "type": "object",
    "required": ["id", "object", "deleted"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "response.deleted"},
        "deleted": {"const": True},
    },
}
ITEM_LIST = {
    "type": "object",
    "required": ["object", "data", "first_id", "last_id", "has_more"],
    "properties": {
        "object": {"const": "list"},
        "data": {"type": "array", "items": {"type": "object"}},
        "first_id": {"type": ["string", "null"]},
        "last_id": {"type": ["string", "null"]},
        "has_more": {"type": "boolean"},
    },
}


def openapi_paths(ref, errors, refusals: tuple[int, ...]) -> dict:
    """The Responses routes for /openapi.json (api.py's ref and errors helpers;
    refusals: the statuses POST may answer, as chat's)."""

    def answer(description: str, schema: dict, stream: bool = False) -> dict:
        content = {"application/json": {"schema": schema}}
        if stream:
            content["text/event-stream"] = {
                "schema": {
                    "type": "object",
                    "required": ["data"],
                    "properties": {"data": {"type": "string"}},
                }
            }
        return {"200": {"description": description, "content": content}}

    response_id = {
        "name": "response_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]+$"},
    }
    kept = errors(404, 405)
    return {
        "/v1/responses": {
            "post": {
                "summary": "OpenAI's Responses API (chat's path underneath)",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": ref("ResponsesRequest")},
                },
                "responses": errors(*refusals)
                | answer(
                    "a Response; with stream=true, the Responses events",
                    RESPONSE,
                    stream=True,
                ),
            }
        },
        "/v1/responses/{response_id}": {
            "get": {
                "summary": "a response kept with store",
                "parameters": [response_id],
                "responses": kept | answer("the Response", RESPONSE),
            },
            "delete": {
                "summary": "forget a kept response",
                "parameters": [response_id],
                "responses": kept | answer("OpenAI's answer", DELETED),
            },
        },
        "/v1/responses/{response_id}/input_items": {
            "get": {
                "summary": "the input items of a kept response, a page at a time",
                "parameters": [
                    response_id,
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 100},
                    },
                    {
                        "name": "order",
                        "in": "query",
                        "schema": {"enum": ["asc", "desc"]},
                    },
                    {"name": "after", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": errors(400, 404, 405) | answer("a page", ITEM_LIST),
            }
        },
        "/v1/responses/{response_id}/cancel": {
            "post": {
                "summary": "vLLM's: only a background response can be cancelled",
                "parameters": [response_id],
                "responses": errors(400, 404, 405),
            }
        },
    }
