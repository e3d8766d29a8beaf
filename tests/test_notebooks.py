"""Every notebook runs top to bottom on the CPU as stored, and keeps the house conventions:
no stored outputs, an opening "What you will see", closing exercises with hidden solutions,
no measured number typed into prose, and exactly what scripts/build_notebooks.py writes.
A cell that raises fails its notebook's test (solutions included: they run too)."""

import importlib.util
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT = 120  # seconds; the slowest cell (loading the model, a sweep) takes a few
# the only measured numbers prose may type: the paper's (KV memory used by earlier systems, waste
# with paging, memory saved by sharing), and the kernel figures the notebooks compare against
# (fraction of peak bandwidth reached by FlashInfer and vLLM on an H100, an H200's 4.8 TB/s)
PAPER_NUMBERS = {"20.4%", "38.2%", "4%",
                 "6.1%", "9.8%", "16.2%", "30.5%", "37.6%", "55.2%", "44.3%", "66.3%",
                 "88%", "85%", "28%", "4.8"}


def read(path: Path):
    return nbformat.read(path, as_version=4)


@pytest.fixture(scope="session")
def kernel_name() -> str:
    """'python3', made to run this interpreter. ipykernel installs that spec into sys.prefix with
    argv[0] 'python', which jupyter_client replaces by sys.executable. If it is missing, or a
    spec that names another interpreter wins, install ipykernel's into sys.prefix (searched
    first inside a virtual environment); the run below checks where the kernel really ran."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    try:
        program = KernelSpecManager().get_kernel_spec("python3").argv[0]
    except NoSuchKernel:
        program = None
    major, minor = sys.version_info[:2]
    if program not in ("python", f"python{major}", f"python{major}.{minor}", sys.executable):
        from ipykernel.kernelspec import install
        install(kernel_name="python3", prefix=sys.prefix)
    return "python3"


def execute(nb, kernel_name: str, cwd: Path) -> None:
    """Run every cell in a fresh kernel started in `cwd`; CellExecutionError if one raises."""
    NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name=kernel_name,
                   resources={"metadata": {"path": str(cwd)}}).execute()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, kernel_name):
    nb = read(path)
    nb.cells.insert(0, nbformat.v4.new_code_cell("import os, sys\nprint(sys.prefix)\nprint(os.getcwd())"))
    execute(nb, kernel_name, path.parent)
    prefix, cwd = nb.cells[0].outputs[0].text.split()
    assert prefix == sys.prefix, f"the kernel ran {prefix}'s Python, not this one ({sys.prefix})"
    assert Path(cwd) == path.parent


def test_a_cell_that_raises_fails_the_run(kernel_name, tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"),
                                         nbformat.v4.new_code_cell("raise ValueError('stale claim')")])
    with pytest.raises(CellExecutionError, match="stale claim"):
        execute(nb, kernel_name, tmp_path)


def test_notebooks_are_numbered_in_reading_order():
    numbers = [int(p.name[:2]) for p in NOTEBOOKS if re.match(r"\d\d_\w+\.ipynb$", p.name)]
    assert len(numbers) == len(NOTEBOOKS) >= 2, [p.name for p in NOTEBOOKS]
    assert numbers == list(range(1, len(NOTEBOOKS) + 1))


def test_notebooks_are_what_build_notebooks_writes():
    spec = importlib.util.spec_from_file_location("build_notebooks", ROOT / "scripts" / "build_notebooks.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    built = builder.build()
    assert sorted(built) == [p.stem for p in NOTEBOOKS]
    for name, nb in built.items():
        assert read(ROOT / "notebooks" / f"{name}.ipynb") == nb, (
            f"notebooks/{name}.ipynb is not what scripts/build_notebooks.py writes: edit the script, "
            "then run `python scripts/build_notebooks.py`")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    for i, cell in enumerate(read(path).cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"cell {i} stores its output"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_opens_with_what_you_will_see(path):
    first = read(path).cells[0]
    assert first.cell_type == "markdown" and first.source.startswith(f"# {int(path.name[:2])}. ")
    assert "**What you will see**" in first.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_ends_with_exercises_whose_solutions_are_hidden(path):
    cells = read(path).cells
    heading = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("## Exercises")]
    assert len(heading) == 1, "one '## Exercises' section, at the end"
    tail = cells[heading[0] + 1:]
    assert len(tail) in (4, 6), "two or three exercises, each followed by its solution"
    for n, (question, solution) in enumerate(zip(tail[::2], tail[1::2]), start=1):
        assert question.cell_type == "markdown" and question.source.startswith(f"**Exercise {n}.**")
        assert solution.cell_type == "code" and solution.metadata.get("tags") == ["solution"]
        assert solution.metadata.get("jupyter") == {"source_hidden": True, "outputs_hidden": True}
    hidden_elsewhere = [i for i, c in enumerate(cells[:heading[0]]) if c.metadata.get("jupyter") or c.metadata.get("tags")]
    assert not hidden_elsewhere, f"cells {hidden_elsewhere} are hidden or tagged (raises-exception?) outside the exercises"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_types_no_measured_number(path):
    """Percentages and decimals in markdown are the paper's; minipaged's numbers come from cells."""
    for i, cell in enumerate(read(path).cells):
        if cell.cell_type == "markdown":
            typed = set(re.findall(r"\d+\.\d+%?|\d+%", cell.source)) - PAPER_NUMBERS
            assert not typed, (f"cell {i} types {sorted(typed)}: print it from a cell, "
                               "e.g. display(Markdown(f'...')), so it cannot go stale")
