"""The `openai` client's typical calls (chat, completions, streaming, tools,
structured output, Responses, async batches)."""

import asyncio
import json

import openai
from common import BASE, MODEL, call
from pydantic import BaseModel

client = openai.OpenAI(base_url=f"{BASE}/v1", api_key="none")
CHAT = [{"role": "user", "content": "Name a colour."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


class Colour(BaseModel):
    name: str
    hex: str


@call("models.list")
def _():
    return [m.id for m in client.models.list()]


@call("chat.completions.create")
def _():
    out = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16)
    assert out.choices[0].message.content
    return out.choices[0].message.content


@call("chat.completions.create stream")
def _():
    stream = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=16, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text
    return text


@call("chat n=2 seed temperature")
def _():
    out = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=8, n=2, seed=1, temperature=0.8
    )
    assert len(out.choices) == 2
    return [c.message.content for c in out.choices]


@call("chat logprobs top_logprobs=3")
def _():
    out = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=4, logprobs=True, top_logprobs=3
    )
    entries = out.choices[0].logprobs.content
    assert entries and len(entries[0].top_logprobs) == 3
    return entries[0].token


@call("chat response_format json_schema")
def _():
    out = client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=200,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "colour", "schema": Colour.model_json_schema()},
        },
    )
    return Colour.model_validate_json(out.choices[0].message.content)


@call("chat response_format json_object")
def _():
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "A colour as JSON."}],
        max_tokens=200,
        response_format={"type": "json_object"},
    )
    return json.loads(out.choices[0].message.content)


@call("chat.completions.parse (pydantic)")
def _():
    out = client.chat.completions.parse(
        model=MODEL, messages=CHAT, max_tokens=200, response_format=Colour
    )
    assert out.choices[0].message.parsed is not None
    return out.choices[0].message.parsed


@call("chat tools tool_choice=required")
def _():
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=200,
    )
    calls = out.choices[0].message.tool_calls
    assert calls and json.loads(calls[0].function.arguments)
    return calls[0].function


@call("chat tools named, tool result sent back")
def _():
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    out = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=40,
    )
    tool_call = out.choices[0].message.tool_calls[0]
    messages += [
        out.choices[0].message,
        {"role": "tool", "tool_call_id": tool_call.id, "content": "sunny, 21 C"},
    ]
    again = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16
    )
    return again.choices[0].message.content


@call("completions.create")
def _():
    out = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=16
    )
    assert out.choices[0].text
    return out.choices[0].text


@call("completions.create stream")
def _():
    stream = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=16, stream=True
    )
    return "".join(c.choices[0].text for c in stream)


@call("completions echo max_tokens=0 logprobs (scoring)")
def _():
    out = client.completions.create(
        model=MODEL, prompt="The sky is blue", max_tokens=0, echo=True, logprobs=1
    )
    assert out.choices[0].text == "The sky is blue"
    return out.choices[0].logprobs.token_logprobs


@call("completions batch of 4 prompts")
def _():
    out = client.completions.create(
        model=MODEL, prompt=["a", "b", "c", "d"], max_tokens=4
    )
    assert len(out.choices) == 4
    return len(out.choices)


@call("async: 16 chats at once")
def _():
    aclient = openai.AsyncOpenAI(base_url=f"{BASE}/v1", api_key="none")

    async def main():
        asked = [
            aclient.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8)
            for _ in range(16)
        ]
        return await asyncio.gather(*asked)

    outs = asyncio.run(main())
    assert len(outs) == 16
    return len(outs)


@call("responses.create")
def _():
    out = client.responses.create(
        model=MODEL,
        input="Name a colour.",
        instructions="Be brief.",
        max_output_tokens=16,
    )
    assert out.output_text
    return out.output_text


@call("responses.create stream")
def _():
    stream = client.responses.create(
        model=MODEL, input="Name a colour.", max_output_tokens=16, stream=True
    )
    kinds = [event.type for event in stream]
    assert kinds[0] == "response.created" and kinds[-1] in (
        "response.completed",
        "response.incomplete",
    )
    return kinds[-1]


@call("responses previous_response_id, retrieve, input_items, delete")
def _():
    first = client.responses.create(
        model=MODEL, input="My name is Ada.", max_output_tokens=8
    )
    second = client.responses.create(
        model=MODEL,
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=8,
    )
    assert client.responses.retrieve(second.id).id == second.id
    items = client.responses.input_items.list(second.id)
    client.responses.delete(first.id)
    return [item.type for item in items.data]


@call("responses function tool round trip")
def _():
    tool = {"type": "function"} | WEATHER["function"]
    first = client.responses.create(
        model=MODEL,
        input="Weather in Paris?",
        tools=[tool],
        tool_choice="required",
        max_output_tokens=200,
    )
    fc = next(item for item in first.output if item.type == "function_call")
    second = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            fc,
            {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"},
        ],
        tools=[tool],
        max_output_tokens=16,
    )
    return second.output_text


@call("responses.parse text_format (pydantic)")
def _():
    out = client.responses.parse(
        model=MODEL, input="Name a colour.", text_format=Colour, max_output_tokens=200
    )
    assert out.output_parsed is not None
    return out.output_parsed


@call("embeddings.create (generation-only server: a 404 that says so)")
def _():
    try:
        client.embeddings.create(model=MODEL, input="hello")
    except openai.NotFoundError as error:
        assert "generation only" in str(error)
        return "404: " + str(error)[:80]
    raise AssertionError("an embedding came back")
