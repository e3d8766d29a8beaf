"""The code's style: `ruff format --check` and `ruff check` pass on the repository (what
`make lint` runs before the tests; `make format` fixes most of what they report), and
scripts/wrap_comments.py, which `make format` runs between two passes of the formatter,
moves and wraps comments and docstrings only: never a string the code holds, never the
code itself."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 88  # pyproject.toml's [tool.ruff] line-length


def load_wrap_comments():
    """scripts/wrap_comments.py as a module (scripts/ is not a package)."""
    path = ROOT / "scripts" / "wrap_comments.py"
    spec = importlib.util.spec_from_file_location("wrap_comments", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wrap_comments = load_wrap_comments()


@pytest.mark.parametrize(
    "args", [["format", "--check", "."], ["check", "."]], ids=["format", "check"]
)
def test_ruff_passes_on_the_repository(args):
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed: pip install -e '.[dev]' (make test does)")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (
        f"ruff {' '.join(args)} fails (make format fixes most of it):\n"
        f"{result.stdout}{result.stderr}"
    )


def code_of(source: str) -> str:
    """The module's AST with every docstring emptied: what runs, docstrings aside."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                value.value = ""
    return ast.dump(tree)


def fix(source: str) -> str:
    fixed = wrap_comments.fix(source, WIDTH)
    assert ast.dump(ast.parse(fixed)) == ast.dump(ast.parse(source)) or (
        code_of(fixed) == code_of(source)
    ), "the code changed"
    return fixed


def test_a_wide_trailing_comment_moves_above_its_line():
    code = "    total = first_value + second_value + third_value"
    comment = "# the three parts, each counted once"
    source = f"def f():\n{code}  {comment}\n    return total\n"
    assert len(f"{code}  {comment}") > WIDTH
    assert fix(source) == f"def f():\n    {comment}\n{code}\n    return total\n"


def test_a_trailing_comment_that_fits_stays():
    source = "x = 1  # one\n"
    assert fix(source) == source


def test_a_wide_docstring_line_is_split_and_carried_into_its_paragraph():
    first = (
        '    """Return the number of frames a request holds once both its prompt and'
        " its output are"
    )
    second = "    in the cache, a shared frame counted once."
    source = (
        f'def frames(request):\n{first}\n{second}\n    """\n'
        "    return len(request.frames)\n"
    )
    assert len(first) > WIDTH
    fixed = fix(source)
    lines = fixed.splitlines()
    assert all(len(line) <= WIDTH for line in lines)
    # the words carried over join the next line of the paragraph: no line is added
    assert len(lines) == len(source.splitlines())
    assert lines[2].startswith("    ") and lines[2].endswith(second.strip())
    assert len(lines[2]) > len(second)
    docstring = ast.get_docstring(ast.parse(fixed).body[0])
    assert docstring.split() == ast.get_docstring(ast.parse(source).body[0]).split()
    assert lines[-1] == "    return len(request.frames)"


def test_a_wide_string_that_is_not_a_docstring_is_left_alone():
    words = " ".join(["word"] * 30)
    source = (
        f'PROMPT = "{words}"\n'
        f'HELP = """\\\n{words}\n{words}\n"""\n'
        "def f():\n"
        f'    x = 1\n    "{words}"\n'
        f'    return "{words}"\n'
    )
    assert fix(source) == source


def test_the_code_never_changes():
    source = (
        "import os\n"
        "\n"
        "\n"
        "def f(a, b):\n"
        '    """A docstring whose first line is long enough that the tool has to wrap'
        " it somewhere.\n"
        "\n"
        "    >>> f(1, 2)  # an example stays as written, however long the line it is"
        " written on\n"
        '    """\n'
        "    url = 'http://example.com/#anchor'  # a comment after a string that holds"
        " a hash sign\n"
        "    total = a + \\\n"
        "        b  # a comment after a backslash continuation, wide enough to move or"
        " to wrap\n"
        "    return {\n"
        "        'a': a,  # a comment inside a dict literal that pushes its line well"
        " past the width\n"
        "        'b': os.sep,\n"
        "    }, total, url  # noqa: E501 and its reason, which stays on its line"
        " whatever its width\n"
    )
    fixed = fix(source)
    assert code_of(fixed) == code_of(source)
    assert "# noqa: E501 and its reason" in fixed.splitlines()[-1]
