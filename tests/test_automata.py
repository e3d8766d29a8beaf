"""The automata of structured output: the regex DFA against Python's re, JSON schemas as
patterns whose matches parse and fit, the token mask against brute force on a small
vocabulary, and random walks over SmolLM2's vocabulary that end in valid answers, emoji,
CJK, Cyrillic and Greek included (bytes of a character split across tokens). What
cannot be held is refused: unwritable text, deep nesting, patterns past the budget,
schema keywords not supported; and the cache of automata stays bounded."""

from __future__ import annotations

import gc
import json
import re
import time
import weakref
import zlib

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from minipaged.sampling import SamplingParams, StructuredOutputsParams
from minipaged.structured import (
    DEAD,
    Automata,
    compile_regex,
    regex_of,
    schema_to_regex,
)
from minipaged.structured.regex import DFA, MAX_NESTING, Budget, parse, to_pattern

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
    # crc32, not hash(): str hashes change from one process to the next
    rng = np.random.default_rng(zlib.crc32(pattern.encode()))
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
        # the tokens' bytes are the decoder's
        assert text == b"".join(automata.pieces[t] for t in ids).decode("utf-8")
        assert check(text), text


# ---- what cannot be held is refused --------------------------------------------------


def test_groups_nested_past_the_limit_are_a_clear_error_not_a_recursion_error():
    deep = "(" * MAX_NESTING + "a" + ")" * MAX_NESTING
    assert compile_regex(deep).fullmatch("a")
    with pytest.raises(ValueError, match=f"nest more than {MAX_NESTING} deep"):
        compile_regex("(" * 400 + "a" + ")" * 400)
    with pytest.raises(ValueError, match="nest more than"):
        regex_of(
            StructuredOutputsParams(
                json={"type": "string", "pattern": "(" * 400 + "a" + ")" * 400}
            )
        )
    automata = Automata(Tiny(), len(WORDS), eos_token_ids=[0])
    very = {"type": "integer"}
    for _ in range(5000):
        very = {"type": "array", "items": very}
    with pytest.raises(ValueError, match=r"structured_outputs\.json: .*nest"):
        automata.compile(StructuredOutputsParams(json=very))
    nested = {"type": "integer"}
    for _ in range(30):
        nested = {"type": "array", "items": nested}
    with pytest.raises(ValueError, match="nests more than 24 levels"):
        regex_of(StructuredOutputsParams(json=nested))


def test_a_pattern_past_the_state_or_time_budget_is_refused():
    start = time.perf_counter()
    with pytest.raises(ValueError, match="automaton states"):
        compile_regex("(a{1000}){1000}")  # counted before it is built
    assert time.perf_counter() - start < 0.5
    with pytest.raises(ValueError, match="budget of 0.01 s"):
        compile_regex("((a|x){1000}){20}", budget=Budget(seconds=0.01))
    automata = Automata(Tiny(), len(WORDS), eos_token_ids=[0])
    automata.max_seconds = 0.01
    with pytest.raises(ValueError, match=r"structured_outputs\.regex: .*budget"):
        automata.compile(StructuredOutputsParams(regex="((a|x){1000}){20}"))


@pytest.mark.parametrize(
    "pattern, words",
    [
        ("a^b", "anchor '^'"),
        ("a$b", "'$' before the end"),
        ("(a$)", "anchor '$'"),
        ("[\\ud800-\\udfff]", "no character"),
        ("a" + "*" * 5000, "a repeat of a repeat"),
        ("a{2}{3}", "a repeat of a repeat"),
    ],
)
def test_anchors_inside_and_empty_classes_are_refused(pattern, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        compile_regex(pattern)


def test_anchors_at_the_ends_of_alternatives_change_nothing():
    dfa = compile_regex("^ab$|^c|d$")
    assert [dfa.fullmatch(t) for t in ("ab", "c", "d", "abc", "")] == [
        True,
        True,
        True,
        False,
        False,
    ]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_tree_written_back_as_a_pattern_matches_the_same(pattern):
    again = compile_regex(to_pattern(parse(pattern)))
    rng = np.random.default_rng(5)
    for _ in range(500):
        text = "".join(rng.choice(list(ALPHABET), int(rng.integers(0, 8))))
        assert again.fullmatch(text) == (re.fullmatch(pattern, text) is not None)


# ---- JSON schemas: what the pattern holds, and what is refused -----------------------


@pytest.mark.parametrize(
    "pattern", [r"^.{3}$", r'[a"\\]{1,4}', r"[\x00-\x1f]x", r"(\"|\\n|.)*z"]
)
def test_a_string_pattern_admits_only_json_strings_that_match_it(pattern):
    dfa = compile_regex(
        regex_of(StructuredOutputsParams(json={"type": "string", "pattern": pattern}))
    )
    rng = np.random.default_rng(3)
    alphabet = 'ab"\\nu0f1zx' + "\n\t\x01\x1f"
    found = [random_match(dfa, rng, alphabet, 40) for _ in range(200)]
    found = [t for t in found if t is not None]
    assert len(found) > 20
    for text in found:
        value = json.loads(text)  # JSON, never a quote or backslash too many
        assert isinstance(value, str) and re.fullmatch(pattern, value, re.S), text
    assert not dfa.fullmatch('"""""')
    for value in ('a"b', "a\\b", 'a"', "\x01x"):
        if re.fullmatch(pattern, value, re.S):
            assert dfa.fullmatch(json.dumps(value)), value


def test_property_names_are_written_as_json_and_additional_properties_false_is_empty():
    schema = {
        "type": "object",
        "properties": {'a"b': {"type": "integer"}, "c\\d": {"type": "null"}},
        "required": ['a"b'],
    }
    dfa = compile_regex(schema_to_regex(schema))
    assert dfa.fullmatch(json.dumps({'a"b': 1, "c\\d": None}))
    assert dfa.fullmatch(json.dumps({'a"b': 2}))
    empty = compile_regex(
        schema_to_regex({"type": "object", "additionalProperties": False})
    )
    assert empty.fullmatch("{}") and not empty.fullmatch('{"a": 1}')


@pytest.mark.parametrize(
    "schema, words",
    [
        (
            {"type": "object", "properties": {"a": {}}, "required": ["a", "b"]},
            "required names 'b'",
        ),
        ({"type": "object", "required": ["a"]}, "required names 'a'"),
        ({"type": "object", "properties": {}, "required": "a"}, "required must be"),
        ({"type": "string", "format": "uri"}, "format 'uri' is not supported"),
        ({"type": "string", "pattern": "a+", "maxLength": 3}, "pattern with"),
        ({"type": "string", "pattern": 3}, "pattern must be a string"),
        ({"type": "string", "pattern": "(a"}, "pattern: an unclosed '('"),
        ({"type": "string", "maxLength": 2000}, "maxLength must be"),
        ({"type": "string", "minLength": 3, "maxLength": 2}, "maxLength is less"),
        ({"type": "array", "minItems": "2"}, "minItems must be"),
        ({"type": "array", "maxItems": -1}, "maxItems must be"),
        ({"type": "integer", "maximum": 3}, "'maximum' is not supported"),
        ({"type": "integer", "minimum": "0"}, "minimum other than 0"),
        ({"type": "array", "uniqueItems": True}, "'uniqueItems' is not supported"),
        ({"type": "string", "nullable": True}, "'nullable' is not supported"),
        (
            {"type": "object", "additionalProperties": {"type": "integer"}},
            "additionalProperties as a schema",
        ),
        ({"anyOf": []}, "anyOf must be a non-empty list"),
        ({"type": []}, "type must not be an empty list"),
    ],
)
def test_a_schema_keyword_that_cannot_be_held_is_refused_by_name(schema, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        regex_of(StructuredOutputsParams(json=schema))


def test_a_schema_whose_refs_multiply_past_the_pattern_limit_is_refused():
    defs = {"L0": {"type": "integer"}}
    for i in range(1, 30):
        defs[f"L{i}"] = {
            "type": "array",
            "items": {"anyOf": [{"$ref": f"#/$defs/L{i - 1}"}] * 2},
        }
    with pytest.raises(ValueError, match="(longer than|nests more than)"):
        regex_of(StructuredOutputsParams(json={"$ref": "#/$defs/L29", "$defs": defs}))


# ---- the vocabulary: what it can write -----------------------------------------------


def test_text_a_vocabulary_cannot_write_is_refused_naming_it():
    automata = Automata(Tiny(), len(WORDS), eos_token_ids=[0])
    with pytest.raises(ValueError, match=r"structured_outputs\.regex: .*cannot write"):
        automata.compile(StructuredOutputsParams(regex="ac"))
    with pytest.raises(ValueError, match=r"structured_outputs\.choice: .*'🦊'"):
        automata.compile(StructuredOutputsParams(choice=["🦊", "🐶"]))
    # what it can write of an alternative is kept
    constraint = automata.compile(StructuredOutputsParams(regex="c|a"))
    assert set(np.flatnonzero(constraint.allowed())) == {WORDS.index("a")}


def test_a_word_level_vocabulary_allows_only_tokens_that_can_be_finished():
    """'q' is only ever the start of the token 'qu': "qa" can never be written, and "q"
    then "u" or "a" then "e" only as "qu" + "e"."""
    words = [*WORDS, "qu", "e"]

    class Words(Tiny):
        def __init__(self):
            self.hf = HFTokenizer(
                models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>")
            )
            self.hf.add_special_tokens(["<eos>", "<pad>"])

    automata = Automata(Words(), len(words), eos_token_ids=[0])
    with pytest.raises(ValueError, match="written with this model's tokens"):
        automata.compile(StructuredOutputsParams(regex="qa"))
    constraint = automata.compile(StructuredOutputsParams(regex="q(u|a)e|a+"))
    assert set(np.flatnonzero(constraint.allowed())) == {words.index("qu"), 4}
    constraint.advance(words.index("qu"))
    assert set(np.flatnonzero(constraint.allowed())) == {words.index("e")}
    constraint.advance(words.index("e"))
    assert set(np.flatnonzero(constraint.allowed())) == {0}  # the end


# ---- the cache of automata -----------------------------------------------------------


class Bytes:
    """A byte-level tokenizer of the 256 bytes alone, and an end-of-sequence token."""

    def __init__(self):
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        vocab = {c: i for i, c in enumerate(alphabet)} | {"<eos>": len(alphabet)}
        self.hf = HFTokenizer(models.BPE(vocab, merges=[]))
        self.hf.decoder = decoders.ByteLevel()
        self.hf.add_special_tokens(["<eos>"])


def test_the_cache_stays_bounded_after_100_distinct_costly_patterns():
    automata = Automata(Bytes(), 257, eos_token_ids=[256])
    assert automata.vocabulary.splits
    automata.max_cached_states = 100_000
    sizes, start = [], time.perf_counter()
    costly = "((a|x){{1000}}){{2}}x{{{}}}".format
    first = automata.hold(StructuredOutputsParams(regex=costly(100)))
    dropped = weakref.ref(
        automata.compile(StructuredOutputsParams(regex=costly(101))).automaton
    )
    for i in range(100):
        automata.compile(StructuredOutputsParams(regex=costly(i)))
        sizes.append(automata.cached_states())
        assert len(automata.cache) <= automata.max_cached
        assert automata.cached_states() <= automata.max_cached_states
        assert time.perf_counter() - start < 120
    gc.collect()
    assert dropped() is None  # an automaton dropped is freed, its masks too
    # a held automaton is never dropped; let go, it can be
    assert StructuredOutputsParams(regex=costly(100)).key() in automata.cache
    first()
    first()  # letting go twice is once
    assert not automata.held
    for i in range(100):  # cheap ones: the count of entries is the bound
        automata.compile(StructuredOutputsParams(regex=f"a{{{i}}}"))
    assert len(automata.cache) == automata.max_cached
    assert max(sizes) > 0.8 * automata.max_cached_states
    assert len(automata.masks) <= automata.masks.limit


def test_masks_are_shared_and_bounded():
    automata = Automata(Tiny(), len(WORDS), eos_token_ids=[0])
    automata.masks.limit = 5
    constraint = automata.compile(StructuredOutputsParams(regex="(ab|x){1,40}"))
    for _ in range(30):
        constraint.allowed()
        constraint.advance(WORDS.index("x"))
    assert len(automata.masks) == 5
    assert len(constraint.automaton.masks) <= 5


# ---- over SmolLM2's whole vocabulary: emoji, CJK, Cyrillic, Greek --------------------

WORLD = [
    {"choice": ["🦊", "🐶", "🦊🐶"]},
    {"regex": "Ω[0-9]{1,3}"},
    {"regex": "[一-龥]{1,6}"},
    {"regex": "Привет, [а-яё]+!"},
    {"regex": "[α-ω]{2,8}( [Α-Ω][α-ω]+)?"},
    {"regex": "(😀|😎|🤖)+ ok"},
    {"regex": "[∑∫√]x"},
    {"json": {"type": "string", "pattern": "^[一-龥🦊é]{1,4}$"}},
]


def value_of(spec: dict, text: str) -> str:
    return json.loads(text) if "json" in spec else text


def pattern_of(spec: dict) -> str:
    if "choice" in spec:
        return "|".join(map(re.escape, spec["choice"]))
    return spec["regex"] if "regex" in spec else spec["json"]["pattern"][1:-1]


@pytest.mark.parametrize("spec", WORLD, ids=lambda s: str(s)[:24])
def test_every_token_a_mask_allows_leaves_a_way_to_a_match(smol_automata, spec):
    """Property over the whole vocabulary: at each state of random walks, every token
    the mask allows (bytes of one character split across tokens too) leads to a state
    whose mask is not empty; the end is allowed exactly at a whole match; and each walk
    ends in one."""
    automata, llm = smol_automata
    eos = sorted(llm.engine.eos_token_ids)
    pattern, rng = pattern_of(spec), np.random.default_rng(7)
    start = time.perf_counter()
    for _ in range(6):
        constraint, data = automata.compile(StructuredOutputsParams(**spec)), b""
        for _ in range(40):
            allowed = constraint.allowed()
            assert allowed.any(), data
            text = data.decode("utf-8", errors="replace")
            whole = constraint.accepting
            assert allowed[eos].all() == whole
            if whole:
                assert re.fullmatch(pattern, value_of(spec, text)), text
            tokens, finishing = [t for t in np.flatnonzero(allowed) if t not in eos], []
            for token in tokens:
                after = constraint.fork()
                after.advance(int(token))
                assert after.allowed().any(), (text, automata.pieces[token])
                finishing += [token] if after.accepting else []
            if not tokens or (whole and rng.random() < 0.4):
                break
            # now and then a token that makes a whole match, so that walks end
            near = finishing if finishing and rng.random() < 0.3 else tokens
            token = int(rng.choice(near))
            constraint.advance(token)
            data += automata.pieces[token]
        assert constraint.accepting, data
        assert re.fullmatch(pattern, value_of(spec, data.decode("utf-8")))
        assert time.perf_counter() - start < 60


def test_smollm2_spells_emoji_and_refuses_what_it_cannot_write(smol_automata):
    automata, _ = smol_automata
    fox = automata.compile(StructuredOutputsParams(choice=["🦊", "🐶"]))
    pieces = [automata.pieces[t] for t in np.flatnonzero(fox.allowed())]
    # the first bytes of the emoji, each a token of its own
    assert pieces and all("🦊".encode().startswith(p) for p in pieces)
    # no token is the byte \x04 (nor holds it), nor a first byte of U+40000..U+BFFFF
    for spec in ({"regex": "a\\x04"}, {"choice": [chr(0x50000)]}):
        with pytest.raises(ValueError, match="cannot write"):
            automata.compile(StructuredOutputsParams(**spec))


def test_the_engine_refuses_what_the_vocabulary_cannot_write(smollm2):
    engine = smollm2.new_engine()
    for spec in ({"choice": [chr(0x50000)]}, {"regex": "(" * 400 + ")" * 400}):
        params = SamplingParams(structured_outputs=StructuredOutputsParams(**spec))
        with pytest.raises(ValueError, match=r"request 'r': structured_outputs\."):
            engine.add_request("r", "Hello", params)
        assert not engine.has_unfinished_requests()
