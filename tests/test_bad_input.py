"""A battery of bad input: each case is refused with a message naming what was wrong,
and nothing else is lost: the good requests of the same call finish unchanged and no
frame leaks.

Every case goes through `LLM.generate` (a "rejected" output between two good prompts)
and through `LLMEngine.add_request` (a ValueError, and nothing queued).
"""

import math

import numpy as np
import pytest

from minipaged import LLM, SamplingParams

GOOD = [{"prompt_token_ids": [1, 5, 9]}, {"prompt_token_ids": [1, 7]}]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)

# (field, bad value, words the message must contain)
BAD_PARAMS = [
    ("n", 0, "n must be"),
    ("n", -1, "n must be"),
    ("n", 2.5, "n must be"),
    ("n", "2", "n must be"),
    ("n", None, "n must be"),
    ("n", True, "n must be"),
    ("temperature", -0.1, "temperature"),
    ("temperature", "0", "temperature"),
    ("temperature", None, "temperature"),
    ("temperature", math.nan, "temperature"),
    ("temperature", math.inf, "temperature"),
    ("temperature", [1.0], "temperature"),
    ("top_k", 0, "top_k"),
    ("top_k", -2, "top_k"),
    ("top_k", 2.5, "top_k"),
    ("top_k", "5", "top_k"),
    ("top_k", None, "top_k"),
    ("top_p", 0, "top_p"),
    ("top_p", 1.5, "top_p"),
    ("top_p", -0.1, "top_p"),
    ("top_p", math.nan, "top_p"),
    ("top_p", "0.9", "top_p"),
    ("top_p", None, "top_p"),
    ("max_tokens", 0, "max_tokens"),
    ("max_tokens", -5, "max_tokens"),
    ("max_tokens", 2.5, "max_tokens"),
    ("max_tokens", "16", "max_tokens"),
    ("max_tokens", None, "max_tokens"),
    ("max_tokens", True, "max_tokens"),
    ("stop", [""], "stop"),
    ("stop", [1], "stop"),
    ("stop", [None], "stop"),
    ("stop", 5, "stop"),
    ("stop", b"x", "stop"),
    ("stop_token_ids", 5, "stop_token_ids"),
    ("stop_token_ids", ["1"], "stop_token_ids"),
    ("stop_token_ids", [1.0], "stop_token_ids"),
    ("stop_token_ids", [None], "stop_token_ids"),
    ("stop_token_ids", [-1], "stop_token_ids"),
    ("stop_token_ids", [10**9], "stop_token_ids"),
    ("ignore_eos", "yes", "ignore_eos"),
    ("ignore_eos", 1, "ignore_eos"),
    ("ignore_eos", None, "ignore_eos"),
    ("seed", 1.5, "seed"),
    ("seed", -1, "seed"),
    ("seed", "7", "seed"),
    ("beam_width", 0, "beam_width"),
    ("beam_width", 2.5, "beam_width"),
    ("beam_width", "2", "beam_width"),
]
# (SamplingParams keyword arguments valid one by one but not together, words of the
# message)
BAD_COMBINATIONS = [
    (dict(beam_width=2, temperature=0.5), "temperature"),
    (dict(beam_width=2, stop=["x"]), "stop strings"),
    (dict(beam_width=2, n=3), "n=3"),
    (dict(beam_width=2, top_k=5), "top_k"),
    (dict(beam_width=2, top_p=0.5), "top_p"),
]
# (prompt, words of the message)
BAD_PROMPTS = [
    ("", "prompt is empty"),
    ("a \ud800 b", "not valid text"),
    ({"prompt_token_ids": []}, "prompt is empty"),
    ({"prompt_token_ids": [1, None]}, "prompt_token_ids"),
    ({"prompt_token_ids": [1, [2]]}, "prompt_token_ids"),
    ({"prompt_token_ids": [1, math.inf]}, "prompt_token_ids"),
    ({"prompt_token_ids": None}, "prompt_token_ids"),
    ({"prompt_token_ids": 5}, "prompt_token_ids"),
    ({"prompt_token_ids": "123"}, "prompt_token_ids"),
    ({"prompt_token_ids": [1, 1.7, 5]}, "prompt_token_ids"),
    ({"prompt_token_ids": ["1", "5"]}, "prompt_token_ids"),
    ({"prompt_token_ids": [1, True]}, "prompt_token_ids"),
    ({"prompt_token_ids": [1, -1]}, "out of vocabulary"),
    ({"prompt_token_ids": [1, 10**6]}, "out of vocabulary"),
    ({"prompt_token_ids": [1] * 64}, "max_model_len"),
    ({"prompt_token_ids": np.array([1.0, 2.0])}, "prompt_token_ids"),
    ({"prompt_token_ids": np.array([[1, 2]])}, "prompt_token_ids"),
    ({"tokens": [1]}, "must be a string or"),
    (123, "must be a string or"),
    (None, "must be a string or"),
    (b"bytes", "must be a string or"),
    ({"prompt_token_ids": [1, 2], "prompt": 5}, "prompt must be a string"),
]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from checkpoints import write_checkpoint

    folder = write_checkpoint(
        tmp_path_factory.mktemp("tiny"),
        hidden=64,
        heads=4,
        kv_heads=2,
        max_positions=64,
    )
    return LLM(str(folder), device="cpu", num_blocks=16, block_size=8)


@pytest.fixture(scope="module")
def expected(llm):
    return [o.outputs[0].token_ids for o in llm.generate(GOOD, GREEDY, use_tqdm=False)]


def with_field(field, value) -> SamplingParams:
    """Valid params, then one field set by assignment (which no dataclass checks)."""
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    setattr(params, field, value)
    return params


def assert_refused_alone(llm, expected, prompt, params, words):
    outs = llm.generate(
        [GOOD[0], prompt, GOOD[1]], [GREEDY, params, GREEDY], use_tqdm=False
    )
    assert (
        outs[1].outputs[0].finish_reason == "rejected"
        and outs[1].outputs[0].token_ids == []
    )
    assert words in outs[1].error, outs[1].error
    assert [outs[0].outputs[0].token_ids, outs[2].outputs[0].token_ids] == expected
    engine = llm.engine
    assert not engine.requests and not engine.blocks.tables and not llm.unclaimed
    with pytest.raises(ValueError, match="request 'bad'") as error:
        engine.add_request("bad", prompt, params)
    assert words in str(error.value)
    assert not engine.requests and not engine.has_unfinished_requests()


def test_the_battery_has_over_fifty_cases():
    assert len(BAD_PARAMS) + len(BAD_COMBINATIONS) + len(BAD_PROMPTS) + 4 > 50


@pytest.mark.parametrize("field, value, words", BAD_PARAMS)
def test_bad_sampling_params(llm, expected, field, value, words):
    # stop ids outside the vocabulary: only the model knows its size
    if value not in (
        [-1],
        [10**9],
    ):
        with pytest.raises(ValueError, match=field):
            SamplingParams(**{field: value})
    assert_refused_alone(llm, expected, GOOD[0], with_field(field, value), words)


@pytest.mark.parametrize("kwargs, words", BAD_COMBINATIONS)
def test_bad_combinations_of_params(llm, expected, kwargs, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)
    params = SamplingParams(temperature=0, max_tokens=6)
    for field, value in kwargs.items():
        setattr(params, field, value)
    assert_refused_alone(llm, expected, GOOD[0], params, words)


@pytest.mark.parametrize("prompt, words", BAD_PROMPTS)
def test_bad_prompts(llm, expected, prompt, words):
    assert_refused_alone(llm, expected, prompt, GREEDY, words)


@pytest.mark.parametrize(
    "params, words",
    [
        ({"temperature": 0}, "params must be SamplingParams"),
        ("greedy", "params must be SamplingParams"),
        (SamplingParams(n=4, max_tokens=60), "frames"),
    ],
)
def test_bad_params_objects_and_requests_that_can_never_fit(
    llm, expected, params, words
):
    assert_refused_alone(llm, expected, GOOD[0], params, words)


@pytest.mark.parametrize("request_id", ["", None, 5])
def test_bad_request_ids(llm, request_id):
    with pytest.raises(ValueError, match="request_id must be a non-empty string"):
        llm.engine.add_request(request_id, GOOD[0], GREEDY)
    assert not llm.engine.requests


def test_a_duplicate_request_id(llm, expected):
    engine = llm.engine
    engine.add_request("same", GOOD[0], GREEDY)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("same", GOOD[1], GREEDY)
    outputs = {}
    while engine.has_unfinished_requests():
        outputs |= {o.request_id: o for o in engine.step().finished}
    assert (
        list(outputs) == ["same"]
        and outputs["same"].outputs[0].token_ids == expected[0]
    )
