"""Pictures of minipaged's state, for people who would rather look than read.

Each picture is a small object: str() gives terminal text, _repr_html_() an inline SVG for
notebooks (no plotting library). One section per picture: the frame map and page tables of
the paging layer here; the scheduler's batch timeline will get its own section.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minipaged.paging import BlockManager

# ---- shared by the paging pictures ---------------------------------------------------------

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
           "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6"]
SHARED, CACHED, FREE, OTHER = "#333333", "#ffffff", "#eeeeee", "#bbbbbb"
CELL = 22  # px, one frame or one logical block


def _styles(manager) -> dict:
    """seq id -> (letter, color), the same in every picture: A..Z, then '#'."""
    return {seq_id: (chr(ord("A") + i) if i < 26 else "#", PALETTE[i % len(PALETTE)])
            for i, seq_id in enumerate(manager.tables)}


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
    dash = ' stroke-dasharray="3,2"' if fill == CACHED else ""
    return (f'<g><title>{escape(tooltip)}</title><rect x="{x}" y="{y}" width="{CELL - 2}" '
            f'height="{CELL - 2}" rx="3" fill="{fill}" stroke="#888"{dash}/>'
            f'<text x="{x + (CELL - 2) / 2}" y="{y + CELL / 2 + 2}" font-size="11" '
            f'text-anchor="middle" fill="{text_color}">{escape(symbol)}</text></g>')


def _svg_arrow(x1: float, y1: float, x2: float, y2: float, color: str) -> str:
    """A line from the middle of one cell to the middle of another (drawn under the cells)."""
    c = CELL / 2 - 1
    return (f'<line x1="{x1 + c}" y1="{y1 + c}" x2="{x2 + c}" y2="{y2 + c}" '
            f'stroke="{color}" stroke-width="1.5" opacity="0.7"/>')


def _svg_label(y: float, text: str) -> str:
    """A row name at the left edge, truncated to fit."""
    return f'<text x="0" y="{y + CELL / 2 + 4}" font-size="11">{escape(text[:11])}</text>'


def _svg(width: float, height: float, body: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
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
        rows = -(-len(body) // self.per_row)
        svg = _svg(min(len(body), self.per_row) * CELL, rows * CELL, body)
        legend = escape(_legend(self.manager, _styles(self.manager))).replace("\n", "<br>")
        return f"<div><b>{escape(self.title())}</b><br>{svg}<br><small>{legend}</small></div>"


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
        above = -(-len(self.seq_ids) // 2)
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
