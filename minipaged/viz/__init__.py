"""Pictures of minipaged's state, for people who would rather look than read.

Each picture is a small object: str() gives terminal text, _repr_html_() an inline SVG for
notebooks (no plotting library). One section per picture: the frame map and page tables of
the paging layer, bar and line charts for the numbers notebooks and lecture notes compute, and
the scheduler's batch timeline.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from html import escape, unescape
from typing import TYPE_CHECKING

from minipaged.backend import cdiv

if TYPE_CHECKING:
    from minipaged.paging import BlockManager

# ---- shared by the paging pictures ---------------------------------------------------------

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
           "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6"]
SHARED, CACHED, FREE, OTHER = "#333333", "#ffffff", "#eeeeee", "#bbbbbb"
PREEMPTED = "#000000"  # the batch timeline's preemption mark
# Sizes for a projector: a figure is read from the back of a room, so text is never under 14 px
# (charts are drawn about 1,000 px wide and scale down to fit a narrower page or notebook).
FONT = 16        # px, labels, numbers, cell symbols
TITLE_FONT = 20  # px, a picture's bold title
SMALL_FONT = 14  # px, captions under a picture
CELL = 36        # px, one frame or one logical block
CHAR_W = 0.6 * FONT  # px, one character of FONT px monospace (to size labels)


def _styles(manager) -> dict:
    """seq id -> (letter, color). Integer ids (the engine's) keep theirs for life: id % 26 and
    id % 10; other ids go by their order in the manager (A..Z, then '#')."""
    def style(i: int, seq_id) -> tuple[str, str]:
        n = seq_id if isinstance(seq_id, int) else i
        letter = chr(ord("A") + n % 26) if isinstance(seq_id, int) or n < 26 else "#"
        return letter, PALETTE[n % len(PALETTE)]
    return {seq_id: style(i, seq_id) for i, seq_id in enumerate(manager.tables)}


def _frame_cell(manager, frame: int, owners: dict, styles: dict) -> tuple[str, str, str]:
    """(text symbol, fill color, tooltip) of one device frame."""
    seqs = owners.get(frame, [])
    if len(seqs) > 1:
        return (str(len(seqs)) if len(seqs) < 10 else "+", SHARED,
                f"frame {frame}: shared by {len(seqs)}: {', '.join(map(repr, seqs))}")
    if seqs:
        letter, color = styles[seqs[0]]
        return letter, color, f"frame {frame}: {seqs[0]!r}"
    cache = manager.device.prefix_cache
    if cache is not None and frame in cache.evictable:
        return "c", CACHED, f"frame {frame}: cached prefix block, nobody maps it, reusable"
    return ".", FREE, f"frame {frame}: free"


def _svg_cell(x: float, y: float, symbol: str, fill: str, tooltip: str) -> str:
    text_color = "#ffffff" if fill in PALETTE or fill == SHARED else "#555555"
    dash = ' stroke-dasharray="5,3"' if fill == CACHED else ""
    return (f'<g><title>{escape(tooltip)}</title><rect x="{x}" y="{y}" width="{CELL - 3}" '
            f'height="{CELL - 3}" rx="4" fill="{fill}" stroke="#888"{dash}/>'
            f'<text x="{x + (CELL - 3) / 2}" y="{y + CELL / 2 + FONT * 0.3:.1f}" font-size="{FONT}" '
            f'text-anchor="middle" fill="{text_color}">{escape(symbol)}</text></g>')


def _svg_arrow(x1: float, y1: float, x2: float, y2: float, color: str) -> str:
    """A line from the middle of one cell to the middle of another (drawn under the cells)."""
    c = CELL / 2 - 1
    return (f'<line x1="{x1 + c}" y1="{y1 + c}" x2="{x2 + c}" y2="{y2 + c}" '
            f'stroke="{color}" stroke-width="2.5" opacity="0.7"/>')


def _svg_label(y: float, text: str) -> str:
    """A row name at the left edge, truncated to fit."""
    return f'<text x="0" y="{y + CELL / 2 + FONT * 0.35:.1f}" font-size="{FONT}">{escape(text[:11])}</text>'


def _svg(width: float, height: float, body: list[str]) -> str:
    """An SVG drawn at width x height px that shrinks to fit a narrower page (never grows)."""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" style="max-width: 100%; height: auto" '
            f'font-family="monospace">{"".join(body)}</svg>')


def _legend(manager, styles: dict) -> str:
    frames = {seq_id: len(t.frames) for seq_id, t in manager.tables.items() if t.allocator is manager.device}
    seqs = "  ".join(f"{styles[s][0]} = {s!r} ({n} frames)" for s, n in frames.items())
    return f"{seqs}\n2-9 = shared by that many sequences  c = cached, reusable  . = free".strip()


# ---- frame map: the physical pool, one cell per frame --------------------------------------

@dataclass(slots=True)
class FrameMap:
    """Every device frame, by owner: a letter per sequence, a digit n for a frame n sequences
    share, c for a cached block nobody maps (reusable), . for free."""
    manager: BlockManager
    per_row: int = 32

    def title(self) -> str:
        m = self.manager
        used = m.device.num_blocks - m.device.num_free
        cached = len(m.device.prefix_cache.evictable) if m.device.prefix_cache else 0
        return (f"frame map: {m.device.num_blocks} frames × {m.block_size} slots; {used} used "
                f"({m.usage().shared_frames} shared), {cached} cached, {len(m.device.free_frames)} free")

    def cells(self) -> list[tuple[str, str, str]]:
        owners, styles = self.manager.frame_owners(), _styles(self.manager)
        return [_frame_cell(self.manager, f, owners, styles) for f in range(self.manager.device.num_blocks)]

    def __str__(self) -> str:
        symbols = [symbol for symbol, _, _ in self.cells()]
        rows = [f"{start:5d}  " + " ".join(symbols[start:start + self.per_row])
                for start in range(0, len(symbols), self.per_row)]
        return "\n".join([self.title(), *rows, _legend(self.manager, _styles(self.manager))])

    def _repr_html_(self) -> str:
        body = [_svg_cell((i % self.per_row) * CELL, (i // self.per_row) * CELL, *cell)
                for i, cell in enumerate(self.cells())]
        rows = cdiv(len(body), self.per_row)
        svg = _svg(min(len(body), self.per_row) * CELL, rows * CELL, body)
        legend = escape(_legend(self.manager, _styles(self.manager))).replace("\n", "<br>")
        return f"<div><b>{escape(self.title())}</b><br>{svg}<br><small>{legend}</small></div>"

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))  # IPython's text form: the terminal picture


# ---- page tables: a sequence's logical blocks, arrows to their frames ----------------------

@dataclass(slots=True)
class PageTableView:
    """Sequences' page tables: logical block i -> frame, with each block's fill and sharing.
    In the SVG the frame row sits in the middle, sequences alternate above and below it."""
    manager: BlockManager
    seq_ids: list
    max_frames_drawn: int = 48  # a larger pool draws only the frames these sequences map

    def __str__(self) -> str:
        return "\n".join(self._text(seq_id) for seq_id in self.seq_ids)

    def _text(self, seq_id) -> str:
        table, size = self.manager.tables[seq_id], self.manager.block_size
        where = "" if table.allocator is self.manager.device else " (swapped out: host frames)"
        lines = [f"page table of {seq_id!r}: {table.num_tokens} tokens in {len(table.frames)} blocks{where}"]
        for i, frame in enumerate(table.frames):
            filled = min(size, table.num_tokens - i * size)
            refs = table.allocator.ref_count(frame)
            lines.append(f"  block {i:3d} -> frame {frame:4d}  {filled:3d}/{size}"
                         + (f"  shared ×{refs}" if refs > 1 else ""))
        return "\n".join(lines)

    def _frames_drawn(self) -> list[int]:
        if self.manager.device.num_blocks <= self.max_frames_drawn:
            return list(range(self.manager.device.num_blocks))
        return sorted({f for s in self.seq_ids for f in self.manager.block_table(s)})

    def _repr_html_(self) -> str:
        m, styles, owners = self.manager, _styles(self.manager), self.manager.frame_owners()
        frames = self._frames_drawn()
        left = 4 * CELL                       # room for the row names
        x_of = {frame: left + i * CELL for i, frame in enumerate(frames)}
        above = cdiv(len(self.seq_ids), 2)
        row = 2 * CELL                        # a sequence row and the gap for its arrows
        frame_y = above * row + CELL
        lines, boxes = [], [_svg_label(frame_y, "frames")]
        for k, seq_id in enumerate(self.seq_ids):
            y = frame_y - (k // 2 + 1) * row if k % 2 == 0 else frame_y + (k // 2 + 1) * row
            letter, color = styles[seq_id]
            boxes.append(_svg_label(y, f"{letter} {seq_id!r}"))
            for i, frame in enumerate(m.block_table(seq_id)):
                x = left + i * CELL
                lines.append(_svg_arrow(x, y, x_of[frame], frame_y, color))
                boxes.append(_svg_cell(x, y, str(i), color, f"{seq_id!r} block {i} -> frame {frame}"))
        for frame in frames:
            symbol, fill, tooltip = _frame_cell(m, frame, owners, styles)
            if frame in owners and not set(owners[frame]) & set(self.seq_ids):
                fill = OTHER  # mapped by a sequence not drawn here
            boxes.append(_svg_cell(x_of[frame], frame_y, str(frame), fill, tooltip))
        width = left + max([len(frames)] + [len(m.tables[s].frames) for s in self.seq_ids]) * CELL
        height = frame_y + CELL + (len(self.seq_ids) // 2) * row
        names = ", ".join(f"{styles[s][0]} = {s!r}" for s in self.seq_ids)
        caption = f"page tables ({names}): numbered logical blocks, arrows to frames (numbered)"
        return f"<div><b>{escape(caption)}</b><br>{_svg(width, height, lines + boxes)}</div>"

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))  # IPython's text form: the terminal picture


# ---- charts: the numbers a notebook or lecture note computes, as bars and lines ------------

CHART_BARS = "█▓▒░"  # text form: one fill character per stacked segment
PAD = 6              # px, a chart's margin at the left edge
BAR_W = 560          # px, the longest bar of a bar chart
PLOT_W, PLOT_H = 640, 320  # px, a line chart's plot area
LINE_H = 1.6 * FONT  # px, one line of a legend or of notes under a picture


def _number(value: float, digits: int, unit: str = "") -> str:
    """The value with `digits` decimals and thousands separators, then the unit."""
    return f"{value:,.{digits}f}{unit}"


def _tick(value: float) -> str:
    """An axis value: 1,024 when whole, else as short as it goes (0.25)."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:g}"


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering lo..hi: steps of 1, 2 or 5 times a power of ten."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]


def _svg_text(x: float, y: float, text: str, size: int = FONT, anchor: str = "start",
              bold: bool = False, color: str = "#222") -> str:
    weight = ' font-weight="bold"' if bold else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="{color}"{weight}>{escape(text)}</text>')


def _svg_title(text: str) -> str:
    """A picture's bold title, at its top left."""
    return _svg_text(PAD, TITLE_FONT, text, size=TITLE_FONT, bold=True)


def _title_width(text: str) -> float:
    return 3 * PAD + 0.62 * TITLE_FONT * len(text)


def _svg_legend(y: float, names: list[str]) -> list[str]:
    """One colored square and name per line, from baseline y down (LINE_H px per line)."""
    box = FONT - 2
    return [f'<rect x="{PAD}" y="{y + i * LINE_H - box + 2:.1f}" width="{box}" height="{box}" '
            f'fill="{PALETTE[i % len(PALETTE)]}"/>' + _svg_text(PAD + box + 6, y + i * LINE_H, name)
            for i, name in enumerate(names)]


def _check_values(kind: str, columns: dict, count: int, of: str) -> None:
    """Each named column has `count` values, none negative: bars and the y axis start at 0."""
    for name, values in columns.items():
        if len(values) != count:
            raise ValueError(f"{kind} {name!r} has {len(values)} values for {count} {of}")
        if any(v < 0 for v in values):
            raise ValueError(f"{kind} {name!r} has a negative value: charts here start at 0")


@dataclass(slots=True)
class BarChart:
    """Horizontal bars, one per label; each bar stacks its segments left to right (with one
    segment it is a plain bar chart). str() is a text chart, _repr_html_() an SVG."""
    title: str
    labels: list[str]
    segments: dict[str, list[float]]  # segment name -> one value per label
    unit: str = ""                    # written after every number: "%", " slots"
    digits: int = 1
    width: int = 40                   # characters of the longest bar in the text form

    def __post_init__(self):
        _check_values("segment", self.segments, len(self.labels), "labels")

    def _rows(self) -> list[list[float]]:
        """Per label, the segments' values in order."""
        return [list(values) for values in zip(*self.segments.values())]

    def _scale(self, length: float) -> float:
        longest = max((sum(row) for row in self._rows()), default=0)
        return length / longest if longest else 0.0

    def __str__(self) -> str:
        scale, pad = self._scale(self.width), max(map(len, self.labels), default=0)
        lines = [self.title]
        for label, row in zip(self.labels, self._rows()):
            ends = [round(sum(row[:i + 1]) * scale) for i in range(len(row))]
            bar = "".join(CHART_BARS[i % len(CHART_BARS)] * (end - start)
                          for i, (start, end) in enumerate(zip([0] + ends, ends)))
            lines.append(f"{label:>{pad}}  {bar:<{self.width}}  {self._values(row)}")
        if len(self.segments) > 1:
            lines.append("  ".join(f"{CHART_BARS[i % len(CHART_BARS)]} {name}"
                                   for i, name in enumerate(self.segments)))
        return "\n".join(lines)

    def _values(self, row: list[float]) -> str:
        if len(row) == 1:
            return _number(row[0], self.digits, self.unit)
        return ", ".join(f"{name} {_number(v, self.digits, self.unit)}" for name, v in zip(self.segments, row))

    def svg(self) -> str:
        left, row_height = PAD + CHAR_W * max(map(len, self.labels), default=0) + 12, CELL + 6
        scale, top, text_y = self._scale(BAR_W), TITLE_FONT + 24, (CELL - 2) / 2 + FONT * 0.35
        body = [_svg_title(self.title)]
        for k, (label, row) in enumerate(zip(self.labels, self._rows())):
            y, x = top + k * row_height, left
            body.append(_svg_text(left - 8, y + text_y, label, anchor="end"))
            for i, (name, value) in enumerate(zip(self.segments, row)):
                w, number = value * scale, _number(value, self.digits, self.unit)
                tooltip = f"{label}: {name} {number}" if len(row) > 1 else f"{label}: {number}"
                body.append(f'<g><title>{escape(tooltip)}</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" '
                            f'height="{CELL - 2}" fill="{PALETTE[i % len(PALETTE)]}"/></g>')
                if len(row) > 1 and w > CHAR_W * len(number) + 8:
                    body.append(_svg_text(x + w / 2, y + text_y, number, anchor="middle", color="#fff"))
                x += w
            if len(row) == 1:
                body.append(_svg_text(x + 6, y + text_y, _number(row[0], self.digits, self.unit)))
        height = top + len(self.labels) * row_height + 6
        if len(self.segments) > 1:
            body += _svg_legend(height + FONT + 8, list(self.segments))
            height += 16 + len(self.segments) * LINE_H
        numbers = max((len(_number(v, self.digits, self.unit)) for row in self._rows() for v in row), default=0)
        width = max(left + BAR_W + 12 + CHAR_W * (numbers + 1) + PAD, _title_width(self.title))
        return _svg(round(width), round(height), body)

    def _repr_html_(self) -> str:
        return self.svg()

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))  # IPython's text form (a terminal, or text-only output): the text chart


@dataclass(slots=True)
class LineChart:
    """One or more series over the same x values, the y axis from 0. str() is a table of the
    points (every one, or evenly thinned to max_rows), _repr_html_() an SVG."""
    title: str
    x: list[float]
    series: dict[str, list[float]]  # name -> one y per x
    x_label: str = "x"
    y_label: str = ""
    log_x: bool = False             # x axis in powers of two (block sizes)
    digits: int = 1
    max_rows: int = 20

    def __post_init__(self):
        _check_values("series", self.series, len(self.x), "x values")
        if not self.x:
            raise ValueError("a line chart needs at least one x value")
        if self.log_x and min(self.x) <= 0:
            raise ValueError("log_x needs x values > 0")

    def __str__(self) -> str:
        n = len(self.x)
        rows = range(n) if n <= self.max_rows else sorted({round(i * (n - 1) / (self.max_rows - 1))
                                                           for i in range(self.max_rows)})
        header = [self.x_label, *self.series]
        table = [[_tick(self.x[i])] + [_number(ys[i], self.digits) for ys in self.series.values()]
                 for i in rows]
        widths = [max(len(cell) for cell in column) for column in zip(header, *table)]
        lines = [self.title + (f" ({self.y_label})" if self.y_label else ""),
                 "  ".join(h.rjust(w) for h, w in zip(header, widths))]
        lines += ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in table]
        if n > self.max_rows:
            lines.append(f"({len(rows)} of {n} points shown)")
        return "\n".join(lines)

    def svg(self) -> str:
        left, top, plot_w, plot_h = PAD + 9 * CHAR_W, TITLE_FONT + 2 * FONT + 16, PLOT_W, PLOT_H
        at = math.log2 if self.log_x else float
        xs = [at(x) for x in self.x]
        x_ticks = sorted(set(self.x)) if self.log_x else _ticks(min(xs), max(xs))
        x_lo, x_hi = (min(xs), max(xs)) if self.log_x else (x_ticks[0], x_ticks[-1])
        y_ticks = _ticks(0, max((max(ys) for ys in self.series.values()), default=1))

        def px(x: float) -> float:
            return left + (at(x) - x_lo) / ((x_hi - x_lo) or 1) * plot_w

        def py(y: float) -> float:
            return top + plot_h - y / y_ticks[-1] * plot_h

        body = [_svg_title(self.title), _svg_text(PAD, top - FONT, self.y_label)]
        for y in y_ticks:
            body.append(f'<line x1="{left}" y1="{py(y):.1f}" x2="{left + plot_w}" y2="{py(y):.1f}" stroke="#ddd"/>')
            body.append(_svg_text(left - 8, py(y) + FONT * 0.35, _tick(y), anchor="end"))
        for x in x_ticks:
            body.append(f'<line x1="{px(x):.1f}" y1="{top + plot_h}" x2="{px(x):.1f}" y2="{top + plot_h + 6}" '
                        'stroke="#888"/>')
            body.append(_svg_text(px(x), top + plot_h + FONT + 8, _tick(x), anchor="middle"))
        body.append(f'<path d="M{left},{top} V{top + plot_h} H{left + plot_w}" fill="none" stroke="#888"/>')
        body.append(_svg_text(left + plot_w / 2, top + plot_h + 2 * FONT + 18, self.x_label, anchor="middle"))
        for i, (name, ys) in enumerate(self.series.items()):
            color = PALETTE[i % len(PALETTE)]
            points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(self.x, ys))
            body.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="3"/>')
            if len(self.x) <= 40:  # dots with tooltips; a long series stays a plain line
                body += [f'<g><title>{escape(f"{name}: {_number(y, self.digits)} at {self.x_label} {_tick(x)}")}'
                         f'</title><circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="5" fill="{color}"/></g>'
                         for x, y in zip(self.x, ys)]
        legend_y = top + plot_h + 3 * FONT + 32
        body += _svg_legend(legend_y, list(self.series))
        names = max(map(len, self.series), default=0)
        width = max(left + plot_w + 3 * CHAR_W, PAD + FONT + 6 + CHAR_W * names + PAD, _title_width(self.title))
        return _svg(round(width), round(legend_y + (len(self.series) - 1) * LINE_H + FONT * 0.6), body)

    def _repr_html_(self) -> str:
        return self.svg()

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))  # IPython's text form (a terminal, or text-only output): the text chart


def _wrap(line: str, columns: int) -> list[str]:
    """A legend line cut into lines of at most `columns` characters, between its entries (which
    are two spaces apart), so that no entry is split."""
    lines = [""]
    for entry in line.split("  "):
        if lines[-1] and len(lines[-1]) + 2 + len(entry) > columns:
            lines.append("")
        lines[-1] += ("  " if lines[-1] else "") + entry
    return lines


def svg_document(picture) -> str:
    """A standalone .svg file of any picture here (for docs/figures): a chart's own SVG; for a
    frame map or page-table view, its SVG with its bold title above and its legend below."""
    if isinstance(picture, (BarChart, LineChart, Timeline)):
        return picture.svg()
    html = picture._repr_html_()
    inner = re.search(r"<svg .*</svg>", html, re.S).group(0).replace(' style="max-width: 100%; height: auto"', "", 1)
    title = unescape(re.search(r"<b>(.*?)</b>", html, re.S).group(1))
    legend = re.search(r"<small>(.*?)</small>", html, re.S).group(1) if "<small>" in html else ""
    inner_w, inner_h = (float(v) for v in re.search(r'width="([\d.]+)" height="([\d.]+)"', inner).groups())
    columns = max(60, int(inner_w / CHAR_W))  # a legend wraps at the picture's width
    notes = [wrapped for line in legend.split("<br>") if legend for wrapped in _wrap(unescape(line), columns)]
    top = TITLE_FONT + 16
    body = [_svg_title(title), inner.replace("<svg ", f'<svg x="{PAD}" y="{top}" ', 1)]
    for i, note in enumerate(notes):  # xml:space keeps the two spaces between legend entries
        text = _svg_text(PAD, top + inner_h + FONT + 10 + i * LINE_H, note)
        body.append(text.replace("<text ", '<text xml:space="preserve" ', 1))
    width = max(2 * PAD + inner_w, _title_width(title), *(2 * PAD + CHAR_W * len(note) for note in notes))
    return _svg(round(width), round(top + inner_h + 16 + LINE_H * len(notes)), body)


# ---- the batch timeline: which request sat in which batch slot at each step ------------------

@dataclass(slots=True)
class Timeline:
    """Batch slots over steps, from the engine's StepReports. A sequence keeps its slot while it
    runs; a letter per request, UPPER case for its prefill step, lower case while decoding,
    ! where it was preempted, _ for a static batch's padding row (computed, thrown away)."""
    reports: list
    max_steps: int = 100  # the text form shows the last this many steps

    def grid(self) -> tuple[list[list[tuple[str, str] | None]], dict[str, int]]:
        """(slots x steps cells of (request_id, kind) or None, request_id -> color index)."""
        slots: list = []          # occupant key (request_id, seq index) per slot, None = free
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
            return marks[kind](letters[rid]) if kind in marks else {"preempted": "!", "padding": "_"}[kind]
        lines = [f"batch timeline: steps {first}-{len(self.reports) - 1}, {len(rows)} slots"]
        lines += [f"slot {i:3d} |" + "".join(cell(c) for c in row[first:]) for i, row in enumerate(rows)]
        shown = list(letters.items())[:12]
        lines.append("  ".join(f"{letter}={rid}" for rid, letter in shown) + ("  ..." if len(letters) > 12 else ""))
        lines.append("UPPER = prefill, lower = decode, ! = preempted, _ = padding, . = empty slot")
        return "\n".join(lines)

    def svg(self) -> str:
        rows, colors = self.grid()
        w, h, left, top = 20, 30, PAD + 8 * CHAR_W, TITLE_FONT + 16
        body = [_svg_title(f"batch timeline: {len(self.reports)} steps, {len(rows)} slots")]
        for i, row in enumerate(rows):
            y = top + i * h
            body.append(_svg_text(PAD, y + h / 2 + FONT * 0.3, f"slot {i}"))
            for step, c in enumerate(row):
                if c is None:
                    continue
                rid, kind = c
                fill = {"preempted": PREEMPTED, "padding": FREE}.get(kind, PALETTE[colors[rid] % len(PALETTE)])
                stroke = ' stroke="#000" stroke-width="3"' if kind == "prefill" else ""
                body.append(f'<g><title>{escape(f"step {step}: {rid} {kind}")}</title>'
                            f'<rect x="{left + step * w + 1.5}" y="{y + 1.5}" width="{w - 4}" height="{h - 5}" '
                            f'fill="{fill}"{stroke}/></g>')
        axis = top + len(rows) * h + FONT + 4  # step numbers under the grid, every 5 steps
        body += [_svg_text(left + step * w + w / 2, axis, str(step), size=SMALL_FONT, anchor="middle", color="#555")
                 for step in range(0, len(self.reports), 5)]
        caption = "step →  color = request; outlined = prefill; black = preempted; grey = padding (static batch)"
        body.append(_svg_text(PAD, axis + LINE_H, caption, size=SMALL_FONT))
        width = max(left + len(self.reports) * w + PAD, 2 * PAD + 0.6 * SMALL_FONT * len(caption))
        return _svg(round(width), round(axis + LINE_H + 8), body)

    def _repr_html_(self) -> str:
        return self.svg()

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))
