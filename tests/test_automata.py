"""The automata of structured output: the regex DFA against Python's re, JSON schemas as
patterns whose matches parse and fit, the token mask against brute force on a small
vocabulary, and random walks over SmolLM2's vocabulary that end in valid answers."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from minipaged.sampling import StructuredOutputsParams
from minipaged.structured import (
    DEAD,
    Automata,
    compile_regex,
    regex_of,
    schema_to_regex,
)
from minipaged.structured.regex import DFA

PATTERNS = [
    r"((25[0-5]|(2[0-4]|1\d|[1-9]|)\d)\.){3}(25[0-5]|(2[0-4]|1\d|[1-9]|)\d)",
    r"a(b|c)*d",
    r"[a-c]{2,3}x?",
    r"\d+(\.\d{1,2})?",
    r'"([^"\\]|\\["\\n])*"',
    r"(ab|a)(bc|c)",
    r"x{0,3}",
    r"[^a-z]+",
    r"a{2,}",
    r"(?:yes|no)\.?",
    r"[\x20-\x22]+",
    r"\w+@\w+\.(com|org)",
    r"^a|b$",
]
ALPHABET = 'abcdx.129"\\5340-Z n@'


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_dfa_matches_what_python_re_matches(pattern):
    rng = np.random.default_rng(abs(hash(pattern)) % 2**32)
    dfa = compile_regex(pattern)
    texts = [
        "".join(rng.choice(list(ALPHABET), int(rng.integers(0, 10))))
        for _ in range(2000)
    ]
    texts += [
        "192.168.0.1",
        "255.255.255.255",
        "256.1.1.1",
        "abcd",
        "ad",
        "abx",
        "12.34",
        '"a\\"b"',
        "aaa",
        "yes.",
        "ada@enigma.com",
        "a",
        "b",
        '!"',
        "",
    ]
    wrong = [
        t for t in texts if (re.fullmatch(pattern, t) is not None) != dfa.fullmatch(t)
    ]
    assert not wrong, wrong[:5]


@pytest.mark.parametrize(
    "pattern, words",
    [
        ("[.*", "unclosed '['"),
        ("a)", "unbalanced ')'"),
        ("(a", "unclosed '('"),
        (r"(a)\1", "back reference"),
        ("(?=a)", "lookaround"),
        ("a{3,1}", "out of order"),
        ("*a", "nothing to repeat"),
        (r"\u12", "4 hex digits"),
    ],
)
def test_a_bad_pattern_says_what_and_where(pattern, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        compile_regex(pattern)


EMPLOYEE = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0},
        "nick": {"type": ["string", "null"], "maxLength": 8},
        "skills": {
            "type": "array",
            "items": {"type": "string", "maxLength": 8},
            "minItems": 1,
            "maxItems": 3,
        },
        "role": {"$ref": "#/$defs/Role"},
        "rate": {"type": "number"},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "skills"],
    "$defs": {"Role": {"enum": ["dev", "ops", 3]}},
}


def fits(value, schema, root=EMPLOYEE) -> bool:
    """A small validator for the schemas of these tests."""
    if "$ref" in schema:
        return fits(value, root["$defs"][schema["$ref"].split("/")[-1]], root)
    if "enum" in schema:
        return value in schema["enum"]
    kinds = (
        schema["type"] if isinstance(schema.get("type"), list) else [schema.get("type")]
    )
    checks = {
        "object": (
            lambda v: (
                isinstance(v, dict)
                and set(schema.get("required", [])) <= set(v)
                and set(v) <= set(schema["properties"])
                and all(fits(v[k], schema["properties"][k], root) for k in v)
            )
        ),
        "array": (
            lambda v: (
                isinstance(v, list)
                and schema.get("minItems", 0) <= len(v) <= schema.get("maxItems", 99)
                and all(fits(x, schema["items"], root) for x in v)
            )
        ),
        "string": (
            lambda v: isinstance(v, str) and len(v) <= schema.get("maxLength", 10**9)
        ),
        "integer": lambda v: type(v) is int and v >= schema.get("minimum", -(10**30)),
        "number": lambda v: type(v) in (int, float),
        "boolean": lambda v: type(v) is bool,
        "null": lambda v: v is None,
    }
    return any(checks[k](value) for k in kinds)


def random_match(dfa: DFA, rng, alphabet: str, limit: int = 400) -> str | None:
    """A random walk over characters that keeps the DFA alive, stopping when accepting
    (sometimes)."""
    state, text = dfa.start, ""
    for _ in range(limit):
        if dfa.accepting(state) and rng.random() < 0.3:
            return text
        options = [c for c in alphabet if dfa.step(state, c) != DEAD]
        if not options:
            return text if dfa.accepting(state) else None
        # so that walks end
        closing = [c for c in options if c in '"}],'] if rng.random() < 0.4 else []
        ch = (closing or options)[int(rng.integers(len(closing or options)))]
        state, text = dfa.step(state, ch), text + ch
    return None


def test_every_match_of_a_schema_parses_and_fits_it():
    dfa = compile_regex(schema_to_regex(EMPLOYEE))
    rng, alphabet = (
        np.random.default_rng(0),
        '{}[]":, .-\\0123456789abcdefghijklmnopqrstuvwxyz',
    )
    found = [
        t
        for t in (random_match(dfa, rng, alphabet) for _ in range(150))
        if t is not None
    ]
    assert len(found) > 100
    for text in found:
        assert fits(json.loads(text), EMPLOYEE), text
    good = {"name": "Ada", "age": 36, "skills": ["math"], "role": "dev", "active": True}
    assert dfa.fullmatch(json.dumps(good)) and dfa.fullmatch(
        json.dumps(good, separators=(",", ":"))
    )
    for bad in (
        {"name": "Ada", "skills": ["x"]},
        {**good, "age": -1},
        {**good, "skills": []},
        {**good, "role": "boss"},
        {**good, "extra": 1},
        {**good, "name": "a" * 13},
    ):
        assert not dfa.fullmatch(json.dumps(bad)), bad


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"type": "object", "properties": {"foo": "bar"}}, "foo"),
        ({"type": "string", "patternProperties": {}}, "'patternProperties'"),
        ({"type": "integer", "minimum": 3}, "minimum"),
        (
            {"$ref": "#/$defs/Node", "$defs": {"Node": {"$ref": "#/$defs/Node"}}},
            "recursive",
        ),
        ({"type": "tuple"}, "not a JSON type"),
    ],
)
def test_what_a_schema_cannot_say_is_a_clear_error(schema, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        regex_of(StructuredOutputsParams(json=schema))


def test_json_object_and_choice_patterns():
    any_object = compile_regex(regex_of(StructuredOutputsParams(json_object=True)))
    assert any_object.fullmatch(
        '{"a": [1, {"b": null}], "c": "x"}'
    ) and not any_object.fullmatch("[1]")
    choice = compile_regex(
        regex_of(StructuredOutputsParams(choice=["C++", "C#", "a.b"]))
    )
    assert [choice.fullmatch(t) for t in ("C++", "C#", "a.b", "axb", "C")] == [
        True,
        True,
        True,
        False,
        False,
    ]


# ---- the token level -----------------------------------------------------------------

WORDS = [
    "<eos>",
    "{",
    "}",
    '"',
    "a",
    "ab",
    '"a',
    'b"',
    ":",
    " ",
    "1",
    "12",
    "x",
    '{"',
    "é",
    "<pad>",
    "b",
    "2",
]


class Tiny:
    """A minipaged-like tokenizer over a handful of whole tokens (no merges)."""

    def __init__(self):
        self.hf = HFTokenizer(
            models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>")
        )
        self.hf.add_special_tokens(["<eos>", "<pad>"])


def matches(pattern: str) -> list[str]:
    """Every match of the three test patterns up to a length the walks below never pass,
    written out by hand (not by the automaton under test)."""
    if pattern.startswith(r"\{"):
        return [
            f'{{"{key}":{space}1{digit}}}'
            for key in ("a", "ab")
            for space in ("", " ")
            for digit in ["", *"0123456789"]
        ]
    if pattern == r'"a+b"':
        return ['"' + "a" * k + 'b"' for k in range(1, 20)]
    units = [[]]
    for _ in range(9):
        units = units + [u + [x] for u in units for x in ("ab", "x") if len(u) < 9]
        units = [list(t) for t in {tuple(u) for u in units}]
    return ["".join(u) for u in units if u]


def spelled(rest: str, texts) -> bool:
    """Can the tokens' texts write `rest` exactly, one after another?"""
    ends = {0}
    for i in range(1, len(rest) + 1):
        if any(j in ends and rest[j:i] in texts for j in range(i)):
            ends.add(i)
    return len(rest) in ends


def brute_allowed(pattern: str, prefix: str, texts) -> set[int]:
    """Tokens whose text keeps prefix + text the start of some match that tokens can
    finish."""
    every = matches(pattern)
    assert all(re.fullmatch(pattern, m) for m in every)
    whole = {t for t in texts if t}
    return {
        token
        for token, text in enumerate(texts)
        if text is not None
        and any(
            m.startswith(prefix + text) and spelled(m[len(prefix + text) :], whole)
            for m in every
        )
    }


@pytest.mark.parametrize("pattern", [r'\{"ab?": ?1\d?\}', r'"a+b"', r"(ab|x)+"])
def test_the_mask_is_the_brute_force_set_and_the_end_needs_a_whole_match(pattern):
    automata = Automata(Tiny(), len(WORDS), eos_token_ids=[0])
    assert automata.texts[0] is None and automata.texts[WORDS.index("x")] == "x"
    constraint = automata.compile(StructuredOutputsParams(regex=pattern))
    rng, text = np.random.default_rng(1), ""
    for _ in range(6):
        allowed = constraint.allowed()
        assert set(np.flatnonzero(allowed[1:]) + 1) == brute_allowed(
            pattern, text, automata.texts
        ), text
        assert allowed[0] == (re.fullmatch(pattern, text) is not None)
        choices = np.flatnonzero(allowed[1:]) + 1
        if not len(choices):
            break
        token = int(rng.choice(choices))
        before = constraint.fork()
        constraint.advance(token)
        text += automata.texts[token]
        # the fork stayed where it was
        assert before.allowed()[token] and before.state != DEAD
    dead = automata.compile(StructuredOutputsParams(regex=pattern))
    dead.advance(WORDS.index("é"))
    assert dead.state == DEAD and not dead.allowed().any()
    assert (
        automata.compile(StructuredOutputsParams(regex=pattern)).automaton
        is constraint.automaton
    )  # cached


@pytest.fixture(scope="module")
def smol_automata(smollm2):
    return (
        Automata(
            smollm2.tokenizer,
            smollm2.model.config.vocab_size,
            smollm2.engine.eos_token_ids,
        ),
        smollm2,
    )


@pytest.mark.parametrize(
    "spec, check",
    [
        ({"json": EMPLOYEE}, lambda t: fits(json.loads(t), EMPLOYEE)),
        ({"regex": PATTERNS[0]}, lambda t: re.fullmatch(PATTERNS[0], t)),
        (
            {"choice": ["Python", "Rust", "C++"]},
            lambda t: t in ["Python", "Rust", "C++"],
        ),
    ],
)
def test_random_walks_over_smollm2s_vocabulary_end_in_valid_answers(
    smol_automata, spec, check
):
    automata, llm = smol_automata
    eos = sorted(llm.engine.eos_token_ids)
    rng = np.random.default_rng(2)
    for _ in range(4):
        constraint, ids = automata.compile(StructuredOutputsParams(**spec)), []
        for _ in range(300):
            allowed = np.flatnonzero(constraint.allowed())
            ends = [t for t in eos if constraint.allowed()[t]]
            token = ends[0] if ends and rng.random() < 0.5 else int(rng.choice(allowed))
            if token in eos:
                break
            ids.append(token)
            constraint.advance(token)
        else:
            pytest.fail("the walk did not end in 300 tokens")
        text = llm.tokenizer.decode(ids)
        # the texts are the decoder's
        assert text == "".join(automata.texts[t] for t in ids)
        assert check(text), text
