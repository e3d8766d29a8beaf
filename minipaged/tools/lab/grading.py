"""Grading one lab file: load it, hold each property up to it, and say in one plain
sentence what failed and on which small input. An exception from the participant's code
is named in one line (its type, message and the line of their file), never shown as a
traceback.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import signal
import sys
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from minipaged.tools.lab.delegation import Delegated


class Failed(AssertionError):
    """A property does not hold: `given` is the small input, `detail` what went wrong on
    it."""

    def __init__(self, given: str, detail: str):
        super().__init__(f"{given}: {detail}")
        self.given, self.detail = given, detail


class NotLoadable(Exception):
    """The participant's file cannot be used at all (missing, a syntax error, a name
    gone)."""


@dataclass(frozen=True, slots=True)
class Property:
    """One thing the lab's code must do, as a sentence, and the check that tries it."""

    sentence: str
    # raises Failed (or anything, from their code) when it fails
    check: Callable[[object], None]
    given: str = ""  # its inputs, said when the participant's code raises


@dataclass(slots=True)
class Verdict:
    sentence: str
    failure: str | None = None  # None: it holds
    # their code did not return, or asked to end the process: stop checking
    fatal: bool = False

    @property
    def holds(self) -> bool:
        return self.failure is None

    def lines(self) -> list[str]:
        if self.holds:
            return [f"  PASS  {self.sentence}"]
        return [f"  FAIL  {self.sentence}"] + [
            f"        {line}" for line in self.failure.splitlines()
        ]


def load(path: Path, names: list[str]) -> ModuleType:
    """Import the participant's file as a fresh module that must define `names`."""
    if not path.is_file():
        raise NotLoadable(
            f"{path} is not a file: copy the starter first (cp labs/<starter>"
            f" {path.name})"
        )
    spec = importlib.util.spec_from_file_location(f"minipaged_lab_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    # in sys.modules, as an import puts it: the check's guard finds there the engine's
    # functions the file imported under its own names (delegation.guarded)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        raise NotLoadable(
            f"{path.name} line {error.lineno}: SyntaxError: {error.msg}"
        ) from None
    except SystemExit as error:
        raise NotLoadable(
            f"{path.name} calls sys.exit({error.code!r}) when"
            f" imported{place(error, path)}: a lab file only defines its pieces"
        ) from None
    except Exception as error:
        raise NotLoadable(
            f"{path.name} fails when imported: {in_one_line(error, path)}"
        ) from None
    missing = [name for name in names if not hasattr(module, name)]
    if missing:
        raise NotLoadable(
            f"{path.name} has no {', '.join(missing)}: keep the starter's names"
        )
    return module


def wrong_kinds(module, originals: dict[str, object]) -> list[str]:
    """Names the participant bound to something else than the starter's kind (a class, a
    function)."""
    found = []
    for name, original in originals.items():
        theirs = getattr(module, name)
        kind = "class" if inspect.isclass(original) else "function"
        if inspect.isclass(theirs) if kind == "class" else inspect.isfunction(theirs):
            continue
        found.append(
            f"{name} is {type(theirs).__name__ if theirs is not None else 'None'}, not"
            f" a {kind}: keep the starter's {kind} {name}"
        )
    return found


def parameters(function) -> list[tuple]:
    """What a caller relies on: the parameters' names, kinds and defaults (not
    annotations)."""
    return [
        (p.name, p.kind, p.default)
        for p in inspect.signature(function).parameters.values()
    ]


def signature_mismatches(module, originals: dict[str, object]) -> list[str]:
    """Every function or method of the participant whose parameters differ from the
    engine's one of that name (the engine calls them with its own arguments)."""
    found = []
    for name, original in originals.items():
        theirs = getattr(module, name)
        pairs = (
            [(name, theirs, original)]
            if not inspect.isclass(original)
            else [
                (f"{name}.{attr}", value, getattr(original, attr))
                for attr, value in vars(theirs).items()
                if inspect.isfunction(value) and hasattr(original, attr)
            ]
        )
        for label, mine, engine in pairs:
            if parameters(mine) != parameters(engine):
                found.append(
                    f"{label}{inspect.signature(mine)} should be"
                    f" {label}{inspect.signature(engine)}"
                )
    return found


def deepest(error: BaseException, path: Path | None = None):
    """The deepest frame of the participant's file in the traceback (else the deepest
    anywhere)."""
    frames = traceback.extract_tb(error.__traceback__)
    theirs = [
        f
        for f in frames
        if path is not None and Path(f.filename).resolve() == path.resolve()
    ]
    return (theirs or frames)[-1] if frames else None


def place(error: BaseException, path: Path | None = None) -> str:
    """' (my_file.py line 12)', or '' without a traceback."""
    where = deepest(error, path)
    return f" ({Path(where.filename).name} line {where.lineno})" if where else ""


def in_one_line(error: BaseException, path: Path | None = None) -> str:
    """'TypeError: message (my_file.py line 12)': the type, the message, and the deepest
    line of the participant's file in the traceback (else the deepest line anywhere)."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return (
        f"{type(error).__name__}{': ' + message if message else ''}{place(error, path)}"
    )


def what_broke(error: BaseException, path: Path | None) -> str:
    """One sentence for an exception out of the participant's code: a time limit names
    their function that did not return, sys.exit names the call, anything else its type
    and line.
    """
    where = deepest(error, path)
    mine = (
        where is not None
        and path is not None
        and Path(where.filename).resolve() == path.resolve()
    )
    who = (
        f"your {where.name} ({Path(where.filename).name} line {where.lineno})"
        if mine
        else "your code"
    )
    if (
        isinstance(error, TimeoutError)
        and error.args
        and str(error.args[0]).startswith("still running")
    ):
        return f"{who} did not return within {error.args[1]} s: an endless loop?"
    if isinstance(error, Delegated):
        return str(error)
    if isinstance(error, SystemExit):
        return (
            f"{who} called sys.exit({error.code!r}): a lab's code returns or raises, it"
            " never ends the process"
        )
    return f"your code raised {in_one_line(error, path)}"


@contextmanager
def time_limit(seconds: int):
    """TimeoutError when the block runs longer (an endless loop in the participant's
    code). Where there is no SIGALRM (Windows) or off the main thread, no limit."""
    import threading

    if (
        not hasattr(signal, "SIGALRM")
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(
            f"still running after {seconds} s: an endless loop?", seconds
        )

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def look_at(module, path: Path | None, failed: Failed) -> str:
    """'\nlook at your allocate (my_file.py line 8)': the first of the participant's own
    methods the message names as a call (`allocate(`, `.allocate`), the failure's text
    before its input; a name two classes define is given with both. '' when none is
    named."""
    if path is None or path.suffix != ".py":
        return ""
    # bare name -> (qualified name, first line) in their file
    mine: dict[str, list[tuple[str, int]]] = {}
    for value in vars(module).values():
        members = vars(value).values() if inspect.isclass(value) else [value]
        for function in members:
            code = getattr(function, "__code__", None)
            if code is not None and Path(code.co_filename).resolve() == path.resolve():
                place = (function.__qualname__, code.co_firstlineno)
                if place not in mine.setdefault(function.__name__, []):
                    mine[function.__name__].append(place)
    for text in (failed.detail, failed.given):
        named = sorted(
            (m.start(), name)
            for name in mine
            for m in re.finditer(
                rf"(?:\.|\b){re.escape(name)}\(|\.{re.escape(name)}\b", text
            )
        )
        if named:
            places = mine[named[0][1]]
            if len(places) == 1:
                return f"\nlook at your {named[0][1]} ({path.name} line {places[0][1]})"
            return (
                "\nlook at your "
                + " or ".join(f"{q} (line {line})" for q, line in places)
                + f" in {path.name}"
            )
    return ""


def judged(properties: list[Property], module, path: Path | None, seconds: int = 30):
    """Try every property (each within `seconds`), yielding its verdict as soon as it is
    known; a failure becomes its given input and what went wrong."""
    for prop in properties:
        try:
            with time_limit(seconds):
                prop.check(module)
            yield Verdict(prop.sentence)
        except Failed as failed:
            yield Verdict(
                prop.sentence,
                f"on {failed.given}\n{failed.detail}{look_at(module, path, failed)}",
            )
        except NotImplementedError as error:
            yield Verdict(prop.sentence, f"not written yet: {error}")
        except (
            Exception,
            SystemExit,
        ) as error:  # their code broke (or ended the process): one line
            on = f"on {prop.given}\n" if prop.given else ""
            fatal = isinstance(error, (SystemExit, TimeoutError)) and not isinstance(
                error, Failed
            )
            yield Verdict(prop.sentence, f"{on}{what_broke(error, path)}", fatal)


def judge(
    properties: list[Property], module, path: Path | None, seconds: int = 30
) -> list[Verdict]:
    """Every property's verdict (see `judged`)."""
    return list(judged(properties, module, path, seconds))


def say(*lines: str) -> None:
    print(*lines, sep="\n", flush=True)
