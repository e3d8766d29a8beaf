"""Lab 11, compressed memory (meeting 15): the properties that grade a participant's
int8 codec (scale per row, rounding, clipping, zero rows, rows coded alone), then the
model served with their codec on the kv_cache_dtype seam beside the built-in "int8": the
same greedy tokens, and the frames the same bytes hold against float32's.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from minipaged.attention import codecs
from minipaged.paging import num_blocks_for_memory
from minipaged.sampling import SamplingParams
from minipaged.tools.lab.engine_run import QUESTIONS, SYSTEM
from minipaged.tools.lab.grading import Failed, Property, in_one_line, time_limit
from minipaged.tools.viz import BarChart, LineChart


def solution() -> dict:
    return {"Int8": codecs.Int8}


# ---- the rows the properties code: small, seeded, each row its own size --------------


def rows(shape=(5, 3, 8), seed: int = 0) -> np.ndarray:
    """Random float32 rows (..., kv_heads, head_dim), each row (token, head) of its own
    magnitude (0.01 to 50), as K and V rows are."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * rng.uniform(0.01, 50, (*shape[:-1], 1))
    return x.astype(np.float32)


def coded(m, x: np.ndarray):
    """(scale, codes, decoded) of x by the participant's codec, as write_kv and gather
    use it: the scale is stored in float16, and decoding reads the stored one."""
    codec = m.Int8()
    scale = codec.scale_of(x)
    codes = codec.encode(x, scale)
    stored = np.asarray(scale).astype(np.float16)
    return scale, codes, codec.decode(codes, stored)


def described(array) -> str:
    """'an int8 array of shape (5, 3)', or what else it is."""
    if not isinstance(array, np.ndarray):
        return f"a {type(array).__name__} ({array!r:.40})"
    return f"a {array.dtype} array of shape {array.shape}"


def shapes_and_dtypes(m) -> None:
    for shape, what in [
        ((5, 3, 8), "(tokens, kv_heads, head_dim)"),
        ((2, 4, 3, 8), "(blocks, block_size, kv_heads, head_dim)"),
    ]:
        x = rows(shape)
        given = f"rows of shape {shape} {what}"
        scale, codes, back = coded(m, x)
        for name, value, want_shape, want_dtype in [
            ("scale_of(rows)", scale, shape[:-1], np.float16),
            ("encode(rows, scale)", codes, shape, None),
            ("decode(codes, scale)", back, shape, np.float32),
        ]:
            if (
                not isinstance(value, np.ndarray)
                or value.shape != want_shape
                or (want_dtype is not None and value.dtype != want_dtype)
            ):
                dtype = f"{np.dtype(want_dtype)} " if want_dtype is not None else ""
                why = (
                    ": one scale per row (the last axis, head_dim, reduced)"
                    if name.startswith("scale")
                    else ""
                )
                raise Failed(
                    given,
                    f"{name} returned {described(value)}; expected a {dtype}array of"
                    f" shape {want_shape}{why}",
                )


def round_trip(m) -> None:
    x = rows((6, 3, 16), seed=1)
    given = "6 tokens x 3 KV heads x 16 numbers, each row of its own size (0.01 to 50)"
    scale, codes, back = coded(m, x)
    step = np.asarray(scale).astype(np.float32)[..., None]
    # + float16's rounding of the scale
    bound = step / 2 + np.abs(x).max(axis=-1, keepdims=True) * 2**-10
    error = np.abs(np.asarray(back, dtype=np.float64) - x)
    bad = np.argwhere(~(error <= bound))
    if len(bad):
        t, h, i = bad[np.argmax((error / np.maximum(bound, 1e-30))[tuple(bad.T)])]
        raise Failed(
            given,
            f"token {t}, head {h}, number {i}: {x[t, h, i]:.5g} came back as"
            f" {back[t, h, i]:.5g} (code {codes[t, h, i]}, scale {step[t, h, 0]:.5g}):"
            f" off by {error[t, h, i]:.3g}, more than half a step"
            f" ({step[t, h, 0] / 2:.3g}); rounded to the nearest code, and decoded as"
            " code * scale?",
        )


def largest_codes_127(m) -> None:
    x = rows((4, 2, 8), seed=2)
    x[1, 0] = -np.abs(x[1, 0])  # a row whose largest |value| is negative
    given = "4 tokens x 2 KV heads x 8 numbers (row (1, 0) all negative)"
    _, codes, _ = coded(m, x)
    where = np.abs(x).argmax(axis=-1)  # (tokens, heads)
    for t, h in np.ndindex(where.shape):
        i = where[t, h]
        want = 127 if x[t, h, i] > 0 else -127
        if codes[t, h, i] != want:
            raise Failed(
                given,
                f"row ({t}, {h}): its largest |value| {x[t, h, i]:.5g} coded"
                f" {codes[t, h, i]}, expected {want}: scale_of is the row's largest"
                " |value| / 127, so that the row uses the whole range",
            )


def codes_in_range_and_clipped(m) -> None:
    x = rows((3, 2, 8), seed=3)
    given = (
        "3 tokens x 2 KV heads x 8 numbers, then encode(x, scale) with x past 127 steps"
    )
    _, codes, _ = coded(m, x)
    if codes.dtype != np.int8:
        raise Failed(
            given,
            f"encode returned {codes.dtype} codes; expected int8 (-127..127, one byte)",
        )
    if codes.min() < -127 or codes.max() > 127:
        raise Failed(
            given,
            f"encode gave code {codes.min() if codes.min() < -127 else codes.max()}:"
            " codes stay in -127..127 (-128 is never used: the range is symmetric)",
        )
    steps = np.array(
        [200.0, -300.0, 127.4, -127.6, 0.4, 1000.0, -128.2, 126.6], np.float32
    )
    scale = np.array([[0.5]], np.float16)
    clipped = m.Int8().encode((steps * 0.5).reshape(1, 1, 8), scale)
    want = np.array([127, -127, 127, -127, 0, 127, -127, 127], np.int8)
    if (
        not isinstance(clipped, np.ndarray)
        or clipped.shape != (1, 1, 8)
        or (clipped.reshape(-1) != want).any()
    ):
        raise Failed(
            f"encode of {(steps * 0.5).tolist()} with scale 0.5 (that is"
            f" {steps.tolist()} steps)",
            f"gave {np.asarray(clipped).reshape(-1).tolist()}, expected"
            f" {want.tolist()}: clip to -127..127 before the codes become int8 (past"
            " 127, int8 wraps around to negative)",
        )


def zero_rows(m) -> None:
    x = rows((4, 2, 8), seed=4)
    x[1] = 0
    x[3, 1] = 0
    given = "4 tokens x 2 KV heads x 8 numbers, token 1's rows and row (3, 1) all zeros"
    with warnings.catch_warnings(record=True) as said, np.errstate(all="warn"):
        warnings.simplefilter("always")
        scale, codes, back = coded(m, x)
    numpy_said = [
        str(w.message) for w in said if issubclass(w.category, RuntimeWarning)
    ]
    if numpy_said:
        raise Failed(
            given,
            f"NumPy warned: {numpy_said[0]}: a zero row has scale 0, and 0 / 0 is NaN;"
            " divide by the scale only where it is above 0 (a zero row codes 0)",
        )
    zero = np.zeros(x.shape[:-1], bool)
    zero[1], zero[3, 1] = True, True
    if (np.asarray(scale)[zero] != 0).any():
        raise Failed(
            given,
            f"scale_of gave a zero row the scale {np.asarray(scale)[zero].max()},"
            " expected 0",
        )
    if (
        (codes[zero] != 0).any()
        or not np.isfinite(back).all()
        or (back[zero] != 0).any()
    ):
        raise Failed(
            given,
            f"a zero row coded {codes[zero][0].tolist()} and decoded"
            f" {np.asarray(back)[zero][0].tolist()}; expected codes 0 and values 0,"
            " no NaN",
        )


def rows_coded_alone(m) -> None:
    x = rows((6, 3, 8), seed=5)
    given = "6 tokens x 3 KV heads x 8 numbers, coded at once and then each token alone"
    scale, codes, _ = coded(m, x)
    for t in range(len(x)):
        alone_scale, alone_codes, _ = coded(m, x[t : t + 1])
        if (np.asarray(alone_scale)[0] != np.asarray(scale)[t]).any() or (
            alone_codes[0] != codes[t]
        ).any():
            raise Failed(
                given,
                f"token {t} alone got scales {np.asarray(alone_scale)[0].tolist()},"
                f" among the others {np.asarray(scale)[t].tolist()}: a row's scale and"
                " codes must depend on that row alone (a scale over the whole batch"
                " changes with what is batched with it)",
            )


SHAPES = (
    "scale_of gives one float16 scale per row (token, KV head), encode keeps the rows'"
    " shape, decode gives float32"
)
ROUND_TRIP = (
    "each number comes back within half a step: |decode(encode(x)) - x| <= scale / 2"
)
FULL_RANGE = (
    "each row's largest |value| codes to +127 or -127, its sign kept: the row uses the"
    " whole range"
)
RANGE = (
    "codes are int8 in -127..127, and a value past 127 steps is clipped to ±127, never"
    " wrapped around"
)
ZERO = (
    "a row of zeros has scale 0, codes 0 and decodes to 0, with no division by zero (no"
    " NaN)"
)
ALONE = (
    "a row's scale and codes depend on that row alone: coded alone or in a batch, the"
    " same bytes"
)

PROPERTIES = [
    Property(SHAPES, shapes_and_dtypes, "rows of shape (5, 3, 8) and (2, 4, 3, 8)"),
    Property(ROUND_TRIP, round_trip, "6 tokens x 3 KV heads x 16 numbers"),
    Property(FULL_RANGE, largest_codes_127, "4 tokens x 2 KV heads x 8 numbers"),
    Property(
        RANGE,
        codes_in_range_and_clipped,
        "3 tokens x 2 KV heads x 8 numbers, and values past 127 steps",
    ),
    Property(ZERO, zero_rows, "4 tokens x 2 KV heads x 8 numbers, some rows all zeros"),
    Property(
        ALONE,
        rows_coded_alone,
        "6 tokens x 3 KV heads x 8 numbers, at once and token by token",
    ),
]


# ---- the run: the model served with their codec on the kv_cache_dtype seam -----------

MEMORY = 64 * 2**20  # the KV pool of the run, bytes
ENGINE = dict(block_size=16, kv_cache_memory=MEMORY, max_num_seqs=4)
MAX_TOKENS = 8


class Watched:
    """Their codec as the engine calls it, the first rows it coded kept (layer 0's K
    rows of the first step): the row the picture shows."""

    def __init__(self, codec):
        self.codec, self.name, self.dtype, self.first = (
            codec,
            getattr(codec, "name", "yours"),
            codec.dtype,
            None,
        )

    def scale_of(self, rows):
        """Their scale_of."""
        return self.codec.scale_of(rows)

    def encode(self, x, scale):
        """Their encode; the first rows kept."""
        if self.first is None:
            self.first = np.array(x, dtype=np.float32)
        return self.codec.encode(x, scale)

    def decode(self, codes, scale):
        """Their decode."""
        return self.codec.decode(codes, scale)


def greedy(engine, prompts: list[str]) -> dict[str, list[int]]:
    """Every prompt to its end, greedy: request id -> its tokens."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    out = {}
    for _ in range(200):
        if not engine.has_unfinished_requests():
            return out
        out.update(
            {o.request_id: list(o.outputs[0].token_ids) for o in engine.step().finished}
        )
    raise RuntimeError("the engine had not finished after 200 steps")


def row_chart(x: np.ndarray, codec) -> LineChart:
    """One K row (head_dim numbers): |value| and |decoded - value| beside half a
    step."""
    rows = x[None, None]  # (1, 1, head_dim): one token, one head
    scale = np.asarray(codec.scale_of(rows))
    back = np.asarray(
        codec.decode(codec.encode(rows, scale), scale.astype(np.float16))
    )[0, 0]
    scale = float(scale.reshape(-1)[0])
    return LineChart(
        "one K row (layer 0, KV head 0): |value| and the error of your int8 codes",
        list(range(len(x))),
        {
            "|value| (float32)": np.abs(x).tolist(),
            "|error| x 100": (100 * np.abs(back - x)).tolist(),
            "half a step x 100": [50 * scale] * len(x),
        },
        x_label="number in the row (head_dim)",
        digits=3,
    )


def serve_lab11(pieces, llm, pictures: Path) -> list[str]:
    """Their Int8 and the built-in 'int8' serve the same prompts: the same greedy
    tokens. Then the frames the pool holds in int8 against float32 (a bar chart) and one
    K row they coded.
    """
    prompts = [f"{SYSTEM} {q}" for q in QUESTIONS]
    watched = Watched(pieces.Int8())
    try:
        with time_limit(300):
            theirs = greedy(llm.new_engine(**ENGINE, kv_cache_dtype=watched), prompts)
    except Exception as error:
        raise RuntimeError(
            f"the engine with your Int8 failed: {in_one_line(error)}"
        ) from None
    built_in = greedy(llm.new_engine(**ENGINE, kv_cache_dtype="int8"), prompts)
    full = greedy(llm.new_engine(**ENGINE), prompts)
    lines = []
    for i in range(len(prompts)):
        request_id = f"r{i}"
        if theirs.get(request_id) != built_in[request_id]:
            raise RuntimeError(
                f"request {request_id}: your codec gave tokens"
                f" {theirs.get(request_id)}, the built-in int8 {built_in[request_id]}"
            )
        same = (
            "the same as"
            if full[request_id] == built_in[request_id]
            else "not those of"
        )
        text = llm.tokenizer.decode(theirs[request_id])
        lines.append(
            f"  {request_id} same {len(theirs[request_id])} tokens as the built-in int8"
            f" ({same} float32): {json.dumps(text[:40])}"
        )
    c = llm.model.config
    sizes = (c.num_layers, c.num_kv_heads, c.head_dim, ENGINE["block_size"])
    frames = {
        "float32": num_blocks_for_memory(MEMORY, *sizes, "float32"),
        "float16": num_blocks_for_memory(MEMORY, *sizes, "float16"),
        "your int8": num_blocks_for_memory(MEMORY, *sizes, watched),
    }
    chart = BarChart(
        f"frames in {MEMORY // 2**20} MiB of KV memory ({c.num_layers} layers,"
        f" block_size {ENGINE['block_size']})",
        list(frames),
        {"frames": list(frames.values())},
        unit=" frames",
        digits=0,
    )
    lines.append(
        f"  {frames['your int8']} frames in {MEMORY // 2**20} MiB with your codes,"
        f" {frames['float32']} in float32:"
        f" {frames['your int8'] / frames['float32']:.2f}x"
    )
    pictures.mkdir(parents=True, exist_ok=True)
    (pictures / "lab11_frames.svg").write_text(chart.svg())
    # layer 0's K, a token of the first prompt, head 0
    row = watched.first[min(5, len(watched.first) - 1), 0]
    (pictures / "lab11_row.svg").write_text(row_chart(row, pieces.Int8()).svg())
    return lines + [
        "",
        str(chart),
        f"picture: {pictures / 'lab11_frames.svg'}",
        f"picture: {pictures / 'lab11_row.svg'}",
    ]
