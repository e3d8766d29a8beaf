"""The batch timeline: which request sat in which batch slot at each step (continuous
batching made visible), drawn from the engine's StepReports as text or as a standalone
SVG.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from minipaged.tools.viz.svg import (
    CHAR_W,
    FONT,
    FREE,
    LINE_H,
    PAD,
    PALETTE,
    PREEMPTED,
    SMALL_FONT,
    TITLE_FONT,
    _svg,
    _svg_text,
    _svg_title,
)


@dataclass(slots=True)
class Timeline:
    """Batch slots over steps, from the engine's StepReports. A sequence keeps its slot
    while it runs; a letter per request, UPPER case for its prefill step, lower case
    while decoding, ! where it was preempted, _ for a static batch's padding row
    (computed, thrown away).
    """

    reports: list
    max_steps: int = 100  # the text form shows the last this many steps

    def grid(self) -> tuple[list[list[tuple[str, str] | None]], dict[str, int]]:
        """(slots x steps cells of (request_id, kind) or None, request_id -> color
        index)."""
        slots: list = []  # occupant key (request_id, seq index) per slot, None = free
        columns, colors = [], {}
        for report in self.reports:
            now = {(rid, i): kind for rid, i, kind, _ in report.ran}
            now |= {key: "padding" for key in report.padded}
            for rid, _ in report.preempted:
                now |= {key: "preempted" for key in slots if key and key[0] == rid}
            slots = [key if key in now else None for key in slots]
            for key in now:
                if key not in slots:  # a newcomer takes the first empty slot
                    if None in slots:
                        slots[slots.index(None)] = key
                    else:
                        slots.append(key)
                colors.setdefault(key[0], len(colors))
            columns.append([(key[0], now[key]) if key else None for key in slots])
        height = max((len(c) for c in columns), default=0)
        rows = [[c[i] if i < len(c) else None for c in columns] for i in range(height)]
        return rows, colors

    def __str__(self) -> str:
        rows, colors = self.grid()
        first = max(0, len(self.reports) - self.max_steps)
        letters = {rid: chr(ord("A") + n % 26) for rid, n in colors.items()}
        marks = {"prefill": str.upper, "decode": str.lower}

        def cell(c):
            if c is None:
                return "."
            rid, kind = c
            return (
                marks[kind](letters[rid])
                if kind in marks
                else {"preempted": "!", "padding": "_"}[kind]
            )

        lines = [
            f"batch timeline: steps {first}-{len(self.reports) - 1}, {len(rows)} slots"
        ]
        lines += [
            f"slot {i:3d} |" + "".join(cell(c) for c in row[first:])
            for i, row in enumerate(rows)
        ]
        shown = list(letters.items())[:12]
        lines.append(
            "  ".join(f"{letter}={rid}" for rid, letter in shown)
            + ("  ..." if len(letters) > 12 else "")
        )
        lines.append(
            "UPPER = prefill, lower = decode, ! = preempted, _ = padding, . = empty"
            " slot"
        )
        return "\n".join(lines)

    def svg(self) -> str:
        rows, colors = self.grid()
        w, h, left, top = 20, 30, PAD + 8 * CHAR_W, TITLE_FONT + 16
        body = [
            _svg_title(f"batch timeline: {len(self.reports)} steps, {len(rows)} slots")
        ]
        for i, row in enumerate(rows):
            y = top + i * h
            body.append(_svg_text(PAD, y + h / 2 + FONT * 0.3, f"slot {i}"))
            for step, c in enumerate(row):
                if c is None:
                    continue
                rid, kind = c
                fill = {"preempted": PREEMPTED, "padding": FREE}.get(
                    kind, PALETTE[colors[rid] % len(PALETTE)]
                )
                stroke = ' stroke="#000" stroke-width="3"' if kind == "prefill" else ""
                body.append(
                    f"<g><title>{escape(f'step {step}: {rid} {kind}')}</title><rect"
                    f' x="{left + step * w + 1.5}" y="{y + 1.5}" width="{w - 4}"'
                    f' height="{h - 5}" fill="{fill}"{stroke}/></g>'
                )
        # step numbers under the grid, every 5 steps
        axis = top + len(rows) * h + FONT + 4
        body += [
            _svg_text(
                left + step * w + w / 2,
                axis,
                str(step),
                size=SMALL_FONT,
                anchor="middle",
                color="#555",
            )
            for step in range(0, len(self.reports), 5)
        ]
        caption = (
            "step →  color = request; outlined = prefill; black = preempted; grey ="
            " padding (static batch)"
        )
        body.append(_svg_text(PAD, axis + LINE_H, caption, size=SMALL_FONT))
        width = max(
            left + len(self.reports) * w + PAD,
            2 * PAD + 0.6 * SMALL_FONT * len(caption),
        )
        return _svg(round(width), round(axis + LINE_H + 8), body)

    def _repr_html_(self) -> str:
        return self.svg()

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))
