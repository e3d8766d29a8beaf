"""Lab 11: compressed memory. You write the int8 codec of the KV cache: a float16 scale per row
(one token's numbers for one KV head), codes -127..127, value ~ code * scale; so the same bytes
hold about 4x the frames of float32 (meeting 15, docs/15_compressed_memory.md).

Grade it (then it serves the model):  python -m minipaged.lab check 11 my_codec.py
Hints, one step at a time:            python -m minipaged.lab hint 11
"""

from __future__ import annotations

import numpy as np


class Int8:
    """Symmetric int8 codes with a float16 scale per row (token, KV head): codes -127..127,
    scale = the row's largest |value| / 127, value ~ code * scale. -128 is never used, so 0 is
    the middle and a row's largest value and its negative code alike.

    The engine calls the three methods below on arrays whose last two axes are (kv_heads,
    head_dim): a row is the last axis. write_kv codes new K and V rows with scale_of then
    encode, stores the scale in float16 beside the codes, and gather decodes whole frames.
    """
    name = "int8"
    dtype = np.dtype(np.int8)   # the KV arrays' storage: one byte a number

    def scale_of(self, rows: np.ndarray) -> np.ndarray:
        """rows (..., kv_heads, head_dim) -> each row's scale, float16 (..., kv_heads): its largest
        |value| / 127, so that its largest value codes to ±127. A row of zeros has scale 0."""
        raise NotImplementedError("lab 11: write Int8.scale_of (stuck? python -m minipaged.lab hint 11)")

    def encode(self, x: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """x (..., kv_heads, head_dim) / scale (..., kv_heads), rounded to the nearest whole number
        and clipped to -127..127 (a scale rounded down to float16 can put the largest value a hair
        past 127): int8 codes of x's shape. A scale of 0 (a row of zeros) codes 0, with no NaN."""
        raise NotImplementedError("lab 11: write Int8.encode (stuck? python -m minipaged.lab hint 11)")

    def decode(self, codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """codes (..., kv_heads, head_dim) back to float32 values: code * scale (..., kv_heads)."""
        raise NotImplementedError("lab 11: write Int8.decode (stuck? python -m minipaged.lab hint 11)")
