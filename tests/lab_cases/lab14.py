"""Lab 14's cases: a file as a participant writes it from the hints, and the catalogue
of plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = """
def closure(nfa, states):
    seen = set(states)
    todo = list(states)
    while todo:
        s = todo.pop()
        for t in nfa.eps_of(s):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return tuple(sorted(seen))


def move(nfa, states, ch):
    c = ord(ch)
    targets = set()
    for s in states:
        for ranges, t in nfa.chars_of(s):
            for lo, hi in ranges.pairs():
                if lo <= c <= hi:
                    targets.add(t)
    return targets
"""

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

# where a statement that breaks the participant's function goes
BREAK_AT = "def closure(nfa, states):\n"

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that
# must catch it)
MISTAKES = [
    (
        "closure follows one empty move, not every one in a row",
        "            if t not in seen:\n                seen.add(t)\n"
        "                todo.append(t)\n",
        "            seen.add(t)\n",
        CLOSURE,
    ),
    (
        "closure leaves out the states it starts from",
        "    seen = set(states)\n",
        "    seen = set()\n",
        CLOSURE,
    ),
    (
        "closure follows character moves too, as if they read nothing",
        "        for t in nfa.eps_of(s):\n",
        "        for t in [*nfa.eps_of(s), *(t for _, t in nfa.chars_of(s))]:\n",
        CLOSURE,
    ),
    (
        "closure without a set of seen states: a loop of empty moves never ends",
        "            if t not in seen:\n                seen.add(t)\n"
        "                todo.append(t)\n",
        "            seen.add(t)\n            todo.append(t)\n",
        CLOSURE,
    ),
    (
        "closure's states in the order they were found, not sorted",
        "                todo.append(t)\n    return tuple(sorted(seen))",
        "                todo.append(t)\n"
        "    found = list(states) + [t for t in seen if t not in states]\n"
        "    return tuple(found)",
        ONE_TUPLE,
    ),
    (
        "closure returns the set itself, which cannot name a DFA state",
        "    return tuple(sorted(seen))",
        "    return seen",
        ONE_TUPLE,
    ),
    (
        "a range's last character left out",
        "if lo <= c <= hi:",
        "if lo <= c < hi:",
        MOVE,
    ),
    (
        "a range read as its first character alone",
        "if lo <= c <= hi:",
        "if c == lo:",
        MOVE,
    ),
    (
        "the character compared as a string, not by its code point",
        "if lo <= c <= hi:",
        "if lo <= ch <= hi:",
        MOVE,
    ),
    (
        "a state that cannot read the character kept in the set",
        "                if lo <= c <= hi:\n                    targets.add(t)\n",
        "                if lo <= c <= hi:\n                    targets.add(t)\n"
        "                else:\n                    targets.add(s)\n",
        MOVE,
    ),
]
