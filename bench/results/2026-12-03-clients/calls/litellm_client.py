"""litellm's typical calls, through its `openai/` and `hosted_vllm/` providers:
completion, streaming, async batches, tools, JSON schema, text completion, and the
Responses API."""

import asyncio
import json

import litellm
from common import BASE, MODEL, call
from pydantic import BaseModel

MESSAGES = [{"role": "user", "content": "Name a colour."}]
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


for provider in ("openai", "hosted_vllm"):
    args = {"model": f"{provider}/{MODEL}", "api_base": f"{BASE}/v1", "api_key": "none"}

    @call(f"completion ({provider}/)")
    def _(args=args):
        out = litellm.completion(messages=MESSAGES, max_tokens=16, **args)
        assert out.choices[0].message.content
        return out.choices[0].message.content

    @call(f"responses ({provider}/)")
    def _(args=args):
        out = litellm.responses(input="Name a colour.", max_output_tokens=16, **args)
        assert out.output
        return out.output[-1]


args = {"model": f"hosted_vllm/{MODEL}", "api_base": f"{BASE}/v1", "api_key": "none"}


@call("completion stream=True")
def _():
    chunks = litellm.completion(messages=MESSAGES, max_tokens=16, stream=True, **args)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text
    return text


@call("acompletion x8 (asyncio.gather)")
def _():
    async def main():
        return await asyncio.gather(
            *[
                litellm.acompletion(messages=MESSAGES, max_tokens=8, **args)
                for _ in range(8)
            ]
        )

    outs = asyncio.run(main())
    assert len(outs) == 8
    return len(outs)


@call("batch_completion of 4")
def _():
    outs = litellm.batch_completion(messages=[MESSAGES] * 4, max_tokens=8, **args)
    assert all(o.choices[0].message.content for o in outs)
    return len(outs)


@call("completion tools tool_choice=required")
def _():
    out = litellm.completion(
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=100,
        **args,
    )
    calls = out.choices[0].message.tool_calls
    assert calls and json.loads(calls[0].function.arguments)
    return calls[0].function


@call("completion response_format=pydantic")
def _():
    out = litellm.completion(
        messages=MESSAGES, response_format=Colour, max_tokens=100, **args
    )
    return Colour.model_validate_json(out.choices[0].message.content)


@call("text_completion")
def _():
    out = litellm.text_completion(prompt="Once upon a time", max_tokens=16, **args)
    assert out.choices[0].text
    return out.choices[0].text


@call("responses stream=True")
def _():
    events = list(
        litellm.responses(
            input="Name a colour.", max_output_tokens=16, stream=True, **args
        )
    )
    kinds = [getattr(e, "type", None) for e in events]
    assert "response.completed" in kinds or "response.incomplete" in kinds
    return kinds[-1]
