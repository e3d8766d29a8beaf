"""Charts for the numbers notebooks, lecture notes and benchmarks compute: bar charts
(stacked or plain) and line charts. str() gives a text chart for a terminal, svg() a
standalone SVG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from minipaged.tools.viz.svg import (
    CELL,
    CHAR_W,
    FONT,
    LINE_H,
    PAD,
    PALETTE,
    TITLE_FONT,
    _svg,
    _svg_legend,
    _svg_text,
    _svg_title,
    _title_width,
)

CHART_BARS = "█▓▒░"  # text form: one fill character per stacked segment
BAR_W = 560  # px, the longest bar of a bar chart
PLOT_W, PLOT_H = 640, 320  # px, a line chart's plot area


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


def _check_values(kind: str, columns: dict, count: int, of: str) -> None:
    """Each named column has `count` values, none negative: bars and the y axis start at
    0."""
    for name, values in columns.items():
        if len(values) != count:
            raise ValueError(
                f"{kind} {name!r} has {len(values)} values for {count} {of}"
            )
        if any(v < 0 for v in values):
            raise ValueError(
                f"{kind} {name!r} has a negative value: charts here start at 0"
            )


@dataclass(slots=True)
class BarChart:
    """Horizontal bars, one per label; each bar stacks its segments left to right (with
    one
    segment it is a plain bar chart). str() is a text chart, _repr_html_() an SVG."""

    title: str
    labels: list[str]
    segments: dict[str, list[float]]  # segment name -> one value per label
    unit: str = ""  # written after every number: "%", " slots"
    digits: int = 1
    width: int = 40  # characters of the longest bar in the text form

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
            ends = [round(sum(row[: i + 1]) * scale) for i in range(len(row))]
            bar = "".join(
                CHART_BARS[i % len(CHART_BARS)] * (end - start)
                for i, (start, end) in enumerate(zip([0] + ends, ends))
            )
            lines.append(f"{label:>{pad}}  {bar:<{self.width}}  {self._values(row)}")
        if len(self.segments) > 1:
            lines.append(
                "  ".join(
                    f"{CHART_BARS[i % len(CHART_BARS)]} {name}"
                    for i, name in enumerate(self.segments)
                )
            )
        return "\n".join(lines)

    def _values(self, row: list[float]) -> str:
        if len(row) == 1:
            return _number(row[0], self.digits, self.unit)
        return ", ".join(
            f"{name} {_number(v, self.digits, self.unit)}"
            for name, v in zip(self.segments, row)
        )

    def svg(self) -> str:
        left, row_height = (
            PAD + CHAR_W * max(map(len, self.labels), default=0) + 12,
            CELL + 6,
        )
        scale, top, text_y = (
            self._scale(BAR_W),
            TITLE_FONT + 24,
            (CELL - 2) / 2 + FONT * 0.35,
        )
        body = [_svg_title(self.title)]
        for k, (label, row) in enumerate(zip(self.labels, self._rows())):
            y, x = top + k * row_height, left
            body.append(_svg_text(left - 8, y + text_y, label, anchor="end"))
            for i, (name, value) in enumerate(zip(self.segments, row)):
                w, number = value * scale, _number(value, self.digits, self.unit)
                tooltip = (
                    f"{label}: {name} {number}"
                    if len(row) > 1
                    else f"{label}: {number}"
                )
                body.append(
                    f'<g><title>{escape(tooltip)}</title><rect x="{x:.1f}" y="{y}"'
                    f' width="{w:.1f}" height="{CELL - 2}"'
                    f' fill="{PALETTE[i % len(PALETTE)]}"/></g>'
                )
                if len(row) > 1 and w > CHAR_W * len(number) + 8:
                    body.append(
                        _svg_text(
                            x + w / 2, y + text_y, number, anchor="middle", color="#fff"
                        )
                    )
                x += w
            if len(row) == 1:
                body.append(
                    _svg_text(
                        x + 6, y + text_y, _number(row[0], self.digits, self.unit)
                    )
                )
        height = top + len(self.labels) * row_height + 6
        if len(self.segments) > 1:
            body += _svg_legend(height + FONT + 8, list(self.segments))
            height += 16 + len(self.segments) * LINE_H
        numbers = max(
            (
                len(_number(v, self.digits, self.unit))
                for row in self._rows()
                for v in row
            ),
            default=0,
        )
        width = max(
            left + BAR_W + 12 + CHAR_W * (numbers + 1) + PAD, _title_width(self.title)
        )
        return _svg(round(width), round(height), body)

    def _repr_html_(self) -> str:
        return self.svg()

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        # IPython's text form (a terminal, or text-only output): the text chart
        printer.text(str(self))


@dataclass(slots=True)
class LineChart:
    """One or more series over the same x values, the y axis from 0. str() is a table of
    the points (every one, or evenly thinned to max_rows), _repr_html_() an SVG."""

    title: str
    x: list[float]
    series: dict[str, list[float]]  # name -> one y per x
    x_label: str = "x"
    y_label: str = ""
    log_x: bool = False  # x axis in powers of two (block sizes)
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
        rows = (
            range(n)
            if n <= self.max_rows
            else sorted(
                {round(i * (n - 1) / (self.max_rows - 1)) for i in range(self.max_rows)}
            )
        )
        header = [self.x_label, *self.series]
        table = [
            [_tick(self.x[i])]
            + [_number(ys[i], self.digits) for ys in self.series.values()]
            for i in rows
        ]
        widths = [max(len(cell) for cell in column) for column in zip(header, *table)]
        lines = [
            self.title + (f" ({self.y_label})" if self.y_label else ""),
            "  ".join(h.rjust(w) for h, w in zip(header, widths)),
        ]
        lines += [
            "  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in table
        ]
        if n > self.max_rows:
            lines.append(f"({len(rows)} of {n} points shown)")
        return "\n".join(lines)

    def svg(self) -> str:
        left, top, plot_w, plot_h = (
            PAD + 9 * CHAR_W,
            TITLE_FONT + 2 * FONT + 16,
            PLOT_W,
            PLOT_H,
        )
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
            body.append(
                f'<line x1="{left}" y1="{py(y):.1f}" x2="{left + plot_w}"'
                f' y2="{py(y):.1f}" stroke="#ddd"/>'
            )
            body.append(
                _svg_text(left - 8, py(y) + FONT * 0.35, _tick(y), anchor="end")
            )
        for x in x_ticks:
            body.append(
                f'<line x1="{px(x):.1f}" y1="{top + plot_h}" x2="{px(x):.1f}"'
                f' y2="{top + plot_h + 6}" stroke="#888"/>'
            )
            body.append(
                _svg_text(px(x), top + plot_h + FONT + 8, _tick(x), anchor="middle")
            )
        body.append(
            f'<path d="M{left},{top} V{top + plot_h} H{left + plot_w}" fill="none"'
            ' stroke="#888"/>'
        )
        body.append(
            _svg_text(
                left + plot_w / 2,
                top + plot_h + 2 * FONT + 18,
                self.x_label,
                anchor="middle",
            )
        )
        for i, (name, ys) in enumerate(self.series.items()):
            color = PALETTE[i % len(PALETTE)]
            points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(self.x, ys))
            body.append(
                f'<polyline points="{points}" fill="none" stroke="{color}"'
                ' stroke-width="3"/>'
            )
            # dots with tooltips; a long series stays a plain line
            if len(self.x) <= 40:
                for x, y in zip(self.x, ys):
                    tip = (
                        f"{name}: {_number(y, self.digits)}"
                        f" at {self.x_label} {_tick(x)}"
                    )
                    body.append(
                        f"<g><title>{escape(tip)}</title><circle"
                        f' cx="{px(x):.1f}" cy="{py(y):.1f}" r="5" fill="{color}"/></g>'
                    )
        legend_y = top + plot_h + 3 * FONT + 32
        body += _svg_legend(legend_y, list(self.series))
        names = max(map(len, self.series), default=0)
        width = max(
            left + plot_w + 3 * CHAR_W,
            PAD + FONT + 6 + CHAR_W * names + PAD,
            _title_width(self.title),
        )
        return _svg(
            round(width),
            round(legend_y + (len(self.series) - 1) * LINE_H + FONT * 0.6),
            body,
        )

    def _repr_html_(self) -> str:
        return self.svg()

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        # IPython's text form (a terminal, or text-only output): the text chart
        printer.text(str(self))
