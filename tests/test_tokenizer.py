"""Tokenizer and chat template: transformers' rendering rules, streaming
detokenization."""

import json

import pytest

from minipaged.model.tokenizer import IncrementalDetokenizer, Tokenizer


def test_chat_template_renders_like_transformers(tiny):
    tok = Tokenizer(tiny())
    messages = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "yes"},
    ]
    assert (
        tok.apply_chat_template(messages)
        == "<|user|> hello <|assistant|> yes <|assistant|> "
    )
    assert (
        tok.apply_chat_template(messages, add_generation_prompt=False)
        == "<|user|> hello <|assistant|> yes "
    )
    assert tok.special_tokens["bos_token"] == "<s>"  # {"content": ...} form unwrapped
    assert tok.eos_token_id == 2


def test_template_features_transformers_provides(tiny):
    folder = tiny()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {
            "name": "default",
            "template": (
                "{{ bos_token }}{% for m in messages %}{% if m.role == 'bad' %}{{"
                " raise_exception('no bad roles') }}{% endif %}{{ m | tojson }}{%"
                " endfor %}"
            ),
        }
    ]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer(folder)
    assert (
        tok.apply_chat_template([{"role": "user", "content": "é"}], False)
        == '<s>{"role": "user", "content": "é"}'
    )
    # a 400 at the server, not a 500
    with pytest.raises(ValueError, match="no bad roles"):
        tok.apply_chat_template([{"role": "bad", "content": ""}])


def test_missing_template_is_explained(tiny):
    folder = tiny()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no chat_template"):
        Tokenizer(folder).apply_chat_template([{"role": "user", "content": "hi"}])


def test_incremental_detokenizer_rebuilds_the_text(smollm2):
    tok = smollm2.tokenizer
    text = "Paging: naïve 🙂 caches waste 60–80% of memory; 日本語 too."
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.add(i) for i in ids]
    assert "".join(pieces) == tok.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)
    # the emoji and CJK bytes span several tokens: held back, then released
    assert "" in pieces
