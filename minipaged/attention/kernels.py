"""How the kernels of cuda/*.cu are launched: their names, grids and arguments, and
which decode version runs when none is asked for. Shared by `cuda` (CuPy) and `emulated`
(NumPy): each builds a `Launcher`, so both run exactly the same launches and the
emulated tests check these lines too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from ..backend import cdiv

CUDA_DIR = Path(__file__).resolve().parents[2] / "cuda"
SOURCES = {
    "paged_attention": CUDA_DIR / "paged_attention.cu",  # the attention kernels
    "cache_ops": CUDA_DIR / "cache_ops.cu",
}  # write_kv, copy_blocks

NUM_THREADS = 128  # threads per block, as NUM_THREADS in the .cu files
PREFILL_ROWS = 16  # query rows per block of paged_prefill (PREFILL_ROWS in the .cu)
HEAD_DIMS = (64, 128)  # the head sizes the kernels are instantiated for
MAX_Q_PER_KV = 8  # v5 and v6 are instantiated for GQA groups of 1..8 query heads
PARTITION_SIZE = 512  # v6: tokens per partition of a context
VERSIONS = (1, 2, 3, 4, 5, 6)  # over a float32/float16 cache
# over an 8-bit (int8) cache and its fp16 scales: v5 decoding in registers
CODED_VERSION = 7
CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float16): "__half"}
# an 8-bit cache's codes: copy_blocks copies their bytes as they are
CODE_CTYPE = "signed char"


# ---- names ---------------------------------------------------------------------------


def source_of(name: str) -> str:
    """The key in SOURCES of the .cu file that defines a kernel instance."""
    return (
        "cache_ops"
        if name.startswith(("write_kv<", "copy_blocks<"))
        else "paged_attention"
    )


def decode_kernel(version: int, dtype, head_dim: int, q_per_kv: int) -> str:
    """The name expression of a decode version; v5 and v6 also depend on the GQA group
    size."""
    ctype = CTYPES[np.dtype(dtype)]
    if version in (5, 6, CODED_VERSION):
        return f"paged_attention_v{version}<{ctype}, {head_dim}, {q_per_kv}>"
    return f"paged_attention_v{version}<{ctype}, {head_dim}>"


def kernel_names(source: str, q_per_kv=range(1, MAX_Q_PER_KV + 1)) -> list[str]:
    """Every instance of a source's kernels the launches below can ask for (q_per_kv
    narrows v5/v6 to some group sizes): what the NVRTC check compiles and the emulated
    library holds.
    """
    if source == "cache_ops":
        return [
            f"{kernel}<{ctype}>"
            for kernel in ("write_kv", "copy_blocks")
            for ctype in CTYPES.values()
        ] + [f"copy_blocks<{CODE_CTYPE}>"]
    names = []
    for dtype, ctype in CTYPES.items():
        for head_dim in HEAD_DIMS:
            names += [decode_kernel(v, dtype, head_dim, 1) for v in (1, 2, 3, 4)]
            names += [
                decode_kernel(v, dtype, head_dim, g)
                for v in (5, 6, CODED_VERSION)
                for g in q_per_kv
            ]
            names += [
                f"paged_attention_v6_reduce<{ctype}, {head_dim}>",
                f"paged_prefill<{ctype}, {head_dim}>",
                f"paged_prefill_int8<{ctype}, {head_dim}>",  # over an 8-bit cache
                f"write_kv_int8<{ctype}, {head_dim}>",
            ]  # codes rows into one
    return names


def pick_version(
    num_seqs: int, num_kv_heads: int, q_per_kv: int, max_context_len: int, num_sms: int
) -> int:
    """The decode version used when none is asked for:
    - v5 (one block per GQA group: each K/V element read once) by default;
    - v6 (split-KV) when v5's num_seqs * num_kv_heads blocks are fewer than the SMs, so
      most of the GPU would idle, and the contexts span more than two partitions, so
      splitting them gives the idle SMs work;
    - v4 when a GQA group has more than MAX_Q_PER_KV query heads (v5/v6 are not built
      for it).
    """
    if q_per_kv > MAX_Q_PER_KV:
        return 4
    if num_seqs * num_kv_heads < num_sms and max_context_len > 2 * PARTITION_SIZE:
        return 6
    return 5


# ---- checks that turn a wrong call into a message ------------------------------------


def _check_cache(cache, q_dtype=None, codes: bool = False) -> None:
    """A full-precision cache (or, with `codes`, an int8 one too) the kernels are built
    for."""
    if cache.ndim != 4 or not cache.flags.c_contiguous:
        raise ValueError(
            "a KV cache must be one contiguous (num_blocks, block_size, "
            f"num_kv_heads, head_dim) array, got shape {cache.shape}"
        )
    known = np.dtype(cache.dtype) in CTYPES or (
        codes and np.dtype(cache.dtype) == np.int8
    )
    if not known or cache.shape[3] not in HEAD_DIMS:
        raise ValueError(
            "the kernels are built for float32/float16 caches with head_dim in "
            f"{HEAD_DIMS}; got {cache.dtype} and head_dim {cache.shape[3]}"
        )
    if q_dtype is not None and np.dtype(q_dtype) != np.dtype(cache.dtype):
        raise ValueError(
            f"q is {q_dtype} but the cache is {cache.dtype}: use one dtype for both"
        )


def _layout(q, k_cache, coded: bool = False) -> tuple[int, int, int]:
    """block_size, num_kv_heads and q_per_kv of a call, once q and the cache are checked
    (an 8-bit cache, `coded`, by _check_coded before; then q is float32 or float16)."""
    if coded:
        if np.dtype(q.dtype) not in CTYPES:
            raise ValueError(f"q must be float32 or float16; got {q.dtype}")
    else:
        _check_cache(k_cache, q.dtype)
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    if q.ndim != 3 or q.shape[2] != head_dim or q.shape[1] % num_kv_heads:
        raise ValueError(
            f"q must be (tokens, num_heads, {head_dim}) with num_heads a multiple of "
            f"the cache's {num_kv_heads} KV heads; got {q.shape}"
        )
    return block_size, num_kv_heads, q.shape[1] // num_kv_heads


def _i32(xp, a):
    return xp.ascontiguousarray(xp.asarray(a), dtype=xp.int32)


def _is_coded(codec, k_scales) -> bool:
    """Whether a call reads or writes an 8-bit cache: codec None lets the scales say
    (given: int8 codes); a codec (a kv_cache_dtype name, or an object with a .name) must
    be "int8", the codes the kernels read. Any other (fp8, a participant's own) runs in
    minipaged.attention.reference.
    """
    if codec is None:
        return k_scales is not None
    name = codec if isinstance(codec, str) else getattr(codec, "name", codec)
    if name != "int8":
        raise ValueError(
            f"the GPU kernels read int8 codes only; kv_cache_dtype={name!r} runs on the"
            " CPU (device='cpu', minipaged.attention.reference)"
        )
    if k_scales is None:
        raise ValueError(
            "codec 'int8' needs the cache's k_scales and v_scales (KVCache.scales_of)"
        )
    return True


def _check_coded(k_cache, v_cache, k_scales, v_scales) -> None:
    """An 8-bit cache as the int8 kernels take it: contiguous int8 codes (num_blocks,
    block_size, num_kv_heads, head_dim) and float16 scales (num_blocks, block_size,
    num_kv_heads), K and V alike.
    """
    for codes in (k_cache, v_cache):
        if (
            np.dtype(codes.dtype) != np.int8
            or codes.ndim != 4
            or not codes.flags.c_contiguous
            or codes.shape != k_cache.shape
            or codes.shape[3] not in HEAD_DIMS
        ):
            raise ValueError(
                "an 8-bit cache must be contiguous int8 (num_blocks, block_size,"
                f" num_kv_heads, head_dim) arrays with head_dim in {HEAD_DIMS}; got"
                f" {codes.dtype} {codes.shape} (fp8 runs in"
                " minipaged.attention.reference only)"
            )
    for scales in (k_scales, v_scales):
        if (
            np.dtype(scales.dtype) != np.float16
            or scales.shape != k_cache.shape[:3]
            or not scales.flags.c_contiguous
        ):
            raise ValueError(
                "k_scales and v_scales must be contiguous float16 (num_blocks,"
                f" block_size, num_kv_heads) = {k_cache.shape[:3]}; got {scales.dtype}"
                f" {scales.shape}"
            )


# ---- the launches --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Launcher:
    """The contract's functions on one device. `launch(name, grid, block, args)` starts
    the kernel instance `name` (a name expression such as "paged_attention_v5<float, 64,
    3>"); `xp` allocates the buffers; `num_sms` feeds the decode version rule."""

    launch: Callable[[str, tuple, tuple, tuple], None]
    xp: ModuleType  # numpy or cupy
    num_sms: int  # streaming multiprocessors

    def write_kv(
        self,
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k_scales=None,
        v_scales=None,
        codec=None,
    ) -> None:
        """cache_ops.cu write_kv: one block per new token. With scales (an 8-bit cache,
        codec None or "int8"), write_kv_int8 codes the rows as they are written
        (write_coded's codes).
        """
        xp = self.xp
        if _is_coded(codec, k_scales):
            return self._write_kv_int8(
                k, v, k_cache, v_cache, slot_mapping, k_scales, v_scales
            )
        _check_cache(k_cache, k.dtype)
        if k.shape[1:] != k_cache.shape[2:] or v.shape != k.shape:
            raise ValueError(
                f"k and v must be (num_tokens, {k_cache.shape[2]}, "
                f"{k_cache.shape[3]}) like the cache rows; got {k.shape}, {v.shape}"
            )
        if len(k) == 0:
            return
        row_size = k_cache.shape[2] * k_cache.shape[3]  # num_kv_heads * head_dim
        self.launch(
            f"write_kv<{CTYPES[np.dtype(k.dtype)]}>",
            (len(k),),
            (NUM_THREADS,),
            (
                k_cache,
                v_cache,
                xp.ascontiguousarray(k),
                xp.ascontiguousarray(v),
                _i32(xp, slot_mapping),
                np.int32(row_size),
            ),
        )

    def _write_kv_int8(
        self, k, v, k_cache, v_cache, slot_mapping, k_scales, v_scales
    ) -> None:
        """paged_attention.cu write_kv_int8: one block per new token, a warp per (K or
        V, KV head) row. The codes and scales are written in place: they must be the
        cache's own arrays.
        """
        xp = self.xp
        _check_coded(k_cache, v_cache, k_scales, v_scales)
        if (
            np.dtype(k.dtype) not in CTYPES
            or k.shape[1:] != k_cache.shape[2:]
            or v.shape != k.shape
            or np.dtype(v.dtype) != np.dtype(k.dtype)
        ):
            raise ValueError(
                f"k and v must be float32/float16 (num_tokens, {k_cache.shape[2]},"
                f" {k_cache.shape[3]}) like the cache rows; got {k.dtype} {k.shape},"
                f" {v.dtype} {v.shape}"
            )
        if len(k) == 0:
            return
        self.launch(
            f"write_kv_int8<{CTYPES[np.dtype(k.dtype)]}, {k_cache.shape[3]}>",
            (len(k),),
            (NUM_THREADS,),
            (
                k_cache,
                v_cache,
                k_scales,
                v_scales,
                xp.ascontiguousarray(k),
                xp.ascontiguousarray(v),
                _i32(xp, slot_mapping),
                np.int32(k_cache.shape[2]),
            ),
        )

    def copy_blocks(self, k_cache, v_cache, pairs) -> None:
        """cache_ops.cu copy_blocks: one block per (src, dst) pair. An 8-bit cache's
        codes are copied as bytes (its scales are copied by KVCache.apply, beside)."""
        _check_cache(k_cache, codes=True)
        coded = np.dtype(k_cache.dtype) == np.int8
        pairs = _i32(self.xp, pairs).reshape(-1, 2)
        if len(pairs) == 0:
            return
        frame_size = k_cache[0].size  # block_size * kvh * head_dim
        ctype = CODE_CTYPE if coded else CTYPES[np.dtype(k_cache.dtype)]
        self.launch(
            f"copy_blocks<{ctype}>",
            (len(pairs),),
            (NUM_THREADS,),
            (k_cache, v_cache, pairs, np.int32(frame_size)),
        )

    def decode(
        self,
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        scale,
        version: int | None = None,
        partition_size: int = PARTITION_SIZE,
        k_scales=None,
        v_scales=None,
        codec=None,
    ):
        """One query per sequence, by decode version 1..6 (None: pick_version's choice);
        partition_size is v6's. With scales (an 8-bit cache, codec None or "int8"),
        version 7 (decode_coded)."""
        xp = self.xp
        if _is_coded(codec, k_scales):
            if version not in (None, CODED_VERSION):
                raise ValueError(
                    f"an 8-bit cache is read by decode version {CODED_VERSION} only,"
                    f" not {version}"
                )
            return self.decode_coded(
                q,
                k_cache,
                v_cache,
                block_tables,
                context_lens,
                scale,
                k_scales,
                v_scales,
            )
        block_size, num_kv_heads, q_per_kv = _layout(q, k_cache)
        num_seqs, num_heads, head_dim = q.shape
        block_tables, context_lens = _i32(xp, block_tables), _i32(xp, context_lens)
        max_blocks = block_tables.shape[1]
        # a bound known without reading context_lens
        max_context = max_blocks * block_size
        if version is None:
            version = pick_version(
                num_seqs, num_kv_heads, q_per_kv, max_context, self.num_sms
            )
        if version not in VERSIONS or (version in (5, 6) and q_per_kv > MAX_Q_PER_KV):
            raise ValueError(
                f"no decode version {version} for {q_per_kv} query heads per KV "
                f"head: versions are {VERSIONS}; 5 and 6 take up to {MAX_Q_PER_KV}"
            )
        out = xp.empty_like(q)
        if num_seqs == 0:
            return out
        name = decode_kernel(version, q.dtype, head_dim, q_per_kv)
        inputs = (
            xp.ascontiguousarray(q),
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            np.int32(max_blocks),
            np.int32(block_size),
            np.int32(num_kv_heads),
            np.float32(scale),
        )
        if version <= 3:  # v1-v3 keep the logits in global memory
            logits = xp.empty((num_seqs, num_heads, max_context), dtype=xp.float32)
            self.launch(
                name,
                (num_heads, num_seqs),
                (NUM_THREADS,),
                (out, *inputs, logits, np.int32(max_context)),
            )
        elif version == 4:  # a block per (query head, sequence)
            self.launch(name, (num_heads, num_seqs), (NUM_THREADS,), (out, *inputs))
        elif version == 5:  # a block per (KV head, sequence)
            self.launch(name, (num_kv_heads, num_seqs), (NUM_THREADS,), (out, *inputs))
        else:  # v6: a block per partition, then the merge
            num_partitions = cdiv(max_context, partition_size)
            part_out = xp.empty(
                (num_seqs, num_partitions, num_heads, head_dim), xp.float32
            )
            part_lse = xp.empty((num_seqs, num_partitions, num_heads), xp.float32)
            self.launch(
                name,
                (num_kv_heads, num_seqs, num_partitions),
                (NUM_THREADS,),
                (part_out, part_lse, *inputs, np.int32(partition_size)),
            )
            self.launch(
                f"paged_attention_v6_reduce<{CTYPES[np.dtype(q.dtype)]}, {head_dim}>",
                (num_heads, num_seqs),
                (NUM_THREADS,),
                (
                    out,
                    part_out,
                    part_lse,
                    context_lens,
                    np.int32(partition_size),
                    np.int32(num_partitions),
                ),
            )
        return out

    def decode_coded(
        self, q, k_cache, v_cache, block_tables, context_lens, scale, k_scales, v_scales
    ):
        """v7: one query per sequence over an int8 cache, k_scales and v_scales
        (num_blocks,
        block_size, num_kv_heads) float16, a block per (KV head, sequence) as v5."""
        xp = self.xp
        if np.dtype(k_cache.dtype) != np.int8 or np.dtype(v_cache.dtype) != np.int8:
            raise ValueError(
                f"decode version {CODED_VERSION} reads int8 codes; got {k_cache.dtype}"
                " caches (fp8 runs in minipaged.attention.reference only)"
            )
        if (
            k_cache.ndim != 4
            or not k_cache.flags.c_contiguous
            or k_cache.shape[3] not in HEAD_DIMS
            or np.dtype(q.dtype) not in CTYPES
            or q.ndim != 3
        ):
            raise ValueError(
                f"v{CODED_VERSION} takes contiguous (num_blocks, block_size,"
                f" num_kv_heads, head_dim) caches with head_dim in {HEAD_DIMS} and a"
                " float32/float16 q (tokens, heads, head_dim); got caches"
                f" {k_cache.shape}, q {q.shape} {q.dtype}"
            )
        num_seqs, num_heads, head_dim = q.shape
        block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
        if k_scales.shape != k_cache.shape[:3] or v_scales.shape != k_scales.shape:
            raise ValueError(
                "k_scales and v_scales must be (num_blocks, block_size, num_kv_heads)"
                f" = {k_cache.shape[:3]}; got {k_scales.shape}, {v_scales.shape}"
            )
        if (
            q.shape[2] != k_cache.shape[3]
            or num_heads % num_kv_heads
            or num_heads // num_kv_heads > MAX_Q_PER_KV
        ):
            raise ValueError(
                f"q must be (tokens, num_heads, {k_cache.shape[3]}) with"
                f" 1..{MAX_Q_PER_KV} query heads per KV head ({num_kv_heads} KV heads);"
                f" got {q.shape}"
            )
        out = xp.empty_like(q)
        if num_seqs == 0:
            return out
        block_tables, context_lens = _i32(xp, block_tables), _i32(xp, context_lens)
        f16 = [xp.ascontiguousarray(s, dtype=xp.float16) for s in (k_scales, v_scales)]
        self.launch(
            decode_kernel(CODED_VERSION, q.dtype, head_dim, num_heads // num_kv_heads),
            (num_kv_heads, num_seqs),
            (NUM_THREADS,),
            (
                out,
                xp.ascontiguousarray(q),
                k_cache,
                v_cache,
                *f16,
                block_tables,
                context_lens,
                np.int32(block_tables.shape[1]),
                np.int32(block_size),
                np.int32(num_kv_heads),
                np.float32(scale),
            ),
        )
        return out

    def prefill(
        self,
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        query_start_loc,
        scale,
        k_scales=None,
        v_scales=None,
        codec=None,
    ):
        """paged_prefill: a block per PREFILL_ROWS query rows (token x head of a GQA
        group). With scales (an 8-bit cache, codec None or "int8"), paged_prefill_int8
        over the same grid.
        """
        xp = self.xp
        coded = _is_coded(codec, k_scales)
        if coded:
            _check_coded(k_cache, v_cache, k_scales, v_scales)
        block_size, num_kv_heads, q_per_kv = _layout(q, k_cache, coded)
        num_tokens, num_heads, head_dim = q.shape
        num_seqs = len(query_start_loc) - 1
        out = xp.empty_like(q)
        if num_tokens == 0 or num_seqs == 0:
            return out
        # the grid's size: free from a host (NumPy) query_start_loc, a sync from a
        # device one
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
        block_tables, context_lens = _i32(xp, block_tables), _i32(xp, context_lens)
        query_start_loc = _i32(xp, query_start_loc)
        grid = (cdiv(max_query_len * q_per_kv, PREFILL_ROWS), num_kv_heads, num_seqs)
        kernel = "paged_prefill_int8" if coded else "paged_prefill"
        cache = (k_cache, v_cache, k_scales, v_scales) if coded else (k_cache, v_cache)
        self.launch(
            f"{kernel}<{CTYPES[np.dtype(q.dtype)]}, {head_dim}>",
            grid,
            (NUM_THREADS,),
            (
                out,
                xp.ascontiguousarray(q),
                *cache,
                block_tables,
                context_lens,
                query_start_loc,
                np.int32(block_tables.shape[1]),
                np.int32(block_size),
                np.int32(num_kv_heads),
                np.int32(q_per_kv),
                np.float32(scale),
            ),
        )
        return out
