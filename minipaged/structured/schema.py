"""A JSON schema as a regular expression (Outlines' way): each type is a pattern, an
object the pattern of its properties in order. JSON itself nests without bound, which no
finite automaton can count (a pushdown automaton can: XGrammar's), so "any JSON" here
nests at most MAX_DEPTH objects or arrays deep, and a schema's own nesting is what it
writes. What a schema says that the pattern cannot hold is refused (a ValueError naming
the keyword), never dropped: every match parses and fits the schema, but for oneOf, held
as anyOf (a text that fits two of its schemas is not refused).
"""

from __future__ import annotations

import json
import re
from functools import cache

from minipaged.structured.regex import (
    MAX_REPEAT,
    WRITABLE,
    Chars,
    Ranges,
    one,
    parse,
    to_pattern,
)

# nesting of objects/arrays in "any JSON value" (json_object, {"type": "object"})
MAX_DEPTH = 3
# a schema's own nesting (its $refs followed): deeper is refused
MAX_SCHEMA_DEPTH = 24
# the pattern of a schema, in characters ($refs copied where used): longer is refused
MAX_PATTERN = 500_000
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
    "additionalProperties",
}


def escape(text: str) -> str:
    """A literal as a pattern: every character that means something in a regex
    escaped."""
    return re.sub(r"([\\.^$|?*+()\[\]{}\-])", r"\\\1", text)


def literal(value) -> str:
    """A JSON value's own text (enum, const) as a pattern."""
    return escape(json.dumps(value, ensure_ascii=False))


@cache
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


def schema_to_regex(
    schema, root=None, where: str = "", seen: tuple = (), depth: int = 0
) -> str:
    """The pattern of every JSON text that fits `schema` (a ValueError naming the
    keyword and where, for what it cannot express)."""
    root = schema if root is None else root
    here = where or "the schema"
    if depth > MAX_SCHEMA_DEPTH:
        raise ValueError(
            f"{here}: the schema nests more than {MAX_SCHEMA_DEPTH} levels deep"
        )
    if schema is True or schema == {}:
        return any_value()
    if not isinstance(schema, dict):
        raise ValueError(f"{here} must be a schema object, got {schema!r:.60}")
    unknown = sorted(set(schema) - SUPPORTED - ANNOTATIONS)
    if unknown:
        raise ValueError(
            f"{here}: {unknown[0]!r} is not supported (supported: "
            f"{', '.join(sorted(SUPPORTED))})"
        )
    pattern = one_schema(schema, root, where, seen, depth + 1)
    if len(pattern) > MAX_PATTERN:
        raise ValueError(
            f"{here}: its pattern is longer than {MAX_PATTERN} characters (a $ref"
            " used in many places is copied into each)"
        )
    return pattern


def one_schema(schema: dict, root, where: str, seen: tuple, depth: int) -> str:
    """schema_to_regex for a schema object whose keywords are all known."""
    here = where or "the schema"
    if "$ref" in schema:
        return schema_to_regex(
            resolve(schema["$ref"], root, where, seen),
            root,
            schema["$ref"],
            (*seen, schema["$ref"]),
            depth,
        )
    if "const" in schema:
        return literal(schema["const"])
    if "enum" in schema:
        if not isinstance(schema["enum"], list) or not schema["enum"]:
            raise ValueError(f"{here}: enum must be a non-empty list")
        return "(" + "|".join(literal(v) for v in schema["enum"]) + ")"
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema and (not isinstance(schema[key], list) or not schema[key]):
            raise ValueError(f"{here}: {key} must be a non-empty list of schemas")
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return (
                "("
                + "|".join(
                    schema_to_regex(s, root, f"{where}.{key}[{i}]", seen, depth)
                    for i, s in enumerate(schema[key])
                )
                + ")"
            )
    if "allOf" in schema:
        if len(schema["allOf"]) != 1:
            raise ValueError(
                f"{here}: allOf with more than one schema is not supported"
            )
        return schema_to_regex(
            schema["allOf"][0], root, f"{where}.allOf[0]", seen, depth
        )
    kind = schema.get("type", "object" if "properties" in schema else None)
    if isinstance(kind, list):
        if not kind:
            raise ValueError(f"{here}: type must not be an empty list")
        return (
            "("
            + "|".join(
                schema_to_regex({**schema, "type": k}, root, where, seen, depth)
                for k in kind
            )
            + ")"
        )
    if kind is None:
        return any_value()
    if kind == "object":
        return object_regex(schema, root, where, seen, depth)
    if kind == "array":
        return array_regex(schema, root, where, seen, depth)
    if kind == "string":
        return string_regex(schema, where)
    if kind in ("integer", "number"):
        minimum = schema.get("minimum")
        if "minimum" in schema and (
            isinstance(minimum, bool)
            or not isinstance(minimum, (int, float))
            or minimum != 0
        ):
            raise ValueError(
                f"{here}: minimum other than 0 is not supported (a range is not a"
                " short regular expression)"
            )
        pattern = SCALARS[kind]
        # minimum 0: no minus sign
        return pattern[2:] if "minimum" in schema else pattern
    if kind in SCALARS:
        return SCALARS[kind]
    raise ValueError(f"{here}: type {kind!r} is not a JSON type")


def resolve(ref: str, root: dict, where: str, seen: tuple) -> dict:
    """A local reference "#/$defs/Name" (or "#/definitions/Name"); recursion is
    refused."""
    if not isinstance(ref, str):
        raise ValueError(f"{where or 'the schema'}: $ref must be a string")
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


def count(schema: dict, key: str, where: str, default=None):
    """A keyword that must be a count: a whole number from 0 to MAX_REPEAT."""
    value = schema.get(key, default)
    if value is not None and (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 0 <= value <= MAX_REPEAT
    ):
        raise ValueError(
            f"{where or 'the schema'}: {key} must be a whole number from 0 to"
            f" {MAX_REPEAT}, got {value!r:.40}"
        )
    return value


def object_regex(schema: dict, root, where: str, seen: tuple, depth: int) -> str:
    """The properties in their order, the required ones always, the optional ones or
    not, with a comma before each but the first present one. Only the properties named
    are written, which fits any additionalProperties; `required` must name them."""
    here = where or "the schema"
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise ValueError(f"{here}: properties must be an object")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError(f"{here}: required must be a list of property names")
    absent = [name for name in required if name not in props]
    if absent:
        raise ValueError(
            f"{here}: required names {absent[0]!r}, which is not in its properties"
            " (give its schema under properties)"
        )
    extra = schema.get("additionalProperties", True)
    if not props:
        if extra is False:
            return rf"\{{{WS}\}}"
        if extra not in (True, {}):
            raise ValueError(
                f"{here}: additionalProperties as a schema is not supported without"
                " properties (name the properties instead)"
            )
        return any_object()
    if not isinstance(extra, (bool, dict)):
        raise ValueError(f"{here}: additionalProperties must be a boolean or a schema")
    items = [
        (
            escape(json.dumps(name, ensure_ascii=False))
            + f"{WS}:{WS}"
            + schema_to_regex(sub, root, f"{where}.{name}", seen, depth),
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


def array_regex(schema: dict, root, where: str, seen: tuple, depth: int) -> str:
    item = schema_to_regex(schema.get("items", {}), root, f"{where}[]", seen, depth)
    low = count(schema, "minItems", where, 0)
    high = count(schema, "maxItems", where)
    if high is not None and high < low:
        raise ValueError(f"{where or 'the schema'}: maxItems is less than minItems")
    if high == 0:
        return rf"\[{WS}\]"
    more = f"({WS},{WS}{item})" + (
        f"{{{max(low - 1, 0)},{high - 1}}}"
        if high is not None
        else f"{{{max(low - 1, 0)},}}"
    )
    body = f"{item}{more}"
    return rf"\[{WS}{body if low > 0 else f'({body})?'}{WS}\]"


def string_regex(schema: dict, where: str) -> str:
    here = where or "the schema"
    low = count(schema, "minLength", where, 0)
    high = count(schema, "maxLength", where)
    if high is not None and high < low:
        raise ValueError(f"{here}: maxLength is less than minLength")
    fmt = schema.get("format")
    lengths = "minLength" in schema or "maxLength" in schema
    if "pattern" in schema:
        if fmt is not None or lengths:
            raise ValueError(
                f"{here}: pattern with format, minLength or maxLength is not supported"
                " (write the lengths into the pattern)"
            )
        return string_pattern(schema["pattern"], here)
    if fmt is not None:
        if fmt not in FORMATS:
            raise ValueError(
                f"{here}: format {fmt!r:.40} is not supported (supported:"
                f" {', '.join(FORMATS)}; or give a pattern)"
            )
        if lengths:
            raise ValueError(
                f"{here}: format with minLength or maxLength is not supported"
            )
        return FORMATS[fmt]
    if low == 0 and high is None:
        return STRING
    return f'"{STRING_CHAR}{{{low},{"" if high is None else high}}}"'


# ---- a string's pattern, written as the JSON text of the strings it matches

# characters a JSON string holds as themselves; the rest are escaped
PLAIN = Ranges([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)]) & WRITABLE
SHORT = {8: "b", 9: "t", 10: "n", 12: "f", 13: "r", 34: '"', 92: "\\"}
HEX = "0123456789abcdef"


def string_pattern(pattern, here: str) -> str:
    """A schema's `pattern` (on the string's value) as a pattern on its JSON text: each
    character the pattern allows is written as JSON writes it (a quote as \\", a newline
    as \\n, another control character as \\u00XX), so `.` never closes the string early.
    The whole value must match (a leading ^ and a trailing $ change nothing)."""
    if not isinstance(pattern, str):
        raise ValueError(f"{here}: pattern must be a string, got {pattern!r:.40}")
    try:
        tree = parse(pattern)
    except ValueError as error:
        raise ValueError(f"{here}: pattern: {error}") from None
    return '"' + to_pattern(json_text(tree)) + '"'


def json_text(tree):
    """The tree of the JSON texts (inside the quotes) of the strings `tree` matches."""
    kind = tree[0]
    if kind in ("cat", "alt"):
        return (kind, [json_text(t) for t in tree[1]])
    if kind == "rep":
        _, inner, low, high = tree
        return ("rep", json_text(inner), low, high)
    ranges = tree[1].positive()
    plain = ranges & PLAIN
    options = [("chars", Chars(tuple(plain.pairs())))] if plain else []
    for c, letter in SHORT.items():
        if c in ranges:
            options.append(("cat", [("chars", one("\\")), ("chars", one(letter))]))
    controls = [c for c in range(0x20) if c in ranges and c not in SHORT]
    by_high = {
        h: tuple((ord(HEX[c & 15]), ord(HEX[c & 15])) for c in controls if c >> 4 == h)
        for h in (0, 1)
    }
    tails = [
        ("cat", [("chars", one(HEX[h])), ("chars", Chars(lows))])
        for h, lows in by_high.items()
        if lows
    ]
    if tails:
        head = [("chars", one(c)) for c in "\\u00"]
        options.append(
            ("cat", [*head, tails[0] if len(tails) == 1 else ("alt", tails)])
        )
    if not options:
        return ("chars", Chars(()))
    return options[0] if len(options) == 1 else ("alt", options)
