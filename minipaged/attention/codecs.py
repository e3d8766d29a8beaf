"""The KV codecs (meeting 15, compressed memory; Wilson, Kaplan and Smaragdakis 1999):
how an 8-bit cache turns a row of K or V (one token, one KV head) into codes and back,
value ~ code * scale. The seam of kv_cache_dtype: "int8", "fp8", or a codec of one's own
(name, dtype, scale_of, encode, decode), coded in write_kv and decoded in gather
(minipaged.attention.reference).
"""

from __future__ import annotations

import numpy as np

# A row's scale is its largest |value| over the codec's largest code, in float16, for K
# and V apart: scales (num_blocks, block_size, kvh) beside the codes. A row's codes
# depend on that row alone, never on what its frame held before or on which step wrote
# it: a batched, chunked, preempted or recomputed request gets the very codes, hence the
# same tokens, as one run alone.

# The largest scale: float16's largest finite value, 65504. A row past code_max * 65504
# (about 8.3e6 for int8) keeps this finite scale and its largest values saturate at the
# largest code; an infinite scale would code every value 0, and 0 * inf decodes to NaN.
SCALE_MAX = float(np.finfo(np.float16).max)


def row_scales(rows: np.ndarray, code_max: float) -> np.ndarray:
    """rows (..., kv_heads, head_dim) -> each row's scale, float16 (..., kv_heads): its
    largest |value| / code_max, at most SCALE_MAX, so that finite rows never get an
    infinite scale."""
    return np.minimum(np.abs(rows).max(axis=-1) / code_max, SCALE_MAX).astype(
        np.float16
    )


class Int8:
    """Symmetric int8 codes with a float16 scale per row (token, KV head): codes
    -127..127, value ~ code * scale, scale = the row's largest |value| / 127 (at most
    SCALE_MAX). -128 is never used, so 0 is the middle and a row's largest value and its
    negative code alike."""

    name = "int8"
    dtype = np.dtype(np.int8)  # the KV arrays' storage: one byte a number

    def scale_of(self, rows: np.ndarray) -> np.ndarray:
        """rows (..., kv_heads, head_dim) -> each row's scale, float16 (..., kv_heads):
        its largest |value| / 127, so that its largest value codes to ±127, at most
        SCALE_MAX (beyond 127 * 65504 the largest values saturate at ±127). A row of
        zeros has scale 0.
        """
        return row_scales(rows, 127.0)

    def encode(self, x: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """x (..., kv_heads, head_dim) / scale (..., kv_heads), rounded to the nearest
        whole number and clipped to -127..127 (a scale rounded down to float16 can put
        the largest value a hair past 127): int8 codes of x's shape. A scale of 0 (a row
        of zeros) codes 0, with no NaN.
        """
        scale = np.asarray(scale, dtype=np.float32)
        y = x / np.where(scale > 0, scale, 1)[..., None]
        return np.rint(np.clip(y, -127, 127)).astype(np.int8)

    def decode(self, codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """codes (..., kv_heads, head_dim) back to float32 values: code * scale (...,
        kv_heads)."""
        return (
            codes.astype(np.float32) * np.asarray(scale).astype(np.float32)[..., None]
        )


def _fp8_e4m3_values() -> np.ndarray:
    """The float32 value of each of the 256 e4m3 bit patterns (0x7f and 0xff are
    NaN)."""
    bits = np.arange(256)
    sign = np.where(bits & 0x80, -1.0, 1.0)
    exponent, mantissa = (bits >> 3) & 0xF, bits & 0x7
    normal = (1 + mantissa / 8) * 2.0 ** (exponent - 7)
    # 0: subnormals
    values = sign * np.where(exponent == 0, mantissa / 8 * 2.0**-6, normal)
    values[(bits & 0x7F) == 0x7F] = np.nan
    return values.astype(np.float32)


FP8_VALUES = _fp8_e4m3_values()  # (256,) bit pattern -> value


class FP8:
    """fp8 e4m3 codes (OCP's E4M3FN: 4 exponent bits, 3 mantissa bits, largest 448),
    emulated: NumPy has no fp8 type, so a code is the bit pattern in uint8, coded by
    looking up the nearest of the 256 values (FP8_VALUES) and decoded through that
    table. scale = largest |value| / 448.
    """

    name = "fp8"
    dtype = np.dtype(np.uint8)
    code_max = 448.0

    def scale_of(self, rows: np.ndarray) -> np.ndarray:
        """rows (..., kv_heads, head_dim) -> float16 (..., kv_heads): largest |value| /
        448, at most SCALE_MAX."""
        return row_scales(rows, self.code_max)

    def encode(self, x: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """x / scale as the nearest e4m3 value's bit pattern (uint8), clipped to ±448;
        scale 0 codes 0."""
        scale = np.asarray(scale, dtype=np.float32)
        y = np.clip(
            x / np.where(scale > 0, scale, 1)[..., None], -self.code_max, self.code_max
        )
        positive = FP8_VALUES[:0x7F]  # codes 0x00..0x7e: 0 up to 448, increasing
        above = np.searchsorted(positive, np.abs(y)).clip(1, 0x7E)
        nearer = np.where(
            np.abs(y) - positive[above - 1] < positive[above] - np.abs(y),
            above - 1,
            above,
        )
        return (nearer | np.where(y < 0, 0x80, 0)).astype(np.uint8)

    def decode(self, codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """codes (..., kv_heads, head_dim) back to float32: the e4m3 value * scale (...,
        kv_heads)."""
        return FP8_VALUES[codes] * np.asarray(scale).astype(np.float32)[..., None]


INT8, FP8_E4M3 = Int8(), FP8()
# kv_cache_dtype -> the built-in codec
CODECS = {codec.name: codec for codec in (INT8, FP8_E4M3)}
# storage dtype -> the largest code
CODE_MAX = {
    INT8.dtype: 127.0,
    FP8_E4M3.dtype: FP8.code_max,
}


def codec_for(dtype, codec=None):
    """The codec of an 8-bit cache: `codec` when given (the KVCache's own), else the
    built-in one of its storage dtype (int8: Int8; uint8: FP8)."""
    if codec is not None:
        return codec
    dtype = np.dtype(dtype)
    if dtype == INT8.dtype:
        return INT8
    if dtype == FP8_E4M3.dtype:
        return FP8_E4M3
    raise ValueError(
        f"no built-in KV codec stores {dtype} (int8: 'int8', uint8: 'fp8'); pass codec="
    )
