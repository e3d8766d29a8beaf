from vllm._tok import get_tokenizer  # noqa: F401
