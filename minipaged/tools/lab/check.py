"""`check`: grade a participant's lab file (or the engine's own code, --solution), then
let it serve the model. Their code runs in a child process under time limits, so that a
loop, a crash or a sys.exit in it ends the check with one sentence. Returns the exit
code: 0 passed, 1 failed.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import multiprocessing
import re
import signal
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from minipaged.tools.lab import delegation, kernel_props
from minipaged.tools.lab.engine_run import load_model, serve
from minipaged.tools.lab.grading import (
    NotLoadable,
    in_one_line,
    judged,
    load,
    say,
    signature_mismatches,
    wrong_kinds,
)
from minipaged.tools.lab.labs import LABS, Lab

# importing a file; compiling a kernel with the emulation's C++ compiler
LOAD_S = {
    ".py": 20,
    ".cu": 180,
}
MODEL_S, ENGINE_S = 120, 300  # loading the model; the two engine runs
GRACE_S = 5  # the child's own limits come first; the parent's after these seconds


def pieces_of(lab: Lab, path: Path | None):
    """The participant's pieces (their module, or their kernel built), or the engine's
    own."""
    if path is None:
        return lab.pieces()
    if lab.starter.endswith(".cu"):
        return kernel_props.load(path)
    module = load(path, list(lab.solution()))
    wrong = wrong_kinds(module, lab.solution())
    if wrong:
        raise NotLoadable(f"in {path.name}, {wrong[0]}")
    wrong = signature_mismatches(module, lab.solution())
    if wrong:
        raise NotLoadable(
            f"{path.name} changed a signature the engine calls: {wrong[0]}"
        )
    wrong = delegation.not_written(module, path, delegation.to_write(lab.starter_path))
    if wrong:
        raise NotLoadable(wrong)
    return module


@contextmanager
def graded_as_written(lab: Lab, path: Path | None):
    """While the block runs, the engine's own version of each piece the lab asks for
    raises Delegated when the participant's file calls it (none for --solution and the
    kernel lab)."""
    if path is None or lab.starter.endswith(".cu"):
        yield
        return
    pieces = delegation.to_write(lab.starter_path)
    with delegation.guarded(lab.number, lab.solution(), pieces, path):
        yield


def check(
    lab: Lab, path: Path | None, model: str | None, pictures: Path, engine: bool = True
) -> int:
    start = time.perf_counter()
    name = "the engine's own code (--solution)" if path is None else path.name
    say(f"lab {lab.number}, {lab.title}: checking {name}")
    code = supervise(lab, path, model, pictures, engine)
    if code == 0:
        say("", f"lab {lab.number} passed ({time.perf_counter() - start:.1f} s).")
    return code


# ---- the parent: start the child, wait for each step within its limit ----------------


def supervise(
    lab: Lab, path: Path | None, model: str | None, pictures: Path, engine: bool
) -> int:
    """Run `grade` in a fresh process; when it ends without a verdict (a loop past its
    limit, a crash, an exit), say in one sentence what it was doing and how it ended."""
    # the same on Linux, macOS and Windows
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    with tempfile.TemporaryDirectory(prefix="minipaged-lab-") as folder:
        trace = Path(folder) / "traceback.txt"
        child = context.Process(
            target=grade,
            args=(
                sender,
                lab.number,
                lab.seconds,
                path,
                model,
                pictures,
                engine,
                trace,
            ),
            daemon=True,
        )
        # Ctrl-C is the parent's to answer (its door says one line): the child starts
        # with SIGINT ignored, which its fresh interpreter keeps, so it prints no
        # KeyboardInterrupt of its own and ends with the parent (it is a daemon)
        answer = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            child.start()
        finally:
            signal.signal(signal.SIGINT, answer)
        sender.close()
        doing, limit = "loading your file", LOAD_S[lab.starter_path.suffix]
        deadline, timed_out = time.monotonic() + limit + GRACE_S, False
        while True:
            wait = deadline - time.monotonic()
            if wait <= 0:
                child.kill()
                timed_out = True
                break
            if not receiver.poll(min(wait, 0.5)):
                continue
            try:
                message = receiver.recv()
            except EOFError:  # the child is gone without its last word
                break
            if message[0] == "done":
                child.join(10)
                return message[1]
            _, doing, limit = message
            deadline = time.monotonic() + limit + GRACE_S
        child.join(10)
        text = trace.read_text(errors="replace") if trace.exists() else ""
    say(
        f"  FAIL  {doing}",
        f"        {how_it_ended(child.exitcode, text, path, limit, timed_out)}",
        "",
        "the check stopped there. Fix that first; stuck? python -m minipaged.lab hint"
        f" {lab.number}",
    )
    return 1


def how_it_ended(
    exitcode: int | None, trace: str, path: Path | None, limit: int, timed_out: bool
) -> str:
    """One sentence from the child's exit code and faulthandler's traceback (most recent
    call first)."""
    frames = re.findall(r'File "(.*)", line (\d+) in (\S+)', trace)
    theirs = [
        (Path(f).name, line, func)
        for f, line, func in frames
        if path is not None and Path(f).resolve() == path.resolve()
    ]
    kernel = path is not None and path.suffix == ".cu"
    who = (
        f"your {theirs[0][2]} ({theirs[0][0]} line {theirs[0][1]})"
        if theirs
        else "your kernel"
        if kernel
        else "your code"
    )
    if timed_out or "Timeout (" in trace:
        return f"{who} did not return within {limit} s: an endless loop?"
    if exitcode is not None and exitcode < 0:
        name = (
            signal.Signals(-exitcode).name
            if -exitcode in signal.valid_signals()
            else f"signal {-exitcode}"
        )
        why = {
            "SIGSEGV": ": it read or wrote memory it does not own",
            "SIGFPE": ": a division by zero?",
            "SIGABRT": ": it aborted",
            "SIGBUS": ": a misaligned or unmapped address",
        }.get(name, "")
        return f"{who} crashed the process ({name}{why})"
    return (
        f"{who} ended the process (exit code {exitcode}): a lab's code returns or"
        " raises, it never exits"
    )


# ---- the child: the check itself, each step announced with its limit -----------------


def grade(
    sender,
    number: int,
    seconds: int,
    path: Path | None,
    model: str | None,
    pictures: Path,
    engine: bool,
    trace: Path,
) -> None:
    """The whole check, in the child. Before each step it tells the parent what it does
    and for how long; faulthandler writes the traceback if the step outlives its limit
    (a loop in compiled code, which SIGALRM cannot stop) or the process crashes."""
    lab = dataclasses.replace(LABS[number], seconds=seconds)
    with open(trace, "w") as log:
        faulthandler.enable(log)

        def doing(what: str, seconds: int) -> None:
            sender.send(("doing", what, seconds))
            faulthandler.dump_traceback_later(seconds + 1, exit=True, file=log)

        try:
            code = run_check(lab, path, model, pictures, engine, doing)
        # not the participant's code (that is judged inside): the check's own
        except Exception as error:
            say(
                f"  the check itself failed: {in_one_line(error)}; this is minipaged's"
                " fault, not yours: please tell the lecturer"
            )
            code = 1
        faulthandler.cancel_dump_traceback_later()
        sender.send(("done", code))


def run_check(
    lab: Lab, path: Path | None, model: str | None, pictures: Path, engine: bool, doing
) -> int:
    doing("loading your file", LOAD_S[lab.starter_path.suffix])
    try:
        pieces = pieces_of(lab, path)
    except NotLoadable as error:
        say(f"  cannot check it: {error}")
        return 1
    with graded_as_written(lab, path):
        return judge_and_serve(lab, path, model, pictures, engine, doing, pieces)


def judge_and_serve(
    lab: Lab,
    path: Path | None,
    model: str | None,
    pictures: Path,
    engine: bool,
    doing,
    pieces,
) -> int:
    """Each property in turn, said as soon as it is known; then, when all hold, the
    model served with the participant's pieces."""
    verdicts = []
    for prop in lab.properties:
        doing(prop.sentence, lab.seconds)
        verdicts += judged([prop], pieces, path, lab.seconds)
        say(*verdicts[-1].lines())
        if verdicts[-1].fatal:
            say(
                "",
                "the check stopped there. Fix that first; stuck? python -m"
                f" minipaged.lab hint {lab.number}",
            )
            return 1
    failed = [v for v in verdicts if not v.holds]
    if failed:
        say(
            "",
            f"{len(failed)} of {len(verdicts)} properties fail. Fix the first one"
            f" first; stuck? python -m minipaged.lab hint {lab.number}",
        )
        return 1
    say("", f"all {len(verdicts)} properties hold.")
    if not engine:
        return 0
    doing("loading the model", MODEL_S)
    try:
        llm, model_line = load_model(model)
    except (OSError, ValueError) as error:  # no such folder, a broken checkpoint
        say(f"cannot load the model to serve your code: {str(error).splitlines()[0]}")
        return 1
    doing("serving the model with your code", ENGINE_S)
    try:
        if lab.run is not None:
            say(
                f"now your code serves {model_line}"
                + (f"; {lab.note}:" if lab.note else ":")
            )
            say(*lab.run(pieces, llm, pictures))
        else:
            say(
                f"now your code serves {model_line}, next to the built-in engine"
                f" ({lab.engine['num_blocks']} frames of {lab.engine['block_size']}"
                " slots)" + (f"; {lab.note}:" if lab.note else ":")
            )
            say(
                *serve(
                    lab.number,
                    pieces,
                    llm,
                    lab.engine,
                    lab.samples,
                    lab.max_tokens,
                    pictures / f"lab{lab.number}_frames.svg",
                )
            )
    except RuntimeError as error:
        say(f"  FAIL  {error}")
        return 1
    return 0
