"""Lab 11's cases: a file as a participant writes it from the hints, and the catalogue
of plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = """
import numpy as np


class Int8:
    name = "int8"
    dtype = np.dtype(np.int8)

    def scale_of(self, rows):
        return (np.abs(rows).max(axis=-1) / 127).astype(np.float16)

    def encode(self, x, scale):
        scale = np.asarray(scale, dtype=np.float32)[..., None]
        steps = x / np.where(scale > 0, scale, 1)
        return np.clip(np.rint(steps), -127, 127).astype(np.int8)

    def decode(self, codes, scale):
        scale = np.asarray(scale, dtype=np.float32)[..., None]
        return codes.astype(np.float32) * scale
"""

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

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that
# must catch it)
MISTAKES = [
    (
        "one scale for every row (the whole array's largest value)",
        "return (np.abs(rows).max(axis=-1) / 127).astype(np.float16)",
        ("return np.full(rows.shape[:-1], np.abs(rows).max() / 127, dtype=np.float16)"),
        FULL_RANGE,
    ),
    (
        "one scale per token, over all its heads",
        "return (np.abs(rows).max(axis=-1) / 127).astype(np.float16)",
        (
            "top = np.abs(rows).max(axis=(-2, -1), keepdims=True)[..., 0]\n"
            "        return np.broadcast_to(top / 127, rows.shape[:-1])"
            ".astype(np.float16)"
        ),
        FULL_RANGE,
    ),
    (
        "the largest value, not the largest |value|",
        "return (np.abs(rows).max(axis=-1) / 127).astype(np.float16)",
        "return (rows.max(axis=-1) / 127).astype(np.float16)",
        FULL_RANGE,
    ),
    (
        "the scale reduced over the wrong axis",
        "return (np.abs(rows).max(axis=-1) / 127).astype(np.float16)",
        "return (np.abs(rows).max(axis=0) / 127).astype(np.float16)",
        SHAPES,
    ),
    (
        "the scale kept in float32",
        "return (np.abs(rows).max(axis=-1) / 127).astype(np.float16)",
        "return np.abs(rows).max(axis=-1) / 127",
        SHAPES,
    ),
    (
        "divided by 128, the end of int8's range",
        "return (np.abs(rows).max(axis=-1) / 127).astype(np.float16)",
        "return (np.abs(rows).max(axis=-1) / 128).astype(np.float16)",
        ROUND_TRIP,
    ),
    (
        "truncated toward zero, not rounded",
        "return np.clip(np.rint(steps), -127, 127).astype(np.int8)",
        "return np.clip(steps, -127, 127).astype(np.int8)",
        ROUND_TRIP,
    ),
    (
        "no clip: past 127 int8 wraps around",
        "return np.clip(np.rint(steps), -127, 127).astype(np.int8)",
        "return np.rint(steps).astype(np.int8)",
        RANGE,
    ),
    (
        "clipped to -128..127",
        "return np.clip(np.rint(steps), -127, 127).astype(np.int8)",
        "return np.clip(np.rint(steps), -128, 127).astype(np.int8)",
        RANGE,
    ),
    (
        "a zero row divided by its scale of 0",
        "steps = x / np.where(scale > 0, scale, 1)",
        "steps = x / scale",
        ZERO,
    ),
    (
        "decode scaled by 127 once more",
        "return codes.astype(np.float32) * scale",
        "return codes.astype(np.float32) * scale / 127",
        ROUND_TRIP,
    ),
    (
        "decode in float16",
        "return codes.astype(np.float32) * scale",
        "return (codes.astype(np.float32) * scale).astype(np.float16)",
        SHAPES,
    ),
    (
        "scale_of hands its work to the engine's own codec",
        "        return (np.abs(rows).max(axis=-1) / 127).astype(np.float16)\n",
        (
            "        from minipaged.attention.codecs import Int8\n"
            "        return Int8().scale_of(rows)\n"
        ),
        SHAPES,
    ),
]

# the line that opens a method body: the loop, crash and exit tests put a statement
# after it
BREAK_AT = "    def scale_of(self, rows):\n"
