"""`python -m minipaged.lab hint N`: a lab's hints, one at a time, from the idea to the
code. Each `## ` section of labs/hints/labN.md is a hint; which ones a participant has
seen is kept in the cache folder (lab-hints.json), so running the command again shows
the next.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from minipaged.model.offline import cache_dir


def hints(path: Path) -> list[tuple[str, str]]:
    """(title, text) of each hint in the file, in order."""
    sections = re.split(r"^## ", path.read_text(), flags=re.M)[1:]
    return [
        (title.strip(), body.strip())
        for title, _, body in (s.partition("\n") for s in sections)
    ]


def _state_file() -> Path:
    return cache_dir() / "lab-hints.json"


def _seen() -> dict:
    try:
        return json.loads(_state_file().read_text())
    except (OSError, ValueError):  # none yet, or a broken file: start over
        return {}


def _remember(seen: dict) -> None:
    try:
        _state_file().parent.mkdir(parents=True, exist_ok=True)
        _state_file().write_text(json.dumps(seen))
    except OSError:  # a read-only cache: the next call shows the same hint, no harm
        pass


def show(lab, which: int | None = None, reset: bool = False) -> list[str]:
    """The lines of lab `lab`'s next hint (or hint `which`, counted from 1); `reset`
    starts over."""
    all_hints, seen = hints(lab.hints_path), _seen()
    key = str(lab.number)
    if reset:
        seen.pop(key, None)
        _remember(seen)
        return [
            f"lab {lab.number}: hints start over; the next one is hint 1 of"
            f" {len(all_hints)}"
        ]
    shown = seen.get(key, 0)
    if which is None:
        which = min(shown + 1, len(all_hints))
    if not 1 <= which <= len(all_hints):
        raise ValueError(
            f"lab {lab.number} has hints 1 to {len(all_hints)}, not {which}"
        )
    seen[key] = max(shown, which)
    _remember(seen)
    title, text = all_hints[which - 1]
    if which < len(all_hints):
        after = (
            f"(stuck still? run the same command for hint {which + 1} of"
            f" {len(all_hints)}, a little more concrete)"
        )
    else:
        after = (
            f"(that was the last hint. `hint {lab.number} 1` shows the first again; "
            f"`hint {lab.number} --reset` starts over)"
        )
    return [
        f"lab {lab.number}, hint {which} of {len(all_hints)}: {title}",
        "",
        text,
        "",
        after,
    ]
