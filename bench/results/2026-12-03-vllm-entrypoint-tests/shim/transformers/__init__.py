"""Stub: AutoTokenizer.from_pretrained gives the tokenizer minipaged serves (not transformers)."""
from vllm._tok import get_tokenizer


class AutoTokenizer:
    @staticmethod
    def from_pretrained(name, *args, **kwargs):
        return get_tokenizer(name)
