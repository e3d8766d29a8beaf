"""docs/reading.md, the reading guide, stays true: it lists every file of the engine
(minipaged/ but tools/ and the five doors), every file it lists exists, and each size
it quotes is the file's length give or take 15% or 20 lines (the files drift)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "reading.md"
DOORS = {"chat.py", "serve.py", "bench.py", "lab.py", "simulate.py"}
# a row of the guide: | [path](../path) | lines | what it holds |
ROW = re.compile(r"^\| \[([^\]]+)\]\(\.\./([^)]+)\) \| (\d+) \|", re.M)


def listed() -> dict[str, int]:
    """path (from the repository root) -> the size the guide gives it, in lines."""
    rows = ROW.findall(GUIDE.read_text())
    assert rows, "docs/reading.md lists no file"
    for text, path, _ in rows:
        assert text == path, f"the row of {path} is labelled {text}"
    paths = [path for _, path, _ in rows]
    assert len(paths) == len(set(paths)), "a file is listed twice"
    return {path: int(lines) for _, path, lines in rows}


def engine_files() -> set[str]:
    """Every .py file of the engine a student reads: minipaged/, less tools/ and the
    doors."""
    package = ROOT / "minipaged"
    return {
        p.relative_to(ROOT).as_posix()
        for p in package.rglob("*.py")
        if "__pycache__" not in p.parts
        and p.relative_to(package).parts[0] != "tools"
        and not (p.parent == package and p.name in DOORS)
    }


def test_every_file_of_the_engine_is_listed():
    missing = sorted(engine_files() - set(listed()))
    assert not missing, f"add these to docs/reading.md: {missing}"


def test_every_listed_file_exists_and_is_no_machinery():
    for path in listed():
        assert (ROOT / path).is_file(), f"docs/reading.md lists {path}: no such file"
        assert not path.startswith("minipaged/tools/"), f"{path} is machinery"


def test_each_size_is_about_the_files_length():
    wrong = []
    for path, quoted in listed().items():
        actual = len((ROOT / path).read_text().splitlines())
        if abs(actual - quoted) > max(20, 0.15 * actual):
            wrong.append(f"{path}: listed {quoted}, has {actual}")
    assert not wrong, "update the sizes in docs/reading.md:\n" + "\n".join(wrong)


def test_the_guide_says_its_sizes_are_approximate_and_is_linked():
    text = " ".join(GUIDE.read_text().split())
    assert "approximate" in text and "tests/test_reading.py" in text
    link = f"({GUIDE.name})"  # a Markdown link to the guide
    assert link.replace("(", "(docs/") in (ROOT / "README.md").read_text()
    assert link in (ROOT / "docs" / "README.md").read_text()


def test_the_row_pattern_reads_a_row():
    row = "| [minipaged/llm.py](../minipaged/llm.py) | 276 | `LLM`, the front door |"
    assert ROW.findall(row) == [("minipaged/llm.py", "minipaged/llm.py", "276")]
