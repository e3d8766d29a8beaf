"""Lab 5, the kernel's page-table lookup: the participant's `struct PagedRows` replaces
the engine's in cuda/paged_attention.cu, the CPU emulation compiles the result (with a
probe kernel that records where each position's row is found), and the kernels are held
to the reference; then the model's decode steps read through it, and the frames it read
are drawn.
"""

from __future__ import annotations

import functools
import hashlib
import re
import tempfile
from html import escape
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from minipaged.attention import emulated, kernels, reference
from minipaged.runner import ModelRunner
from minipaged.tools.lab import engine_run
from minipaged.tools.lab.grading import Failed, NotLoadable, Property
from minipaged.tools.viz.pages import plural
from minipaged.tools.viz.svg import (
    CELL,
    FONT,
    FREE,
    PALETTE,
    SHARED,
    SMALL_FONT,
    _framed,
    _svg_text,
)

STRUCT = re.compile(
    r"template <typename T, int HEAD_DIM>\s*struct PagedRows \{.*?\n\};", re.S
)
BODY = re.compile(r"(operator\[\]\(int pos\) const \{).*?\n    \}", re.S)
PROBE = """
// lab 5's probe: where PagedRows finds each position's row \
(elements from the cache's start)
template <typename T, int HEAD_DIM>
__global__ void lab5_probe(long long* out, const T* cache, const int* block_table, \
int num_positions,
                           int block_size, int num_kv_heads, int kv_head) {
    const PagedRows<T, HEAD_DIM> rows{cache, block_table, block_size, \
num_kv_heads, kv_head};
    for (int pos = threadIdx.x; pos < num_positions; pos += NUM_THREADS) \
out[pos] = rows[pos] - cache;
}
"""
HEAD_DIM = 64
NAMES = (
    "lab5_probe<float, 64>",
    "paged_attention_v1<float, 64>",
    "paged_prefill<float, 64>",
    *(kernels.decode_kernel(5, np.float32, HEAD_DIM, g) for g in (1, 2, 3)),
)  # the GQA groups used


def declaration(struct: str) -> str:
    """The struct without comments, its operator's body and spacing: what must stay the
    engine's."""
    code = re.sub(r"//[^\n]*", "", BODY.sub(r"\1 }", struct))
    return " ".join(code.split())


def engine_struct() -> str:
    return STRUCT.search(kernels.SOURCES["paged_attention"].read_text()).group(0)


def load(path: Path) -> SimpleNamespace:
    """The participant's struct inside the engine's kernels, compiled for the CPU."""
    if not path.is_file():
        raise NotLoadable(
            f"{path} is not a file: copy the starter first (cp labs/lab5_kernel.cu"
            f" {path.name})"
        )
    found = STRUCT.search(path.read_text())
    if found is None:
        raise NotLoadable(
            f"{path.name} has no `template <typename T, int HEAD_DIM> struct PagedRows"
            " { ... };` (keep the starter's first and last lines of the struct)"
        )
    if declaration(found.group(0)) != declaration(engine_struct()):
        raise NotLoadable(
            f"{path.name} changed the struct's fields or operator[]'s declaration: keep"
            " them as in the starter, the kernels build it with {cache, block_table,"
            " block_size, num_kv_heads, kv_head}"
        )
    return build(found.group(0))


def solution() -> dict:
    return vars(build(engine_struct()))


def build(struct: str) -> SimpleNamespace:
    source = kernels.SOURCES["paged_attention"].read_text()
    text = source.replace(engine_struct(), struct) + PROBE
    folder = emulated.cache_dir() / "lab5"
    folder.mkdir(parents=True, exist_ok=True)
    path = (
        folder / f"paged_attention_{hashlib.sha256(text.encode()).hexdigest()[:12]}.cu"
    )
    if not path.exists():
        path.write_text(text)
    try:
        compiled = emulated.library(path, NAMES)
    except RuntimeError as error:
        raise NotLoadable(
            f"your struct does not compile: {first_error(str(error))}"
        ) from None
    launch = functools.partial(emulated.launch_on, compiled)
    launcher = kernels.Launcher(launch=launch, xp=np, num_sms=emulated.NUM_SMS)
    # in the engine run, decode steps read K and V through the participant's lookup;
    # prompts go through the reference (the prefill kernel emulated for 30 layers takes
    # most of a minute; the properties hold it to the reference instead), and so do the
    # writes
    attention = SimpleNamespace(
        write_kv=reference.write_kv,
        copy_blocks=reference.copy_blocks,
        decode=launcher.decode,
        prefill=reference.prefill,
    )
    return SimpleNamespace(
        launch=launch,
        launcher=launcher,
        ModelRunner=functools.partial(ModelRunner, attention=attention),
    )


def first_error(log: str) -> str:
    lines = [line for line in log.splitlines() if "error" in line and ".cu:" in line]
    return (
        re.sub(r"^.*?\.cu:", "line of the kernel file ", lines[0])
        if lines
        else log.splitlines()[-1]
    )


# ---- the properties ------------------------------------------------------------------


def _where(offset: int, block_size: int, num_kv_heads: int) -> str:
    slot, rest = divmod(offset, num_kv_heads * HEAD_DIM)
    head, element = divmod(rest, HEAD_DIM)
    return f"frame {slot // block_size}, offset {slot % block_size}, KV head {head}" + (
        f", element {element}" if element else ""
    )


INT_MAX = 2**31 - 1
BIG = [
    2**27 + 5,
    3,
    2**27 - 2,
]  # frame ids of a huge pool: with 16 slots a frame, slots pass INT_MAX
PROBED = (
    (4, 2, 1, [7, 2, 9, 0]),
    (8, 3, 2, [1, 3, 0]),
    (16, 1, 0, [2, 0]),
    (16, 2, 1, BIG),
)


def probe(
    m, table, num_positions: int, block_size: int, num_kv_heads: int, kv_head: int
) -> np.ndarray:
    """(num_positions,) int64: where the lookup finds each position's row, in elements
    from the cache's start (a pointer difference only: no K or V is read, so a frame id
    may be huge).
    """
    cache = np.zeros((1, block_size, num_kv_heads, HEAD_DIM), np.float32)
    out = np.zeros(num_positions, np.int64)
    m.launch(
        "lab5_probe<float, 64>",
        (1,),
        (kernels.NUM_THREADS,),
        (
            out,
            cache,
            np.array(list(table) + [-1], np.int32),
            np.int32(num_positions),
            np.int32(block_size),
            np.int32(num_kv_heads),
            np.int32(kv_head),
        ),
    )
    return out


def rows_are_found_through_the_block_table(m) -> None:
    for block_size, num_kv_heads, kv_head, table in PROBED:
        num_positions = len(table) * block_size - 1
        found = probe(m, table, num_positions, block_size, num_kv_heads, kv_head)
        if not found.any():
            raise Failed(
                f"block_size {block_size}, {num_kv_heads} KV heads, kv_head {kv_head},"
                f" block table {table}",
                "every rows[pos] is the cache's first row, as the starter's `return"
                " cache;` gives: write operator[] (stuck? python -m minipaged.lab"
                " hint 5)",
            )
        for pos, got in enumerate(found):
            got, slot = (
                int(got),
                table[pos // block_size] * block_size + pos % block_size,
            )
            want = (slot * num_kv_heads + kv_head) * HEAD_DIM
            if got == want:
                continue
            given = (
                f"block_size {block_size}, {num_kv_heads} KV heads, kv_head {kv_head},"
                f" block table {table}"
            )
            found = (
                f"yours read {_where(got, block_size, num_kv_heads)}"
                if got >= 0
                else f"yours read {-got} elements before the cache's start"
            )
            wide = (
                f" (its row starts {want} elements in, more than an int holds"
                f" ({INT_MAX}): compute the slot and the offset in long long)"
                if want > INT_MAX
                else ""
            )
            raise Failed(
                given,
                f"rows[{pos}] should be the row of"
                f" {_where(want, block_size, num_kv_heads)}{wide}; {found}",
            )


def _lookup_first(m) -> None:
    """The kernels dereference what the lookup returns: a wrong lookup reads outside the
    cache
    and could crash the whole emulation, so they run only once the lookup is right."""
    try:
        rows_are_found_through_the_block_table(m)
    except Failed:
        raise Failed(
            "the cases of the first property",
            "not run until the lookup is right (a wrong lookup "
            "reads outside the cache, which could crash the emulation)",
        ) from None


def _case(
    seed: int,
    context_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    block_size: int = 4,
):
    rng = np.random.default_rng(seed)
    num_blocks = sum(-(-n // block_size) for n in context_lens) + 3
    k, v = (
        rng.standard_normal((num_blocks, block_size, num_kv_heads, HEAD_DIM)).astype(
            np.float32
        )
        for _ in "kv"
    )
    frames = list(rng.permutation(num_blocks))  # scattered frames, not in order
    width = max(-(-n // block_size) for n in context_lens)
    tables = np.full((len(context_lens), width), -1, np.int32)
    for i, n in enumerate(context_lens):
        for b in range(-(-n // block_size)):
            tables[i, b] = frames.pop()
    given = (
        f"block_size {block_size}, contexts of {context_lens} tokens in scattered"
        f" frames, {num_heads} query heads over {num_kv_heads} KV heads"
    )
    return k, v, tables, np.array(context_lens, np.int32), rng, given


def _compare(got, want, given: str, what: str, rows: str) -> None:
    error = float(np.abs(got - want).max())
    if not error < 1e-4:
        row, head, element = map(
            int, np.unravel_index(int(np.nanargmax(np.abs(got - want))), got.shape)
        )
        raise Failed(
            given,
            f"{what} differs from the NumPy reference by {error:.3g} (worst at {rows}"
            f" {row}, query head {head}, element {element})",
        )


def decode_matches_the_reference(version: int):
    def check(m) -> None:
        _lookup_first(m)
        k, v, tables, lens, rng, given = _case(
            version, [5, 13, 1], num_heads=6, num_kv_heads=2
        )
        q = rng.standard_normal((len(lens), 6, HEAD_DIM)).astype(np.float32)
        want = reference.decode(q, k, v, tables, lens, 0.125)
        _compare(
            m.launcher.decode(q, k, v, tables, lens, 0.125, version=version),
            want,
            given,
            f"decode version {version}'s output",
            "sequence",
        )

    return check


def prefill_matches_the_reference(m) -> None:
    _lookup_first(m)
    k, v, tables, lens, rng, given = _case(7, [6, 11], num_heads=3, num_kv_heads=1)
    # the last 4 and 3 tokens of each are queries
    starts = np.array([0, 4, 7], np.int32)
    q = rng.standard_normal((7, 3, HEAD_DIM)).astype(np.float32)
    want = reference.prefill(q, k, v, tables, lens, starts, 0.125)
    _compare(
        m.launcher.prefill(q, k, v, tables, lens, starts, 0.125),
        want,
        given,
        "the prefill kernel's output",
        "query row",
    )


LAB5 = [
    Property(
        "rows[pos] is the row of kv_head in slot block_table[pos / block_size] *"
        " block_size + pos % block_size",
        rows_are_found_through_the_block_table,
        "block tables of 2 to 4 frames, frame ids up to 134217733",
    ),
    Property(
        "decode version 1 (one thread per token) equals the NumPy reference",
        decode_matches_the_reference(1),
        "block_size 4, contexts of [5, 13, 1] tokens in scattered frames",
    ),
    Property(
        "decode version 5 (the engine's default) equals the NumPy reference",
        decode_matches_the_reference(5),
        "block_size 4, contexts of [5, 13, 1] tokens in scattered frames",
    ),
    Property(
        "the prefill kernel (causal, many queries) equals the NumPy reference",
        prefill_matches_the_reference,
        "block_size 4, contexts of [6, 11] tokens in scattered frames",
    ),
]


# ---- the engine run: the model reads K and V through the lookup, and a picture of what
# it read ----


class Reads:
    """The frames the participant's lookup found in the decode steps of one engine run:
    before each step's first decode kernel, the probe asks it where every position of
    every row is.
    """

    def __init__(self, pieces):
        self.pieces, self.rows, self.pending, self.steps = pieces, [], False, 0
        self.fullest: tuple[int, int, list[tuple[str, list[int]]]] = (
            0,
            0,
            [],
        )  # (positions, step, rows)

    def new_step(self, batch) -> None:
        """The step's rows, named as the lines say (r1.0: sample 0 of r1)."""
        self.steps, self.pending = self.steps + 1, True
        self.rows = [
            s.request.request_id
            + (f".{s.seq.index}" if len(s.request.seqs) > 1 else "")
            for s in batch.scheduled
        ]

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale, **options):
        # the first layer's call: every layer reads through the same tables
        if self.pending:
            self.pending = False
            _, block_size, num_kv_heads, _ = k_cache.shape
            rows = []
            for name, table, n in zip(
                self.rows, np.asarray(block_tables), np.asarray(context_lens)
            ):
                found = probe(
                    self.pieces, table.tolist(), int(n), block_size, num_kv_heads, 0
                )
                rows.append(
                    (
                        name,
                        [
                            int(o) // (num_kv_heads * HEAD_DIM) // block_size
                            for o in found
                        ],
                    )
                )
            self.fullest = max(
                self.fullest, (sum(len(f) for _, f in rows), -self.steps, rows)
            )
        return self.pieces.launcher.decode(
            q, k_cache, v_cache, block_tables, context_lens, scale, **options
        )


class _RecordingRunner(ModelRunner):
    """The engine's ModelRunner, telling `reads` which sequence each row of a step
    is."""

    def __init__(
        self, model, kv_cache, blocks, attention=None, reads: Reads | None = None
    ):
        super().__init__(model, kv_cache, blocks, attention)
        self.reads = reads

    def prepare(self, batch, extra=None):
        self.reads.new_step(batch)
        return super().prepare(batch, extra)


def _spans(frames: list[int]) -> str:
    """'positions 0-3 in frame 7, 4-5 in frame 2': each run of positions read from one
    frame."""
    spans, start = [], 0
    for pos in range(1, len(frames) + 1):
        if pos == len(frames) or frames[pos] != frames[start]:
            where = f"{start}-{pos - 1}" if pos - 1 > start else f"{start}"
            spans.append(f"{where} in frame {frames[start]}")
            start = pos
    return "positions " + ", ".join(spans)


def _reader(names: list[str]) -> str:
    """A slot's label: its one reader, or 'r1 ×2' for samples of one request sharing
    it."""
    if len(names) == 1:
        return names[0]
    requests = {name.split(".")[0] for name in names}
    return f"{requests.pop()} ×{len(names)}" if len(requests) == 1 else f"×{len(names)}"


def reads_svg(
    rows: list[tuple[str, list[int]]], step: int, block_size: int, per_line: int = 4
) -> str:
    """The frames one decode step read, `per_line` frames a line, each a row of its
    slots: in each slot, the sequence that read it and at which position (dark: a slot
    several sequences read, the prompt that forked samples share)."""
    readers: dict[tuple[int, int], list[tuple[str, int]]] = {}
    for name, frames in rows:
        for pos, frame in enumerate(frames):
            readers.setdefault((frame, pos % block_size), []).append((name, pos))
    color = {name: PALETTE[i % len(PALETTE)] for i, (name, _) in enumerate(rows)}
    frames = sorted({frame for frame, _ in readers})
    slot_w, slot_h, gap, head = 4 * CELL // 3, CELL + 10, CELL // 2, FONT + 6
    frame_w = block_size * slot_w + gap
    body = []
    for i, frame in enumerate(frames):
        x0, y = (i % per_line) * frame_w, (i // per_line) * (head + slot_h + gap // 2)
        body.append(_svg_text(x0, y + FONT, f"frame {frame}"))
        for offset in range(block_size):
            x, who = x0 + offset * slot_w, readers.get((frame, offset), [])
            names = sorted({name for name, _ in who})
            fill = SHARED if len(names) > 1 else color[names[0]] if names else FREE
            ink = "#ffffff" if names else "#555555"
            tip = f"frame {frame}, offset {offset}: " + (
                ", ".join(f"{n} position {p}" for n, p in who) or "not read"
            )
            body += [
                (
                    f'<g><title>{escape(tip)}</title><rect x="{x}" y="{y + head}"'
                    f' width="{slot_w - 3}" height="{slot_h - 3}" rx="4" fill="{fill}"'
                    ' stroke="#888"/>'
                ),
                _svg_text(
                    x + slot_w / 2,
                    y + head + SMALL_FONT + 3,
                    _reader(names) if names else "-",
                    SMALL_FONT,
                    "middle",
                    color=ink,
                ),
                _svg_text(
                    x + slot_w / 2,
                    y + head + 2 * SMALL_FONT + 6,
                    f"p{who[0][1]}" if who else "",
                    SMALL_FONT,
                    "middle",
                    color=ink,
                ),
                "</g>",
            ]
    lines = -(-len(frames) // per_line)
    notes = [
        "p7: position 7 of the sequence; -: a slot not read (past the sequence's end)"
    ]
    notes += [
        f"{name}:  " + _spans(frames).replace(", ", "  ") for name, frames in rows
    ]
    title = (
        f"the frames your lookup read at decode step {step}: each slot's reader and"
        " position"
    )
    return _framed(
        title,
        min(len(frames), per_line) * frame_w,
        lines * (head + slot_h + gap // 2),
        body,
        notes,
    )


# lab 5's run, in which frames run out
ENGINE = dict(block_size=4, num_blocks=24, max_num_seqs=8, enable_prefix_caching=False)
# per sequence: every decode step runs the emulated kernel for each layer
MAX_TOKENS = 8


def serve(pieces, llm, pictures: Path) -> list[str]:
    """Lab 5's engine run: the plugged run of labs 1-5 (the same tokens as the built-in
    engine), with the frames each decode step's rows read through the participant's
    lookup recorded, and the fullest step drawn: which frame every position was read
    from."""
    reads = Reads(pieces)
    attention = SimpleNamespace(
        write_kv=reference.write_kv,
        copy_blocks=reference.copy_blocks,
        decode=reads.decode,
        prefill=reference.prefill,
    )
    recording = SimpleNamespace(
        ModelRunner=functools.partial(
            _RecordingRunner, attention=attention, reads=reads
        )
    )
    # the plugged run's frame map: not this lab's picture
    with tempfile.TemporaryDirectory() as folder:
        lines = engine_run.serve(
            5, recording, llm, ENGINE, True, MAX_TOKENS, Path(folder) / "frames.svg"
        )
    lines = (
        lines[: lines.index("")]
        if "" in lines
        else [line for line in lines if not line.startswith("picture:")]
    )
    positions, step, rows = reads.fullest
    if not rows:
        raise RuntimeError("the engine ran no decode step through your lookup")
    picture = pictures / "lab5_reads.svg"
    picture.parent.mkdir(parents=True, exist_ok=True)
    picture.write_text(reads_svg(rows, -step, ENGINE["block_size"]))
    return lines + [
        "",
        (
            f"what your lookup read at decode step {-step}"
            f" ({plural(positions, 'position')} of {plural(len(rows), 'sequence')}),"
            " each row's positions and the frames they came from:"
        ),
        *(f"  {name:<5} {_spans(frames)}" for name, frames in rows),
        f"picture: {picture}",
    ]
