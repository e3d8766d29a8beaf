"""langchain-openai's typical calls: invoke, stream, batch, structured output in its
three methods, tools, the Responses API, and the completions LLM."""

import asyncio

from common import BASE, MODEL, call
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI, OpenAI
from pydantic import BaseModel, Field

chat = ChatOpenAI(model=MODEL, base_url=f"{BASE}/v1", api_key="none", max_tokens=32)


class Person(BaseModel):
    """A person mentioned in the text."""

    name: str = Field(max_length=20)
    age: int


def get_weather(city: str) -> str:
    """Get the weather in a city."""
    return "sunny"


PERSON = "Extract: Jason is 25 years old."


@call("invoke (system + human)")
def _():
    out = chat.invoke([SystemMessage("Be brief."), HumanMessage("Name a colour.")])
    assert out.content
    return out.content


@call("stream")
def _():
    pieces = [chunk.content for chunk in chat.stream("Name a colour.")]
    assert "".join(pieces)
    return "".join(pieces)


@call("batch of 8")
def _():
    outs = chat.batch([f"Say the number {i}." for i in range(8)])
    assert len(outs) == 8
    return [o.content[:10] for o in outs]


@call("abatch of 16 (async)")
def _():
    outs = asyncio.run(chat.abatch([f"Count to {i}." for i in range(16)]))
    assert len(outs) == 16
    return len(outs)


for method in ("function_calling", "json_schema", "json_mode"):

    @call(f"with_structured_output(method={method})")
    def _(method=method):
        prompt = PERSON
        if method == "json_mode":
            prompt += " Answer as JSON with keys name and age."
        structured = ChatOpenAI(
            model=MODEL, base_url=f"{BASE}/v1", api_key="none", max_tokens=200
        ).with_structured_output(Person, method=method)
        out = structured.invoke(prompt)
        return Person.model_validate(out)


@call("bind_tools + tool_choice, then the tool's answer back")
def _():
    llm = chat.bind_tools([get_weather], tool_choice="get_weather")
    first = llm.invoke("Weather in Paris?")
    calls = first.tool_calls
    assert calls and calls[0]["name"] == "get_weather"
    from langchain_core.messages import ToolMessage

    second = chat.invoke(
        [
            HumanMessage("Weather in Paris?"),
            first,
            ToolMessage("sunny", tool_call_id=calls[0]["id"]),
        ]
    )
    return second.content


@call("ChatOpenAI(use_responses_api=True).invoke")
def _():
    llm = ChatOpenAI(
        model=MODEL,
        base_url=f"{BASE}/v1",
        api_key="none",
        max_tokens=32,
        use_responses_api=True,
    )
    out = llm.invoke("Name a colour.")
    assert out.text
    return out.text


@call("ChatOpenAI(use_responses_api=True).stream")
def _():
    llm = ChatOpenAI(
        model=MODEL,
        base_url=f"{BASE}/v1",
        api_key="none",
        max_tokens=32,
        use_responses_api=True,
    )
    text = "".join(chunk.text for chunk in llm.stream("Name a colour."))
    assert text
    return text


@call("responses API switched on by `truncation` (LangChain's own switch)")
def _():
    llm = ChatOpenAI(
        model=MODEL,
        base_url=f"{BASE}/v1",
        api_key="none",
        max_tokens=32,
        truncation="auto",
    )
    return llm.invoke("Name a colour.").text


@call("responses API with_structured_output(json_schema)")
def _():
    llm = ChatOpenAI(
        model=MODEL,
        base_url=f"{BASE}/v1",
        api_key="none",
        max_tokens=200,
        use_responses_api=True,
    )
    return Person.model_validate(llm.with_structured_output(Person).invoke(PERSON))


@call("OpenAI (completions LLM).invoke")
def _():
    llm = OpenAI(model=MODEL, base_url=f"{BASE}/v1", api_key="none", max_tokens=16)
    out = llm.invoke("Once upon a time")
    assert out
    return out
