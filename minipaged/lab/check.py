"""`check`: grade a participant's lab file (or the engine's own code, --solution), then let it
serve the model. Returns the exit code: 0 passed, 1 a property or the engine run failed.
"""

from __future__ import annotations

import time
from pathlib import Path

from minipaged.lab import kernel_props
from minipaged.lab.engine_run import load_model, serve
from minipaged.lab.grading import NotLoadable, judge, load, say, signature_mismatches
from minipaged.lab.labs import Lab


def pieces_of(lab: Lab, path: Path | None):
    """The participant's pieces (their module, or their kernel built), or the engine's own."""
    if path is None:
        return lab.pieces()
    if lab.starter.endswith(".cu"):
        return kernel_props.load(path)
    module = load(path, list(lab.solution()))
    wrong = signature_mismatches(module, lab.solution())
    if wrong:
        raise NotLoadable(f"{path.name} changed a signature the engine calls: {wrong[0]}")
    return module


def check(lab: Lab, path: Path | None, model: str | None, picture: Path, engine: bool = True) -> int:
    start = time.perf_counter()
    name = "the engine's own code (--solution)" if path is None else path.name
    say(f"lab {lab.number}, {lab.title}: checking {name}")
    try:
        pieces = pieces_of(lab, path)
    except NotLoadable as error:
        say(f"  cannot check it: {error}")
        return 1
    verdicts = judge(lab.properties, pieces, path)
    say(*[line for v in verdicts for line in v.lines()])
    failed = [v for v in verdicts if not v.holds]
    if failed:
        say("", f"{len(failed)} of {len(verdicts)} properties fail. Fix the first one first; hints: "
                f"labs/README.md, lab {lab.number}.")
        return 1
    say("", f"all {len(verdicts)} properties hold.")
    if engine:
        try:
            llm, model_line = load_model(model)
        except (OSError, ValueError) as error:  # no such folder, a broken checkpoint
            say(f"cannot load the model to serve your code: {str(error).splitlines()[0]}")
            return 1
        say(f"now your code serves {model_line}, next to the built-in engine "
            f"({lab.engine['num_blocks']} frames of {lab.engine['block_size']} slots)"
            + (f"; {lab.note}:" if lab.note else ":"))
        try:
            say(*serve(lab.number, pieces, llm, lab.engine, lab.samples, lab.max_tokens, picture))
        except RuntimeError as error:
            say(f"  FAIL  {error}")
            return 1
    say("", f"lab {lab.number} passed ({time.perf_counter() - start:.1f} s).")
    return 0
