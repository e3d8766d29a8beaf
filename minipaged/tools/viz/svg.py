"""What every picture draws with: the palette, sizes for a projector, and SVG text
helpers.

A picture builds a list of SVG elements and wraps it with _svg (a standalone drawing) or
_framed (a drawing under its bold title, with legend lines below it: a standalone
figure).
"""

from __future__ import annotations

from html import escape

PALETTE = [
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#86bcb6",
]
SHARED, CACHED, FREE, OTHER, RESERVED = (
    "#333333",
    "#ffffff",
    "#eeeeee",
    "#bbbbbb",
    "#dddddd",
)
PREEMPTED = "#000000"  # the batch timeline's preemption mark
# Sizes for a projector: a figure is read from the back of a room, so text is never
# under 14 px (charts are drawn about 1,000 px wide and scale down to fit a narrower
# page or notebook).
FONT = 16  # px, labels, numbers, cell symbols
TITLE_FONT = 20  # px, a picture's bold title
SMALL_FONT = 14  # px, captions under a picture
CELL = 36  # px, one frame or one logical block
CHAR_W = 0.6 * FONT  # px, one character of FONT px monospace (to size labels)
PAD = 6  # px, a picture's margin at the left edge
LINE_H = 1.6 * FONT  # px, one line of a legend or of notes under a picture


def _svg(
    width: float, height: float, body: list[str], at: tuple[float, float] | None = None
) -> str:
    """An SVG drawn at width x height px that shrinks to fit a narrower page (never
    grows); or, placed `at` (x, y) inside another SVG, one that keeps its size there."""
    place = f'x="{at[0]}" y="{at[1]}" ' if at else ""
    style = "" if at else ' style="max-width: 100%; height: auto"'
    return (
        f'<svg {place}xmlns="http://www.w3.org/2000/svg" width="{width}"'
        f' height="{height}" viewBox="0 0 {width} {height}"{style}'
        f' font-family="monospace">{"".join(body)}</svg>'
    )


def _svg_text(
    x: float,
    y: float,
    text: str,
    size: int = FONT,
    anchor: str = "start",
    bold: bool = False,
    color: str = "#222",
) -> str:
    weight = ' font-weight="bold"' if bold else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
        f'fill="{color}"{weight}>{escape(text)}</text>'
    )


def _svg_title(text: str) -> str:
    """A picture's bold title, at its top left."""
    return _svg_text(PAD, TITLE_FONT, text, size=TITLE_FONT, bold=True)


def _title_width(text: str) -> float:
    return 3 * PAD + 0.62 * TITLE_FONT * len(text)


def _svg_legend(y: float, names: list[str]) -> list[str]:
    """One colored square and name per line, from baseline y down (LINE_H px per
    line)."""
    box = FONT - 2
    return [
        f'<rect x="{PAD}" y="{y + i * LINE_H - box + 2:.1f}" width="{box}"'
        f' height="{box}" fill="{PALETTE[i % len(PALETTE)]}"/>'
        + _svg_text(PAD + box + 6, y + i * LINE_H, name)
        for i, name in enumerate(names)
    ]


def _wrap(line: str, columns: int) -> list[str]:
    """A legend line cut into lines of at most `columns` characters, between its entries
    (which are two spaces apart), so that no entry is split."""
    lines = [""]
    for entry in line.split("  "):
        if lines[-1] and len(lines[-1]) + 2 + len(entry) > columns:
            lines.append("")
        lines[-1] += ("  " if lines[-1] else "") + entry
    return lines


def _framed(
    title: str, width: float, height: float, body: list[str], notes: list[str] = ()
) -> str:
    """A standalone figure: the bold title, under it the drawing (width x height px of
    `body`), under that the notes (legend lines), wrapped at the drawing's width."""
    columns = max(60, int(width / CHAR_W))
    lines = [wrapped for note in notes for wrapped in _wrap(note, columns)]
    top = TITLE_FONT + 16
    parts = [_svg_title(title), _svg(width, height, body, at=(PAD, top))]
    # xml:space keeps the two spaces between legend entries
    for i, line in enumerate(lines):
        text = _svg_text(PAD, top + height + FONT + 10 + i * LINE_H, line)
        parts.append(text.replace("<text ", '<text xml:space="preserve" ', 1))
    full_width = max(
        2 * PAD + width,
        _title_width(title),
        *(2 * PAD + CHAR_W * len(line) for line in lines),
    )
    return _svg(
        round(full_width), round(top + height + 16 + LINE_H * len(lines)), parts
    )
