"""instructor's typical calls: a pydantic model out of the chat, in its modes, with
streamed partials and iterables."""

import instructor
import openai
from common import BASE, MODEL, call
from pydantic import BaseModel, Field


class User(BaseModel):
    name: str = Field(max_length=20)
    age: int


PROMPT = [{"role": "user", "content": "Extract: Jason is 25 years old."}]
client = openai.OpenAI(base_url=f"{BASE}/v1", api_key="none")


def patched(mode):
    return instructor.from_openai(client, mode=mode)


for mode in (
    instructor.Mode.TOOLS,
    instructor.Mode.JSON_SCHEMA,
    instructor.Mode.JSON,
    instructor.Mode.MD_JSON,
    instructor.Mode.RESPONSES_TOOLS,
):

    @call(f"create response_model=User mode={mode.name}")
    def _(mode=mode):
        kwargs = {"max_tokens": 200}
        if mode == instructor.Mode.RESPONSES_TOOLS:
            kwargs = {"max_output_tokens": 200}
        return patched(mode).create(
            model=MODEL, response_model=User, messages=PROMPT, max_retries=1, **kwargs
        )


@call("create_partial (streamed partial objects) mode=TOOLS")
def _():
    parts = list(
        patched(instructor.Mode.TOOLS).create_partial(
            model=MODEL, response_model=User, messages=PROMPT, max_tokens=200
        )
    )
    assert parts
    return parts[-1]


@call("create_partial mode=JSON_SCHEMA")
def _():
    parts = list(
        patched(instructor.Mode.JSON_SCHEMA).create_partial(
            model=MODEL, response_model=User, messages=PROMPT, max_tokens=200
        )
    )
    assert parts
    return parts[-1]


@call("create_iterable (a list of Users) mode=JSON_SCHEMA")
def _():
    users = list(
        patched(instructor.Mode.JSON_SCHEMA).create_iterable(
            model=MODEL,
            response_model=User,
            messages=[{"role": "user", "content": "Extract: Jason is 25, Ann is 31."}],
            max_tokens=300,
        )
    )
    return users


@call("from_provider('openai/...') with base_url")
def _():
    client = instructor.from_provider(
        f"openai/{MODEL}", base_url=f"{BASE}/v1", api_key="none"
    )
    return client.create(response_model=User, messages=PROMPT, max_tokens=200)
