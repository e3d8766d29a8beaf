"""The real default model, SmolLM2-135M-Instruct from the offline GGUF, against
transformers.

tests/data/hf_greedy.json holds the greedy tokens Hugging Face transformers produced in
float32 on the CPU from the same GGUF file (its own conversion; see
scripts/hf_reference.py).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from minipaged import SamplingParams
from minipaged.model.oracle import greedy_generate

HF = json.loads((Path(__file__).parent / "data" / "hf_greedy.json").read_text())
CASES = HF["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["prompt"][:24] for c in CASES])
def test_greedy_tokens_equal_transformers(smollm2, case):
    messages = [{"role": "user", "content": case["prompt"]}]
    prompt_ids = smollm2.tokenizer.encode_chat(messages)
    assert prompt_ids == case["prompt_token_ids"]  # tokenizer + chat template
    eos = smollm2.model.config.eos_token_ids
    assert (
        greedy_generate(smollm2.model, prompt_ids, HF["max_tokens"], eos)
        == case["output_token_ids"]
    )


def test_batched_generate_equals_transformers(smollm2):
    prompts = [{"prompt_token_ids": c["prompt_token_ids"]} for c in CASES]
    outs = smollm2.generate(
        prompts,
        SamplingParams(temperature=0, max_tokens=HF["max_tokens"]),
        use_tqdm=False,
    )
    for case, out in zip(CASES, outs):
        assert out.outputs[0].token_ids == case["output_token_ids"]
        assert out.outputs[0].text == case["text"]


def test_converted_folder_looks_like_the_hub_model(smollm2):
    config = smollm2.model.config
    assert (
        config.num_layers,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
    ) == (30, 9, 3, 64)
    assert config.tie_word_embeddings and config.eos_token_ids == [2]
    assert smollm2.tokenizer.encode("2024") == [
        34,
        32,
        34,
        36,
    ]  # digits split one by one
    assert smollm2.tokenizer.encode("<|im_start|>") == [1]  # control tokens stay whole


def test_chat_reads_a_pipe_and_answers(smollm2):
    command = [
        sys.executable,
        "-m",
        "minipaged.chat",
        "--device",
        "cpu",
        "--model",
        str(smollm2.folder),
    ]
    result = subprocess.run(
        command,
        input="What is the capital of France?\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
