"""A lab's pieces must be written, not handed to the engine's: the starter names them
(each body that raises NotImplementedError), the participant's file must define each of
them itself, and while it is graded the engine's own version of each raises Delegated
when it is called from their file (`return super().growth(...)`, an imported
`ngram_propose`), so that the check grades their code and never the engine's in its
place.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path


class Delegated(Exception):
    """The engine's own version of a piece the lab asks for ran in the participant's
    place; its message is the whole sentence."""


def to_write(starter: Path) -> dict[str, list[str]]:
    """The pieces a starter leaves to write: a function's name -> [], a class's name ->
    its methods whose body raises NotImplementedError."""

    def left_out(function: ast.FunctionDef) -> bool:
        return any(
            isinstance(statement, ast.Raise)
            and "NotImplementedError" in ast.unparse(statement.exc or statement)
            for statement in function.body
        )

    pieces: dict[str, list[str]] = {}
    for node in ast.parse(starter.read_text()).body:
        if isinstance(node, ast.FunctionDef) and left_out(node):
            pieces[node.name] = []
        elif isinstance(node, ast.ClassDef):
            methods = [
                f.name
                for f in node.body
                if isinstance(f, ast.FunctionDef) and left_out(f)
            ]
            if methods:
                pieces[node.name] = methods
    return pieces


def mine(function, path: Path) -> bool:
    """Is `function` written in the participant's file (under any decorator that keeps
    `__wrapped__`)?"""
    code = getattr(inspect.unwrap(function), "__code__", None)
    return code is not None and Path(code.co_filename).resolve() == path.resolve()


def not_written(module, path: Path, pieces: dict[str, list[str]]) -> str | None:
    """Why the participant's file does not hold its own version of each piece (one
    sentence), or None."""
    for name, methods in pieces.items():
        theirs = getattr(module, name)
        if not methods:
            if not mine(theirs, path):
                return (
                    f"{name} in {path.name} is not written there (it is"
                    f" {theirs.__module__}.{theirs.__qualname__}): the lab asks you to"
                    f" write {name}; keep the starter's def {name}"
                )
            continue
        for method in methods:
            own = vars(theirs).get(method)
            if own is None:
                return (
                    f"your {name} has no {method} of its own, so the engine's would be"
                    f" graded in its place: keep the starter's {name}.{method} and"
                    " write it"
                )
            if not mine(own, path):
                return (
                    f"your {name}.{method} is not written in {path.name} (it is"
                    f" {own.__module__}.{own.__qualname__}): the lab asks you to write"
                    " it"
                )
    return None


def guard(engine, label: str, lab: int, path: Path):
    """`engine` (a function, or a method taken from its class) that raises Delegated
    when called straight from the participant's file, and otherwise runs as itself."""

    @functools.wraps(engine)
    def guarded(*args, **kwargs):
        caller = sys._getframe(1)
        if Path(caller.f_code.co_filename).resolve() == path.resolve():
            raise Delegated(
                f"your {caller.f_code.co_name} ({path.name} line {caller.f_lineno})"
                f" calls the engine's own {label} ({engine.__module__}) instead of"
                f" doing the work: lab {lab} asks you to write"
                f" {label.split('.')[-1]} yourself, and the check grades yours, never"
                " the engine's"
            )
        return engine(*args, **kwargs)

    return guarded


@contextmanager
def guarded(lab: int, solution: dict, pieces: dict[str, list[str]], path: Path):
    """While the block runs, the engine's version of each piece raises Delegated when
    the participant's file calls it; put back after, even on an error."""
    with ExitStack() as stack:

        def replace(owner, name: str, value) -> None:
            old = vars(owner)[name]
            setattr(owner, name, value)
            stack.callback(setattr, owner, name, old)

        for name, methods in pieces.items():
            engine = solution[name]
            if not methods:
                wrapper = guard(engine, name, lab, path)
                # every module that holds it (the engine's, and the participant's own
                # imports of it), whatever the name it is bound to there
                for module in list(sys.modules.values()):
                    if not getattr(module, "__name__", "").startswith("minipaged"):
                        continue
                    for attr, value in list(vars(module).items()):
                        if value is engine:
                            replace(module, attr, wrapper)
                continue
            for method in methods:
                owner = next((c for c in engine.__mro__ if method in c.__dict__), None)
                if owner is None or not inspect.isfunction(owner.__dict__[method]):
                    continue
                replace(
                    owner,
                    method,
                    guard(
                        owner.__dict__[method], f"{owner.__name__}.{method}", lab, path
                    ),
                )
        yield
