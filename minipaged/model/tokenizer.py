"""Text in, token ids out, and back: `tokenizers` for the BPE, jinja2 for the chat
template.

The first and last stops on the path of a request: a chat becomes one prompt string
through the model's own chat template, then ids; generated ids become text again, a few
at a time.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.sandbox
from tokenizers import Tokenizer as HFTokenizer


class Tokenizer:
    """tokenizer.json + tokenizer_config.json of a Hugging Face model folder."""

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        self.hf = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        # tokenizer_config.json as read (the server's /tokenizer_info)
        self.config = config
        self.special_tokens = {
            key: _content(config.get(key))
            for key in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = {t["name"]: t["template"] for t in template}.get("default")
        # newer repos keep it in its own file
        if (folder / "chat_template.jinja").exists():
            template = (folder / "chat_template.jinja").read_text()
        self.chat_template = template
        self._template = _compile(template) if template else None
        eos = self.special_tokens["eos_token"]
        self.eos_token_id = None if eos is None else self.hf.token_to_id(eos)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids, skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list | None = None,
    ) -> str:
        """The prompt string for a conversation, exactly as transformers renders it;
        with continue_final_message, it ends where the last message's content ends
        (transformers' way), so that the model continues that message instead of
        starting a new one. `tools` (OpenAI's function list) go to the template, which
        shows them if it knows how.
        """
        if not self.chat_template:
            raise ValueError(
                "this model's tokenizer_config.json has no chat_template; "
                "use generate() with a plain prompt instead of chat()"
            )
        for i, message in enumerate(messages):
            if (
                not isinstance(message, dict)
                or "role" not in message
                or "content" not in message
            ):
                raise ValueError(
                    f"message {i} must be a dict with 'role' and 'content', got"
                    f" {message!r}"
                )
        try:
            text = self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                **{k: v for k, v in self.special_tokens.items() if v is not None},
            )
        except (
            jinja2.TemplateError
        ) as error:  # the template's raise_exception(): it refuses this conversation
            raise ValueError(
                f"the chat template refused the conversation: {error}"
            ) from None
        return (
            open_end(text, messages[-1]["content"])
            if continue_final_message and messages
            else text
        )

    def encode_chat(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        add_special_tokens: bool = False,
        tools: list | None = None,
    ) -> list[int]:
        # the template already wrote the special tokens: the tokenizer adds its BOS
        # again only when asked
        return self.encode(
            self.apply_chat_template(
                messages, add_generation_prompt, continue_final_message, tools
            ),
            add_special_tokens=add_special_tokens,
        )

    def token_strings(self, token_ids) -> list[str]:
        """Each id's token as the vocabulary writes it ("Ġworld"), not decoded (vLLM's
        token_strs)."""
        return [self.hf.id_to_token(int(t)) or "" for t in token_ids]


class IncrementalDetokenizer:
    """Text of a growing list of ids, handed out as new pieces (for streaming).

    Decoding one id at a time breaks multi-byte characters and word-joining spaces, so
    we decode a short window of ids before and after the last emitted point, and hold
    text back while it ends in an incomplete character (U+FFFD), as vLLM and
    transformers' TextStreamer do.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        # window start: context that makes the next decode correct
        self.prefix_offset = 0
        self.read_offset = 0  # ids up to here have been emitted as text
        self.text = ""

    def add(self, token_id: int) -> str:
        """Append one id; return the text it completes ('' while a character is
        unfinished)."""
        self.token_ids.append(token_id)
        decode = self.tokenizer.decode
        before = decode(self.token_ids[self.prefix_offset : self.read_offset])
        after = decode(self.token_ids[self.prefix_offset :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        new = after[len(before) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        self.text += new
        return new


def open_end(text: str, final: str) -> str:
    """A rendered chat cut right after its last message's content (whatever the template
    writes after it, an end-of-turn token, goes): keep the content's trailing spaces if
    the template kept them.
    """
    if not isinstance(final, str) or final.strip() not in text:
        raise ValueError(
            "continue_final_message is set but the final message does not appear in the"
            " chat after applying the chat template"
        )
    at = text.rindex(final.strip())
    whole = final.lstrip()
    return (
        text[: at + len(whole)]
        if text[at : at + len(whole)] == whole
        else text[: at + len(final.strip())]
    )


def _content(token) -> str | None:
    """tokenizer_config.json writes special tokens as strings or as {"content": ...}
    dicts."""
    return token.get("content") if isinstance(token, dict) else token


def _compile(source: str) -> jinja2.Template:
    """Compile a chat template in the sandboxed environment transformers uses."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
    )


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)
