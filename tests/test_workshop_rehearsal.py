"""docs/workshop.md rehearsed as typed: every command of its ```sh blocks, and the ones
its prose and note 16 give the lecturer, run, or checked by the program that would run
it where running installs or takes minutes (issue 42).

Run: the attendees' clone and a script of their own saved beside it; the chat's pipe;
the lecturer's server (on 127.0.0.1 and a free port instead of 0.0.0.0:8000), the curl
that checks the connection, the room's client script, several requests at once from one
attendee, note 16's curl, and the static server's pool; where vllm-router is installed,
the "Three laptops" section on one machine (three replicas, the cache_aware router, the
script through it). Checked, not run: `make setup`, `make notebook(s)` and `make test`
(`make -n`; make test's pytest line by pytest itself), the GPU block (the extra exists,
the script parses), and every option the "Three laptops" section gives vllm-router (its
--help) or the server (its parser). Each `make` runs with `-o .venv/.installed`:
installing is `make setup`'s step, and here it would rewrite the .venv the other tests
run in.
"""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from minipaged.tools import chat
from minipaged.tools.bench import cli as bench_cli
from minipaged.tools.serve import cli as serve_cli

ROOT = Path(__file__).resolve().parent.parent
WORKSHOP = ROOT / "docs" / "workshop.md"
NOTE_16 = ROOT / "docs" / "16_automata.md"
ROUTER = ROOT / ".venv" / "bin" / "vllm-router"
NO_INSTALL = ["-o", ".venv/.installed"]
NUMBERS = {"one": 1, "seven": 7, "eleven": 11}


def shell_commands(text: str) -> list[tuple[str, str]]:
    """(section, command) for each command of the text's ```sh blocks, as a shell reads
    them: a line ending in a backslash or inside an open quote goes on, and a comment
    ("  # ...") is cut."""
    commands, section = [], ""
    parts = re.split(r"^(## [^\n]*|```sh\n.*?^```)$", text, flags=re.S | re.M)
    for part in parts:
        if part.startswith("## "):
            section = part[3:].strip()
        elif part.startswith("```sh"):
            pending = ""
            for line in part.splitlines()[1:-1]:
                pending += line.split("  #")[0].rstrip() + "\n"
                if pending.endswith("\\\n") or not complete(pending):
                    continue
                commands.append((section, pending.replace("\\\n", "").strip()))
                pending = ""
            assert not pending, f"an unfinished command in a ```sh block: {pending!r}"
    return [(s, c) for s, c in commands if c]


def complete(command: str) -> bool:
    try:
        shlex.split(command)
    except ValueError:  # an open quote: the command goes on on the next line
        return False
    return True


COMMANDS = shell_commands(WORKSHOP.read_text())
THREE_LAPTOPS = [c for s, c in COMMANDS if s.startswith("Three laptops")]

# How each command is rehearsed: run by the test named, or checked without running.
REHEARSALS = {
    r"git clone <this repository> (\S+) && cd \1": "run: the attendees' clone",
    r"make (setup|notebooks?|test)": "checked: make -n (installs, or runs for minutes)",
    r'echo "[^"]+" \| make chat': "run: the chat's pipe",
    r'make serve ARGS="[^"]*"': "run: the room, the static demo; parsed elsewhere",
    r"(\.venv/bin/)?pip install .*": "checked: an extra it names exists",
    r"(\w+=\S+ )?bash scripts/[\w.]+\.sh": "checked: bash -n (needs a GPU)",
    r"(\S*/)?vllm-router .*": "run (cache_aware); every option in vllm-router --help",
    r"(\S*python )?-m minipaged\.\w+ .*": "run (a replica); every one parsed",
    r"curl .*": "checked: the shell reads it (the room's curl of the prose is run)",
}


def how(command: str) -> str | None:
    for pattern, rehearsal in REHEARSALS.items():
        if re.fullmatch(pattern, command):
            return rehearsal
    return None


def test_every_command_of_the_workshop_is_rehearsed():
    """A command added to docs/workshop.md needs its line in REHEARSALS."""
    assert len(COMMANDS) >= 8, COMMANDS
    unknown = [c for _, c in COMMANDS if how(c) is None]
    assert not unknown, f"commands this test does not rehearse: {unknown}"


def make(*words: str, **options) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", *NO_INSTALL, *words],
        cwd=ROOT,
        capture_output=True,
        text=True,
        **options,
    )


PARSERS = {
    "chat": chat.parse_args,
    "serve": serve_cli.build_parser().parse_args,
    "bench": bench_cli.build_parser().parse_args,
}


def parses(program: str, args: list[str]) -> None:
    try:
        PARSERS[program](args)
    except SystemExit as stop:
        assert stop.code == 0, f"{program} refuses {shlex.join(args)}"


def test_the_steps_not_run_are_make_targets_extras_and_scripts_that_exist():
    """`make setup`, `make notebook`, the lecturer's `make notebooks`, `make test`: each
    a target whose recipe make can lay out; every ARGS given to make parses; the GPU
    block's extra is in pyproject.toml and its script is valid bash."""
    # pyproject.toml's extras, one a line (no tomllib on Python 3.10)
    extras = re.findall(r"^([\w-]+) = \[", (ROOT / "pyproject.toml").read_text(), re.M)
    prose = re.findall(r"`(make [a-z-]+)`", WORKSHOP.read_text())
    assert "make notebooks" in prose  # the lecturer's preparation, after make setup
    for command in [c for _, c in COMMANDS] + prose:
        words = shlex.split(command)
        if words[0] == "make":
            dry_run = subprocess.run(
                ["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True
            )
            assert dry_run.returncode == 0, f"{command}: {dry_run.stderr}"
            given = [w[len("ARGS=") :] for w in words if w.startswith("ARGS=")]
            if given and words[1] in PARSERS:
                parses(words[1], shlex.split(given[0]))
        elif extra := re.search(r"'\.\[(\w+)\]'", command):
            assert extra[1] in extras, f"{command}: no extra {extra[1]!r}"
        elif script := re.search(r"bash (scripts/\S+)", command):
            syntax = subprocess.run(["bash", "-n", ROOT / script[1]], text=True)
            assert syntax.returncode == 0, command
    # the time it states is the Makefile's and the README's
    stated = re.search(
        r"`make test` runs .*?\(about (\d+) minutes", WORKSHOP.read_text()
    )
    assert stated, "docs/workshop.md says how long make test takes"
    minutes = f"about {stated[1]} minutes"
    assert minutes in (ROOT / "Makefile").read_text(), minutes
    assert minutes in (ROOT / "README.md").read_text(), minutes


def test_make_tests_pytest_line_is_one_pytest_accepts_and_names_failures_early():
    """`make test` on a busy machine once lost two failures' names (a run cut short
    never reached pytest's summary): its recipe's pytest line prints each failure as it
    happens (--instafail) and lists them at the end (-rf), and pytest takes every option
    of it (a collection of one file, here)."""
    recipe = make("-n", "-o", ".venv/.installed-test", "test").stdout
    (line,) = [x for x in recipe.splitlines() if " -m pytest " in x]
    words = shlex.split(line)
    assert "--instafail" in words and "-rf" in words, line
    collected = subprocess.run(
        [*words, "--collect-only", "tests/test_note_numbers.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr


def test_the_attendees_clone_and_a_script_saved_beside_it(tmp_path):
    """The clone as typed (this repository for <this repository>), then a script of an
    attendee's own in the folder above it: `from minipaged import LLM` finds the
    package. Beside a folder named `minipaged` it would not (the note under the block
    says so), which this checks too."""
    (clone,) = [c for _, c in COMMANDS if c.startswith("git clone")]
    typed = clone.replace("<this repository>", shlex.quote(str(ROOT)))
    done = subprocess.run(
        ["bash", "-c", f"{typed} && git log -1 --format=%H"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    script = tmp_path / "mine.py"
    script.write_text("from minipaged import LLM\nprint(LLM.__name__)\n")
    ran = subprocess.run(
        [sys.executable, script.name], cwd=tmp_path, capture_output=True, text=True
    )
    assert ran.returncode == 0 and ran.stdout == "LLM\n", ran.stderr
    (tmp_path / "minipaged").mkdir()
    shadowed = subprocess.run(
        [sys.executable, script.name], cwd=tmp_path, capture_output=True, text=True
    )
    # an editable install of setuptools' (make setup's) finds the package after the
    # folders of sys.path, so the folder wins; an install that puts the repository on
    # sys.path would not be shadowed
    said = "cannot import name 'LLM' from 'minipaged'"
    assert shadowed.returncode == 0 or said in shadowed.stderr, shadowed.stderr
    assert said in WORKSHOP.read_text()
    assert "minipaged" not in re.findall(r"cd (\S+)", clone), clone


@pytest.mark.slow
def test_the_chats_pipe_answers_through_make():
    (typed,) = [c for _, c in COMMANDS if c.endswith("| make chat")]
    done = subprocess.run(
        ["bash", "-c", typed.replace("make chat", "make -o .venv/.installed chat")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer = done.stdout.split("minipaged.chat", 1)[-1]
    assert len(answer.split()) >= 5, done.stdout


# ---- the room: the lecturer's servers, run as typed ----------------------------------


URL_PRINTED = r"API \(OpenAI\):\s+(http://127\.0\.0\.1:\d+)/v1"


def here(args: list[str], port: int = 0) -> list[str]:
    """A room command's options, on 127.0.0.1 and `port` (0: a free one) instead of the
    --host and --port it gives."""
    kept, value = [], False
    for arg in args:
        if not value and arg not in ("--host", "--port"):
            kept.append(arg)
        value = arg in ("--host", "--port")
    return [*kept, "--host", "127.0.0.1", "--port", str(port)]


class Server:
    """A command of the doc's, in a process group of its own (make and the server, say),
    stopped by its id; `url` is the address it prints (the pattern's group)."""

    def __init__(self, argv: list[str], ready: str | None = URL_PRINTED):
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={k: v for k, v in os.environ.items() if k != "MINIPAGED_API_KEY"},
        )
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self._wait_for(ready) if ready else None

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    def _wait_for(self, pattern: str, seconds: float = 300) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = re.search(pattern, "".join(self.lines))
            if found:
                return found[1]
            assert self.process.poll() is None, "".join(self.lines)[-3000:]
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} in:\n{''.join(self.lines)}")

    def printed(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def make_serve(command: str) -> Server:
    """`make serve ARGS=...` from the doc, on 127.0.0.1 and a free port."""
    args = shlex.split(re.fullmatch(r'make serve ARGS="([^"]*)"', command)[1])
    return Server(["make", *NO_INSTALL, "serve", f"ARGS={shlex.join(here(args))}"])


def serve_commands() -> list[str]:
    before = [c for s, c in COMMANDS if not s.startswith("Three laptops")]
    return [c for c in before if c.startswith("make serve")]


def curl(typed: str, url: str) -> dict:
    """A curl of the docs, as typed, against url instead of HOST:8000 or
    localhost:8000."""
    for host in ("http://HOST:8000", "localhost:8000"):
        typed = typed.replace(host, url)
    done = subprocess.run(
        ["bash", "-c", typed + " -s -w '\\n%{http_code}'"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    body, status = done.stdout.rsplit("\n", 1)
    assert status == "200", f"{typed}: {status} {body}"
    return json.loads(body)


def workshop_script() -> str:
    (script,) = [
        block
        for block in re.findall(
            r"^```python\n(.*?)^```", WORKSHOP.read_text(), re.S | re.M
        )
        if "OpenAI(" in block
    ]
    return script


@pytest.mark.slow
def test_the_room_as_the_lecturer_and_the_attendees_type_it(capsys):
    """The lecturer's server with the room's options, then what everyone types: the
    connection's curl, the client script, several requests at once from one attendee
    (streamed and n=3: with the server's defaults none is refused, and the client is
    told not to retry, so a 429 would show), and note 16's curl."""
    from openai import OpenAI

    server = make_serve(serve_commands()[0])
    try:
        printed = server.printed()
        assert "96 KV frames of 16 tokens" in printed, printed
        assert "dashboard:" in printed and "metrics:" in printed, printed
        (check,) = re.findall(
            r"`(curl http://HOST:8000/v1/models [^`]+)`", WORKSHOP.read_text()
        )
        models = curl(check, server.url)
        assert models["data"][0]["id"], models

        names: dict = {}
        exec(workshop_script().replace("http://HOST:8000", server.url), names)
        answer = names["answer"]
        assert capsys.readouterr().out == answer.choices[0].message.content + "\n"
        assert 1 <= answer.usage.completion_tokens <= 200, answer.usage
        # "room for about seven 200-token answers at once" in 96 frames of 16
        text = " ".join(WORKSHOP.read_text().split())
        about = re.search(r"room for about (\w+) 200-token answers at once", text)
        frames = -(-(answer.usage.prompt_tokens + 200) // 16)
        assert abs(96 // frames - NUMBERS[about[1]]) <= 1, (about[0], frames)
        # "a request without `max_tokens` gets 256 tokens"
        default = re.search(r"a request without `max_tokens` gets (\d+) tokens", text)
        assert f"({default[1]} if a chat gives no max_tokens)" in printed, printed

        client = OpenAI(base_url=server.url + "/v1", api_key="room42", max_retries=0)
        model = client.models.list().data[0].id
        ask = {
            "model": model,
            "messages": [{"role": "user", "content": "What is a page table?"}],
            "max_tokens": 24,
            "temperature": 0.7,
        }

        def streamed(_) -> int:
            chunks = client.chat.completions.create(**ask, stream=True)
            return sum(1 for c in chunks if c.choices and c.choices[0].delta.content)

        with ThreadPoolExecutor(4) as pool:
            streams = [pool.submit(streamed, i) for i in range(3)]
            three = pool.submit(client.chat.completions.create, **ask, n=3)
            assert all(s.result(timeout=600) >= 1 for s in streams)
            assert len(three.result(timeout=600).choices) == 3

        (date,) = [c for _, c in shell_commands(NOTE_16.read_text()) if "curl" in c]
        held = curl(date, server.url)
        text = held["choices"][0]["message"]["content"]
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", text), text
    finally:
        server.stop()


@pytest.mark.slow
def test_the_static_demo_holds_the_requests_the_doc_says():
    """The restart for static batching: the pool it prints, in regions of
    --max-model-len slots, holds as many requests as the text says (issue 42: it kept
    --num-blocks 96 and held one)."""
    static = serve_commands()[1]
    assert "--scheduler static" in static and "--num-blocks" not in static
    text = " ".join(WORKSHOP.read_text().split())
    said = re.search(
        r'prints "(\d+ KV frames of (\d+) tokens)", (\w+) requests at once.*?'
        r"96 frames of 16 tokens would make (\w+) region",
        text,
    )
    assert said, "docs/workshop.md says what the static server prints"
    server = make_serve(static)
    try:
        printed = server.printed()
    finally:
        server.stop()
    assert f"{said[1]}, max_model_len {said[2]}, static batching" in printed, printed
    assert int(said[1].split()[0]) == NUMBERS[said[3]]
    assert 96 * 16 // int(said[2]) == NUMBERS[said[4]]


# ---- three laptops: the router in front of replicas ---------------------------------


@pytest.mark.skipif(
    not THREE_LAPTOPS, reason="docs/workshop.md has no Three laptops section"
)
@pytest.mark.skipif(
    not ROUTER.exists(),
    reason="vllm-router is not installed (make test installs it on Linux)",
)
def test_the_three_laptops_commands_name_options_that_exist():
    """Each vllm-router option the section types is one its --help lists; each
    minipaged command of the section parses."""
    help_text = subprocess.run(
        [ROUTER, "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    for command in THREE_LAPTOPS:
        words = shlex.split(command)
        if any(w.endswith("vllm-router") for w in words):
            for option in [w.split("=")[0] for w in words if w.startswith("--")]:
                assert re.search(rf"\[{re.escape(option)}\b", help_text), (
                    f"{command}: vllm-router has no {option}"
                )
        elif words[0] == "make" and words[1] in PARSERS:
            given = [w[len("ARGS=") :] for w in words if w.startswith("ARGS=")]
            parses(words[1], shlex.split(given[0]) if given else [])
        elif "-m" in words:
            program = words[words.index("-m") + 1].removeprefix("minipaged.")
            parses(program, words[words.index("-m") + 2 :])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.skipif(
    not THREE_LAPTOPS, reason="docs/workshop.md has no Three laptops section"
)
@pytest.mark.skipif(
    not ROUTER.exists(),
    reason="vllm-router is not installed (make test installs it on Linux)",
)
def test_three_laptops_on_one_machine_as_the_section_says(capsys):
    """The section's replica command three times and its cache_aware router in front,
    on one machine as its last paragraph says (ports of their own, 127.0.0.1 for
    LAPTOP1-3); the room's client script through the router, twice, and the section's
    curl of a replica's prefix-cache metrics."""
    (replica,) = {c for c in THREE_LAPTOPS if c.endswith("--served-model-name smollm2")}
    (router,) = [c for c in THREE_LAPTOPS if "--policy cache_aware" in c]
    words = shlex.split(replica)
    at = words.index("minipaged.serve") + 1
    replicas = [Server([*words[:at], *here(words[at:])]) for _ in range(3)]
    running = list(replicas)
    try:
        for i, r in enumerate(replicas, 1):
            router = router.replace(f"http://LAPTOP{i}:8000", r.url)
        port = free_port()
        words = shlex.split(router)
        running.append(Server([words[0], *here(words[1:], port)], ready=None))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the router waits for every replica
            try:
                if curl_status(f"{url}/v1/models", "room42") == "200":
                    break
            except subprocess.TimeoutExpired:
                pass
            assert running[-1].process.poll() is None, running[-1].printed()
            time.sleep(1)
        for _ in range(2):
            names: dict = {}
            exec(workshop_script().replace("http://HOST:8000", url), names)
            answer = names["answer"]
            assert capsys.readouterr().out == answer.choices[0].message.content + "\n"
        (metrics,) = re.findall(
            r"`(curl -s http://LAPTOP1:8000/metrics \| grep prefix_cache_)`",
            " ".join(WORKSHOP.read_text().split()),
        )
        shown = subprocess.run(
            ["bash", "-c", metrics.replace("http://LAPTOP1:8000", replicas[0].url)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "minipaged:prefix_cache_queries" in shown.stdout, shown.stdout
    finally:
        for server in running:
            server.stop()


def curl_status(url: str, key: str) -> str:
    done = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url]
        + ["-H", f"Authorization: Bearer {key}"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    return done.stdout
