"""A JSON schema as a regular expression (Outlines' way): each type is a pattern, an
object the pattern of its properties in order. JSON itself nests without bound, which no
finite automaton can count (a pushdown automaton can: XGrammar's), so "any JSON" here
nests at most MAX_DEPTH objects or arrays deep, and a schema's own nesting is what it
writes.
"""

from __future__ import annotations

import json
import re

# nesting of objects/arrays in "any JSON value" (json_object, {"type": "object"})
MAX_DEPTH = 3
# between tokens: one space or none (Outlines' default), so no endless whitespace
WS = "[ ]?"
STRING_CHAR = r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'
STRING = f'"{STRING_CHAR}*"'
INTEGER = r"-?(0|[1-9]\d{0,15})"
NUMBER = INTEGER + r"(\.\d{1,15})?([eE][+-]?\d{1,3})?"
SCALARS = {
    "string": STRING,
    "integer": INTEGER,
    "number": NUMBER,
    "boolean": "(true|false)",
    "null": "null",
}
FORMATS = {
    "date": r'"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"',
    "time": (
        r'"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)?"'
    ),
    "email": r'"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63}){1,4}"',
    "uuid": (
        r'"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"'
    ),
}
ANNOTATIONS = {
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "$defs",
    "definitions",
    "additionalProperties",
    "strict",
    "readOnly",
    "writeOnly",
    "deprecated",
}
SUPPORTED = {
    "type",
    "properties",
    "required",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "format",
    "minimum",
}


def escape(text: str) -> str:
    """A literal as a pattern: every character that means something in a regex
    escaped."""
    return re.sub(r"([\\.^$|?*+()\[\]{}\-])", r"\\\1", text)


def literal(value) -> str:
    """A JSON value's own text (enum, const) as a pattern."""
    return escape(json.dumps(value, ensure_ascii=False))


def any_value(depth: int = MAX_DEPTH) -> str:
    """Any JSON value nesting at most `depth` objects or arrays."""
    scalars = "|".join(SCALARS.values())
    if depth == 0:
        return f"({scalars})"
    inner = any_value(depth - 1)
    obj = (
        rf"\{{{WS}({STRING}{WS}:{WS}{inner}"
        rf"({WS},{WS}{STRING}{WS}:{WS}{inner})*)?{WS}\}}"
    )
    arr = rf"\[{WS}({inner}({WS},{WS}{inner})*)?{WS}\]"
    return f"({scalars}|{obj}|{arr})"


def any_object(depth: int = MAX_DEPTH) -> str:
    """Any JSON object (json_object), its values nesting at most depth - 1 deeper."""
    inner = any_value(depth - 1)
    return (
        rf"\{{{WS}({STRING}{WS}:{WS}{inner}"
        rf"({WS},{WS}{STRING}{WS}:{WS}{inner})*)?{WS}\}}"
    )


def schema_to_regex(schema, root=None, where: str = "", seen: tuple = ()) -> str:
    """The pattern of every JSON text that fits `schema` (a ValueError naming the
    keyword and where, for what it cannot express)."""
    root = schema if root is None else root
    if schema is True or schema == {}:
        return any_value()
    if not isinstance(schema, dict):
        raise ValueError(
            f"{where or 'the schema'} must be a schema object, got {schema!r:.60}"
        )
    unknown = sorted(set(schema) - SUPPORTED - ANNOTATIONS)
    if unknown:
        raise ValueError(
            f"{where or 'the schema'}: {unknown[0]!r} is not supported (supported: "
            f"{', '.join(sorted(SUPPORTED))})"
        )
    if "$ref" in schema:
        return schema_to_regex(
            resolve(schema["$ref"], root, where, seen),
            root,
            schema["$ref"],
            (*seen, schema["$ref"]),
        )
    if "const" in schema:
        return literal(schema["const"])
    if "enum" in schema:
        if not isinstance(schema["enum"], list) or not schema["enum"]:
            raise ValueError(f"{where or 'the schema'}: enum must be a non-empty list")
        return "(" + "|".join(literal(v) for v in schema["enum"]) + ")"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return (
                "("
                + "|".join(
                    schema_to_regex(s, root, f"{where}.{key}[{i}]", seen)
                    for i, s in enumerate(schema[key])
                )
                + ")"
            )
    if "allOf" in schema:
        if len(schema["allOf"]) != 1:
            raise ValueError(
                f"{where or 'the schema'}: allOf with more than one schema is not"
                " supported"
            )
        return schema_to_regex(schema["allOf"][0], root, f"{where}.allOf[0]", seen)
    kind = schema.get("type", "object" if "properties" in schema else None)
    if isinstance(kind, list):
        return (
            "("
            + "|".join(
                schema_to_regex({**schema, "type": k}, root, where, seen) for k in kind
            )
            + ")"
        )
    if kind is None:
        return any_value()
    if kind == "object":
        return object_regex(schema, root, where, seen)
    if kind == "array":
        return array_regex(schema, root, where, seen)
    if kind == "string":
        return string_regex(schema, where)
    if kind in ("integer", "number"):
        if "minimum" in schema and schema["minimum"] != 0:
            raise ValueError(
                f"{where or 'the schema'}: minimum other than 0 is not supported (a"
                " range is not a short regular expression)"
            )
        pattern = SCALARS[kind]
        # minimum 0: no minus sign
        return pattern[2:] if "minimum" in schema else pattern
    if kind in SCALARS:
        return SCALARS[kind]
    raise ValueError(f"{where or 'the schema'}: type {kind!r} is not a JSON type")


def resolve(ref: str, root: dict, where: str, seen: tuple) -> dict:
    """A local reference "#/$defs/Name" (or "#/definitions/Name"); recursion is
    refused."""
    if ref in seen:
        raise ValueError(
            f"{where}: the recursive reference {ref!r} is not supported (a finite"
            " automaton cannot nest without bound)"
        )
    parts = ref.removeprefix("#/").split("/") if ref.startswith("#/") else None
    node = root
    for part in parts or ["?"]:
        if not isinstance(node, dict) or part not in node:
            raise ValueError(
                f"{where or 'the schema'}: cannot resolve the reference {ref!r} (only"
                " '#/$defs/...')"
            )
        node = node[part]
    return node


def object_regex(schema: dict, root, where: str, seen: tuple) -> str:
    """The properties in their order, the required ones always, the optional ones or
    not, with a comma before each but the first present one."""
    props = schema.get("properties")
    if not props:
        return any_object()
    if not isinstance(props, dict):
        raise ValueError(f"{where or 'the schema'}: properties must be an object")
    required = set(schema.get("required", []))
    items = [
        (
            rf'"{escape(name)}"{WS}:{WS}'
            + schema_to_regex(sub, root, f"{where}.{name}", seen),
            name in required,
        )
        for name, sub in props.items()
    ]
    first_required = next((i for i, (_, req) in enumerate(items) if req), len(items))
    options = []
    # which property comes first
    for first in range(min(first_required + 1, len(items))):
        rest = "".join(
            f"{WS},{WS}{item}" if req else f"({WS},{WS}{item})?"
            for item, req in items[first + 1 :]
        )
        options.append(items[first][0] + rest)
    body = "(" + "|".join(options) + ")"
    if first_required == len(items):  # all optional: {} too
        body += "?"
    return rf"\{{{WS}{body}{WS}\}}"


def array_regex(schema: dict, root, where: str, seen: tuple) -> str:
    item = schema_to_regex(schema.get("items", {}), root, f"{where}[]", seen)
    low, high = schema.get("minItems", 0), schema.get("maxItems")
    more = f"({WS},{WS}{item})" + (
        f"{{{max(low - 1, 0)},{high - 1}}}"
        if high is not None
        else f"{{{max(low - 1, 0)},}}"
    )
    if high == 0:
        return rf"\[{WS}\]"
    body = f"{item}{more}"
    return rf"\[{WS}{body if low > 0 else f'({body})?'}{WS}\]"


def string_regex(schema: dict, where: str) -> str:
    if "pattern" in schema:
        return '"(' + schema["pattern"].removeprefix("^").removesuffix("$") + ')"'
    if schema.get("format") in FORMATS:
        return FORMATS[schema["format"]]
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    if low == 0 and high is None:
        return STRING
    return f'"{STRING_CHAR}{{{low},{"" if high is None else high}}}"'
