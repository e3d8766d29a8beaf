"""Structured output on the server, with SmolLM2 (the room's model) and the `openai`
client: vLLM's structured_outputs (json, regex, choice), OpenAI's response_format, tools
with each tool_choice, streamed and not; every held answer parses and fits, emoji and
other scripts included; bad ones (unwritable, too deep, past the budget, a schema
keyword not supported) are clear 400s naming the field. Servers on 127.0.0.1 on free
ports; every loop bounded."""

from __future__ import annotations

import json
import re

import openai
import pytest
from test_serve import serve

EMPLOYEE = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "skills": {
            "type": "array",
            "items": {"type": "string", "maxLength": 12},
            "maxItems": 3,
        },
    },
    "required": ["name", "age", "skills"],
}
IP = r"((25[0-5]|(2[0-4]|1\d|[1-9]|)\d)\.){3}(25[0-5]|(2[0-4]|1\d|[1-9]|)\d)"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
ASK = [
    {
        "role": "user",
        "content": "What is the weather in Paris? Answer with a JSON object.",
    }
]


@pytest.fixture(scope="module")
def url(smollm2):
    with serve(smollm2, name="smol", max_num_seqs=16) as url:
        yield url


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120
    )


def fits(value, schema) -> bool:
    """A small validator for the schemas above (jsonschema is not a dependency)."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind == "object":
        return (
            isinstance(value, dict)
            and set(schema.get("required", [])) <= set(value)
            and set(value) <= set(schema["properties"])
            and all(fits(value[k], schema["properties"][k]) for k in value)
        )
    if kind == "array":
        return (
            isinstance(value, list)
            and len(value) <= schema.get("maxItems", len(value))
            and all(fits(v, schema["items"]) for v in value)
        )
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get(
            "maxLength", len(value)
        )
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    raise AssertionError(f"no check for {schema}")


def test_json_schema_regex_and_choice_answers_all_fit(url):
    c = client(url)
    messages = [
        {"role": "user", "content": "Give an example JSON for an employee profile."}
    ]
    for extra in (
        {"structured_outputs": {"json": EMPLOYEE}},
        {"guided_json": EMPLOYEE},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "e", "schema": EMPLOYEE},
            }
        },
    ):
        answer = c.chat.completions.create(
            model="smol",
            messages=messages,
            max_tokens=120,
            temperature=0.8,
            seed=3,
            n=2,
            extra_body=extra,
        )
        for choice in answer.choices:
            assert choice.finish_reason == "stop", choice
            assert fits(json.loads(choice.message.content), EMPLOYEE), (
                choice.message.content
            )
    ips = c.chat.completions.create(
        model="smol",
        n=3,
        temperature=1.0,
        seed=1,
        max_tokens=20,
        messages=[{"role": "user", "content": "Give an example IP address."}],
        extra_body={"structured_outputs": {"regex": IP}},
    )
    assert all(re.fullmatch(IP, ch.message.content) for ch in ips.choices), [
        ch.message.content for ch in ips.choices
    ]
    languages = [
        "Python",
        "Java",
        "JavaScript",
        "C++",
        "C#",
        "PHP",
        "TypeScript",
        "Ruby",
        "Swift",
        "Kotlin",
    ]
    picked = c.completions.create(
        model="smol",
        prompt="The best language for type-safe systems programming is ",
        max_tokens=10,
        n=4,
        temperature=1.0,
        seed=5,
        extra_body={"structured_outputs": {"choice": languages}},
    )
    assert all(ch.text in languages for ch in picked.choices), [
        ch.text for ch in picked.choices
    ]


def test_json_object_and_a_streamed_held_answer(url):
    c = client(url)
    answer = c.chat.completions.create(
        model="smol",
        messages=ASK,
        max_tokens=100,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(answer.choices[0].message.content), dict)
    stream = c.chat.completions.create(
        model="smol",
        messages=ASK,
        max_tokens=100,
        temperature=0,
        stream=True,
        response_format={"type": "json_object"},
    )
    text = "".join(
        chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices
    )
    assert text == answer.choices[0].message.content


def test_a_named_tool_is_answered_as_tool_calls_streamed_or_not(url):
    c = client(url)
    choice = {"type": "function", "function": {"name": "get_weather"}}
    answer = c.chat.completions.create(
        model="smol",
        messages=ASK,
        tools=[WEATHER],
        tool_choice=choice,
        max_tokens=80,
        temperature=0,
    )
    message = answer.choices[0].message
    assert message.content == "" and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert (
        call.type == "function"
        and call.function.name == "get_weather"
        and call.id.startswith("chatcmpl-tool-")
    )
    assert fits(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    pieces, reasons = [], []
    for chunk in c.chat.completions.create(
        model="smol",
        messages=ASK,
        tools=[WEATHER],
        tool_choice=choice,
        max_tokens=80,
        temperature=0,
        stream=True,
    ):
        delta = chunk.choices[0].delta
        assert not delta.content
        pieces += (
            [delta.tool_calls[0].function.arguments or ""] if delta.tool_calls else []
        )
        reasons += (
            [chunk.choices[0].finish_reason] if chunk.choices[0].finish_reason else []
        )
    assert "".join(pieces) == call.function.arguments and len(reasons) == 1


def test_required_tools_give_calls_and_none_gives_text(url):
    c = client(url)
    answer = c.chat.completions.create(
        model="smol",
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=120,
        temperature=0,
    )
    calls = answer.choices[0].message.tool_calls
    assert calls and all(call.function.name == "get_weather" for call in calls)
    assert all(
        fits(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        for call in calls
    )
    plain = c.chat.completions.create(
        model="smol",
        messages=ASK,
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=8,
        temperature=0,
    )
    assert (
        plain.choices[0].message.tool_calls is None and plain.choices[0].message.content
    )


def test_parallel_tool_calls_false_holds_required_to_one_call(url):
    """Sampled, "required" may list the same call again and again until max_tokens
    cuts the list (no tool_calls then); parallel_tool_calls false ends it at one."""
    # with calls: 3 of 24 sampled answers listed calls until 60 tokens cut them
    answer = client(url).chat.completions.create(
        model="smol",
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,  # more than one call of this schema can take
        n=8,
        seed=1,
    )
    for choice in answer.choices:
        assert len(choice.message.tool_calls) == 1
        assert choice.finish_reason == "stop"
        arguments = json.loads(choice.message.tool_calls[0].function.arguments)
        assert fits(arguments, WEATHER["function"]["parameters"])


@pytest.mark.parametrize(
    "extra, param, words",
    [
        ({"structured_outputs": {"regex": "[.*"}}, "structured_outputs", "regex"),
        (
            {"structured_outputs": {"regex": {"1": "Python"}}},
            "structured_outputs",
            "must be a string",
        ),
        (
            {"structured_outputs": {"grammar": ""}},
            "structured_outputs",
            "context-free grammar",
        ),
        (
            {
                "structured_outputs": {
                    "json": {"type": "object", "properties": {"foo": "bar"}}
                }
            },
            "structured_outputs",
            "foo",
        ),
        (
            {
                "structured_outputs": {"regex": "a"},
                "response_format": {"type": "json_object"},
            },
            "response_format",
            "not both",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format", "json_schema"),
        (
            {
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
            },
            "tool_choice",
            "nope",
        ),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": [{"type": "function"}]}, "tools", "tools[0]"),
        # issue 41: what cannot be held is refused, never dropped or a 500
        (
            {"structured_outputs": {"regex": "(" * 400 + "a" + ")" * 400}},
            "structured_outputs",
            "nest more than 100 deep",
        ),
        ({"guided_regex": "a\\x04"}, "guided_regex", "cannot write '\\x04'"),
        ({"guided_choice": [chr(0x50000)]}, "guided_choice", "cannot write"),
        (
            {"structured_outputs": {"regex": "(a{1000}){1000}"}},
            "structured_outputs",
            "automaton states",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "e",
                        "schema": {
                            "type": "object",
                            "properties": {"a": {"type": "integer"}},
                            "required": ["a", "b"],
                        },
                    },
                }
            },
            "response_format",
            "required names 'b'",
        ),
        (
            {"guided_json": {"type": "string", "format": "uri"}},
            "guided_json",
            "format 'uri' is not supported",
        ),
        (
            {"guided_json": {"type": "string", "pattern": "a", "maxLength": 3}},
            "guided_json",
            "pattern with format, minLength or maxLength",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "type": "object",
                                "properties": {"n": {"type": "integer", "maximum": 9}},
                            },
                        },
                    }
                ],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            "tool_choice",
            "'maximum' is not supported",
        ),
    ],
)
def test_bad_structures_are_400s_naming_the_field(url, extra, param, words):
    with pytest.raises(openai.BadRequestError) as refused:
        client(url).chat.completions.create(
            model="smol", messages=ASK, max_tokens=4, extra_body=extra
        )
    error = refused.value.body
    error = error.get("error", error)
    assert error["param"] == param and words in error["message"], error


def test_emoji_greek_cyrillic_choices_and_patterns_are_held(url):
    """Issue 41: a choice of emoji answered '� Finned Lark', and Ω[0-9]{1,3} answered
    'A': the mask was empty and the answer ran free. Now each character's bytes are
    spelled across tokens, and a schema's pattern stays inside its JSON string."""
    c = client(url)
    animals = ["🦊", "🐶"]
    for extra, check in (
        ({"guided_choice": animals}, lambda t: t in animals),
        ({"guided_regex": "Ω[0-9]{1,3}"}, lambda t: re.fullmatch("Ω[0-9]{1,3}", t)),
        ({"guided_regex": "Да|Нет"}, lambda t: t in ("Да", "Нет")),
        (
            {"guided_json": {"type": "string", "pattern": "^.{3}$"}},
            lambda t: isinstance(json.loads(t), str) and len(json.loads(t)) == 3,
        ),
    ):
        answer = c.completions.create(
            model="smol",
            prompt="Answer: ",
            max_tokens=12,
            n=3,
            temperature=1.0,
            seed=4,
            extra_body=extra,
        )
        for choice in answer.choices:
            assert choice.finish_reason == "stop", (extra, choice)
            assert check(choice.text), (extra, choice.text)
