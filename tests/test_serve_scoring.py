"""Issue 40, scoring without generation, and embeddings answered honestly:
/v1/completions with max_tokens=0 and echo answers the prompt's log-probabilities and no
new token, as vLLM's "echo without generation" does; max_tokens=0 without echo is a 400
that says why. Servers listen on 127.0.0.1 on free ports.
"""

import json

import httpx
import openai
import pytest
from checkpoints import write_checkpoint
from test_serve import serve

from minipaged import LLM, SamplingParams


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    folder = write_checkpoint(tmp_path_factory.mktemp("scoring") / "tiny")
    return LLM(str(folder), device="cpu", num_blocks=128, block_size=4)


PROMPT = "one two three four"


def test_max_tokens_0_with_echo_scores_the_prompt_and_generates_nothing(tiny_llm):
    ids = tiny_llm.tokenizer.encode(PROMPT)
    expected = tiny_llm.generate(
        [PROMPT], SamplingParams(max_tokens=1, prompt_logprobs=2, temperature=0)
    )[0].prompt_logprobs
    with serve(tiny_llm) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        answer = client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=0,
            echo=True,
            logprobs=2,
            extra_body={"prompt_logprobs": 2},
        )
        batch = httpx.post(
            f"{url}/v1/completions",
            json={"prompt": [PROMPT, "five six"], "max_tokens": 0, "echo": True},
            timeout=30,
        ).json()
        streamed = httpx.post(
            f"{url}/v1/completions",
            json={"prompt": PROMPT, "max_tokens": 0, "echo": True, "stream": True},
            timeout=30,
        ).text
    choice = answer.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert answer.usage.completion_tokens == 0
    assert answer.usage.prompt_tokens == len(ids)
    # the prompt's tokens and nothing more, the first without a logprob (vLLM's)
    assert len(choice.logprobs.tokens) == len(ids)
    assert choice.logprobs.token_logprobs[0] is None
    assert all(lp <= 0 for lp in choice.logprobs.token_logprobs[1:])
    prompt_logprobs = choice.model_extra["prompt_logprobs"]
    assert prompt_logprobs[0] is None and len(prompt_logprobs) == len(ids)
    for step, want in zip(prompt_logprobs[1:], expected[1:]):
        for token, lp in want.items():
            assert step[str(token)]["logprob"] == pytest.approx(lp.logprob, abs=1e-4)
    assert [c["text"] for c in batch["choices"]] == [PROMPT, "five six"], batch
    assert batch["usage"]["completion_tokens"] == 0
    chunks = [
        json.loads(line[6:])
        for line in streamed.splitlines()
        if line.startswith("data: {")
    ]
    assert "".join(c["choices"][0]["text"] for c in chunks) == PROMPT, streamed
    assert chunks[-1]["choices"][0]["finish_reason"] == "length", streamed


def test_max_tokens_0_without_echo_is_a_400_that_says_why(tiny_llm):
    with serve(tiny_llm) as url:
        for body, param in [
            ({"max_tokens": 0}, "max_tokens"),
            ({"max_completion_tokens": 0}, "max_completion_tokens"),
            ({"max_tokens": 0, "echo": True, "min_tokens": 2}, "min_tokens"),
        ]:
            refused = httpx.post(
                f"{url}/v1/completions", json={"prompt": PROMPT} | body, timeout=30
            )
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["param"] == param, error
        message = httpx.post(
            f"{url}/v1/completions",
            json={"prompt": PROMPT, "max_tokens": 0},
            timeout=30,
        ).json()["error"]["message"]
        assert "echo" in message and "generates nothing" in message, message
        # chat keeps max_tokens >= 1
        chat = httpx.post(
            f"{url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
            timeout=30,
        )
        assert chat.status_code == 400 and chat.json()["error"]["param"] == (
            "max_tokens"
        )


def test_embeddings_are_a_404_that_says_generation_only_and_what_to_use(tiny_llm):
    with serve(tiny_llm) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.NotFoundError) as refused:
            client.embeddings.create(model="tiny", input="one two")
    error = refused.value.body
    assert set(error) == {"message", "type", "param", "code"}, error
    assert "generation only" in error["message"], error
    assert "--runner pooling" in error["message"], error
