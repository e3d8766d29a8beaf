"""minipaged: a small, readable LLM inference engine that teaches how vLLM serves
models.

from minipaged import LLM, SamplingParams llm = LLM() llm.generate(["The capital of
France is"], SamplingParams(temperature=0, max_tokens=16))
"""

import sys

try:
    from minipaged.llm import LLM
    from minipaged.outputs import CompletionOutput, RequestOutput
    from minipaged.sampling import SamplingParams
except (
    ModuleNotFoundError
) as missing:  # `python -m minipaged...` with a Python outside the project's .venv
    if sys.argv[:1] != ["-m"] or missing.name not in {
        "numpy",
        "safetensors",
        "tokenizers",
        "huggingface_hub",
        "gguf",
        "jinja2",
        "tqdm",
        "threadpoolctl",
    }:
        raise
    sys.exit(
        f"this Python ({sys.executable}) does not have minipaged's dependencies (no"
        f" {missing.name}): run `source .venv/bin/activate` first (on Windows"
        " `.venv\\Scripts\\activate`; `make setup` creates it), or write"
        " .venv/bin/python instead of python"
    )

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
