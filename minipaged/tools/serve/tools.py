"""Structured output on the server: vLLM's `structured_outputs` (and its older
`guided_*`), OpenAI's `response_format`, and `tools` with `tool_choice`, each read into
one StructuredOutputsParams (the automaton of meeting 16 holds the answer to it); a tool
call is structured output whose text is a function's arguments, answered as OpenAI's
`tool_calls`.
"""

from __future__ import annotations

import json
import re
import secrets

from minipaged.sampling import StructuredOutputsParams

GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


class BadStructure(ValueError):
    """A structured-output field that is wrong: the message names the field (a 400)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def spec_of(body) -> StructuredOutputsParams | None:
    """The one constraint a completions or chat request asks for, from whichever field
    gave it: structured_outputs, a guided_* field, or response_format; two of them is a
    400.
    """
    given = {}
    if body.structured_outputs is not None:
        if not isinstance(body.structured_outputs, dict):
            raise BadStructure(
                "structured_outputs",
                "structured_outputs must be an object such as "
                f'{{"regex": "..."}}, got {body.structured_outputs!r:.80}',
            )
        known = {
            k: v
            for k, v in body.structured_outputs.items()
            if k in ("json", "regex", "choice", "json_object", "grammar")
        }
        given["structured_outputs"] = known
    for name, key in GUIDED.items():
        if getattr(body, name, None) is not None:
            given[name] = {key: getattr(body, name)}
    if body.response_format is not None:
        fields = response_format(body.response_format)
        if fields is not None:
            given["response_format"] = fields
    if not given:
        return None
    if len(given) > 1:
        raise BadStructure(
            list(given)[1],
            f"give one of {' and '.join(given)}, not both: each asks for a format",
        )
    field, fields = given.popitem()
    try:
        return StructuredOutputsParams(**fields)
    except ValueError as error:
        raise BadStructure(
            field, str(error).replace("structured_outputs", field, 1)
        ) from None


def field_of(body) -> str:
    """The field a request's structured output came in (for a 400 about it)."""
    plan = getattr(body, "tool_plan", None)
    if plan is not None and plan.holds:
        return "tool_choice"
    names = ["structured_outputs", *GUIDED, "response_format"]
    return next(
        (name for name in names if getattr(body, name, None) is not None),
        "structured_outputs",
    )


def response_format(value) -> dict | None:
    """OpenAI's response_format: {"type": "text"} (None: no constraint), {"type":
    "json_object"} (any JSON object), or {"type": "json_schema", "json_schema": {"name":
    ..., "schema": {...}}}.
    """
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        inner = value.get("json_schema")
        if not isinstance(inner, dict) or not isinstance(inner.get("schema", {}), dict):
            raise BadStructure(
                "response_format",
                'response_format of type "json_schema" needs "json_schema": '
                '{"name": ..., "schema": {...}}',
            )
        return {"json": inner.get("schema") or {"type": "object"}}
    raise BadStructure(
        "response_format",
        'response_format must be {"type": "text"}, {"type": "json_object"} '
        f'or {{"type": "json_schema", "json_schema": {{...}}}}, got {value!r:.80}',
    )


class ToolPlan:
    """What a chat's tools and tool_choice ask: "none" (text; the tools are not even
    shown), "auto" (the model may answer text or a call: read from its text afterwards),
    "required" (a list of calls, held to their schemas), or a named function (its
    arguments, held). parallel_tool_calls false holds "required" to one call.
    """

    def __init__(self, tools: list | None, tool_choice, parallel_tool_calls=None):
        self.parallel = parallel_tool_calls is not False
        self.tools = {t["function"]["name"]: t["function"] for t in tools_list(tools)}
        choice = (
            tool_choice
            if tool_choice is not None
            else ("auto" if self.tools else "none")
        )
        if isinstance(choice, dict):
            name = (
                (choice.get("function") or {}).get("name")
                if choice.get("type") == "function"
                else None
            )
            if name not in self.tools:
                raise BadStructure(
                    "tool_choice",
                    f"tool_choice names the function {name!r}, but tools has "
                    f"{', '.join(map(repr, self.tools)) or 'none'}",
                )
            self.mode, self.name = "named", name
        elif choice in ("none", "auto", "required"):
            if choice != "none" and not self.tools:
                raise BadStructure(
                    "tool_choice",
                    f'tool_choice "{choice}" needs tools: give at least one function',
                )
            self.mode, self.name = choice, None
        else:
            raise BadStructure(
                "tool_choice",
                'tool_choice must be "none", "auto", "required" or {"type":'
                f' "function", "function": {{"name": ...}}}}, got {choice!r:.80}',
            )

    @property
    def holds(self) -> bool:
        """Is the answer held to a schema (a named function, or "required")?"""
        return self.mode in ("named", "required")

    def template_tools(self) -> list | None:
        """The tools the chat template shows the model (none under "none")."""
        return (
            None
            if self.mode == "none"
            else [{"type": "function", "function": f} for f in self.tools.values()]
        )

    def spec(self) -> StructuredOutputsParams | None:
        """The schema the answer is held to: the function's parameters, or a list of
        calls."""
        if self.mode == "named":
            return StructuredOutputsParams(json=parameters(self.tools[self.name]))
        if self.mode == "required":
            calls, defs = [], {}
            for name, f in self.tools.items():
                schema = parameters(f)
                for key, value in local_defs(schema).items():
                    defs[f"{name}__{key}"] = refs_renamed(value, name)
                calls.append(
                    {
                        "type": "object",
                        "properties": {
                            "name": {"enum": [name]},
                            "parameters": refs_renamed(schema, name),
                        },
                        "required": ["name", "parameters"],
                    }
                )
            held = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
            if not self.parallel:
                held["maxItems"] = 1
            if defs:
                held["$defs"] = defs
            return StructuredOutputsParams(json=held)
        return None

    def calls(self, text: str) -> list[dict] | None:
        """The tool calls in an answer's text, as OpenAI's tool_calls (None: it is
        text)."""
        if self.mode == "named":
            return [call(self.name, text)]
        if self.mode == "required":
            try:
                return [
                    call(c["name"], json.dumps(c["parameters"]))
                    for c in json.loads(text)
                ]
            except (
                ValueError,
                TypeError,
                KeyError,
            ):  # cut by max_tokens: not whole JSON
                return None
        return self.read_call(text) if self.mode == "auto" else None

    def answer(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """A chat choice's message fields and finish_reason: its calls (content "" when
        held, None under "auto"), or its text; "auto" that called a tool ends with
        "tool_calls".
        """
        calls = self.calls(text) if self.mode != "none" else None
        if calls is None:
            return {"content": text}, finish_reason
        return {"content": "" if self.holds else None, "tool_calls": calls}, (
            "tool_calls" if self.mode == "auto" else finish_reason
        )

    def read_call(self, text: str) -> list[dict] | None:
        """ "auto": a call the model wrote, as Hermes-style
        `<tool_call>{...}</tool_call>` or a
        whole JSON object {"name": ..., "arguments": {...}} naming one of the tools."""
        found = re.findall(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.S) or [
            text.strip()
        ]
        out = []
        for piece in found:
            try:
                value = json.loads(piece)
            except ValueError:
                return None
            arguments = (
                value.get("arguments", value.get("parameters"))
                if isinstance(value, dict)
                else None
            )
            if (
                not isinstance(value, dict)
                or value.get("name") not in self.tools
                or not isinstance(arguments, dict)
            ):
                return None
            out.append(call(value["name"], json.dumps(arguments)))
        return out


def tools_list(tools) -> list:
    """The tools, checked: each {"type": "function", "function": {"name": ...,
    "parameters": {...}}}."""
    for i, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            tool.get("type", "function") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not function["name"]
        ):
            raise BadStructure(
                "tools",
                f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., '
                f'"parameters": {{...}}}}}}, got {tool!r:.80}',
            )
        if not isinstance(function.get("parameters", {}) or {}, dict):
            raise BadStructure(
                "tools", f"tools[{i}].function.parameters must be a JSON schema object"
            )
    return list(tools or [])


def local_defs(schema: dict) -> dict:
    """A tool's own definitions ($defs, or the older definitions)."""
    return {**schema.get("definitions", {}), **schema.get("$defs", {})}


def refs_renamed(node, tool: str):
    """A tool's schema to sit inside the list of calls: "#/$defs/X" is read from the
    root of the whole schema, so its definitions move there as "{tool}__X" (two tools
    may each define an X), and its references follow."""
    if isinstance(node, list):
        return [refs_renamed(item, tool) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: refs_renamed(value, tool)
        for key, value in node.items()
        if key not in ("$defs", "definitions")
    }
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/")):
        out["$ref"] = f"#/$defs/{tool}__{ref.rsplit('/', 1)[1]}"
    return out


def parameters(function: dict) -> dict:
    """A function's parameters schema (none given: any object)."""
    return function.get("parameters") or {"type": "object"}


def call(name: str, arguments: str) -> dict:
    """One OpenAI tool call: its id, the function's name and its arguments as JSON
    text."""
    return {
        "id": f"chatcmpl-tool-{secrets.token_hex(12)}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


class StreamShape:
    """The deltas of a streamed chat under a ToolPlan. A named function's arguments
    stream as they come (`tool_calls[0].function.arguments` pieces, the id and name in
    the first); "required" and "auto" hold each choice's text to its end, where it is
    either calls or text; without tools each piece is `content`, as always."""

    def __init__(self, plan: ToolPlan):
        self.plan, self.held, self.called, self.ids = plan, {}, set(), {}

    def delta(self, index: int, piece: str, last: bool) -> dict | None:
        """What choice `index` sends for a new piece of text (last: the choice ends);
        None: nothing yet."""
        mode = self.plan.mode
        if mode == "named":
            if index not in self.ids:
                first = call(self.plan.name, piece)
                self.ids[index] = first["id"]
                return {"tool_calls": [{"index": 0, **first}]}
            return (
                {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
                if piece or not last
                else {}
            )
        if mode not in ("required", "auto"):
            return {"content": piece}
        self.held[index] = self.held.get(index, "") + piece
        if not last:
            return None
        text = self.held.pop(index)
        calls = self.plan.calls(text)
        if calls is None:
            return {"content": text}
        self.called.add(index)
        return {"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}

    def finish_reason(self, index: int, reason: str | None) -> str | None:
        """ "auto" that called a tool ends with "tool_calls" (vLLM's, OpenAI's); else as
        it ended."""
        return (
            "tool_calls"
            if index in self.called and self.plan.mode == "auto"
            else reason
        )
