"""Regular expressions as automata (Kleene 1956): a pattern is parsed, built into an NFA
by Thompson's construction (CACM 1968), and run as a DFA whose states are sets of NFA
states, each found the first time a character leads there (the subset construction, done
lazily). Compiling is bounded: groups nest at most MAX_NESTING deep, the NFA has at most
MAX_STATES states, and a Budget can stop it at a deadline.
"""

from __future__ import annotations

import time
from array import array
from bisect import bisect_right
from dataclasses import dataclass

DEAD = -1  # the DFA state of a text that no match can start with
# {m,n} copies the repeated part: bounded, so a pattern cannot fill memory
MAX_REPEAT = 1000
# groups inside groups: deeper is refused (the parser and the builder recurse)
MAX_NESTING = 100
# NFA states of one pattern (about 40 MB of Python objects): more is refused
MAX_STATES = 200_000
UNICODE_MAX = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)  # code points UTF-8 cannot encode: never matched


# a courteous compile (on a server's worker thread) pauses this long after each slice
# of work while the engine is busy, so that the engine's thread, which lets go of the
# GIL in every NumPy call, gets it back at once rather than after Python's switch
# interval (5 ms) each time: the engine keeps most of its pace, the compile goes slower
SLICE, PAUSE = 0.0003, 0.001


class Budget:
    """A compile's limits: at most `states` NFA states, and `seconds` of its thread's
    CPU time (None: no limit). `tick(n)` is called in the long loops (n: work done). A
    `courteous` budget (True, or a function that says whether the engine is busy now)
    pauses after each SLICE of work while it is. A ValueError past a limit."""

    def __init__(
        self,
        seconds: float | None = None,
        states: int = MAX_STATES,
        courteous=False,
    ):
        self.seconds, self.states = seconds, states
        self.courteous = courteous if callable(courteous) else lambda: courteous
        self.count, self.next = 0, 64
        self.started = time.thread_time()
        self.slice_end = time.perf_counter() + SLICE

    def tick(self, n: int = 1) -> None:
        self.count += n
        if self.count < self.next:
            return
        self.next = self.count + 32
        if time.perf_counter() > self.slice_end:
            if self.courteous():
                time.sleep(PAUSE)
            self.slice_end = time.perf_counter() + SLICE
        if (
            self.seconds is not None
            and time.thread_time() - self.started > self.seconds
        ):
            raise ValueError(
                f"compiling it took more than the budget of {self.seconds:g} s: write"
                " a smaller pattern or schema"
            )


class Unbounded(Budget):
    """No limits, no pauses: what an automaton runs under once compiled."""

    def tick(self, n: int = 1) -> None:
        pass


UNBOUNDED = Unbounded()


class Ranges:
    """A set of code points as sorted, disjoint, non-adjacent ranges [lo, hi]: `c in r`
    and `r.overlaps(lo, hi)` by binary search."""

    __slots__ = ("los", "his")

    def __init__(self, pairs=()):
        merged: list[list[int]] = []
        for lo, hi in sorted(pairs):
            if lo > hi:
                continue
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self.los = tuple(lo for lo, _ in merged)
        self.his = tuple(hi for _, hi in merged)

    def __contains__(self, c: int) -> bool:
        i = bisect_right(self.los, c) - 1
        return i >= 0 and c <= self.his[i]

    def overlaps(self, lo: int, hi: int) -> bool:
        i = bisect_right(self.los, hi) - 1
        return i >= 0 and self.his[i] >= lo

    def __bool__(self) -> bool:
        return bool(self.los)

    def pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.los, self.his))

    def size(self) -> int:
        return sum(hi - lo + 1 for lo, hi in zip(self.los, self.his))

    def __and__(self, other: Ranges) -> Ranges:
        out, i, j = [], 0, 0
        while i < len(self.los) and j < len(other.los):
            lo, hi = max(self.los[i], other.los[j]), min(self.his[i], other.his[j])
            if lo <= hi:
                out.append((lo, hi))
            if self.his[i] < other.his[j]:
                i += 1
            else:
                j += 1
        return Ranges(out)

    def __sub__(self, other: Ranges) -> Ranges:
        return self & other.complement()

    def complement(self) -> Ranges:
        out, at = [], 0
        for lo, hi in zip(self.los, self.his):
            if lo > at:
                out.append((at, lo - 1))
            at = hi + 1
        if at <= UNICODE_MAX:
            out.append((at, UNICODE_MAX))
        return Ranges(out)


# every code point UTF-8 can write: what any character class is first cut to
WRITABLE = Ranges([(0, SURROGATES[0] - 1), (SURROGATES[1] + 1, UNICODE_MAX)])


@dataclass(frozen=True)
class Chars:
    """A set of characters: code point ranges [lo, hi], or everything but them
    (negated)."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False

    def __contains__(self, ch: str) -> bool:
        c = ord(ch)
        return any(lo <= c <= hi for lo, hi in self.ranges) != self.negated

    def positive(self) -> Ranges:
        """The same set as Ranges of characters UTF-8 can write (no surrogates)."""
        ranges = Ranges(self.ranges)
        return (ranges.complement() if self.negated else ranges) & WRITABLE


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
    atoms. Groups nest at most MAX_NESTING deep, so the recursion stays far from
    Python's limit. The whole text must match: a `^` that opens a top-level alternative
    and a `$` that closes one say nothing more, and any other anchor is refused."""

    def __init__(self, pattern: str, budget: Budget | None = None):
        self.p, self.i, self.depth = pattern, 0, 0
        self.tick = (budget or UNBOUNDED).tick

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
        if self.peek() == "^" and self.depth == 0:
            self.take()
        while self.peek() not in (None, "|", ")"):
            if self.peek() == "$" and self.depth == 0:
                self.take()
                if self.peek() not in (None, "|"):
                    raise self.error("a '$' before the end is not supported")
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
            if node[0] == "rep":
                raise self.error(
                    "a repeat of a repeat (write a group around the first)"
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
        self.tick()
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
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise self.error(f"groups nest more than {MAX_NESTING} deep")
            inner = self.alternation()
            if self.peek() != ")":
                raise self.error("an unclosed '('")
            self.take()
            self.depth -= 1
            return inner
        if ch == "[":
            return ("chars", self.char_class())
        if ch in ("*", "+", "?"):
            raise self.error(f"nothing to repeat before {ch!r}")
        if ch in ("^", "$"):
            raise self.error(f"the anchor {ch!r} inside the pattern is not supported")
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


def parse(pattern: str, budget: Budget | None = None):
    """A pattern's tree (a ValueError saying what and where if it is not one)."""
    if not isinstance(pattern, str):
        raise ValueError(f"a regex must be a string, got {pattern!r:.80}")
    return Parser(pattern, budget).parse()


def states_needed(tree) -> int:
    """The NFA states Thompson's construction makes for `tree`, counted before building
    it (so that `(a{1000}){1000}` is refused at once)."""
    kind = tree[0]
    if kind == "chars":
        return 2
    if kind in ("cat", "alt"):
        return (1 if kind == "cat" else 2) + sum(states_needed(t) for t in tree[1])
    _, inner, low, high = tree
    size = states_needed(inner)
    return 2 + size * (low + (1 if high is None else high - low))


# ---- a tree written back as a pattern (schema.py rewrites trees)

SPECIAL = set("\\.^$|?*+()[]{}-")


def char_text(c: int, in_class: bool) -> str:
    if c < 0x20 or 0x7F <= c <= 0xA0 or 0xD800 <= c <= 0xDFFF:
        return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"
    ch = chr(c)
    return "\\" + ch if ch in SPECIAL or (in_class and ch in "^]") else ch


def to_pattern(tree) -> str:
    """The pattern text of a tree (what Parser reads back into the same tree's
    language)."""
    kind = tree[0]
    if kind == "chars":
        ranges = tree[1].positive()
        pairs = ranges.pairs()
        if len(pairs) == 1 and pairs[0][0] == pairs[0][1]:
            return char_text(pairs[0][0], False)
        if not pairs:  # nothing: a class that matches no character
            return "[^\\x00-\\uffff" + chr(0x10000) + "-" + chr(UNICODE_MAX) + "]"
        return (
            "["
            + "".join(
                char_text(lo, True) + ("" if lo == hi else "-" + char_text(hi, True))
                for lo, hi in pairs
            )
            + "]"
        )
    if kind == "cat":
        return "".join(
            f"(?:{to_pattern(t)})" if t[0] == "alt" else to_pattern(t) for t in tree[1]
        )
    if kind == "alt":
        return "(?:" + "|".join(to_pattern(t) for t in tree[1]) + ")"
    _, inner, low, high = tree
    count = f"{{{low},{'' if high is None else high}}}"
    return f"(?:{to_pattern(inner)}){count}"


# ---- Thompson's construction: each part of the tree becomes a fragment (start, end)


def grouped(n: int, sources: list[int], targets: list[int], tick=UNBOUNDED.tick):
    """Edges (sources[k] -> targets[k]) grouped by source: (offsets, targets), state s's
    targets being targets[offsets[s]:offsets[s + 1]] (flat integer arrays: nothing for
    the garbage collector to walk, however many states)."""
    offsets = [0] * (n + 1)
    for i, s in enumerate(sources):
        offsets[s + 1] += 1
        if not i & 1023:
            tick(1024)
    for i in range(n):
        offsets[i + 1] += offsets[i]
    out, at = [0] * len(sources), offsets[:-1]
    for i, (s, t) in enumerate(zip(sources, targets)):
        out[at[s]] = t
        at[s] += 1
        if not i & 1023:
            tick(1024)
    return array("l", offsets), array("l", out)


class NFA:
    """States 0..n-1, one start and one accepting end, kept as flat integer arrays:
    `eps` the moves that read nothing, `chars` the moves that read a character of a set
    (`sets[k]`, Ranges). Each character set is cut to `alphabet` (the characters a
    vocabulary can write; None: every one), and after `finish()` every state left can
    reach the end, and each state's moves are grouped (`eps_of`, `chars_of`)."""

    def __init__(self, alphabet: Ranges | None = None, budget: Budget | None = None):
        self.alphabet, self.budget = alphabet, budget or UNBOUNDED
        self.n = self.start = self.end = 0
        self.eps_from: list[int] = []
        self.eps_to: list[int] = []
        self.chars_from: list[int] = []
        self.chars_set: list[int] = []
        self.chars_to: list[int] = []
        self.sets: list[Ranges] = []
        self.cut: dict = {}  # Chars -> its index in sets, cut to the alphabet
        # characters the pattern names that the alphabet lacks (for the error)
        self.missing: set[str] = set()

    def state(self) -> int:
        self.budget.tick()
        self.n += 1
        return self.n - 1

    def move(self, a: int, b: int) -> None:
        self.eps_from.append(a)
        self.eps_to.append(b)

    def set_of(self, chars: Chars) -> int | None:
        """The index of `chars`, cut to the alphabet, in `sets` (None: none is left)."""
        if chars not in self.cut:
            ranges = chars.positive()
            if self.alphabet is not None:
                kept = ranges & self.alphabet
                if len(self.missing) < 5:
                    lost = (ranges - kept).pairs()[:5]
                    self.missing.update(chr(lo) for lo, _ in lost)
                ranges = kept
            self.cut[chars] = len(self.sets) if ranges else None
            if ranges:
                self.sets.append(ranges)
        return self.cut[chars]

    def build(self, node) -> tuple[int, int]:
        """A fragment for `node`: (its start, its end), the end not yet connected
        onwards."""
        kind = node[0]
        s = self.state()
        if kind == "chars":
            e = self.state()
            k = self.set_of(node[1])
            if k is not None:
                self.chars_from.append(s)
                self.chars_set.append(k)
                self.chars_to.append(e)
            return s, e
        if kind == "cat":
            e = s
            for part in node[1]:
                a, b = self.build(part)
                self.move(e, a)
                e = b
            return s, e
        if kind == "alt":
            e = self.state()
            for option in node[1]:
                a, b = self.build(option)
                self.move(s, a)
                self.move(b, e)
            return s, e
        # "rep": low copies, then (high - low) optional ones or a loop
        _, inner, low, high = node
        e = s
        for _ in range(low):
            a, b = self.build(inner)
            self.move(e, a)
            e = b
        end = self.state()
        if high is None:
            a, b = self.build(inner)
            self.move(e, a)
            self.move(b, a)
            self.move(e, end)
            self.move(b, end)
            return s, end
        for _ in range(high - low):
            a, b = self.build(inner)
            self.move(e, a)
            self.move(e, end)
            e = b
        self.move(e, end)
        return s, end

    def finish(self) -> bool:
        """Drop every move into a state that cannot reach the end (a character set the
        alphabet emptied leaves such states), group the moves by state; False if the
        start cannot reach the end."""
        n, tick = self.n, self.budget.tick
        back_at, back = grouped(
            n, self.eps_to + self.chars_to, self.eps_from + self.chars_from, tick
        )
        live = bytearray(n)
        live[self.end], todo = 1, [self.end]
        while todo:
            s = todo.pop()
            tick()
            for t in back[back_at[s] : back_at[s + 1]]:
                if not live[t]:
                    live[t] = 1
                    todo.append(t)
        eps_from, eps_to, from_, to = [], [], [], []
        for i, (a, b) in enumerate(zip(self.eps_from, self.eps_to)):
            if live[b]:
                eps_from.append(a)
                eps_to.append(b)
            if not i & 1023:
                tick(1024)
        for a, k, b in zip(self.chars_from, self.chars_set, self.chars_to):
            tick()
            if live[b]:
                from_.append(a)
                to.append(k * n + b)
        self.eps_at, self.eps = grouped(n, eps_from, eps_to, tick)
        # a character move: (its set's index) * n + its target
        self.chars_at, self.chars = grouped(n, from_, to, tick)
        del self.eps_from, self.eps_to, self.chars_from, self.chars_set, self.chars_to
        return bool(live[self.start])

    def eps_of(self, s: int):
        return self.eps[self.eps_at[s] : self.eps_at[s + 1]]

    def chars_of(self, s: int):
        """State s's character moves as (Ranges, target) pairs."""
        n = self.n
        return [
            (self.sets[k // n], k % n)
            for k in self.chars[self.chars_at[s] : self.chars_at[s + 1]]
        ]


# ---- the subset construction's step: a set of NFA states, then a character


def closure(nfa: NFA, states) -> tuple[int, ...]:
    """The NFA states reachable from `states` reading nothing, `states` among them: a
    sorted tuple, so that one set of NFA states is always the same DFA state."""
    seen, todo = set(states), list(states)
    while todo:
        s = todo.pop()
        for t in nfa.eps_of(s):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return tuple(sorted(seen))


def move(nfa: NFA, states, ch: str) -> set[int]:
    """The NFA states that `states` go to reading `ch`: the target of each character
    move whose set holds it (a set is ranges [lo, hi], both ends included). No closure
    yet: the DFA's step is closure(move(...)); DFA.step gives the same from an index of
    each DFA state's moves, built once."""
    c = ord(ch)
    targets = set()
    for s in states:
        for ranges, t in nfa.chars_of(s):
            if c in ranges:
                targets.add(t)
    return targets


class DFA:
    """The NFA run as a DFA: a state is the set of NFA states a text leads to (a sorted
    tuple), numbered the first time it is found; `step(state, ch)` computes a transition
    once, then remembers it. Each state's NFA moves are indexed the first time it is
    left (single characters in a dict, wide classes in a list), so a step costs the few
    moves that can take the character, not all of them.
    """

    def __init__(
        self, pattern: str, alphabet: Ranges | None = None, budget: Budget | None = None
    ):
        budget = budget or UNBOUNDED
        tree = parse(pattern, budget)
        needed = states_needed(tree)
        if needed > budget.states:
            raise ValueError(
                f"the pattern needs {needed} automaton states, more than the"
                f" {budget.states} allowed: write a smaller pattern (fewer or shorter"
                " repeats and alternatives)"
            )
        nfa = NFA(alphabet, budget)
        nfa.start, nfa.end = nfa.build(tree)
        if not nfa.finish():
            lacking = ", ".join(repr(c) for c in sorted(nfa.missing))
            raise ValueError(
                "no text can match the pattern"
                + (
                    f" with this model's vocabulary (it cannot write {lacking})"
                    if alphabet is not None and lacking
                    else " (a character class that matches no character)"
                )
            )
        self.nfa, self.pattern, self.budget = nfa, pattern, budget
        self.sets: list[tuple[int, ...]] = []
        self.finals = bytearray()  # 1 for a state that holds the NFA's end
        self.ids: dict[tuple[int, ...], int] = {}
        self.moves: list[dict[str, int]] = []
        self.index: list = []  # per state, None until first left
        self.start = self.number(self.closure([nfa.start]))

    def closure(self, states) -> tuple[int, ...]:
        """The states reachable from `states` reading nothing (sorted), counted in
        the budget."""
        found = closure(self.nfa, states)
        self.budget.tick(len(found))
        return found

    def number(self, states: tuple[int, ...]) -> int:
        if not states:
            return DEAD
        if states not in self.ids:
            self.budget.tick()
            self.ids[states] = len(self.sets)
            self.sets.append(states)
            self.finals.append(self.nfa.end in states)
            self.moves.append({})
            self.index.append(None)
        return self.ids[states]

    def edges(self, state: int):
        """The state's NFA moves: ({code point: [targets]}, its sorted keys, [(Ranges,
        target)] for the wide ones)."""
        if self.index[state] is None:
            points: dict[int, list[int]] = {}
            wide = []
            tick = self.budget.tick
            for s in self.sets[state]:
                tick()
                for ranges, t in self.nfa.chars_of(s):
                    if ranges.size() <= 16:
                        for lo, hi in ranges.pairs():
                            for c in range(lo, hi + 1):
                                points.setdefault(c, []).append(t)
                    else:
                        wide.append((ranges, t))
            self.index[state] = (points, sorted(points), wide)
        return self.index[state]

    def step(self, state: int, ch: str) -> int:
        """The state after reading `ch` in `state` (DEAD: no match starts this way):
        closure(move(...)) of its set, the move read from the state's index."""
        if state == DEAD:
            return DEAD
        moves = self.moves[state]
        nxt = moves.get(ch)
        if nxt is None:
            points, _, wide = self.edges(state)
            c = ord(ch)
            targets = set(points.get(c, ()))
            targets.update(t for ranges, t in wide if c in ranges)
            nxt = moves[ch] = self.number(self.closure(targets))
        return nxt

    def overlaps(self, state: int, lo: int, hi: int) -> bool:
        """Can `state` read some character in [lo, hi]?"""
        if state == DEAD:
            return False
        _, keys, wide = self.edges(state)
        i = bisect_right(keys, hi) - 1
        return (i >= 0 and keys[i] >= lo) or any(r.overlaps(lo, hi) for r, _ in wide)

    def walk(self, state: int, text: str) -> int:
        for ch in text:
            state = self.step(state, ch)
            if state == DEAD:
                break
        return state

    def accepting(self, state: int) -> bool:
        return state != DEAD and bool(self.finals[state])

    def fullmatch(self, text: str) -> bool:
        return self.accepting(self.walk(self.start, text))

    @property
    def size(self) -> int:
        """Its states, NFA and DFA: what a cache of automata counts."""
        return self.nfa.n + len(self.sets)


def compile_regex(
    pattern: str, alphabet: Ranges | None = None, budget: Budget | None = None
) -> DFA:
    """The automaton of a pattern (a ValueError saying what and where if it is not one,
    or if it is past the budget); `alphabet`: the characters it may read."""
    if not isinstance(pattern, str):
        raise ValueError(f"a regex must be a string, got {pattern!r:.80}")
    return DFA(pattern, alphabet, budget)
