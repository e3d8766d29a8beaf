"""Wrap what `ruff format` leaves wide: comments and docstrings, to the formatter's
width.

`make format` runs it after `ruff format`. A trailing comment that pushes its line past
the width moves to a line of its own above; a comment or docstring line past the width
is split at a space and its rest carried into the next line of the same paragraph (or a
new one). Strings that are not docstrings are left alone: a prompt or a message changes
what runs.

    python scripts/wrap_comments.py [--width 88] [--check] FILE_OR_FOLDER...
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from pathlib import Path

# a line that starts a structure of its own: never merged into the line above
STARTS_BLOCK = re.compile(r"^(\||[-*+] |\d+[.)] |>>>|\.\.\. |```|[A-Z][A-Za-z ]*:$)")
LIST_ITEM = re.compile(r"^([-*+] |\d+[.)] )")


def docstring_lines(tree: ast.AST, source_lines: list[str]) -> set[int]:
    """The 1-based numbers of the docstrings' lines of prose: a line indented deeper
    than its docstring's body (an example, a formula, a table) is left as written."""
    lines = set()
    for node in ast.walk(tree):
        is_owner = isinstance(
            node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        )
        if not is_owner or not node.body:
            continue
        first = node.body[0]
        if not isinstance(first, ast.Expr):
            continue
        if not isinstance(first.value, ast.Constant) or not isinstance(
            first.value.value, str
        ):
            continue
        numbers = range(first.lineno, first.end_lineno + 1)
        body = [source_lines[n - 1] for n in numbers[1:]]
        body = [line for line in body if line.strip()]
        indent = min((len(line) - len(line.lstrip()) for line in body), default=0)
        for n in numbers:
            line = source_lines[n - 1]
            if n == first.lineno or len(line) - len(line.lstrip()) <= indent:
                lines.add(n)
    return lines


def trailing_comments(source: str) -> dict[int, int]:
    """Line number -> column of a comment that follows code on that line."""
    found = {}
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    last_code_line = 0
    for token in tokens:
        if token.type == tokenize.COMMENT:
            if token.start[0] == last_code_line:
                found[token.start[0]] = token.start[1]
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT):
            last_code_line = token.end[0]
    return found


def comment_lines(source: str) -> set[int]:
    """The line numbers that hold a comment and nothing else."""
    found = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and not token.line[: token.start[1]].strip():
            found.add(token.start[0])
    return found


def lift_trailing_comments(source: str, width: int) -> str:
    """A wide line's trailing comment goes on a line of its own above it."""
    lines = source.splitlines(keepends=True)
    for number, column in sorted(trailing_comments(source).items(), reverse=True):
        line = lines[number - 1]
        if len(line.rstrip("\n")) <= width:
            continue
        code = line[:column].rstrip()
        if code.endswith("\\"):  # a comment cannot sit inside a backslash continuation
            continue
        indent = line[: len(line) - len(line.lstrip())]
        comment = line[column:].rstrip("\n")
        if comment.startswith(("# noqa", "# type:")):
            continue
        lines[number - 1 : number] = [indent + comment + "\n", code + "\n"]
    return "".join(lines)


def statement_spans(tree: ast.AST) -> list[tuple[int, int]]:
    """(first, last) line of each statement, a compound statement's header only."""
    spans = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt):
            continue
        last = node.end_lineno
        body = getattr(node, "body", None)
        if isinstance(body, list) and body:
            last = body[0].lineno - 1
            decorators = getattr(node, "decorator_list", [])
            if decorators:
                continue
        spans.append((node.lineno, last))
    return spans


def lift_split_comments(source: str, width: int) -> str:
    """A statement of at most four lines that holds one trailing comment (the
    formatter split it around that comment) gets the comment on a line above it;
    `ruff format` then joins the statement again."""
    lines = source.splitlines(keepends=True)
    comments = trailing_comments(source)
    moves = []
    for first, last in statement_spans(ast.parse(source)):
        inside = [n for n in comments if first <= n <= last]
        if last == first or last - first > 3 or len(inside) != 1:
            continue
        code = " ".join(lines[n - 1].strip() for n in range(first, last + 1))
        if len(code) - len(lines[inside[0] - 1][comments[inside[0]] :]) > width + 8:
            continue
        moves.append((first, inside[0]))
    for first, number in sorted(moves, reverse=True):
        line = lines[number - 1]
        column = comments[number]
        comment = line[column:].rstrip("\n")
        if comment.startswith(("# noqa", "# type:")):
            continue
        lines[number - 1] = line[:column].rstrip() + "\n"
        start = lines[first - 1]
        indent = start[: len(start) - len(start.lstrip())]
        lines.insert(first - 1, indent + comment + "\n")
    return "".join(lines)


def prefix_of(line: str, is_comment: bool) -> tuple[str, str]:
    """(prefix, text): the indentation (and `# ` for a comment) before a line's
    words."""
    if is_comment:
        match = re.match(r"^(\s*#+ ?\s*)(.*)$", line)
    else:
        match = re.match(r"^(\s*)(.*)$", line)
    return match.group(1), match.group(2)


def split_at(text: str, room: int) -> tuple[str, str] | None:
    """Split text at the last space that leaves its head within `room`; None if none."""
    cut = text.rfind(" ", 0, room + 1)
    if cut <= 0:
        return None
    return text[:cut].rstrip(), text[cut + 1 :].lstrip()


def wrap_lines(source: str, width: int) -> str:
    """Split each too-wide comment or docstring line, carrying its rest forward."""
    tree = ast.parse(source)
    lines = source.splitlines()
    in_docstring = docstring_lines(tree, lines)
    comments = comment_lines(source)
    kinds = {}
    for number in range(1, len(lines) + 1):
        text = lines[number - 1].lstrip()
        if number in comments and re.match(r"#+ ?\s", text):
            continue  # an indented comment: a table, an example, kept as written
        if number in comments:
            kinds[number - 1] = "comment"
        elif number in in_docstring:
            kinds[number - 1] = "doc"
    out = []
    carried = None  # (prefix, words) still to place
    i = 0
    while i < len(lines):
        line = lines[i]
        kind = kinds.get(i)
        if carried is not None:
            prefix, rest = carried
            carried = None
            joinable = kind is not None and line.strip()
            if joinable:
                this_prefix, text = prefix_of(line, kind == "comment")
                joinable = this_prefix == prefix and not STARTS_BLOCK.match(text)
                joinable = joinable and not text.startswith(('"""', "'''"))
                joinable = joinable and not text.endswith(('"""', "'''"))
            if joinable:
                line = prefix + rest + " " + text
            else:
                out.append(prefix + rest)
        if kind is None or len(line) <= width:
            out.append(line)
            i += 1
            continue
        prefix, text = prefix_of(line, kind == "comment")
        pieces = split_at(text, width - len(prefix))
        if pieces is None:
            out.append(line)
            i += 1
            continue
        head, rest = pieces
        out.append(prefix + head)
        item = LIST_ITEM.match(text)
        follow = prefix + " " * len(item.group(1)) if item else prefix
        if kind == "comment" and item is None and text.startswith(" "):
            follow = prefix
        # the rest is placed at the next line (joined to it when it continues the
        # paragraph)
        if len(follow + rest) > width:
            lines[i] = follow + rest  # still too wide: split again
            continue
        carried = (follow, rest)
        i += 1
    if carried is not None:
        out.append(carried[0] + carried[1])
    return "\n".join(out) + ("\n" if source.endswith("\n") else "")


def refill_docstrings(source: str, width: int) -> str:
    """A docstring paragraph that fits in fewer lines (a short line left by an
    earlier split) is filled again, word by word, at its own indentation."""
    lines = source.splitlines()
    prose = docstring_lines(ast.parse(source), lines)
    out = []
    i = 0
    while i < len(lines):
        if i + 1 not in prose or not lines[i].strip():
            out.append(lines[i])
            i += 1
            continue
        prefix, _ = prefix_of(lines[i], False)
        paragraph = [lines[i]]
        i += 1
        while i < len(lines) and i + 1 in prose and lines[i].strip():
            this_prefix, text = prefix_of(lines[i], False)
            if this_prefix != prefix or STARTS_BLOCK.match(text):
                break
            if text in QUOTES or paragraph[-1].rstrip().endswith(QUOTES):
                break
            paragraph.append(lines[i])
            i += 1
        out += fill(paragraph, prefix, width)
    return "\n".join(out) + ("\n" if source.endswith("\n") else "")


QUOTES = ('"' * 3, "'" * 3)


def fill(paragraph: list[str], prefix: str, width: int) -> list[str]:
    """The paragraph's words, greedily filled; the paragraph as it was unless that
    takes fewer lines (and no line grows past the width)."""
    words = " ".join(line.strip() for line in paragraph).split(" ")
    filled = [prefix + words[0]]
    for word in words[1:]:
        if len(filled[-1]) + 1 + len(word) <= width:
            filled[-1] += " " + word
        else:
            filled.append(prefix + word)
    if len(filled) < len(paragraph) and all(len(x) <= width for x in filled):
        return filled
    return paragraph


def fix(source: str, width: int) -> str:
    lifted = lift_split_comments(source, width)
    fixed = wrap_lines(lift_trailing_comments(lifted, width), width)
    fixed = refill_docstrings(fixed, width)
    if ast.dump(ast.parse(fixed)) == ast.dump(ast.parse(source)):
        return fixed
    # a docstring changed: only its text may have, never the code around it
    return fixed if same_code(source, fixed) else source


def same_code(before: str, after: str) -> bool:
    """Whether two sources differ in docstrings' text only."""

    def without_docstrings(source: str) -> str:
        tree = ast.parse(source)
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
                value = body[0].value
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    value.value = ""
        return ast.dump(tree)

    return without_docstrings(before) == without_docstrings(after)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--width", type=int, default=88)
    parser.add_argument(
        "--check", action="store_true", help="change nothing; list what would change"
    )
    args = parser.parse_args(argv)
    files = []
    for path in args.paths:
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    changed = []
    for path in files:
        source = path.read_text()
        fixed = fix(source, args.width)
        if fixed != source:
            changed.append(path)
            if not args.check:
                path.write_text(fixed)
    for path in changed:
        print(f"{'would wrap' if args.check else 'wrapped'} {path}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
