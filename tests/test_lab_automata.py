"""Lab 14 (the subset construction) beyond the cross-lab checks of test_labs.py: the
engine's closure and move are what its DFA steps by, and a file that hands them to the
engine's own is refused, naming the line.
"""

import subprocess
import sys

import pytest

from minipaged.structured.regex import DEAD, closure, compile_regex, move
from minipaged.tools.lab.automata_lab import ALPHABET, random_cases


def test_the_dfas_indexed_step_is_closure_of_move():
    """DFA.step reads a state's moves from an index built once: the same set of NFA
    states as closure(move(...)), on every state and character of random patterns."""
    for pattern, _, texts in random_cases(count=30, seed=3):
        dfa = compile_regex(pattern)
        for text in texts:
            dfa.walk(dfa.start, text)
        for state, states in enumerate(list(dfa.sets)):
            for ch in ALPHABET + "xz":
                step = dfa.step(state, ch)
                want = closure(dfa.nfa, move(dfa.nfa, states, ch))
                got = () if step == DEAD else dfa.sets[step]
                assert got == want, (pattern, states, ch)


@pytest.mark.parametrize(
    "text",
    [
        "from minipaged.structured import regex\n\n\n"
        "def closure(nfa, states):\n    return regex.closure(nfa, states)\n\n\n"
        "def move(nfa, states, ch):\n    return regex.move(nfa, states, ch)\n",
        "from minipaged.structured.regex import closure as engines\n\n\n"
        "def closure(nfa, states):\n    return engines(nfa, states)\n\n\n"
        "def move(nfa, states, ch):\n    return set()\n",
    ],
    ids=["module", "imported"],
)
def test_a_file_that_calls_the_engines_closure_fails_naming_the_line(text, tmp_path):
    path = tmp_path / "my_subsets.py"
    path.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "minipaged.lab", "check", "14", path, "--no-engine"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert (
        "your closure (my_subsets.py line 5) calls the engine's own closure"
        " (minipaged.structured.regex) instead of doing the work" in done.stdout
    ), done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_the_engines_function_bound_to_the_name_is_not_written_there(tmp_path):
    path = tmp_path / "my_subsets.py"
    path.write_text(
        "from minipaged.structured.regex import closure\n\n\n"
        "def move(nfa, states, ch):\n    return set()\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "minipaged.lab", "check", "14", path, "--no-engine"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert (
        "closure in my_subsets.py is not written there (it is"
        " minipaged.structured.regex.closure)" in done.stdout
    ), done.stdout
