"""Automata for structured output (meeting 16): a request's regex, JSON schema or choice
is compiled into a DFA over characters (regex.py, schema.py); the vocabulary, as a trie
of token bytes, is walked from each state once to find the tokens that keep the text a
prefix of a match: that is the state's mask, and a sequence's Constraint is where it
stands. Tokens are bytes, so a character whose UTF-8 bytes are split across tokens (an
emoji, most CJK) is read a byte at a time; the automaton only reads characters the
vocabulary can write, so every token a mask allows leaves a way to a whole match.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import OrderedDict

import numpy as np

from minipaged.structured.regex import (
    DEAD,
    DFA,
    MAX_STATES,
    UNBOUNDED,
    WRITABLE,
    Budget,
    Ranges,
    compile_regex,
)
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
        except (ValueError, RecursionError) as error:
            raise ValueError(f"structured_outputs.json is not JSON: {error}") from None
    try:
        return schema_to_regex(schema)
    except ValueError as error:
        raise ValueError(f"structured_outputs.json: {error}") from None


def field_of(spec) -> str:
    """The StructuredOutputsParams field that holds the constraint."""
    for name in ("regex", "json", "choice"):
        if getattr(spec, name) is not None:
            return name
    return "json_object"


def key_of(spec) -> str:
    """The cache's name for a constraint (a ValueError if it nests past what JSON can
    write)."""
    try:
        return spec.key()
    except RecursionError:
        raise ValueError(
            f"structured_outputs.{field_of(spec)}: it nests too deeply to compile"
        ) from None


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


def token_bytes(
    tokenizer, vocab_size: int, budget: Budget = UNBOUNDED
) -> list[bytes | None]:
    """The bytes each token id adds to an answer; None for a special token or an id
    past the tokenizer's vocabulary. A byte-level token may hold part of a character
    (its UTF-8 bytes split across tokens); SentencePiece's byte fallback `<0xNN>` is its
    one byte."""
    hf = tokenizer.hf
    special = {t.content for t in hf.get_added_tokens_decoder().values() if t.special}
    decoder = byte_decoder()
    # GPT-2's alphabet
    byte_level = "ByteLevel" in json.dumps(json.loads(hf.to_str()).get("decoder"))
    pieces: list[bytes | None] = []
    size = hf.get_vocab_size()
    for i in range(vocab_size):
        budget.tick()
        piece = hf.id_to_token(i) if i < size else None
        if piece is None or piece in special or not piece:
            pieces.append(None)
        elif byte_level and all(c in decoder for c in piece):
            pieces.append(bytes(decoder[c] for c in piece))
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                pieces.append(bytes([int(piece[3:5], 16)]))
            except ValueError:
                pieces.append(piece.encode())
        else:  # SentencePiece and word-level vocabularies: "▁" is the space
            pieces.append(piece.replace("▁", " ").encode())
    return pieces


def text_of(piece: bytes | None) -> str | None:
    """A token's text if its bytes are whole characters, else None."""
    try:
        return None if piece is None else piece.decode("utf-8")
    except UnicodeDecodeError:
        return None


def token_texts(tokenizer, vocab_size: int) -> list[str | None]:
    """The text each token id adds, where it is whole characters; None for a special
    token, an id past the vocabulary, or a piece of a multi-byte character."""
    return [text_of(piece) for piece in token_bytes(tokenizer, vocab_size)]


# UTF-8: the code points a character of n bytes may have, by its first byte
LEADS = {2: (0xC2, 0xDF, 0x1F, 0x80), 3: (0xE0, 0xEF, 0x0F, 0x800)}
LEADS[4] = (0xF0, 0xF4, 0x07, 0x10000)
CONTINUATION = range(0x80, 0xC0)
# token-level states Automaton.explore may visit
MAX_EXPLORED = 50_000
SERIALS = itertools.count()  # each automaton's number


def utf8_length(lead: int) -> int:
    """How many bytes a character starting with `lead` has (0: not a first byte)."""
    for n, (lo, hi, _, _) in LEADS.items():
        if lo <= lead <= hi:
            return n
    return 1 if lead < 0x80 else 0


def prefix_range(prefix: bytes) -> tuple[int, int]:
    """The code points whose UTF-8 starts with `prefix` (an incomplete character),
    as [lo, hi]; lo > hi when none does (an overlong or out-of-range start)."""
    n = utf8_length(prefix[0])
    _, _, mask, least = LEADS[n]
    value = prefix[0] & mask
    for b in prefix[1:]:
        value = value << 6 | (b & 0x3F)
    free = 6 * (n - len(prefix))
    lo, hi = value << free, (value << free) | ((1 << free) - 1)
    return max(lo, least), min(hi, 0x10FFFF)


class Vocabulary:
    """The tokens' bytes as a trie, node 0 its root: `children[node]` {byte: node},
    `tokens[node]` the token ids that end there (flat: nothing for the garbage collector
    to walk). And what the vocabulary can write: `alphabet`, the characters it spells
    with tokens inside the character (every character whose bytes are single-byte
    tokens, and those a token or two spell whole), and `splits`, whether a token may end
    inside a character (every continuation byte is a token, so the rest can always
    follow)."""

    def __init__(self, pieces: list[bytes | None], budget: Budget = UNBOUNDED):
        children: list[dict[int, int]] = [{}]
        ending: dict[int, list[int]] = {}
        for token, piece in enumerate(pieces):
            budget.tick()
            if piece:
                node = 0
                for b in piece:
                    nxt = children[node].get(b)
                    if nxt is None:
                        nxt = children[node][b] = len(children)
                        children.append({})
                    node = nxt
                ending.setdefault(node, []).append(token)
        self.children, self.tokens = children, []
        for i in range(len(children)):
            budget.tick()
            self.tokens.append(tuple(ending.get(i, ())))
        self.size = len(pieces)
        singles = {p[0] for p in pieces if p is not None and len(p) == 1}
        self.splits = all(b in singles for b in CONTINUATION)
        self.alphabet = self._alphabet(pieces, singles, budget)

    def _alphabet(self, pieces, singles: set[int], budget: Budget) -> Ranges:
        """Where every continuation byte is a token (`splits`): the characters whose
        bytes are all tokens, and those that tokens spell whole. Elsewhere (a word-level
        vocabulary): every character some token holds (which of them can be finished is
        then found by exploring, Automaton.explore)."""
        known = set()
        for piece in pieces:
            budget.tick()
            if piece:
                known.update(piece.decode("utf-8", errors="ignore"))
        if not self.splits:
            return Ranges((ord(c), ord(c)) for c in known) & WRITABLE
        ranges = [(b, b) for b in singles if b < 0x80]
        for first, last, _, _ in LEADS.values():
            ranges += [
                prefix_range(bytes([lead]))
                for lead in range(first, last + 1)
                if lead in singles
            ]
        whole = {p for p in pieces if p}
        have = Ranges(ranges)
        for ch in known:
            if ord(ch) not in have and spelled(ch.encode(), whole):
                ranges.append((ord(ch), ord(ch)))
        return Ranges(ranges) & WRITABLE

    def walk(self, automaton: Automaton, state: int, budget: Budget = UNBOUNDED):
        """Every (tokens, state after them) of tokens whose bytes, read from `state`,
        leave the automaton alive (and, if tokens may not end inside a character, at a
        character's end): a depth-first walk of the trie that stops at the first byte
        refused (the whole subtree goes)."""
        found: list[tuple[tuple[int, ...], int]] = []
        todo = [(0, state)]
        step, moves, states = automaton.step, automaton.moves, automaton.states
        children, tokens, splits = self.children, self.tokens, self.splits
        tick = None if budget is UNBOUNDED else budget.tick
        while todo:
            node, at = todo.pop()
            below = children[node]
            if tick is not None:
                tick(len(below))
            known = moves[at]
            for b, child in below.items():
                nxt = known.get(b)
                if nxt is None:
                    nxt = step(at, b)
                if nxt != DEAD:
                    if tokens[child] and (splits or not states[nxt][1]):
                        found.append((tokens[child], nxt))
                    todo.append((child, nxt))
        return found

    def allowed(
        self, automaton: Automaton, state: int, budget: Budget = UNBOUNDED
    ) -> np.ndarray:
        """The tokens of `walk` that lead to a state a match can still be finished from
        (every one, unless the automaton was explored: Automaton.live)."""
        live = automaton.live
        allowed = [
            t
            for tokens, nxt in self.walk(automaton, state, budget)
            if live is None or nxt in live
            for t in tokens
        ]
        mask = np.zeros(self.size, dtype=bool)
        mask[allowed] = True
        return mask


def spelled(data: bytes, whole: set[bytes]) -> bool:
    """Can tokens (`whole`, their bytes) spell `data` exactly, one after another?"""
    ends = {0}
    for i in range(1, len(data) + 1):
        if any(j in ends and data[j:i] in whole for j in range(i)):
            ends.add(i)
    return len(data) in ends


class Automaton:
    """One compiled constraint over bytes: a state is (a DFA state, the bytes read of a
    character not yet whole), numbered as found; `step(state, byte)` is computed once.
    Masks are kept in the backend's bounded `masks` (computed again if dropped)."""

    def __init__(self, dfa: DFA, vocabulary: Vocabulary, eos_token_ids, cache=None):
        self.dfa, self.vocabulary = dfa, vocabulary
        self.eos = [t for t in eos_token_ids if t < vocabulary.size]
        self.cache = cache if cache is not None else MaskCache()
        self.serial = next(SERIALS)  # its masks' name in the cache
        self.states: list[tuple[int, bytes]] = []
        self.ids: dict[tuple[int, bytes], int] = {}
        self.moves: list[dict[int, int]] = []
        self.start = self.number(dfa.start, b"")
        # the states a match can be finished from, where not every one can (explore)
        self.live: set[int] | None = None

    def number(self, at: int, prefix: bytes) -> int:
        if at == DEAD:
            return DEAD
        key = (at, prefix)
        if key not in self.ids:
            self.ids[key] = len(self.states)
            self.states.append(key)
            self.moves.append({})
        return self.ids[key]

    def step(self, state: int, b: int) -> int:
        """The state after one more byte (DEAD: no match starts this way)."""
        if state == DEAD:
            return DEAD
        moves = self.moves[state]
        nxt = moves.get(b)
        if nxt is None:
            nxt = moves[b] = self._step(state, b)
        return nxt

    def _step(self, state: int, b: int) -> int:
        at, prefix = self.states[state]
        data = prefix + bytes([b])
        n = utf8_length(data[0])
        if n == 0 or (prefix and b not in CONTINUATION):
            return DEAD
        if len(data) == n:
            try:
                ch = data.decode("utf-8")
            except UnicodeDecodeError:  # overlong, or a surrogate
                return DEAD
            return self.number(self.dfa.step(at, ch), b"")
        lo, hi = prefix_range(data)
        if lo > hi or not self.dfa.overlaps(at, lo, hi):
            return DEAD
        return self.number(at, data)

    def explore(self, budget: Budget, limit: int = MAX_EXPLORED) -> None:
        """Find the states a match can be finished from, by tokens: every state tokens
        lead to from the start, then back from the whole matches (a vocabulary that
        does not write every character on its own can leave a text alive that no token
        finishes: a word-level one, 'q' only inside 'qu'). Bounded: past `limit` states
        a ValueError."""
        after: dict[int, set[int]] = {}
        todo, seen = [self.start], {self.start}
        while todo:
            state = todo.pop()
            after[state] = {nxt for _, nxt in self.vocabulary.walk(self, state, budget)}
            for nxt in after[state] - seen:
                seen.add(nxt)
                todo.append(nxt)
            if len(seen) > limit:
                raise ValueError(
                    f"its automaton has more than {limit} states over this model's"
                    " tokens, too many to check which can be finished (the vocabulary"
                    " does not spell every character on its own): write a smaller"
                    " pattern"
                )
        before: dict[int, list[int]] = {}
        for state, nexts in after.items():
            for nxt in nexts:
                before.setdefault(nxt, []).append(state)
        live = {s for s in seen if self.accepting(s)}
        todo = list(live)
        while todo:
            for state in before.get(todo.pop(), ()):
                if state not in live:
                    live.add(state)
                    todo.append(state)
        self.live = live

    def walk(self, state: int, data: bytes) -> int:
        for b in data:
            state = self.step(state, b)
            if state == DEAD:
                break
        return state

    def accepting(self, state: int) -> bool:
        if state == DEAD:
            return False
        at, prefix = self.states[state]
        return not prefix and self.dfa.accepting(at)

    def allowed(self, state: int, budget: Budget = UNBOUNDED) -> np.ndarray:
        mask = self.cache.get(self, state)
        if mask is None:
            if state == DEAD:
                mask = np.zeros(self.vocabulary.size, dtype=bool)
            else:
                mask = self.vocabulary.allowed(self, state, budget)
                # the end, once the text is a whole match
                mask[self.eos] = self.accepting(state)
            # shared by every sequence at this state
            mask.flags.writeable = False
            self.cache.put(self, state, mask)
        return mask

    @property
    def masks(self) -> dict[int, np.ndarray]:
        """Its states' masks still in the cache, by state."""
        return self.cache.of(self)

    @property
    def size(self) -> int:
        """Its states: the NFA's, the DFA's and the byte-level ones."""
        return self.dfa.size + len(self.states)


class MaskCache:
    """The masks of every automaton of a backend, least recently used dropped past
    `limit` (a mask is a vocabulary's worth of bools: 49 KB for SmolLM2); shared by the
    engine thread and the server's compiling thread, so locked."""

    def __init__(self, limit: int = 512):
        self.limit, self.lock = limit, threading.Lock()
        self.masks: OrderedDict = OrderedDict()

    def get(self, automaton: Automaton, state: int):
        key = (automaton.serial, state)
        with self.lock:
            mask = self.masks.get(key)
            if mask is not None:
                self.masks.move_to_end(key)
            return mask

    def put(self, automaton: Automaton, state: int, mask: np.ndarray) -> None:
        with self.lock:
            self.masks[(automaton.serial, state)] = mask
            while len(self.masks) > self.limit:
                self.masks.popitem(last=False)

    def of(self, automaton: Automaton) -> dict[int, np.ndarray]:
        """An automaton's masks in the cache, by state."""
        with self.lock:
            return {
                state: mask
                for (serial, state), mask in self.masks.items()
                if serial == automaton.serial
            }

    def forget(self, automaton: Automaton) -> None:
        """Drop an automaton's masks (it left the cache of automata)."""
        with self.lock:
            for key in [k for k in self.masks if k[0] == automaton.serial]:
                del self.masks[key]

    def __len__(self) -> int:
        return len(self.masks)


class Constraint:
    """One sequence's place in an automaton: the tokens it may take next (allowed), the
    token it took (advance: the token's bytes walked through it), a copy (fork)."""

    def __init__(self, automaton: Automaton, pieces: list[bytes | None], state: int):
        self.automaton, self.pieces, self.state = automaton, pieces, state

    def allowed(self) -> np.ndarray:
        return self.automaton.allowed(self.state)

    def advance(self, token: int) -> None:
        piece = self.pieces[token] if 0 <= token < len(self.pieces) else None
        # an end-of-sequence token (or a special one): done
        if self.state == DEAD or piece is None:
            self.state = DEAD
            return
        self.state = self.automaton.walk(self.state, piece)

    def fork(self) -> Constraint:
        return Constraint(self.automaton, self.pieces, self.state)

    @property
    def accepting(self) -> bool:
        return self.automaton.accepting(self.state)


class Automata:
    """The structured-output backend
    (EngineConfig.structured_outputs_backend="automata"): the vocabulary's bytes and
    trie, built once (at the first compile); one Automaton per distinct constraint, kept
    in a cache of at most `max_cached` automata and `max_cached_states` states (least
    recently used dropped first, never one held). Compiling one stops past `max_states`
    NFA states or `max_seconds` of CPU time (a ValueError naming the field).
    Thread-safe: the server compiles on a worker thread (`hold`, which pauses now and
    then while the engine is busy, so that it keeps its pace) while the engine's thread
    reads masks.
    """

    name = "automata"
    max_states = MAX_STATES
    max_seconds: float | None = 5.0
    max_cached = 64
    max_cached_states = 1_000_000

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids=()):
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.cache: OrderedDict[str, Automaton] = OrderedDict()
        self.held: dict[str, int] = {}  # key -> holds not yet let go
        self.masks = MaskCache()
        self.lock, self.building = threading.Lock(), threading.Lock()
        self._vocabulary: Vocabulary | None = None

    def prepare(self, budget: Budget = UNBOUNDED) -> Vocabulary:
        """The vocabulary's bytes, texts and trie, built by the first caller."""
        with self.building:
            if self._vocabulary is None:
                self.pieces = token_bytes(self.tokenizer, self.vocab_size, budget)
                self.texts = [text_of(piece) for piece in self.pieces]
                self._vocabulary = Vocabulary(self.pieces, budget)
        return self._vocabulary

    @property
    def vocabulary(self) -> Vocabulary:
        return self._vocabulary or self.prepare()

    def __getattr__(self, name: str):
        if name in ("pieces", "texts"):  # built with the vocabulary
            self.prepare()
            return self.__dict__[name]
        raise AttributeError(name)

    def compile(self, spec) -> Constraint:
        """A fresh Constraint at the start of `spec`'s automaton (ValueError: a bad
        pattern or schema, one the vocabulary cannot write, or one past the budget)."""
        automaton = self.automaton(spec)
        return Constraint(automaton, self.pieces, automaton.start)

    def hold(self, spec, busy=None):
        """Compile `spec` courteously (`busy()`: is the engine busy now? None: assume
        so) and keep its automaton cached until the returned function is called: the
        server compiles on its own thread, then the engine's add_request finds it here,
        however many others were compiled meanwhile."""
        key = key_of(spec)
        self.automaton(spec, hold=True, courteous=busy or True)
        released = False

        def release() -> None:
            nonlocal released
            with self.lock:
                if not released and key in self.held:
                    released = True
                    self.held[key] -= 1
                    if not self.held[key]:
                        del self.held[key]
                    self._evict()

        return release

    def automaton(self, spec, hold: bool = False, courteous=False) -> Automaton:
        key = key_of(spec)
        with self.lock:
            automaton = self.cache.get(key)
            if automaton is not None:
                self.cache.move_to_end(key)
                if hold:
                    self.held[key] = self.held.get(key, 0) + 1
                return automaton
        # unlocked: the engine's thread goes on
        automaton = self.build(spec, courteous)
        with self.lock:
            automaton = self.cache.setdefault(key, automaton)
            self.cache.move_to_end(key)
            if hold:
                self.held[key] = self.held.get(key, 0) + 1
            self._evict()
        return automaton

    def build(self, spec, courteous=False) -> Automaton:
        """A new automaton for `spec`, its start's mask computed (the costliest one, off
        the engine's thread when the server compiles), all within the budget; a
        `courteous` build pauses now and then for the engine's thread."""
        field = field_of(spec)
        vocabulary = self.prepare(Budget(courteous=courteous))
        budget = Budget(self.max_seconds, self.max_states, courteous)
        try:
            pattern = regex_of(spec)
            dfa = compile_regex(pattern, vocabulary.alphabet, budget)
            automaton = Automaton(dfa, vocabulary, self.eos_token_ids, self.masks)
            if not vocabulary.splits:
                automaton.explore(budget)
            if not automaton.allowed(automaton.start, budget).any():
                raise ValueError(
                    "no text that matches it can be written with this model's tokens"
                    " (and it is not already a whole match)"
                )
        except RecursionError:
            raise ValueError(
                f"structured_outputs.{field}: it nests too deeply to compile"
            ) from None
        except ValueError as error:
            message = str(error)
            if not message.startswith("structured_outputs."):
                message = f"structured_outputs.{field}: {message}"
            raise ValueError(message) from None
        dfa.budget = UNBOUNDED  # from now on it grows on the engine's thread
        return automaton

    def _evict(self) -> None:
        """Drop the least recently used automata not held while the cache is past its
        bounds (called with the lock held)."""
        for key in list(self.cache):
            if len(self.cache) <= self.max_cached and (
                self.cached_states() <= self.max_cached_states
            ):
                return
            if key not in self.held:
                self.masks.forget(self.cache.pop(key))

    def cached_states(self) -> int:
        """The states of every cached automaton (NFA, DFA and byte-level)."""
        return sum(a.size for a in self.cache.values())


__all__ = [
    "Automata",
    "Automaton",
    "Constraint",
    "Vocabulary",
    "compile_regex",
    "regex_of",
    "schema_to_regex",
    "token_bytes",
    "token_texts",
    "DEAD",
]
