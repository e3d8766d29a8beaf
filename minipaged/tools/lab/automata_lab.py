"""Lab 14, the subset construction (meeting 16): the properties that grade a
participant's `closure` and `move`, the step that turns a set of NFA states and a
character into the next set, on the NFAs the engine's Thompson construction builds; the
DFA run by their step is held to Python's re on random strings of random small patterns;
then the model answers under regex and choice constraints compiled with their step,
token for token as under the engine's own.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from minipaged.sampling import SamplingParams, StructuredOutputsParams
from minipaged.structured import Automata, Automaton, regex_of
from minipaged.structured.regex import (
    DEAD,
    DFA,
    UNBOUNDED,
    closure,
    compile_regex,
    move,
)
from minipaged.tools.lab.grading import Failed, Property, in_one_line, time_limit
from minipaged.tools.viz import BarChart


def solution() -> dict:
    return {"closure": closure, "move": move}


class Subsets(DFA):
    """The engine's DFA over the NFA of `compiled`, each new state found by the
    participant's closure and move (`pieces`), as the engine's finds its own: lazily,
    the first time a character leads there. A set of NFA states is a DFA state by its
    tuple, so the tuple closure gives names it."""

    def __init__(self, compiled: DFA, pieces):
        self.nfa, self.pattern, self.budget = compiled.nfa, compiled.pattern, UNBOUNDED
        self.pieces = pieces
        self.sets: list[tuple[int, ...]] = []
        self.finals = bytearray()
        self.ids: dict[tuple[int, ...], int] = {}
        self.moves: list[dict[str, int]] = []
        self.index: list = []
        self.start = self.number(self.closure([self.nfa.start]))

    def closure(self, states) -> tuple[int, ...]:
        found = self.pieces.closure(self.nfa, list(states))
        if not isinstance(found, tuple):
            raise ValueError(
                f"closure returned {type(found).__name__} {found!r:.60}, not a tuple"
            )
        return found

    def step(self, state: int, ch: str) -> int:
        if state == DEAD:
            return DEAD
        moves = self.moves[state]
        nxt = moves.get(ch)
        if nxt is None:
            targets = self.pieces.move(self.nfa, self.sets[state], ch)
            nxt = moves[ch] = self.number(self.closure(sorted(targets)))
        return nxt


# ---- what a failure says: a set of states, a state's moves ---------------------------


def shown(states) -> str:
    return "{" + ", ".join(str(s) for s in sorted(states)) + "}"


def class_text(ranges) -> str:
    """A Ranges as a short character class: [a-c], [x], [^a] for almost everything."""
    pairs = ranges.pairs()
    if len(pairs) > 3:
        left_out = ranges.complement().pairs()[:3]
        return "[^" + "".join(range_text(lo, hi) for lo, hi in left_out) + "...]"
    return "[" + "".join(range_text(lo, hi) for lo, hi in pairs) + "]"


def range_text(lo: int, hi: int) -> str:
    def char(c: int) -> str:
        return chr(c) if 32 < c < 127 else f"\\u{c:04x}"

    if lo == hi:
        return char(lo)
    return f"{char(lo)}-{char(hi)}"


def moves_text(nfa, states) -> str:
    """The moves of `states`, as the failure shows them: '3 -> 4 on [a-c]; 4 -> 6
    (empty)'."""
    words = []
    for s in sorted(states):
        words += [f"{s} -> {t} (empty)" for t in nfa.eps_of(s)]
        words += [f"{s} -> {t} on {class_text(r)}" for r, t in nfa.chars_of(s)]
    return "; ".join(words[:12]) or "no moves"


# ---- closure and move, state by state, on small patterns -----------------------------

# empty moves in a row, alternatives, loops of empty moves ((?:a|)* goes round without
# reading), counted repeats
CLOSURE_PATTERNS = ["ab", "a*b", "(?:a|b?)*c", "(?:ab|a|)+", "a{2,3}(?:b|c)?", "(a|)*"]
# ranges: their ends, one character, almost everything
MOVE_PATTERNS = ["[a-c]x", "[b-d]|a", "[^b]c", "a.c", "\\d[0-3]", "[ace-g]+"]
MOVE_CHARS = "abcdefgx0239\n"


def expect_closure(m, pattern: str) -> None:
    nfa = compile_regex(pattern).nfa
    for s in range(nfa.n):
        got = m.closure(nfa, [s])
        want = closure(nfa, [s])
        if set(got) != set(want):
            missing = set(want) - set(got)
            extra = set(got) - set(want)
            said = []
            if missing:
                said.append(f"missing {shown(missing)}")
            if extra:
                said.append(f"with {shown(extra)} too, not reachable reading nothing")
            raise Failed(
                f"the NFA of {pattern!r} ({nfa.n} states)",
                f"closure(nfa, [{s}]) gave {shown(got)}, expected {shown(want)}:"
                f" {', '.join(said)} (the moves: {moves_text(nfa, want)})",
            )


def closure_reaches_everything(m) -> None:
    for pattern in CLOSURE_PATTERNS:
        expect_closure(m, pattern)


def closure_is_one_tuple(m) -> None:
    for pattern in CLOSURE_PATTERNS:
        nfa = compile_regex(pattern).nfa
        # starts given out of order, as a set's order may give them
        for starts in ([0], [nfa.n - 1, 0], list(range(nfa.n))[::-1]):
            got = m.closure(nfa, list(starts))
            want = closure(nfa, starts)
            given = f"the NFA of {pattern!r}"
            if not isinstance(got, tuple):
                raise Failed(
                    given,
                    f"closure(nfa, {starts}) gave a {type(got).__name__}, {got!r:.60}:"
                    " a DFA state is named by its set as a tuple (a list or a set"
                    " cannot be a dict key), sorted",
                )
            if got != want and sorted(set(got)) == list(want):
                raise Failed(
                    given,
                    f"closure(nfa, {starts}) gave {got}, expected {want}: the same set"
                    " written in another order, or with a state twice, would be"
                    " another DFA state",
                )
            if got != want:
                raise Failed(
                    given, f"closure(nfa, {starts}) gave {got}, expected {want}"
                )


def move_reads_the_ranges(m) -> None:
    for pattern in MOVE_PATTERNS:
        nfa = compile_regex(pattern).nfa
        for s in range(nfa.n):
            for ch in MOVE_CHARS:
                expect_move(m, pattern, nfa, [s], ch)
        everything = list(range(nfa.n))
        for ch in MOVE_CHARS:
            expect_move(m, pattern, nfa, everything, ch)


def expect_move(m, pattern: str, nfa, states: list[int], ch: str) -> None:
    got = m.move(nfa, list(states), ch)
    want = move(nfa, states, ch)
    if not isinstance(got, (set, frozenset, list, tuple)) or set(got) != want:
        if len(states) > 3:
            named = f"[0, ..., {nfa.n - 1}]"
        else:
            named = str(states)
        raise Failed(
            f"the NFA of {pattern!r}",
            f"move(nfa, {named}, {ch!r}) gave {got!r:.60}, expected {shown(want)}"
            f" (the moves: {moves_text(nfa, states)}; {ch!r} is code point"
            f" {ord(ch)})",
        )


# ---- random small patterns, held to Python's re --------------------------------------

ALPHABET = "abcd"
ATOMS = ["a", "b", "c", "[ab]", "[a-c]", "[b-d]", "[^a]", "."]


def random_tree(rng: random.Random, depth: int = 0):
    """A small pattern as a tree: ("atom", text), ("cat", [..]), ("alt", [..]),
    ("rep", node, low, high) with high None for no bound."""
    roll = rng.random()
    if depth >= 3 or roll < 0.35:
        return ("atom", rng.choice(ATOMS))
    if roll < 0.6:
        return ("cat", [random_tree(rng, depth + 1) for _ in range(rng.randint(2, 3))])
    if roll < 0.8:
        options = [random_tree(rng, depth + 1) for _ in range(rng.randint(2, 3))]
        if rng.random() < 0.3:
            options.append(("cat", []))  # an empty alternative
        return ("alt", options)
    low, high = rng.choice([(0, None), (1, None), (0, 1), (1, 2), (2, 2), (0, 2)])
    return ("rep", random_tree(rng, depth + 1), low, high)


def pattern_of(tree) -> str:
    kind = tree[0]
    if kind == "atom":
        return tree[1]
    if kind == "cat":
        return "".join(pattern_of(t) for t in tree[1])
    if kind == "alt":
        return "(?:" + "|".join(pattern_of(t) for t in tree[1]) + ")"
    _, inner, low, high = tree
    counts = {(0, None): "*", (1, None): "+", (0, 1): "?"}
    count = counts.get((low, high), f"{{{low},{high}}}")
    return f"(?:{pattern_of(inner)}){count}"


def drawn(rng: random.Random, tree) -> str:
    """A random text the tree matches."""
    kind = tree[0]
    if kind == "atom":
        return rng.choice([c for c in ALPHABET if re.fullmatch(tree[1], c)])
    if kind == "cat":
        return "".join(drawn(rng, t) for t in tree[1])
    if kind == "alt":
        return drawn(rng, rng.choice(tree[1]))
    _, inner, low, high = tree
    count = rng.randint(low, 3 if high is None else high)
    return "".join(drawn(rng, inner) for _ in range(count))


def random_cases(count: int = 60, seed: int = 16):
    """(pattern, tree, texts): random patterns, each with random strings over ALPHABET
    and texts it matches."""
    rng = random.Random(seed)
    for _ in range(count):
        tree = random_tree(rng)
        texts = ["".join(rng.choices(ALPHABET, k=rng.randint(0, 6))) for _ in range(30)]
        texts += [drawn(rng, tree) for _ in range(10)]
        yield pattern_of(tree), tree, texts


def fullmatches_as_re(m) -> None:
    for pattern, _, texts in random_cases():
        theirs = Subsets(compile_regex(pattern), m)
        for text in texts:
            got = theirs.fullmatch(text)
            want = re.fullmatch(pattern, text) is not None
            if got != want:
                raise Failed(
                    f"the pattern {pattern!r}, the text {text!r}",
                    f"your DFA says {'a match' if got else 'no match'}, Python's"
                    f" re.fullmatch says {'a match' if want else 'no match'}",
                )


def live_exactly_on_prefixes(m) -> None:
    for pattern, _, texts in random_cases():
        compiled = compile_regex(pattern)
        theirs = Subsets(compiled, m)
        for text in texts:
            matched = re.fullmatch(pattern, text) is not None
            for end in range(len(text) + 1):
                prefix = text[:end]
                got = theirs.walk(theirs.start, prefix) != DEAD
                want = compiled.walk(compiled.start, prefix) != DEAD
                if matched and not got:
                    raise Failed(
                        f"the pattern {pattern!r}, the text {prefix!r}",
                        f"your DFA is dead after {prefix!r}, yet {text!r} matches"
                        " (Python's re.fullmatch): a prefix of a match must stay live",
                    )
                if got != want:
                    raise Failed(
                        f"the pattern {pattern!r}, the text {prefix!r}",
                        f"your DFA is {'live' if got else 'dead'} after it, the"
                        f" engine's is {'live' if want else 'dead'}: a text is live"
                        " exactly when some match starts with it",
                    )


def one_state_per_set(m) -> None:
    for pattern, _, texts in random_cases():
        compiled = compile_regex(pattern)
        theirs = Subsets(compiled, m)
        ours = Subsets(compiled, DFA_PIECES)
        for text in texts:
            theirs.walk(theirs.start, text)
            ours.walk(ours.start, text)
        if len(theirs.sets) != len(ours.sets):
            raise Failed(
                f"the pattern {pattern!r}, {len(texts)} texts walked",
                f"your DFA found {len(theirs.sets)} states, the engine's"
                f" {len(ours.sets)} on the same texts: one set of NFA states must be"
                " one DFA state, whatever the order its states were found in",
            )


class Engine:
    """The engine's closure and move, as a participant's module holds them."""

    closure = staticmethod(closure)
    move = staticmethod(move)


DFA_PIECES = Engine()

CLOSURE = (
    "closure holds the states it starts from and every state reachable from them by"
    " empty moves, however many in a row"
)
ONE_TUPLE = (
    "closure gives each set of states one way: a sorted tuple, no state twice (one"
    " set, one DFA state)"
)
MOVE = (
    "move takes every character move whose ranges hold the character, both ends"
    " included, and nothing else"
)
FULLMATCH = (
    "the DFA stepped by your closure and move fullmatches what Python's re"
    " fullmatches, on random strings of 60 random small patterns"
)
PREFIX = (
    "a text leaves the DFA live exactly when a match starts with it: every prefix of a"
    " match is live, and the rest die where the engine's DFA dies"
)
STATES = (
    "the DFA finds as many states as the engine's on the same texts: one set of NFA"
    " states is one DFA state"
)

PROPERTIES = [
    Property(CLOSURE, closure_reaches_everything, "small NFAs: a*b, (a|)* ..."),
    Property(ONE_TUPLE, closure_is_one_tuple, "small NFAs, starts out of order"),
    Property(MOVE, move_reads_the_ranges, "NFAs of character classes"),
    Property(FULLMATCH, fullmatches_as_re, "random patterns over abcd"),
    Property(PREFIX, live_exactly_on_prefixes, "random patterns over abcd"),
    Property(STATES, one_state_per_set, "random patterns over abcd"),
]


# ---- the model answers under constraints compiled with their step --------------------


class TheirAutomata(Automata):
    """The engine's structured-output backend, each automaton stepped by the
    participant's closure and move: the engine's own build checks the constraint and
    says what is wrong with it, then a Subsets over the same NFA serves it."""

    name = "automata, your closure and move"

    def __init__(self, pieces, tokenizer, vocab_size: int, eos_token_ids=()):
        super().__init__(tokenizer, vocab_size, eos_token_ids)
        # not `pieces`: the backend's own pieces are the tokens' bytes
        self.theirs = pieces

    def build(self, spec, courteous=False) -> Automaton:
        engine_built = super().build(spec, courteous)
        dfa = Subsets(engine_built.dfa, self.theirs)
        automaton = Automaton(dfa, self.vocabulary, self.eos_token_ids, self.masks)
        if not self.vocabulary.splits:
            automaton.explore(UNBOUNDED)
        return automaton


ENGINE = dict(block_size=16, num_blocks=64, max_num_seqs=4)
# (question, its constraint): written with the lab's words, which every model the
# check serves can spell (the small random one has only those)
ASKED = [
    ("What does fork copy ?", dict(choice=["page", "table", "frames"])),
    ("What is a page table ?", dict(regex="[a-f][a-z]{2,5}")),
    ("Why do frames have a fixed size ?", dict(regex="(fixed|size|frames)[.?]")),
    ("What is a page table ?", dict(regex="(page|table|one){1,3}\\.")),
]


def answers(engine) -> dict[str, list[int]]:
    """Each question, greedy under its constraint: request id -> its tokens."""
    for i, (question, constraint) in enumerate(ASKED):
        params = SamplingParams(
            temperature=0,
            max_tokens=24,
            structured_outputs=StructuredOutputsParams(**constraint),
        )
        engine.add_request(f"r{i}", question, params)
    done = {}
    for _ in range(400):
        if not engine.has_unfinished_requests():
            break
        for output in engine.step().finished:
            done[output.request_id] = list(output.outputs[0].token_ids)
    return done


def spelled(backend: Automata, tokens: list[int]) -> str:
    """The text the tokens write, as the automaton read it (the end token writes
    nothing)."""
    data = b"".join(backend.pieces[t] for t in tokens if t not in backend.eos_token_ids)
    return data.decode("utf-8", errors="replace")


def serve_lab14(pieces, llm, pictures: Path) -> list[str]:
    """The questions answered greedily under their constraints, on an engine whose
    automata step by the participant's closure and move and on the engine's own: the
    same tokens, each answer a whole match for Python's re; then the DFA states each
    constraint needed."""
    ours = llm.new_engine(**ENGINE)
    vocab_size = ours.model.config.vocab_size
    backend = TheirAutomata(pieces, ours.tokenizer, vocab_size, ours.eos_token_ids)
    try:
        with time_limit(300):
            theirs = answers(
                llm.new_engine(**ENGINE, structured_outputs_backend=backend)
            )
    except Exception as error:
        raise RuntimeError(
            f"the engine with your closure and move failed: {in_one_line(error)}"
        ) from None
    built_in = answers(ours)
    lines = []
    for i, (question, constraint) in enumerate(ASKED):
        request_id = f"r{i}"
        tokens = theirs.get(request_id, [])
        if tokens != built_in[request_id]:
            raise RuntimeError(
                f"request {request_id} ({question!r}): with your closure and move the"
                f" engine gave tokens {tokens}, with its own {built_in[request_id]}"
            )
        pattern = regex_of(StructuredOutputsParams(**constraint))
        text = spelled(backend, tokens)
        if re.fullmatch(pattern, text) is None:
            raise RuntimeError(
                f"request {request_id} ({question!r}): the answer {text!r} is not a"
                f" whole match of {pattern!r} (Python's re.fullmatch)"
            )
        kind, value = next(iter(constraint.items()))
        lines.append(
            f"  {request_id} {kind} {value!r}: {text!r}, the same {len(tokens)}"
            " tokens as the engine's own, a whole match for Python's re"
        )
    found = {}
    for automaton in backend.cache.values():
        found[automaton.dfa.pattern] = len(automaton.dfa.sets)
    labels = [label[:28] for label in found]
    chart = BarChart(
        "DFA states your subset construction found, per constraint",
        labels,
        {"states": list(found.values())},
        unit=" states",
        digits=0,
    )
    pictures.mkdir(parents=True, exist_ok=True)
    path = pictures / "lab14_states.svg"
    path.write_text(chart.svg())
    return lines + ["", str(chart), f"picture: {path}"]
