"""The tokenizer minipaged serves, as transformers' would be used by vLLM's tests (encode, decode)."""
from pathlib import Path

from tokenizers import Tokenizer

FOLDER = Path("/root/.cache/minipaged/SmolLM2-135M-Instruct-from-gguf-v1")


class _Tok:
    def __init__(self):
        self.hf = Tokenizer.from_file(str(FOLDER / "tokenizer.json"))

    def encode(self, text, add_special_tokens=True):
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens=False):
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": self.encode(text, add_special_tokens)}

    @property
    def vocab_size(self):
        return self.hf.get_vocab_size()

    def __len__(self):
        return self.hf.get_vocab_size()

    def get_vocab(self):
        return self.hf.get_vocab()

    def convert_ids_to_tokens(self, ids):
        return [self.hf.id_to_token(i) for i in ids]


def get_tokenizer(tokenizer_name=None, *args, **kwargs):
    return _Tok()


def _apply_chat_template(self, conversation, add_generation_prompt=False, continue_final_message=False,
                         tokenize=False, tools=None, **kwargs):
    """transformers' apply_chat_template, for tokenize=False: the model's Jinja template, rendered as
    transformers renders it (sandboxed, trim_blocks, lstrip_blocks); continue_final_message cuts the
    text after the last message's content."""
    import json

    from jinja2.sandbox import ImmutableSandboxedEnvironment
    config = json.loads((FOLDER / "tokenizer_config.json").read_text())
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, indent=indent, ensure_ascii=False)
    extra = {k: (v if isinstance(v, str) else (v or {}).get("content")) for k, v in config.items()
             if k.endswith("_token")}
    text = env.from_string(config["chat_template"]).render(
        messages=conversation, add_generation_prompt=add_generation_prompt, tools=tools, **extra)
    if continue_final_message:
        final = conversation[-1]["content"]
        text = text[: text.rindex(final) + len(final)]
    return text


_Tok.apply_chat_template = _apply_chat_template
