"""Every notebook runs top to bottom on the CPU as stored, without a warning, and keeps
the house conventions: each notebooks/NN_name.py (jupytext py:percent, the source to
read and diff) is in sync with its paired .ipynb (what people open; outputs aside); the
.ipynb stores the outputs of one run (`make notebooks`); an opening "What you will see";
closing exercises whose solutions are folded in <details> blocks, in JupyterLab, VS Code
and an HTML export alike, then the lab that builds on it; no measured number typed into
prose. A cell that raises fails its notebook's test, and so does a solution: the tests
run them after the notebook's cells.
"""

import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT = 120  # seconds; the slowest cell (loading the model, a sweep) takes a few
# the only measured numbers prose may type: the paper's (KV memory used by earlier
# systems, waste with paging, memory saved by sharing), and the kernel figures the
# notebooks compare against (fraction of peak bandwidth reached by FlashInfer and vLLM
# on an H100, an H200's 4.8 TB/s)
PAPER_NUMBERS = {
    "20.4%",
    "38.2%",
    "4%",
    "6.1%",
    "9.8%",
    "16.2%",
    "30.5%",
    "37.6%",
    "55.2%",
    "44.3%",
    "66.3%",
    "88%",
    "85%",
    "28%",
    "4.8",
    "96.3%",
    "1.7",
    "2.7",
}  # notebook 7: vLLM's token-state share, its rate over Orca (Oracle)
# a solution: a markdown cell holding one folded block of Python, and nothing else
SOLUTION = re.compile(
    r"<details><summary>Solution"
    r" (\d+)</summary>\n\n```python\n(.+?)\n```\n\n</details>",
    re.S,
)


def read(path: Path):
    return nbformat.read(path, as_version=4)


def solutions(nb) -> list[str]:
    """The code of each folded solution, in order."""
    return [
        m.group(2)
        for c in nb.cells
        if c.cell_type == "markdown"
        for m in [SOLUTION.fullmatch(c.source)]
        if m
    ]


@pytest.fixture(scope="session")
def kernel_name() -> str:
    """'python3', made to run this interpreter. ipykernel installs that spec into
    sys.prefix with argv[0] 'python', which jupyter_client replaces by sys.executable.
    If it is missing, or a spec that names another interpreter wins, install ipykernel's
    into sys.prefix (searched first inside a virtual environment); the run below checks
    where the kernel really ran.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        program = KernelSpecManager().get_kernel_spec("python3").argv[0]
    except NoSuchKernel:
        program = None
    major, minor = sys.version_info[:2]
    if program not in (
        "python",
        f"python{major}",
        f"python{major}.{minor}",
        sys.executable,
    ):
        from ipykernel.kernelspec import install

        install(kernel_name="python3", prefix=sys.prefix)
    return "python3"


def execute(nb, kernel_name: str, cwd: Path) -> None:
    """Run every cell in a fresh kernel started in `cwd`; CellExecutionError if one
    raises."""
    NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(cwd)}},
    ).execute()


@pytest.mark.slow  # runs each notebook, most of them with the real SmolLM2
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_and_its_solutions_run_without_a_warning(path, kernel_name):
    nb = read(path)
    nb.cells.insert(
        0,
        nbformat.v4.new_code_cell(
            "import os, sys\nprint(sys.prefix)\nprint(os.getcwd())"
        ),
    )
    nb.cells += [nbformat.v4.new_code_cell(code) for code in solutions(nb)]
    execute(nb, kernel_name, path.parent)
    prefix, cwd = nb.cells[0].outputs[0].text.split()
    assert prefix == sys.prefix, (
        f"the kernel ran {prefix}'s Python, not this one ({sys.prefix})"
    )
    assert Path(cwd) == path.parent
    stderr = [
        (i, out.text)
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.output_type == "stream" and out.name == "stderr"
    ]
    warned = [(i - 1, text) for i, text in stderr if re.search(r"warn", text, re.I)]
    assert not warned, f"cells (counted from 0) print warnings: {warned}"


def test_a_cell_that_raises_fails_the_run(kernel_name, tmp_path):
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("x = 1"),
            nbformat.v4.new_code_cell("raise ValueError('stale claim')"),
        ]
    )
    with pytest.raises(CellExecutionError, match="stale claim"):
        execute(nb, kernel_name, tmp_path)


def test_notebooks_are_numbered_in_reading_order():
    numbers = [
        int(p.name[:2]) for p in NOTEBOOKS if re.match(r"\d\d_\w+\.ipynb$", p.name)
    ]
    assert len(numbers) == len(NOTEBOOKS) >= 2, [p.name for p in NOTEBOOKS]
    assert numbers == list(range(1, len(NOTEBOOKS) + 1))


def test_every_notebook_is_a_python_file_paired_with_its_ipynb():
    scripts = sorted((ROOT / "notebooks").glob("*.py"))
    assert [p.stem for p in scripts] == [p.stem for p in NOTEBOOKS], (
        "each .ipynb has its .py, and no .py is alone"
    )
    for path in NOTEBOOKS:
        assert (
            read(path).metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent"
        ), path.name
        assert (
            jupytext.read(path.with_suffix(".py")).metadata["jupytext"]["formats"]
            == "ipynb,py:percent"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_python_file_and_notebook_have_the_same_cells(path):
    """Edit either one (JupyterLab with jupytext saves both); `jupytext --sync` brings
    the other up to date from the one changed last."""
    script = path.with_suffix(".py")
    in_script = [(c.cell_type, c.source) for c in jupytext.read(script).cells]
    in_notebook = [(c.cell_type, c.source) for c in read(path).cells]
    differ = next(
        (i for i, (a, b) in enumerate(zip(in_script, in_notebook)) if a != b),
        (
            None
            if len(in_script) == len(in_notebook)
            else min(len(in_script), len(in_notebook))
        ),
    )
    assert differ is None, (
        f"notebooks/{script.name} and {path.name} differ from cell {differ} on: run"
        f" `.venv/bin/jupytext --sync notebooks/{script.name}` (the file changed last"
        " wins)"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_python_file_is_plain_python(path):
    """The code cells are code, not strings: the file compiles, and no docstring is
    escaped."""
    text = path.with_suffix(".py").read_text()
    compile(text, str(path.with_suffix(".py")), "exec")
    assert '\\"\\"\\"' not in text and "\\\\n" not in text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_with_the_outputs_of_one_run_top_to_bottom(path):
    """`make notebooks` stores what a reader sees without running anything: every code
    cell ran once, in order, in one fresh kernel, none raised, and no timing metadata is
    kept (a rerun changes only measured numbers). The .py pair holds the cells; outputs
    live here only.
    """
    code = [cell for cell in read(path).cells if cell.cell_type == "code"]
    counts = [cell.execution_count for cell in code]
    assert counts == list(range(1, len(code) + 1)), (
        f"{path.name} is not stored as one run top to bottom (execution counts"
        f" {counts}): run `make notebooks NOTEBOOKS={path.relative_to(ROOT)}`"
    )
    errors = [
        i
        for i, cell in enumerate(code)
        for out in cell.outputs
        if out.output_type == "error"
    ]
    assert not errors, f"code cells {errors} of {path.name} stored an error"
    assert not any("execution" in cell.metadata for cell in code), (
        "timing metadata: run `make notebooks`"
    )
    assert any(cell.outputs for cell in code), f"{path.name} stores no output at all"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_opens_with_what_you_will_see(path):
    first = read(path).cells[0]
    assert first.cell_type == "markdown" and first.source.startswith(
        f"# {int(path.name[:2])}. "
    )
    assert "**What you will see**" in first.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_ends_with_exercises_whose_solutions_are_folded(path):
    nb = read(path)
    cells = nb.cells
    heading = [
        i
        for i, c in enumerate(cells)
        if c.cell_type == "markdown" and c.source.startswith("## Exercises")
    ]
    assert len(heading) == 1, (
        "one '## Exercises' section, at the end (before a notebook's lab)"
    )
    tail = cells[heading[0] + 1 :]
    # the lab that follows the exercises
    if tail and tail[-1].source.startswith("## Lab"):
        tail = tail[:-1]
    assert len(tail) in (4, 6), "two or three exercises, each followed by its solution"
    for n, (question, solution) in enumerate(zip(tail[::2], tail[1::2]), start=1):
        assert question.cell_type == "markdown" and question.source.startswith(
            f"**Exercise {n}.**"
        )
        match = SOLUTION.fullmatch(solution.source)
        assert (
            solution.cell_type == "markdown" and match and match.group(1) == str(n)
        ), (
            f"the cell after exercise {n} must be only its folded solution: "
            f"<details><summary>Solution {n}</summary>, a ```python block, </details>"
        )
        assert "```" not in match.group(2) and "<details" not in match.group(2)
    assert len(solutions(nb)) == len(tail) // 2, (
        "no folded solution outside the exercises"
    )
    tagged = [
        i
        for i, c in enumerate(cells)
        if c.metadata.get("jupyter") or c.metadata.get("tags")
    ]
    assert not tagged, (
        f"cells {tagged} are hidden or tagged (raises-exception?): nothing is hidden by"
        " metadata"
    )


LABS_OF = {
    "02_page_tables": [1],
    "03_kernel": [5],
    "04_sharing": [2, 3],
    "05_batching": [4],
    "08_speculative": [9],
    "09_replacement": [6],
    "10_thrashing": [8],
    "11_scheduling": [7],
    "12_drum": [12],
    "14_fair_queuing": [10],
    "15_compressed_memory": [11],
    "16_automata": [14],
    "17_routing": [13],
}


def test_each_lab_closes_the_notebook_it_builds_on():
    """The notebook ends with a '## Lab' cell that quotes the lab's starter and check
    command; every lab of minipaged.lab has its notebook."""
    from minipaged.tools.lab.labs import LABS

    assert sorted(n for labs in LABS_OF.values() for n in labs) == sorted(LABS)
    for path in NOTEBOOKS:
        last = read(path).cells[-1]
        if path.stem not in LABS_OF:
            assert not last.source.startswith("## Lab"), path.name
            continue
        assert last.cell_type == "markdown" and last.source.startswith("## Lab"), (
            path.name
        )
        for n in LABS_OF[path.stem]:
            starter = LABS[n].starter
            mine = re.search(rf"cp labs/{re.escape(starter)} (\S+)", last.source)
            assert mine and (ROOT / "labs" / starter).exists(), (path.name, starter)
            assert f"python -m minipaged.lab check {n} {mine.group(1)}" in last.source
            assert f"(about {LABS[n].minutes} minutes)" in last.source
        assert "(../labs/README.md)" in last.source


class Folds(HTMLParser):
    """The text of a page, split into what sits inside <details> elements and what is
    shown."""

    def __init__(self):
        super().__init__()
        self.depth, self.folded, self.shown, self.opened = 0, [], [], 0

    def handle_starttag(self, tag, attrs):
        if tag == "details":
            self.depth += 1
            self.opened += "open" in dict(attrs)

    def handle_endtag(self, tag):
        if tag == "details":
            self.depth -= 1

    def handle_data(self, data):
        (self.folded if self.depth else self.shown).append(data)


def words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_html_export_keeps_the_solutions_folded(path):
    """`jupyter nbconvert --to html` shows each solution's code only inside a closed
    <details>."""
    from nbconvert import HTMLExporter

    nb = read(path)
    page = Folds()
    page.feed(HTMLExporter().from_notebook_node(nb)[0])
    folded, shown = words("".join(page.folded)), words("".join(page.shown))
    assert page.depth == 0 and page.opened == 0
    for n, code in enumerate(solutions(nb), start=1):
        assert words(code) in folded, f"solution {n} is not inside a <details> element"
        assert words(code) not in shown, f"solution {n} is shown expanded"
    # the rest is shown
    assert words(nb.cells[0].source.splitlines()[0].lstrip("# ")) in shown


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_types_no_measured_number(path):
    """Percentages and decimals in markdown are the paper's; minipaged's numbers come
    from cells. (A folded solution's code may hold any number: it is code.)"""
    for i, cell in enumerate(read(path).cells):
        if cell.cell_type == "markdown":
            prose = re.sub(r"```.*?```", "", cell.source, flags=re.S)
            typed = set(re.findall(r"\d+\.\d+%?|\d+%", prose)) - PAPER_NUMBERS
            assert not typed, (
                f"cell {i} types {sorted(typed)}: print it from a cell, "
                "e.g. display(Markdown(f'...')), so it cannot go stale"
            )
