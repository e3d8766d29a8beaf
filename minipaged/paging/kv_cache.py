"""KV storage: per layer, K and V arrays [num_blocks, block_size, num_kv_heads,
head_dim].

The block manager decides where tokens go; before each forward step this module moves
whole frames (the step's MemoryMoves: swaps, the tier's stores and loads, copy-on-write)
with their scales when they hold 8-bit codes (kv_cache_dtype), and the attention layers
read it.
"""

from __future__ import annotations

import importlib
import os
import weakref

import numpy as np

from minipaged.backend import default_dtype, get_xp, resolve_device, to_numpy
from minipaged.paging.allocator import DEFAULT_BLOCK_SIZE, check_size
from minipaged.paging.tier_file import TierFile

SWAP_SPACE = 4 * 2**30  # default bytes of host memory for swapped-out frames
# kv_cache_dtype (vLLM's option) -> how a frame stores K and V: None is the model's
# dtype; int8 and fp8 (e4m3 bit patterns in uint8) are 8-bit codes with a float16 scale
# per (slot, KV head), coded by the built-in codecs of minipaged.attention.codecs. The
# option also takes a codec of one's own (an object, or a "module:Class" path): what it
# must have is CODEC_PARTS.
KV_CACHE_DTYPES = {"auto": None, "int8": np.dtype(np.int8), "fp8": np.dtype(np.uint8)}
CODEC_PARTS = ("name", "dtype", "scale_of", "encode", "decode")


def kv_storage_dtype(kv_cache_dtype, model_dtype):
    """How the KV arrays store K and V for vLLM's kv_cache_dtype option: a dtype for
    "auto" (the model's), "int8" or "fp8" (8-bit codes, see minipaged.attention.codecs);
    a codec of one's own (an object, or a "module:Class" path: a class is built with no
    arguments) is checked (check_codec) and returned as it is, its `dtype` the
    storage's. Else a ValueError.
    """
    if isinstance(kv_cache_dtype, str) and ":" in kv_cache_dtype:
        kv_cache_dtype = load_codec(kv_cache_dtype)
    if isinstance(kv_cache_dtype, type) and not issubclass(kv_cache_dtype, np.generic):
        kv_cache_dtype = kv_cache_dtype()  # a codec's class
    if kv_cache_dtype is not None and not isinstance(
        kv_cache_dtype, (str, int, float, type, np.dtype)
    ):
        return check_codec(kv_cache_dtype)
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"kv_cache_dtype must be one of {', '.join(map(repr, KV_CACHE_DTYPES))}, a"
            f" codec ('module:Class' or an object with {', '.join(CODEC_PARTS)}), got"
            f" {kv_cache_dtype!r} (fp8 is e4m3, emulated in NumPy)"
        )
    return KV_CACHE_DTYPES[kv_cache_dtype] or np.dtype(model_dtype)


def is_codec(storage) -> bool:
    """Whether a KV storage (kv_storage_dtype's answer) is a codec object rather than a
    dtype."""
    return not isinstance(storage, (str, type, np.dtype)) and hasattr(storage, "encode")


def storage_dtype(storage) -> np.dtype:
    """The numpy dtype of the KV arrays for a storage: the dtype itself, or a codec's
    `dtype`."""
    return np.dtype(storage.dtype if is_codec(storage) else storage)


def check_codec(codec):
    """A codec of one's own, returned when it has every part (CODEC_PARTS: methods
    callable) and stores one byte a number; else a ValueError saying what is missing."""
    missing = [part for part in CODEC_PARTS if not hasattr(codec, part)]
    missing += [
        part
        for part in CODEC_PARTS[2:]
        if hasattr(codec, part) and not callable(getattr(codec, part))
    ]
    if missing:
        raise ValueError(
            f"kv_cache_dtype={codec!r}: a codec needs {', '.join(CODEC_PARTS)}"
            " (scale_of, encode and decode methods); it has no usable"
            f" {', '.join(missing)}"
        )
    try:
        dtype = np.dtype(codec.dtype)
    except TypeError:
        dtype = None
    if dtype is None or dtype.itemsize != 1:
        size = (
            f"{dtype} ({dtype.itemsize} bytes)"
            if dtype is not None
            else f"{codec.dtype!r}, not a numpy dtype"
        )
        raise ValueError(
            f"kv_cache_dtype codec {getattr(codec, 'name', codec)!r}: its dtype is"
            f" {size}; a codec stores one byte a number (numpy int8 or uint8): that is"
            " what compresses"
        )
    return codec


def load_codec(path: str):
    """The object at "package.module:Name" (a codec, or its class), or a ValueError
    naming the path."""
    module, _, name = path.partition(":")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(
            f"kv_cache_dtype={path!r}: cannot load {name!r} from module {module!r}"
            f" ({error})"
        ) from None
    return found


def is_coded(dtype) -> bool:
    """Whether KV arrays of this dtype (or codec) hold 8-bit codes, with scales beside
    them."""
    return storage_dtype(dtype).itemsize == 1


def default_kv_memory(device: str, requested: int) -> int:
    """Bytes for the KV cache: as asked, else 512 MiB on a CPU, half the free memory on
    a GPU."""
    if requested:
        return requested
    if device == "cuda":
        import cupy

        free, _ = cupy.cuda.runtime.memGetInfo()
        return free // 2
    return 512 * 2**20


def bytes_per_frame(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    dtype="float16",
) -> int:
    """2 (K and V) × num_layers × block_size × num_kv_heads × head_dim × itemsize, and
    for 8-bit codes as many float16 scales as rows: 2 × num_layers × block_size ×
    num_kv_heads × 2 bytes.
    """
    scales = 2 * num_layers * block_size * num_kv_heads * 2 if is_coded(dtype) else 0
    return (
        2
        * num_layers
        * block_size
        * num_kv_heads
        * head_dim
        * storage_dtype(dtype).itemsize
        + scales
    )


def num_blocks_for_memory(
    kv_cache_memory: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    dtype="float16",
) -> int:
    """How many frames fit in `kv_cache_memory` bytes:

        bytes per frame = 2 (K and V) × num_layers × block_size × num_kv_heads
                          × head_dim × itemsize
        num_blocks      = kv_cache_memory // bytes per frame

    SmolLM2-135M in fp16 (30 layers, 3 KV heads, head_dim 64), block_size 16:
    2 × 30 × 16 × 3 × 64 × 2 = 368,640 bytes a frame (23,040 a token); 1 GiB holds 2,912
    frames, 46,592 tokens. In int8: 184,320 + 5,760 bytes of scales = 190,080 (1.94x
    fewer), 5,648 frames.
    """
    kv_cache_memory = check_size("kv_cache_memory", kv_cache_memory, minimum=0)
    frame = bytes_per_frame(
        check_size("num_layers", num_layers),
        check_size("num_kv_heads", num_kv_heads),
        check_size("head_dim", head_dim),
        check_size("block_size", block_size),
        dtype,
    )
    if kv_cache_memory < frame:
        raise ValueError(
            f"kv_cache_memory of {kv_cache_memory:,} bytes holds no frame: one frame "
            f"needs {frame:,} bytes; give more memory or a smaller block_size"
        )
    return kv_cache_memory // frame


class KVCache:
    """K and V of every frame, every layer: k[layer] and v[layer] are [num_blocks,
    block_size, num_kv_heads, head_dim] views; frame f, offset o is slot f * block_size
    + o. One allocation holds them all, (2, num_layers, num_blocks, ...) on the caller's
      device, plus a host (NumPy)
    pool of the same shape for swapped-out frames, and one for the tier behind the
    prefix cache (`num_tier_blocks`; in a file through numpy.memmap when `tier_path` is
    given). New tokens' K and V are written into their slots by the attention layer
    (`write_kv` of minipaged.attention), not here. A dtype of one byte (int8, or uint8
    for fp8) holds 8-bit codes: `scales` (K/V, layers, num_blocks, block_size, kv_heads)
    float16 then go wherever their frames go (host, tier; beside a tier file its scales
    stay in memory, 1/32 of its bytes). Other dtypes have empty scales (last axis 0), so
    every move copies both without a test. `dtype` may be a codec (kv_storage_dtype):
    the cache keeps it (`codec`) and stores its dtype.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        num_host_blocks: int = 0,
        dtype=None,
        device: str | None = None,
        num_tier_blocks: int = 0,
        tier_path=None,
    ):
        self.device = resolve_device(device)
        self.xp = get_xp(self.device)
        # None: the built-in codec of an 8-bit dtype
        self.codec = dtype if is_codec(dtype) else None
        self.dtype = storage_dtype(dtype or default_dtype(self.device))
        layers = check_size("num_layers", num_layers)
        num_blocks = check_size("num_blocks", num_blocks, minimum=0)
        num_host_blocks = check_size("num_host_blocks", num_host_blocks, minimum=0)
        frame = (
            check_size("block_size", block_size),
            check_size("num_kv_heads", num_kv_heads),
            check_size("head_dim", head_dim),
        )
        # (K/V, layers, num_blocks, block_size, kv_heads, head_dim) on the device, the
        # same in host memory
        num_tier_blocks = check_size("num_tier_blocks", num_tier_blocks, minimum=0)
        if is_coded(self.dtype) and self.device == "cuda":
            raise ValueError(
                "an 8-bit kv_cache_dtype runs on the CPU for now: the GPU has its"
                " decode kernel (paged_attention_v7) but no coding write_kv or 8-bit"
                " prefill yet; use 'auto' there"
            )
        self.data = self.xp.zeros((2, layers, num_blocks, *frame), dtype=self.dtype)
        self.host = np.zeros((2, layers, num_host_blocks, *frame), dtype=self.dtype)
        self.tier, self.tier_file = make_tier(
            (2, layers, num_tier_blocks, *frame), self.dtype, tier_path
        )
        # (K/V, layers, frames, block_size, kv_heads)
        rows = frame[:2] if is_coded(self.dtype) else (block_size, 0)
        self.scales = self.xp.zeros((2, layers, num_blocks, *rows), dtype=np.float16)
        self.host_scales = np.zeros(
            (2, layers, num_host_blocks, *rows), dtype=np.float16
        )
        self.tier_scales = np.zeros(
            (2, layers, num_tier_blocks, *rows), dtype=np.float16
        )
        self.closed = False
        # the tier file's lock is held as long as this cache lives: given back by
        # close(), or when it is garbage collected
        self._release = (
            weakref.finalize(self, self.tier_file.release) if self.tier_file else None
        )

    def close(self) -> None:
        """Give back the tier's file (kv_offload_path): flush it and release its lock,
        so that another engine may use the path. The tier is empty after it; closing
        twice does nothing.
        """
        if self.closed:
            return
        self.closed = True
        if isinstance(self.tier, np.memmap):
            self.tier.flush()
        self.tier = np.zeros(
            (*self.tier.shape[:2], 0, *self.tier.shape[3:]), dtype=self.dtype
        )
        self.tier_scales = self.tier_scales[:, :, :0]
        if self._release is not None:
            self._release()

    @classmethod
    def for_memory(
        cls,
        kv_cache_memory: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        dtype=None,
        device: str | None = None,
        num_host_blocks: int = 0,
    ) -> KVCache:
        """As many frames as `kv_cache_memory` bytes hold (see
        num_blocks_for_memory)."""
        dtype = (
            dtype
            if is_codec(dtype)
            else np.dtype(dtype or default_dtype(resolve_device(device)))
        )
        num_blocks = num_blocks_for_memory(
            kv_cache_memory, num_layers, num_kv_heads, head_dim, block_size, dtype
        )
        return cls(
            num_layers,
            num_blocks,
            num_kv_heads,
            head_dim,
            block_size,
            num_host_blocks,
            dtype,
            device,
        )

    @property
    def k(self):
        return self.data[0]  # (layers, num_blocks, block_size, kv_heads, head_dim)

    @property
    def v(self):
        return self.data[1]  # (layers, num_blocks, block_size, kv_heads, head_dim)

    def scales_of(self, layer: int) -> dict:
        """The attention functions' scale arguments for one layer: {} for full
        precision, else k_scales and v_scales, each (num_blocks, block_size, kv_heads)
        float16, and the codec that
        codes them (None: the built-in one of the cache's dtype, int8 or fp8)."""
        if not is_coded(self.dtype):
            return {}
        return {
            "k_scales": self.scales[0, layer],
            "v_scales": self.scales[1, layer],
            "codec": self.codec,
        }

    @property
    def num_blocks(self) -> int:
        return self.data.shape[2]

    @property
    def block_size(self) -> int:
        return self.data.shape[3]

    def apply(self, moves, copy_blocks) -> None:
        """Make one step's MemoryMoves before its forward pass, in their order: swap
        out, the tier's stores and loads, swap in, then copy-on-write with
        `copy_blocks(k_cache, v_cache, pairs)` of the attention implementation, layer by
        layer (on a GPU, the copy_blocks kernel of cuda/cache_ops.cu)."""
        self.swap_out(moves.swap_out)
        self.move_tier(moves.tier)
        self.swap_in(moves.swap_in)
        if moves.copies:
            # (num_copies, 2)
            pairs = self.xp.asarray(moves.copies, dtype=self.xp.int32)
            for layer in range(self.data.shape[1]):
                copy_blocks(self.k[layer], self.v[layer], pairs)
            # a copy keeps its scales
            self.scales[:, :, pairs[:, 1]] = self.scales[:, :, pairs[:, 0]]

    def swap_out(self, pairs) -> None:
        """Copy (device_frame, host_frame) pairs to the host pool
        (BlockManager.swap_out)."""
        if pairs:
            device_frames, host_frames = map(list, zip(*pairs))
            self.host[:, :, host_frames] = to_numpy(self.data[:, :, device_frames])
            self.host_scales[:, :, host_frames] = to_numpy(
                self.scales[:, :, device_frames]
            )

    def swap_in(self, pairs) -> None:
        """Copy (host_frame, device_frame) pairs back to the device
        (BlockManager.swap_in)."""
        if pairs:
            host_frames, device_frames = map(list, zip(*pairs))
            self.data[:, :, device_frames] = self.xp.asarray(
                self.host[:, :, host_frames]
            )
            self.scales[:, :, device_frames] = self.xp.asarray(
                self.host_scales[:, :, host_frames]
            )

    def move_tier(self, moves) -> None:
        """Make the tier's moves in their order (BlockManager.take_tier_moves):
        ("store", device frame, tier frame) copies out, ("load", tier frame, device
        frame) copies back. A run of one kind into distinct frames is one copy."""
        if moves and self.closed:
            raise RuntimeError(
                "this KV cache was closed (KVCache.close): its tier holds no frames any"
                " more"
            )
        for kind, sources, targets in tier_runs(moves):
            if kind == "store":
                self.tier[:, :, targets] = to_numpy(self.data[:, :, sources])
                self.tier_scales[:, :, targets] = to_numpy(self.scales[:, :, sources])
            else:
                self.data[:, :, targets] = self.xp.asarray(self.tier[:, :, sources])
                self.scales[:, :, targets] = self.xp.asarray(
                    self.tier_scales[:, :, sources]
                )


def make_tier(shape: tuple, dtype, path=None) -> tuple[np.ndarray, TierFile | None]:
    """The tier's K and V (K/V, layers, num_tier_blocks, block_size, kv_heads,
    head_dim): in host memory, or in the file at `path` (numpy.memmap, made anew), the
    drum behind the pool; and the TierFile that owns that file (None in memory). One
    file has one owner: a path in use by another KVCache, here or in another process, is
    refused (ValueError), as is a path that is
    not a regular file in a writable folder."""
    if path is None or not shape[2]:
        if path is not None:
            raise ValueError(
                f"kv_offload_path={str(path)!r} needs kv_offload_frames > 0: the file"
                " holds the tier's frames"
            )
        return np.zeros(shape, dtype=dtype), None
    owner = TierFile(path)
    try:
        os.ftruncate(owner.fd, 0)  # made anew: no frame of an earlier run is read back
        # the locked file itself, not its name again
        with os.fdopen(os.dup(owner.fd), "r+b") as f:
            tier = np.memmap(f, dtype=dtype, mode="r+", shape=shape)
        tier.filename = os.path.abspath(owner.path)
    except OSError as error:
        owner.release()
        raise ValueError(
            f"kv_offload_path={owner.path!r}: cannot make the tier's file of"
            f" {int(np.prod(shape)) * np.dtype(dtype).itemsize:,} bytes there"
            f" ({error.strerror or error}); give a regular file path in a writable"
            " folder with room for it"
        ) from None
    return tier, owner


def tier_runs(moves) -> list[tuple[str, list[int], list[int]]]:
    """The moves, in order, cut into runs of one kind whose targets differ: (kind,
    sources, targets). A run reads nothing it writes, so it can be one copy; a frame
    written twice in a
    step starts a new run, so the second write lands after what read the first."""
    runs: list[tuple[str, list[int], list[int]]] = []
    for kind, source, target in moves:
        if not runs or runs[-1][0] != kind or target in runs[-1][2]:
            runs.append((kind, [], []))
        runs[-1][1].append(source)
        runs[-1][2].append(target)
    return runs
