"""Issue 41: Ctrl-C in any `python -m minipaged ...` command ends it with one line on
stderr and exit code 130 (128 + SIGINT), never a KeyboardInterrupt traceback: each of
the five doors (minipaged/chat.py, serve.py, bench.py, lab.py, simulate.py) runs its
command inside minipaged.tools.door, and `python -m minipaged.lab check` does so even
while its grading child runs the participant's code."""

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from minipaged.tools.door import INTERRUPTED

ROOT = Path(__file__).resolve().parent.parent
# the door -> the module whose main() it runs
DOORS = {
    "chat": "minipaged.tools.chat",
    "serve": "minipaged.tools.serve.cli",
    "bench": "minipaged.tools.bench.cli",
    "lab": "minipaged.tools.lab.cli",
    "simulate": "minipaged.tools.simulate",
}
SAID = "stopped (Ctrl-C)"


def children(pid: int) -> list[int]:
    """The processes `pid` started, as Linux's /proc lists them (none elsewhere)."""
    listed = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in listed.read_text().split()] if listed.exists() else []


def assert_stopped_quietly(done_code: int, out: str, err: str) -> None:
    assert done_code == INTERRUPTED == 130, (done_code, out, err)
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, err
    assert err.strip().splitlines() == [SAID], err


@pytest.mark.parametrize("door", DOORS)
def test_each_door_ends_a_ctrl_c_with_one_line_and_code_130(door):
    """The command's main() gets SIGINT while it works (here: it sends itself one, then
    sleeps): the door answers it."""
    program = textwrap.dedent(
        f"""
        import os, runpy, signal, time
        import {DOORS[door]} as command

        def main():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)

        command.main = main
        runpy.run_module("minipaged.{door}", run_name="__main__", alter_sys=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert_stopped_quietly(done.returncode, done.stdout, done.stderr)


def test_ctrl_c_during_a_lab_check_stops_the_check_and_its_child_quietly(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: the checker and the child
    that grades. The participant's pick loops forever; once the check is in it, SIGINT
    to the group ends it at once with one line, and no traceback from either process."""
    cases = ROOT / "tests" / "lab_cases" / "lab7.py"
    namespace: dict = {}
    exec(cases.read_text(), namespace)
    looping = namespace["WRITTEN"].replace(
        namespace["BREAK_AT"],
        namespace["BREAK_AT"] + "        while True:\n            pass\n",
        1,
    )
    path = tmp_path / "my_aging.py"
    path.write_text(looping)
    check = subprocess.Popen(
        [sys.executable, "-m", "minipaged.lab", "check", "7", str(path), "--no-engine"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,  # its own process group, as a terminal's job
    )
    try:
        # the first property holds; the second runs their pick, which loops
        deadline, seen = time.monotonic() + 60, ""
        while "PASS" not in seen:
            assert time.monotonic() < deadline, f"no property checked: {seen!r}"
            ready, _, _ = select.select([check.stdout], [], [], 1)
            if ready:
                line = check.stdout.readline()
                assert line, f"the check ended early: {seen!r}"
                seen += line
        time.sleep(0.5)
        # the grading child alone first (where /proc lists it): it leaves Ctrl-C to
        # the parent, and nothing happens
        for child in children(check.pid):
            os.kill(child, signal.SIGINT)
        time.sleep(1)
        assert check.poll() is None
        started = time.monotonic()
        os.killpg(check.pid, signal.SIGINT)
        out, err = check.communicate(timeout=60)
    finally:
        if check.poll() is None:
            os.killpg(check.pid, signal.SIGKILL)
            check.wait()
    assert time.monotonic() - started < 30  # at once, not at the property's time limit
    assert_stopped_quietly(check.returncode, seen + out, err)
