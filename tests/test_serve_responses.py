"""Issue 40, OpenAI's Responses API (POST /v1/responses) as vLLM serves it, through the
official `openai` client: a plain answer, a stream of Responses events, text.format, a
function-call round trip, previous_response_id and the bounded store, DELETE and
input_items as OpenAI answers them, logprobs, the routes in /openapi.json, and the 400s
for what vLLM leaves out. The tiny random model's answers are held to their shapes only.
Servers listen on 127.0.0.1 on free ports.
"""

import json

import httpx
import openai
import pytest
from test_serve import serve
from test_serve_scoring import tiny_llm  # noqa: F401  (the fixture)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "the weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def url(tiny_llm):  # noqa: F811
    with serve(tiny_llm, max_stored_responses=3) as url:
        yield url


@pytest.fixture
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def smol(smollm2):
    """The real model (its vocabulary writes JSON; the tiny one's cannot)."""
    with serve(smollm2, name="smol", max_num_seqs=8) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)


def test_a_response_from_a_string_and_from_message_items(client):
    answer = client.responses.create(
        model="tiny",
        input="one two",
        instructions="be brief",
        max_output_tokens=5,
        temperature=0.0,
        top_p=0.9,
        extra_body={"seed": 3, "top_k": 5},
    )
    assert answer.object == "response" and answer.id.startswith("resp_")
    assert answer.status in ("completed", "incomplete")
    assert answer.output[0].type == "message" and answer.output[0].role == "assistant"
    assert answer.output_text == answer.output[0].content[0].text
    assert 1 <= answer.usage.output_tokens <= 5 and answer.usage.input_tokens > 0
    assert answer.usage.total_tokens == (
        answer.usage.input_tokens + answer.usage.output_tokens
    )
    items = client.responses.create(
        model="tiny",
        input=[
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "two"}]},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "three"}],
            },
        ],
        max_output_tokens=3,
    )
    assert items.output and 1 <= items.usage.output_tokens <= 3
    # stored by default, and GET gives it back
    assert client.responses.retrieve(answer.id).output_text == answer.output_text


def test_a_stream_is_the_responses_event_sequence(client):
    with client.responses.create(
        model="tiny",
        input="one two",
        max_output_tokens=4,
        stream=True,
        extra_body={"ignore_eos": True},  # cut at 4: a sampled end never comes first
    ) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    # vLLM's sequence: the last is response.completed, cut or not
    assert kinds[-1] == "response.completed", kinds
    assert events[-1].response.usage.output_tokens == 4
    assert events[-1].response.status == "incomplete"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    done = [e for e in events if e.type == "response.output_text.done"]
    final = events[-1].response
    if deltas:
        assert len(done) == 1 and done[0].text == "".join(deltas)
        assert final.output_text == "".join(deltas)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.usage.output_tokens >= 1


def test_text_format_holds_the_answer_to_a_schema(smol):
    client = smol
    schema = {
        "type": "object",
        "properties": {"n": {"enum": [1, 2, 3]}},
        "required": ["n"],
        "additionalProperties": False,
    }
    answer = client.responses.create(
        model="smol",
        input="a number",
        temperature=0,
        max_output_tokens=40,
        text={"format": {"type": "json_schema", "name": "n", "schema": schema}},
    )
    assert answer.status == "completed", answer
    assert set(json.loads(answer.output_text)) == {"n"}
    assert answer.text.format.type == "json_schema"


def test_a_function_call_round_trip(smol):
    client = smol
    first = client.responses.create(
        model="smol",
        input="weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=60,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", first.output
    assert set(json.loads(calls[0].arguments)) == {"city"}
    second = client.responses.create(
        model="smol",
        input=[
            {"role": "user", "content": "weather in Paris?"},
            calls[0].model_dump(),
            {
                "type": "function_call_output",
                "call_id": calls[0].call_id,
                "output": "sunny",
            },
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=3,
    )
    assert second.output[0].type == "message"
    required = client.responses.create(
        model="smol",
        input="weather?",
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_output_tokens=80,
    )
    assert required.status == "completed"
    assert {item.type for item in required.output} == {"function_call"}
    one = client.responses.create(
        model="smol",
        input="weather?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=120,
        extra_body={"seed": 3},
    )
    assert [item.type for item in one.output] == ["function_call"]
    assert one.parallel_tool_calls is False
    # streamed: the arguments arrive as function_call_arguments events
    with client.responses.create(
        model="smol",
        input="weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=60,
        stream=True,
    ) as stream:
        events = list(stream)
    pieces = [
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    ]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert pieces and len(done) == 1 and done[0].arguments == "".join(pieces)
    assert events[-1].response.output[0].type == "function_call"


def test_previous_response_id_continues_and_the_store_is_bounded(client, url):
    first = client.responses.create(model="tiny", input="one", max_output_tokens=2)
    second = client.responses.create(
        model="tiny",
        input="two",
        previous_response_id=first.id,
        max_output_tokens=2,
    )
    # the second's prompt holds the first's input and answer
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.previous_response_id == first.id
    unstored = client.responses.create(
        model="tiny", input="one", max_output_tokens=1, store=False
    )
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    for _ in range(3):  # the store keeps 3: the first is evicted
        client.responses.create(model="tiny", input="x", max_output_tokens=1)
    with pytest.raises(openai.NotFoundError, match="evicted"):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(
            model="tiny", input="two", previous_response_id=first.id
        )
    assert missing.value.body["param"] == "previous_response_id"
    kept = client.responses.create(model="tiny", input="x", max_output_tokens=1)
    cancel = httpx.post(f"{url}/v1/responses/{kept.id}/cancel", timeout=10)
    assert cancel.status_code == 400 and "synchronous" in cancel.text


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search_preview"}]}, "tools"),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools"),
        ({"tools": [{"type": "computer_use_preview"}]}, "tools"),
        ({"input": [{"type": "image", "url": "x"}]}, "input"),
        ({"text": {"format": {"type": "yaml"}}}, "text"),
        # the field as the client named it
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"store": "yes"}, "store"),
        ({"input": 5}, "input"),
        ({"background": True, "store": False}, "background"),
    ],
)
def test_what_vllm_leaves_out_is_a_400_naming_the_field(url, fields, param):
    answer = httpx.post(
        f"{url}/v1/responses",
        json={"model": "tiny", "input": "one"} | fields,
        timeout=10,
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["param"] == param, error


def test_delete_forgets_a_kept_response_and_input_items_pages_its_input(client, url):
    items = [
        {"role": "system", "content": "brief"},
        {"role": "user", "content": [{"type": "input_text", "text": "one"}]},
        {"type": "message", "role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
    ]
    kept = client.responses.create(model="tiny", input=items, max_output_tokens=2)
    page = client.responses.input_items.list(kept.id, order="asc", limit=3)
    assert [item.role for item in page.data] == ["system", "user", "assistant"]
    assert [item.content[0].text for item in page.data] == ["brief", "one", "two"]
    assert page.data[2].content[0].type == "output_text"
    assert page.has_more and page.first_id == page.data[0].id
    rest = client.responses.input_items.list(kept.id, order="asc", after=page.last_id)
    assert [item.content[0].text for item in rest.data] == ["three"]
    assert not rest.has_more
    # OpenAI's default order: the newest first; the client pages through them all
    newest = [
        item.content[0].text
        for item in client.responses.input_items.list(kept.id, limit=1)
    ]
    assert newest == ["three", "two", "one", "brief"]
    bad = httpx.get(f"{url}/v1/responses/{kept.id}/input_items?limit=0", timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"
    gone = httpx.delete(f"{url}/v1/responses/{kept.id}", timeout=10)
    assert gone.json() == {"id": kept.id, "object": "response.deleted", "deleted": True}
    for missing in (
        lambda: client.responses.retrieve(kept.id),
        lambda: client.responses.delete(kept.id),
        lambda: client.responses.input_items.list(kept.id),
    ):
        with pytest.raises(openai.NotFoundError, match="not found"):
            missing()


def test_logprobs_of_the_output_text_when_asked(client):
    # ignore_eos (vLLM's field): the tiny model's answers are never empty
    answer = client.responses.create(
        model="tiny",
        input="one",
        max_output_tokens=3,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    part = answer.output[0].content[0]
    assert len(part.logprobs) == answer.usage.output_tokens
    assert all(len(entry.top_logprobs) == 2 for entry in part.logprobs)
    assert all(entry.logprob <= 0 and entry.token for entry in part.logprobs)
    plain = client.responses.create(model="tiny", input="one", max_output_tokens=2)
    assert plain.output[0].content[0].logprobs == []
    stream = client.responses.create(
        model="tiny",
        input="one",
        max_output_tokens=3,
        top_logprobs=1,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    deltas = [e for e in stream if e.type == "response.output_text.delta"]
    assert sum(len(e.logprobs) for e in deltas) >= len(deltas) > 0


def test_the_responses_routes_are_in_the_openapi_schema(url):
    schema = httpx.get(f"{url}/openapi.json", timeout=10).json()
    paths = schema["paths"]
    assert set(paths["/v1/responses/{response_id}"]) == {"get", "delete"}
    assert "get" in paths["/v1/responses/{response_id}/input_items"]
    assert "post" in paths["/v1/responses/{response_id}/cancel"]
    body = paths["/v1/responses"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"]["$ref"].endswith("/ResponsesRequest")
    fields = schema["components"]["schemas"]["ResponsesRequest"]["properties"]
    assert {"input", "instructions", "store", "previous_response_id"} <= set(fields)


def test_a_forced_call_with_a_text_format_answers_the_call(smol):
    """instructor's RESPONSES_TOOLS mode sends text.format beside a named tool_choice:
    the call is the answer, held to the tool's schema."""
    answer = smol.responses.create(
        model="smol",
        input="weather?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        text={
            "format": {
                "type": "json_schema",
                "name": "x",
                "schema": WEATHER["parameters"],
            }
        },
        temperature=0,
        max_output_tokens=30,
    )
    assert [item.type for item in answer.output] == ["function_call"]
    assert answer.output[0].name == "get_weather"


def test_required_calls_with_tools_that_define_their_own_refs(smol):
    """vLLM's weather tool keeps an object in its parameters' $defs: under "required"
    each tool sits inside the list of calls, and its references still resolve."""
    options = {
        "type": "object",
        "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["unit"],
        "additionalProperties": False,
    }
    tools = [
        {
            "type": "function",
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {"options": {"$ref": "#/$defs/Options"}},
                "required": ["options"],
                "$defs": {"Options": options},
            },
        }
        for name in ("get_weather", "get_forecast")
    ]
    answer = smol.responses.create(
        model="smol",
        input="weather in Paris?",
        tools=tools,
        tool_choice="required",
        # greedy, with room for the call: at temperature 1 an answer was once cut
        # inside its arguments at 80 tokens, and a cut call is no call
        temperature=0,
        max_output_tokens=200,
    )
    calls = [item for item in answer.output if item.type == "function_call"]
    assert calls and calls[0].name in ("get_weather", "get_forecast")
    unit = json.loads(calls[0].arguments)["options"]["unit"]
    assert unit in ("celsius", "fahrenheit")
