"""Logits of Hugging Face transformers on the tiny test checkpoints:
tests/data/hf_tiny_logits.json.

tests/test_model.py rebuilds the same seeded checkpoints (tests/checkpoints.py) and
checks that minipaged's forward pass gives these logits. Covers GQA ratios 1/3/8, Qwen2
biases, Llama attention_bias, untied embeddings and llama3 rope scaling. Run once with
torch + transformers:

    /tmp/hf/bin/python scripts/hf_tiny_reference.py > tests/data/hf_tiny_logits.json
"""

import json
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from checkpoints import write_checkpoint  # noqa: E402

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
CASES = {
    "gqa1": dict(heads=4, kv_heads=4),
    "gqa3": dict(hidden=96, heads=6, kv_heads=2),
    "gqa8": dict(hidden=128, heads=8, kv_heads=1, tied=False),
    "qwen2": dict(arch="Qwen2ForCausalLM", heads=4, kv_heads=2),
    "llama_bias": dict(bias=True),
    "llama3_rope": dict(rope_scaling=LLAMA3_ROPE, max_positions=512),
}
TOKENS = [
    1,
    5,
    9,
    17,
    33,
    12,
    40,
    7,
    22,
    51,
    3,
    28,
    50,
    11,
    9,
    9,
    44,
    30,
    19,
    2,
    6,
    55,
    15,
    8,
]

result = {"transformers": transformers.__version__, "tokens": TOKENS, "cases": {}}
with tempfile.TemporaryDirectory() as tmp:
    for name, options in CASES.items():
        folder = write_checkpoint(Path(tmp) / name, **options)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = model(torch.tensor([TOKENS])).logits[0]
        result["cases"][name] = {"options": options, "logits": logits.tolist()}
json.dump(result, sys.stdout)
print()
