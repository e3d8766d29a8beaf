"""Automata for structured output (meeting 16): a request's regex, JSON schema or choice
is compiled into a DFA over characters (regex.py, schema.py); the vocabulary, as a trie
of token texts, is walked from each DFA state once to find the tokens that keep the text
a prefix of a match: that is the state's mask, and a sequence's Constraint is where it
stands in the DFA.
"""

from __future__ import annotations

import json

import numpy as np

from minipaged.structured.regex import DEAD, DFA, compile_regex
from minipaged.structured.schema import any_object, escape, schema_to_regex


def regex_of(spec) -> str:
    """The pattern a StructuredOutputsParams stands for (a ValueError naming its
    field)."""
    if spec.regex is not None:
        return spec.regex
    if spec.choice is not None:
        return "(" + "|".join(escape(c) for c in spec.choice) + ")"
    if spec.json_object:
        return any_object()
    schema = spec.json
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as error:
            raise ValueError(f"structured_outputs.json is not JSON: {error}") from None
    try:
        return schema_to_regex(schema)
    except ValueError as error:
        raise ValueError(f"structured_outputs.json: {error}") from None


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet back to bytes: the printable bytes stand for
    themselves, the others were moved to code points 256 and up ("Ġ" is the space)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    codes, extra = {}, 0
    for b in range(256):
        if b in printable:
            codes[chr(b)] = b
        else:
            codes[chr(256 + extra)] = b
            extra += 1
    return codes


def token_texts(tokenizer, vocab_size: int) -> list[str | None]:
    """The text each token id adds to an answer; None for a special token, an id past
    the tokenizer's vocabulary, or a piece of a multi-byte character (such a token is
    never allowed: non-ASCII text then comes from whole-character tokens)."""
    hf = tokenizer.hf
    special = {t.content for t in hf.get_added_tokens_decoder().values() if t.special}
    decoder = byte_decoder()
    # GPT-2's alphabet
    byte_level = "ByteLevel" in json.dumps(json.loads(hf.to_str()).get("decoder"))
    texts = []
    for i in range(vocab_size):
        piece = hf.id_to_token(i) if i < hf.get_vocab_size() else None
        if piece is None or piece in special or not piece:
            texts.append(None)
        elif byte_level and all(c in decoder for c in piece):
            try:
                texts.append(bytes(decoder[c] for c in piece).decode("utf-8"))
            except UnicodeDecodeError:
                texts.append(None)
        else:  # SentencePiece and word-level vocabularies: "▁" is the space
            text = piece.replace("▁", " ")
            texts.append(None if text.startswith("<0x") else text)
    return texts


class Vocabulary:
    """The token texts as a trie: node = (children {char: node}, token ids ending
    here)."""

    def __init__(self, texts: list[str | None]):
        self.root: tuple[dict, list] = ({}, [])
        for token, text in enumerate(texts):
            if text:
                node = self.root
                for ch in text:
                    node = node[0].setdefault(ch, ({}, []))
                node[1].append(token)
        self.size = len(texts)

    def allowed(self, dfa: DFA, state: int) -> np.ndarray:
        """Every token whose text, read from `state`, leaves the DFA alive: a
        depth-first walk of the trie that stops at the first character the DFA refuses
        (the whole subtree goes).
        """
        mask = np.zeros(self.size, dtype=bool)
        todo = [(self.root, state)]
        while todo:
            (children, _), at = todo.pop()
            for ch, child in children.items():
                nxt = dfa.step(at, ch)
                if nxt != DEAD:
                    mask[child[1]] = True
                    todo.append((child, nxt))
        return mask


class Automaton:
    """One compiled constraint: its DFA, and each visited state's mask (computed
    once)."""

    def __init__(self, dfa: DFA, vocabulary: Vocabulary, eos_token_ids):
        self.dfa, self.vocabulary = dfa, vocabulary
        self.eos = [t for t in eos_token_ids if t < vocabulary.size]
        self.masks: dict[int, np.ndarray] = {}

    def allowed(self, state: int) -> np.ndarray:
        if state not in self.masks:
            if state == DEAD:
                self.masks[state] = np.zeros(self.vocabulary.size, dtype=bool)
            else:
                mask = self.vocabulary.allowed(self.dfa, state)
                # the end, once the text is a whole match
                mask[self.eos] = self.dfa.accepting(state)
                self.masks[state] = mask
            # shared by every sequence at this state
            self.masks[state].flags.writeable = False
        return self.masks[state]


class Constraint:
    """One sequence's place in an automaton: the tokens it may take next (allowed), the
    token it took (advance: the token's text walked through the DFA), a copy (fork)."""

    def __init__(self, automaton: Automaton, texts: list[str | None], state: int):
        self.automaton, self.texts, self.state = automaton, texts, state

    def allowed(self) -> np.ndarray:
        return self.automaton.allowed(self.state)

    def advance(self, token: int) -> None:
        text = self.texts[token] if 0 <= token < len(self.texts) else None
        # an end-of-sequence token (or a special one): done
        if self.state == DEAD or text is None:
            self.state = DEAD
            return
        self.state = self.automaton.dfa.walk(self.state, text)

    def fork(self) -> Constraint:
        return Constraint(self.automaton, self.texts, self.state)

    @property
    def accepting(self) -> bool:
        return self.automaton.dfa.accepting(self.state)


class Automata:
    """The structured-output backend
    (EngineConfig.structured_outputs_backend="automata"): the vocabulary's texts and
    trie, built once; one Automaton per distinct constraint (cached).
    """

    name = "automata"

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids=()):
        self.texts = token_texts(tokenizer, vocab_size)
        self.vocabulary = Vocabulary(self.texts)
        self.eos_token_ids = sorted(eos_token_ids)
        self.cache: dict[str, Automaton] = {}

    def compile(self, spec) -> Constraint:
        """A fresh Constraint at the start of `spec`'s automaton (ValueError: a bad
        pattern or schema)."""
        key = spec.key()
        if key not in self.cache:
            pattern = regex_of(spec)
            try:
                dfa = compile_regex(pattern)
            except ValueError as error:
                field = (
                    "regex"
                    if spec.regex is not None
                    else "json"
                    if spec.json is not None
                    else "choice"
                )
                raise ValueError(f"structured_outputs.{field}: {error}") from None
            self.cache[key] = Automaton(dfa, self.vocabulary, self.eos_token_ids)
        automaton = self.cache[key]
        return Constraint(automaton, self.texts, automaton.dfa.start)


__all__ = [
    "Automata",
    "Automaton",
    "Constraint",
    "Vocabulary",
    "compile_regex",
    "regex_of",
    "schema_to_regex",
    "token_texts",
    "DEAD",
]
