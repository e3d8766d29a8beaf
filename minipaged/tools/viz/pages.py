"""Pictures of paged memory: the frame map (the physical pool, one cell per frame) and
page tables (each sequence's logical blocks, with arrows to their frames). They read the
block manager only through its views (frame_states, table_view, seq_ids) and public
methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

from minipaged.backend import cdiv
from minipaged.tools.viz.svg import (
    CACHED,
    CELL,
    FONT,
    FREE,
    OTHER,
    PALETTE,
    RESERVED,
    SHARED,
    _framed,
)

if TYPE_CHECKING:
    from minipaged.paging import BlockManager, FrameState


def _styles(manager: BlockManager) -> dict:
    """seq id -> (letter, color). Integer ids (the engine's) keep theirs for life: id %
    26 and id % 10; other ids go by their order in the manager (A..Z, then '#')."""

    def style(i: int, seq_id) -> tuple[str, str]:
        n = seq_id if isinstance(seq_id, int) else i
        letter = chr(ord("A") + n % 26) if isinstance(seq_id, int) or n < 26 else "#"
        return letter, PALETTE[n % len(PALETTE)]

    return {seq_id: style(i, seq_id) for i, seq_id in enumerate(manager.seq_ids())}


def _frame_cell(state: FrameState, styles: dict) -> tuple[str, str, str]:
    """(text symbol, fill color, tooltip) of one device frame."""
    frame, seqs = state.frame, state.owners
    if len(seqs) > 1:
        return (
            str(len(seqs)) if len(seqs) < 10 else "+",
            SHARED,
            f"frame {frame}: shared by {len(seqs)}: {', '.join(map(repr, seqs))}",
        )
    if seqs:
        letter, color = styles[seqs[0]]
        return letter, color, f"frame {frame}: {seqs[0]!r}"
    if state.cached:
        return (
            "c",
            CACHED,
            f"frame {frame}: cached prefix block, nobody maps it, reusable",
        )
    if state.reserved:
        return (
            "r",
            RESERVED,
            f"frame {frame}: reserved in a sequence's chunk, no token written yet",
        )
    return ".", FREE, f"frame {frame}: free"


def _svg_cell(x: float, y: float, symbol: str, fill: str, tooltip: str) -> str:
    text_color = "#ffffff" if fill in PALETTE or fill == SHARED else "#555555"
    dash = ' stroke-dasharray="5,3"' if fill == CACHED else ""
    return (
        f'<g><title>{escape(tooltip)}</title><rect x="{x}" y="{y}" width="{CELL - 3}"'
        f' height="{CELL - 3}" rx="4" fill="{fill}" stroke="#888"{dash}/><text'
        f' x="{x + (CELL - 3) / 2}" y="{y + CELL / 2 + FONT * 0.3:.1f}"'
        f' font-size="{FONT}" text-anchor="middle"'
        f' fill="{text_color}">{escape(symbol)}</text></g>'
    )


def _svg_arrow(x1: float, y1: float, x2: float, y2: float, color: str) -> str:
    """A line from the middle of one cell to the middle of another (drawn under the
    cells)."""
    c = CELL / 2 - 1
    return (
        f'<line x1="{x1 + c}" y1="{y1 + c}" x2="{x2 + c}" y2="{y2 + c}" '
        f'stroke="{color}" stroke-width="2.5" opacity="0.7"/>'
    )


def _svg_label(y: float, text: str) -> str:
    """A row name at the left edge, truncated to fit."""
    return (
        f'<text x="0" y="{y + CELL / 2 + FONT * 0.35:.1f}"'
        f' font-size="{FONT}">{escape(text[:11])}</text>'
    )


def plural(count: int, noun: str) -> str:
    """'1 frame', '3 frames'."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


# ---- frame map: the physical pool, one cell per frame --------------------------------


@dataclass(slots=True)
class FrameMap:
    """Every device frame, by owner: a letter per sequence, a digit n for a frame n
    sequences share, c for a cached block nobody maps (reusable), r for a frame reserved
    in a contiguous chunk, . for free. `names` (seq id -> a name, e.g. the request's
    "r0") labels the legend.
    """

    manager: BlockManager
    per_row: int = 32
    names: dict | None = None

    def title(self) -> str:
        m = self.manager
        cached = sum(state.cached for state in m.frame_states())
        return (
            f"frame map: {m.num_frames} frames × {m.block_size} slots;"
            f" {m.num_frames - m.num_free_frames} used ({m.usage().shared_frames}"
            f" shared), {cached} cached, {m.num_free_frames - cached} free"
        )

    def cells(self) -> list[tuple[str, str, str]]:
        styles = _styles(self.manager)
        return [_frame_cell(state, styles) for state in self.manager.frame_states()]

    def legend(self) -> list[str]:
        """Who each letter is, then what the other symbols mean."""
        m, styles = self.manager, _styles(self.manager)
        on_device = [
            view for view in map(m.table_view, m.seq_ids()) if not view.swapped
        ]
        names = self.names or {}
        seqs = "  ".join(
            f"{styles[v.seq_id][0]} = {names.get(v.seq_id, repr(v.seq_id))}"
            f" ({plural(len(v.frames), 'frame')})"
            for v in on_device
        )
        reserved = (
            "  r = reserved, not written yet"
            if any(s.reserved for s in m.frame_states())
            else ""
        )
        symbols = (
            f"2-9 = shared by that many sequences  c = cached, reusable{reserved}  . ="
            " free"
        )
        return [seqs, symbols] if seqs else [symbols]

    def __str__(self) -> str:
        symbols = [symbol for symbol, _, _ in self.cells()]
        rows = [
            f"{start:5d}  " + " ".join(symbols[start : start + self.per_row])
            for start in range(0, len(symbols), self.per_row)
        ]
        return "\n".join([self.title(), *rows, *self.legend()])

    def svg(self) -> str:
        """A standalone SVG: the title, the cells, the legend."""
        body = [
            _svg_cell((i % self.per_row) * CELL, (i // self.per_row) * CELL, *cell)
            for i, cell in enumerate(self.cells())
        ]
        rows = cdiv(len(body), self.per_row)
        return _framed(
            self.title(),
            min(len(body), self.per_row) * CELL,
            rows * CELL,
            body,
            self.legend(),
        )

    def _repr_html_(self) -> str:
        return self.svg()

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))  # IPython's text form: the terminal picture


# ---- page tables: a sequence's logical blocks, arrows to their frames ----------------


@dataclass(slots=True)
class PageTableView:
    """Sequences' page tables: logical block i -> frame, with each block's fill and
    sharing. In the SVG the frame row sits in the middle, sequences alternate above and
    below it.
    """

    manager: BlockManager
    seq_ids: list
    # a larger pool draws only the frames these sequences map
    max_frames_drawn: int = 48

    def __str__(self) -> str:
        return "\n".join(self._text(seq_id) for seq_id in self.seq_ids)

    def _text(self, seq_id) -> str:
        view, size = self.manager.table_view(seq_id), self.manager.block_size
        where = " (swapped out: host frames)" if view.swapped else ""
        guessed = f", the last {view.guesses} guessed" if view.guesses else ""
        lines = [
            f"page table of {seq_id!r}: {view.num_tokens} tokens{guessed} in"
            f" {len(view.frames)} blocks{where}"
        ]
        for i, (frame, refs) in enumerate(zip(view.frames, view.ref_counts)):
            filled = min(size, view.num_tokens - i * size)
            lines.append(
                f"  block {i:3d} -> frame {frame:4d}  {filled:3d}/{size}"
                + (f"  shared ×{refs}" if refs > 1 else "")
            )
        return "\n".join(lines)

    def _frames_drawn(self) -> list[int]:
        if self.manager.num_frames <= self.max_frames_drawn:
            return list(range(self.manager.num_frames))
        return sorted({f for s in self.seq_ids for f in self.manager.block_table(s)})

    def svg(self) -> str:
        """A standalone SVG: the caption, then the page tables around the frame row."""
        m, styles, states = (
            self.manager,
            _styles(self.manager),
            self.manager.frame_states(),
        )
        frames = self._frames_drawn()
        tables = {seq_id: m.block_table(seq_id) for seq_id in self.seq_ids}
        left = 4 * CELL  # room for the row names
        x_of = {frame: left + i * CELL for i, frame in enumerate(frames)}
        above = cdiv(len(self.seq_ids), 2)
        row = 2 * CELL  # a sequence row and the gap for its arrows
        frame_y = above * row + CELL
        lines, boxes = [], [_svg_label(frame_y, "frames")]
        for k, seq_id in enumerate(self.seq_ids):
            y = (
                frame_y - (k // 2 + 1) * row
                if k % 2 == 0
                else frame_y + (k // 2 + 1) * row
            )
            letter, color = styles[seq_id]
            boxes.append(_svg_label(y, f"{letter} {seq_id!r}"))
            view = m.table_view(seq_id)
            # blocks from here on hold guesses: "?"
            first_guess = view.num_tokens - view.guesses
            for i, frame in enumerate(tables[seq_id]):
                x = left + i * CELL
                guessed = (i + 1) * m.block_size > first_guess and view.guesses > 0
                lines.append(_svg_arrow(x, y, x_of[frame], frame_y, color))
                boxes.append(
                    _svg_cell(
                        x,
                        y,
                        f"{i}?" if guessed else str(i),
                        color,
                        f"{seq_id!r} block {i} -> frame {frame}"
                        + (", holds guesses" if guessed else ""),
                    )
                )
        for frame in frames:
            _, fill, tooltip = _frame_cell(states[frame], styles)
            if states[frame].owners and not set(states[frame].owners) & set(
                self.seq_ids
            ):
                fill = OTHER  # mapped by a sequence not drawn here
            boxes.append(_svg_cell(x_of[frame], frame_y, str(frame), fill, tooltip))
        width = (
            left + max([len(frames)] + [len(table) for table in tables.values()]) * CELL
        )
        height = frame_y + CELL + (len(self.seq_ids) // 2) * row
        names = ", ".join(f"{styles[s][0]} = {s!r}" for s in self.seq_ids)
        guesses = (
            " (? holds guesses)"
            if any(m.table_view(s).guesses for s in self.seq_ids)
            else ""
        )
        caption = (
            f"page tables ({names}): numbered logical blocks{guesses}, arrows to frames"
            " (numbered)"
        )
        return _framed(caption, width, height, lines + boxes)

    def _repr_html_(self) -> str:
        return self.svg()

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))  # IPython's text form: the terminal picture
