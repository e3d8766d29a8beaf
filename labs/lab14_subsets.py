"""Lab 14: the subset construction (meeting 16, automata). A constraint's pattern is built
into an NFA by Thompson's construction: states joined by empty moves (read nothing) and
character moves (read one character of a set). The engine runs it as a DFA whose states are
sets of NFA states, each found the first time a character leads there. You write the step
that finds them: `closure`, the states a set reaches reading nothing, and `move`, where a
set goes reading one character; the DFA's step is closure(move(...)) (docs/16_automata.md).

Grade it (then the model answers under constraints compiled with it):
    python -m minipaged.lab check 14 my_subsets.py
Hints, one step at a time:  python -m minipaged.lab hint 14

The NFA you are given (minipaged/structured/regex.py builds it): states 0 .. nfa.n - 1;
`nfa.eps_of(s)` lists the states s reaches by one empty move; `nfa.chars_of(s)` lists s's
character moves as (ranges, target) pairs, `ranges.pairs()` being the code point ranges
[(lo, hi), ...] it reads, both ends included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the annotations only: the NFA is the engine's
    from minipaged.structured.regex import NFA


def closure(nfa: NFA, states) -> tuple[int, ...]:
    """The NFA states reachable from `states` reading nothing, `states` among them: a
    sorted tuple, so that one set of NFA states is always the same DFA state."""
    raise NotImplementedError("lab 14: write closure (stuck? python -m minipaged.lab hint 14)")


def move(nfa: NFA, states, ch: str) -> set[int]:
    """The NFA states that `states` go to reading `ch`: the target of each character
    move whose set holds it (a set is ranges [lo, hi], both ends included). No closure
    yet: the DFA's step is closure(move(...)); DFA.step gives the same from an index of
    each DFA state's moves, built once."""
    raise NotImplementedError("lab 14: write move (stuck? python -m minipaged.lab hint 14)")
