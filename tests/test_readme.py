"""The README and the docs, run as written: a stated sample, bounded in time.

Every command line they quote (inline code or a line of a ```sh block) is checked: each
`python -m minipaged.chat|bench ...` is parsed by that command's own argument parser
(the benchmark and each option exist, each value parses), each `make <target>` is a
target of the Makefile (`make -n`), each `pytest <file>` names a test file. Run for
real, as the user would: every command's --help, `bench memory`, `bench kernel --json`
and a four-token decode. The benchmarks of minutes (throughput, sharing, decode at its
defaults) are parsed, not run; the chat's pipe example runs in tests/test_real_model.py.
The README's Python examples run in order in one interpreter, and each prints what its
comment says.
"""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from minipaged.backend import cuda_available
from minipaged.tools import chat, simulate
from minipaged.tools.bench import cli as bench_cli
from minipaged.tools.serve import cli as serve_cli

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("0*.md")),
    ROOT / "docs" / "workshop.md",
]


def quoted_commands(text: str) -> list[str]:
    """Command lines of a Markdown text: the lines of ```sh blocks (comments cut) and
    inline code spans that start like a command a reader would type."""
    lines = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M):
        lines += [line.split("  #")[0].strip() for line in block.splitlines()]
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    lines += re.findall(r"`([^`\n]+)`", prose)
    starts = ("python -m minipaged", "make ", "echo ", "pytest ", ".venv/bin/python -m")
    return [line for line in lines if line.startswith(starts)]


COMMANDS = sorted(
    {
        (doc.name, command)
        for doc in DOCUMENTS
        for command in quoted_commands(doc.read_text())
    }
)


def test_the_documents_quote_the_commands_a_newcomer_needs():
    commands = {command for _, command in COMMANDS}
    for needed in [
        "make chat",
        "make test",
        "make test-fast",
        "make notebook",
        "make setup",
        "python -m minipaged.bench memory",
        "python -m minipaged.chat --help",
    ]:
        assert needed in commands
    assert "source .venv/bin/activate" in (ROOT / "README.md").read_text()
    assert len(COMMANDS) >= 25


@pytest.mark.parametrize("document, command", COMMANDS)
def test_every_quoted_command_names_real_things(document, command):
    """Parsed by the program it names, without running it (see the module docstring)."""
    for part in command.split("|"):
        words = shlex.split(part.strip())
        if words[:1] == ["echo"]:
            continue
        if words[0] == "make":
            dry_run = subprocess.run(
                ["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True
            )
            assert dry_run.returncode == 0, dry_run.stderr
        elif "pytest" in words:
            assert all((ROOT / w).exists() for w in words if w.startswith("tests/")), (
                command
            )
        else:
            module, args = words[words.index("-m") + 1], words[words.index("-m") + 2 :]
            parse = {
                "minipaged.chat": chat.parse_args,
                "minipaged.bench": bench_cli.build_parser().parse_args,
                "minipaged.serve": serve_cli.build_parser().parse_args,
                "minipaged.simulate": simulate.build_parser().parse_args,
            }
            assert module in parse, f"{document} quotes {command!r}: no such command"
            try:
                parse[module](args)
            except (
                SystemExit
            ) as stop:  # --help exits 0; anything else is a bad command line
                assert stop.code == 0, f"{document}: {command!r} does not parse"


def run(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "command",
    [
        ["minipaged.chat"],
        ["minipaged.bench"],
        ["minipaged.serve"],
        *[["minipaged.bench", name] for name in bench_cli.COMMANDS],
    ],
)
def test_help_is_written_for_users(command):
    result = run(*command, "--help")
    assert result.returncode == 0 and result.stdout.startswith(
        "usage: python -m " + command[0]
    )
    description = result.stdout.split("\n\n")[1]
    assert not description.startswith("`") and "@command" not in result.stdout
    if command[1:]:  # one benchmark: what it measures, how long it takes, every default
        assert re.search(
            r"With the defaults it takes [^.]+\.$", " ".join(description.split())
        )
        options = re.findall(r"^  (--[\w-]+) [A-Z_{]", result.stdout, re.M)
        for option in options:
            assert re.search(
                rf"{option} .*?\(default[ :][^)]+\)", result.stdout, re.S
            ), option
    elif command == ["minipaged.bench"]:
        for name, (*_, takes) in bench_cli.COMMANDS.items():
            assert name in result.stdout and takes.split()[0] in result.stdout


def test_bench_memory_prints_its_table_and_json_alone_on_stdout():
    table, as_json = (
        run("minipaged.bench", "memory"),
        run("minipaged.bench", "memory", "--json"),
    )
    assert "utilization" in table.stdout and "vLLM paper" in table.stdout
    result = json.loads(as_json.stdout)
    assert result["paged"]["utilization"] > 0.9 > 0.5 > result["static"]["utilization"]


@pytest.mark.skipif(
    cuda_available(), reason="this machine has a GPU: the benchmark would run"
)
def test_bench_kernel_json_without_a_gpu_is_a_json_error():
    result = run("minipaged.bench", "kernel", "--json")
    assert result.returncode == 1
    error = json.loads(result.stdout)
    assert error["benchmark"] == "kernel" and "needs a CUDA device" in error["error"]


@pytest.mark.slow
def test_bench_decode_shows_progress_on_stderr_and_json_on_stdout():
    result = run(
        "minipaged.bench",
        "decode",
        "--batch",
        "2",
        "--tokens",
        "4",
        "--json",
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    decode = json.loads(result.stdout)
    assert (
        decode["batch"] == 2
        and decode["decode_steps"] == 3
        and decode["tokens_per_s"] > 0
    )
    assert decode["blas_threads"] >= 1
    assert "decode, batch 2: 100%" in result.stderr and "4/4" in result.stderr


# ---- the README's Python, in order ---------------------------------------------------


def readme_python() -> str:
    return "\n".join(
        re.findall(
            r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M
        )
    )


@pytest.mark.slow
def test_the_readme_examples_print_what_their_comments_say():
    code = readme_python()
    assert "llm.new_engine()" in code and "print(answer" in code
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    first, rest = out.split("\n4\n", 1)  # the generate text, then "4" (samples)
    assert first.lstrip().startswith("Paris.")
    talk, steps = rest.split("step 0: ", 1)  # the chat answer and the story; the steps
    answer, story = talk.split("\n", 1)
    assert answer.startswith(("Hello", "Hi")) and len(story.strip()) > 20
    assert story.endswith("\n")  # the story ended its line: steps start afresh
    numbers = [int(n) for n in re.findall(r"^step (\d+): ", "step 0: " + steps, re.M)]
    assert numbers == list(range(len(numbers))) and len(numbers) > 8
    assert (
        steps.startswith("2 prefill + 0 decode")
        and "finished r1" in steps
        and "finished r2" in steps
    )
