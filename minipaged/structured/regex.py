"""Regular expressions as automata (Kleene 1956): a pattern is parsed, built into an NFA
by Thompson's construction (CACM 1968), and run as a DFA whose states are sets of NFA
states, each found the first time a character leads there (the subset construction, done
lazily).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEAD = -1  # the DFA state of a text that no match can start with
# {m,n} copies the repeated part: bounded, so a pattern cannot fill memory
MAX_REPEAT = 1000


@dataclass(frozen=True)
class Chars:
    """A set of characters: code point ranges [lo, hi], or everything but them
    (negated)."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False

    def __contains__(self, ch: str) -> bool:
        c = ord(ch)
        return any(lo <= c <= hi for lo, hi in self.ranges) != self.negated


def one(ch: str) -> Chars:
    return Chars(((ord(ch), ord(ch)),))


DIGIT, WORD = Chars(((48, 57),)), Chars(((48, 57), (65, 90), (95, 95), (97, 122)))
SPACE = Chars(((9, 13), (32, 32)))
CLASSES = {
    "d": DIGIT,
    "w": WORD,
    "s": SPACE,
    "D": Chars(DIGIT.ranges, True),
    "W": Chars(WORD.ranges, True),
    "S": Chars(SPACE.ranges, True),
}
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
ANY = Chars(((10, 10),), True)  # `.`: anything but a newline


# ---- the parser: pattern -> a tree of ("chars", Chars) ("cat", [..]) ("alt", [..])
# ("rep", x, m, n)


class Parser:
    """Recursive descent over the pattern: alternation, concatenation, repetition,
    atoms."""

    def __init__(self, pattern: str):
        self.p, self.i = pattern, 0

    def error(self, what: str) -> ValueError:
        return ValueError(f"{what} at character {self.i} of the pattern {self.p!r:.80}")

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < len(self.p) else None

    def take(self) -> str:
        if self.i >= len(self.p):
            raise self.error("the pattern ends too early")
        self.i += 1
        return self.p[self.i - 1]

    def parse(self):
        if self.p.startswith("^"):  # the whole text must match anyway
            self.i = 1
        tree = self.alternation()
        if self.i < len(self.p):
            raise self.error(f"unbalanced {self.p[self.i]!r}")
        return tree

    def alternation(self):
        options = [self.concatenation()]
        while self.peek() == "|":
            self.take()
            options.append(self.concatenation())
        return options[0] if len(options) == 1 else ("alt", options)

    def concatenation(self):
        parts = []
        while self.peek() not in (None, "|", ")"):
            if self.peek() == "$" and self.i == len(self.p) - 1:
                self.take()
                break
            parts.append(self.repetition())
        return ("cat", parts)

    def repetition(self):
        node = self.atom()
        while self.peek() in ("*", "+", "?", "{"):
            start = self.i
            op = self.take()
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(
                op, (None, None)
            )
            if op == "{":
                low, high = self.counts(start)
                # a "{" that is not a count is a literal, as in Python's re
                if low is None:
                    self.i = start
                    return ("cat", [node, self.literal()])
            if self.peek() in ("?", "+"):
                raise self.error(
                    "lazy and possessive quantifiers (*?, ++) are not supported"
                )
            node = ("rep", node, low, high)
        return node

    def counts(self, start: int):
        """{m}, {m,}, {m,n} after the "{"; (None, None) if it is not a count."""
        end = self.p.find("}", self.i)
        body = self.p[self.i : end] if end >= 0 else ""
        low, comma, high = body.partition(",")
        if not low.isdigit() or (high and not high.isdigit()):
            return None, None
        self.i = end + 1
        low, high = int(low), (int(high) if high else None) if comma else int(low)
        if high is not None and high < low or max(low, high or 0) > MAX_REPEAT:
            raise self.error(
                f"the count {{{body}}} is out of order or above {MAX_REPEAT}"
            )
        return low, high

    def atom(self):
        ch = self.peek()
        if ch == "(":
            self.take()
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.peek() == "?":
                raise self.error(
                    "lookarounds and named groups ((?=, (?!, (?P<...>) are not"
                    " supported"
                )
            inner = self.alternation()
            if self.peek() != ")":
                raise self.error("an unclosed '('")
            self.take()
            return inner
        if ch == "[":
            return ("chars", self.char_class())
        if ch in ("*", "+", "?"):
            raise self.error(f"nothing to repeat before {ch!r}")
        return self.literal()

    def literal(self):
        ch = self.take()
        if ch == ".":
            return ("chars", ANY)
        if ch == "\\":
            return ("chars", self.escape())
        return ("chars", one(ch))

    def escape(self) -> Chars:
        ch = self.take()
        if ch in CLASSES:
            return CLASSES[ch]
        if ch in ESCAPES:
            return one(ESCAPES[ch])
        if ch in ("u", "x"):  # \uXXXX, \xXX
            size = 4 if ch == "u" else 2
            digits = self.p[self.i : self.i + size]
            if len(digits) != size or any(
                c not in "0123456789abcdefABCDEF" for c in digits
            ):
                raise self.error(f"\\{ch} needs {size} hex digits")
            self.i += size
            return one(chr(int(digits, 16)))
        if ch.isdigit() or ch in "bBAZ":
            raise self.error(f"\\{ch} (a back reference or an anchor) is not supported")
        return one(ch)  # \. \\ \" \[ ...: the character itself

    def char_class(self) -> Chars:
        self.take()  # "["
        negated = self.peek() == "^"
        if negated:
            self.take()
        ranges, first = [], True
        while first or self.peek() != "]":
            first = False
            if self.peek() is None:
                raise self.error("an unclosed '['")
            ch = self.take()
            if ch == "\\":
                part = self.escape()
                if part.negated:
                    raise self.error("\\D, \\W, \\S inside [...] are not supported")
                if len(part.ranges) > 1 or part.ranges[0][0] != part.ranges[0][1]:
                    ranges += part.ranges
                    continue
                ch = chr(part.ranges[0][0])
            if self.peek() == "-" and self.p[self.i + 1 : self.i + 2] not in ("]", ""):
                self.take()
                end = self.take()
                end = chr(self.escape().ranges[0][0]) if end == "\\" else end
                if ord(end) < ord(ch):
                    raise self.error(f"the range {ch}-{end} is out of order")
                ranges.append((ord(ch), ord(end)))
            else:
                ranges.append((ord(ch), ord(ch)))
        self.take()  # "]"
        return Chars(tuple(ranges), negated)


# ---- Thompson's construction: each part of the tree becomes a fragment (start, end)


@dataclass
class NFA:
    """States 0..n-1: `eps[s]` the states s reaches reading nothing, `edges[s]` its
    (Chars,
    target) edges; one start and one accepting end. Every state can reach the end."""

    eps: list[list[int]] = field(default_factory=list)
    edges: list[list[tuple[Chars, int]]] = field(default_factory=list)
    start: int = 0
    end: int = 0

    def state(self) -> int:
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, node) -> tuple[int, int]:
        """A fragment for `node`: (its start, its end), the end not yet connected
        onwards."""
        kind = node[0]
        s = self.state()
        if kind == "chars":
            e = self.state()
            self.edges[s].append((node[1], e))
            return s, e
        if kind == "cat":
            e = s
            for part in node[1]:
                a, b = self.build(part)
                self.eps[e].append(a)
                e = b
            return s, e
        if kind == "alt":
            e = self.state()
            for option in node[1]:
                a, b = self.build(option)
                self.eps[s].append(a)
                self.eps[b].append(e)
            return s, e
        # "rep": low copies, then (high - low) optional ones or a loop
        _, inner, low, high = node
        e = s
        for _ in range(low):
            a, b = self.build(inner)
            self.eps[e].append(a)
            e = b
        if high is None:
            a, b = self.build(inner)
            self.eps[e] += [a]
            self.eps[b] += [a]
            end = self.state()
            self.eps[e].append(end)
            self.eps[b].append(end)
            return s, end
        end = self.state()
        for _ in range(high - low):
            a, b = self.build(inner)
            self.eps[e] += [a, end]
            e = b
        self.eps[e].append(end)
        return s, end


class DFA:
    """The NFA run as a DFA: a state is the set of NFA states a text leads to, numbered
    the first time it is found; `step(state, ch)` computes a transition once, then
    remembers it.
    """

    def __init__(self, pattern: str):
        nfa = NFA()
        nfa.start, nfa.end = nfa.build(Parser(pattern).parse())
        self.nfa, self.pattern = nfa, pattern
        self.sets: list[frozenset] = []
        self.ids: dict[frozenset, int] = {}
        self.moves: list[dict[str, int]] = []
        self.start = self.number(self.closure({nfa.start}))

    def closure(self, states) -> frozenset:
        """The states reachable from `states` reading nothing."""
        seen, todo = set(states), list(states)
        while todo:
            for t in self.nfa.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)

    def number(self, states: frozenset) -> int:
        if not states:
            return DEAD
        if states not in self.ids:
            self.ids[states] = len(self.sets)
            self.sets.append(states)
            self.moves.append({})
        return self.ids[states]

    def step(self, state: int, ch: str) -> int:
        """The state after reading `ch` in `state` (DEAD: no match starts this way)."""
        if state == DEAD:
            return DEAD
        moves = self.moves[state]
        if ch not in moves:
            targets = {
                t
                for s in self.sets[state]
                for chars, t in self.nfa.edges[s]
                if ch in chars
            }
            moves[ch] = self.number(self.closure(targets))
        return moves[ch]

    def walk(self, state: int, text: str) -> int:
        for ch in text:
            state = self.step(state, ch)
            if state == DEAD:
                break
        return state

    def accepting(self, state: int) -> bool:
        return state != DEAD and self.nfa.end in self.sets[state]

    def fullmatch(self, text: str) -> bool:
        return self.accepting(self.walk(self.start, text))


def compile_regex(pattern: str) -> DFA:
    """The automaton of a pattern (a ValueError saying what and where if it is not
    one)."""
    if not isinstance(pattern, str):
        raise ValueError(f"a regex must be a string, got {pattern!r:.80}")
    return DFA(pattern)
