"""`python -m minipaged.bench kernel`: the decode kernels on a GPU, GB/s and % of peak
bandwidth.

The habit of llm.c's dev/cuda: every version is first checked against a dense attention
on the same K/V, then timed (CUDA events around back-to-back launches, after a warm-up,
on working sets of at least 4x the L2 cache, so each launch reads from device memory);
see bench_shape.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass, replace

import numpy as np
from tqdm import tqdm

from minipaged.attention import kernels
from minipaged.backend import cdiv
from minipaged.llm import number

BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class Shape:
    num_seqs: int
    context_len: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str


SHAPES = (
    Shape(64, 1024, 9, 3, 64, "float16"),  # SmolLM2-135M, a full batch of chats
    Shape(64, 2048, 32, 8, 128, "float16"),  # Llama 3 8B, a full batch
    Shape(
        2, 32768, 32, 8, 128, "float16"
    ),  # few sequences, long contexts: split-KV's case
    Shape(16, 2048, 32, 8, 128, "float32"),  # an fp32 cache
)


def run(
    shapes=SHAPES, versions=kernels.VERSIONS, repeats: int = 20, verbose: bool = True
) -> list[dict]:
    """Check and time every version on every shape; a list of rows (dicts), one per
    timing."""
    from minipaged.backend import cuda_available

    if not cuda_available():
        raise SystemExit(
            "python -m minipaged.bench kernel needs a CUDA device (and CuPy); this "
            "machine has none. On a CPU the same kernels run, for correctness "
            "only, through minipaged.attention.emulated: "
            "pytest tests/test_kernels_emulated.py"
        )
    device = describe_device()
    if verbose:
        print(
            f"{device['device']}: peak {device['peak_gbps']:.0f} GB/s"
            f" ({device['peak_source']}), {device['sms']} SMs, L2"
            f" {device['l2_bytes'] / 2**20:.0f} MiB; * marks the version the rule"
            f" picks\n{HEADER}"
        )
    rows = []
    for shape in shapes:
        for row in bench_shape(shape, versions, repeats, device):
            rows.append(row)
            if verbose:
                print(format_row(row))
    return rows


HEADER = (
    f"{'shape (seqs x context, heads/kv, dim)':<38} {'version':<11} {'us':>9}"
    f" {'GB/s':>7} {'% peak':>7} {'max err':>9}"
)


def format_row(r: dict) -> str:
    shape = (
        f"{r['num_seqs']}x{r['context_len']} h{r['num_heads']}/{r['num_kv_heads']} "
        f"d{r['head_dim']} {r['dtype']}"
    )
    default = "*" if r["version"] == f"v{r['default_version']}" else " "
    return (
        f"{shape:<38} {r['version']:<10}{default} {r['seconds'] * 1e6:9.1f}"
        f" {r['gbps']:7.0f} {100 * r['peak_fraction']:6.1f}% {r['max_abs_error']:9.2e}"
    )


def describe_device() -> dict:
    """Name, SMs, L2 size, and the peak memory bandwidth: 2 (DDR) x memory clock x bus
    width from the device's attributes, else the bandwidth of a large device-to-device
    copy.
    """
    import cupy

    attributes = cupy.cuda.Device().attributes
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    copy = copy_gbps()
    clock_khz, bus_bits = (
        attributes.get("MemoryClockRate"),
        attributes.get("GlobalMemoryBusWidth"),
    )
    peak = 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9 if clock_khz and bus_bits else None
    return {
        "device": name.decode() if isinstance(name, bytes) else name,
        "sms": attributes["MultiProcessorCount"],
        "l2_bytes": attributes["L2CacheSize"],
        "peak_gbps": peak or copy,
        "peak_source": "memory clock x bus width" if peak else "measured copy",
        "copy_gbps": copy,
    }


def copy_gbps(num_bytes: int = 2**30) -> float:
    """A device-to-device copy of 1 GiB: bytes read + bytes written per second, in
    GB/s."""
    import cupy

    src, dst = cupy.ones(num_bytes, cupy.uint8), cupy.empty(num_bytes, cupy.uint8)
    seconds = seconds_per_call([lambda: cupy.copyto(dst, src)], repeats=5)
    return 2 * num_bytes / seconds / 1e9


def seconds_per_call(calls, repeats: int) -> float:
    """Median over `repeats` of the time per call, each run launching `calls` back to
    back (at least 8) between two CUDA events, after one warm-up run (compilation, first
    touch).
    """
    import cupy

    calls = list(calls) * math.ceil(8 / len(calls))
    for call in calls:
        call()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        for call in calls:
            call()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3 / len(calls))
    return float(np.median(times))


def bench_shape(shape: Shape, versions, repeats: int, device: dict) -> list[dict]:
    """Rows for one shape: the two dense baselines, then each version (frames in random
    order). `bytes` is what a decode step must move at least: K and V of every context
    token once per KV head, q, out, the block tables; GB/s = bytes / seconds. The
    baselines, on the same K/V contiguous per sequence: `dense-v5`, our v5 through an
    identity block table (what the paging costs), and `dense-cupy`, softmax(q K^T) V
    with CuPy's matmuls (cuBLAS), the way a framework without an attention kernel
    computes it. Small shapes rotate over copies of
    their cache, to stay out of the L2."""
    import cupy as xp

    s, itemsize = shape, np.dtype(shape.dtype).itemsize
    pages = cdiv(s.context_len, BLOCK_SIZE)
    kv_bytes = 2 * s.num_seqs * s.context_len * s.num_kv_heads * s.head_dim * itemsize
    # rotate to stay out of the L2
    copies = math.ceil(4 * device["l2_bytes"] / kv_bytes)

    def random(*size):
        return xp.random.standard_normal(size, dtype=xp.float32).astype(s.dtype)

    q = random(s.num_seqs, s.num_heads, s.head_dim)
    cache_shape = (s.num_seqs * pages, BLOCK_SIZE, s.num_kv_heads, s.head_dim)
    caches = [(random(*cache_shape), random(*cache_shape)) for _ in range(copies)]
    permutation = np.random.default_rng(0).permutation(s.num_seqs * pages)
    frames = xp.asarray(permutation.reshape(s.num_seqs, pages), xp.int32)
    identity = xp.arange(s.num_seqs * pages, dtype=xp.int32).reshape(s.num_seqs, pages)
    context_lens = xp.full(s.num_seqs, s.context_len, xp.int32)
    scale = 1.0 / math.sqrt(s.head_dim)
    # the same K/V contiguous per sequence: frames in table order; and per head for
    # matmuls
    dense = [tuple(c[frames].reshape(cache_shape) for c in pair) for pair in caches]
    per_head = [
        tuple(
            c.reshape(s.num_seqs, -1, s.num_kv_heads, s.head_dim)[:, : s.context_len]
            .transpose(0, 2, 1, 3)
            .copy()
            for c in pair
        )
        for pair in dense
    ]
    expected = dense_attention(
        *(a.astype(xp.float32) for a in (q, *per_head[0])), scale
    )
    moved = kv_bytes + 2 * q.nbytes + frames.nbytes + context_lens.nbytes
    default = kernels.pick_version(
        s.num_seqs,
        s.num_kv_heads,
        s.num_heads // s.num_kv_heads,
        pages * BLOCK_SIZE,
        device["sms"],
    )

    def row(version: str, calls, out) -> dict:
        seconds = seconds_per_call(calls, repeats)
        gbps = moved / seconds / 1e9
        error = float(
            xp.abs(out.astype(xp.float32) - expected.astype(xp.float32)).max()
        )
        return {
            **asdict(s),
            "block_size": BLOCK_SIZE,
            "version": version,
            "seconds": seconds,
            "bytes": moved,
            "gbps": gbps,
            "peak_gbps": device["peak_gbps"],
            "peak_fraction": gbps / device["peak_gbps"],
            "max_abs_error": error,
            "default_version": default,
            "device": device["device"],
        }

    rows = [
        row(
            "dense-cupy",
            [lambda kv=kv: dense_attention(q, *kv, scale) for kv in per_head],
            dense_attention(q, *per_head[0], scale),
        )
    ]
    rows.append(
        row(
            "dense-v5",
            *record(
                lambda launcher, k, v: launcher.decode(
                    q, k, v, identity, context_lens, scale, version=5
                ),
                dense,
            ),
        )
    )
    for version in versions:
        rows.append(
            row(
                f"v{version}",
                *record(
                    lambda launcher, k, v, version=version: launcher.decode(
                        q, k, v, frames, context_lens, scale, version=version
                    ),
                    caches,
                ),
            )
        )
    return rows


def record(decode, caches):
    """Run decode(launcher, k_cache, v_cache) once per cache copy with a launcher that
    records its launches instead of running them. Returns one call per copy that replays
    them (the kernels alone: no allocations, no checks), and the first copy's output
    from a real run.
    """
    from minipaged.attention import cuda

    replays = []
    for k_cache, v_cache in caches:
        recorded = []
        recorder = replace(
            cuda.LAUNCHER, launch=lambda *call, recorded=recorded: recorded.append(call)
        )
        decode(recorder, k_cache, v_cache)
        replays.append(
            lambda recorded=recorded: [cuda.LAUNCHER.launch(*call) for call in recorded]
        )
    return replays, decode(cuda.LAUNCHER, *caches[0])


def dense_attention(q, k, v, scale):
    """softmax(q K^T * scale) V over contiguous K/V (num_seqs, num_kv_heads,
    context_len, head_dim) with CuPy matmuls; logits and softmax in float32."""
    import cupy

    num_seqs, num_heads, head_dim = q.shape
    groups = q.reshape(num_seqs, k.shape[1], -1, head_dim)  # (S, kvh, group, hd)
    # (S, kvh, group, T)
    logits = cupy.matmul(groups, k.transpose(0, 1, 3, 2)).astype(cupy.float32)
    logits *= scale
    p = cupy.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return cupy.matmul(p.astype(q.dtype), v).reshape(num_seqs, num_heads, head_dim)


def table(rows: list[dict]) -> str:
    return (
        f"{rows[0]['device']}, peak {rows[0]['peak_gbps']:.0f} GB/s; * marks the"
        f" version the rule picks\n{HEADER}\n"
        + "\n".join(format_row(row) for row in rows)
    )


def version_list(text: str) -> list[int]:
    """--versions: '1,3,6' -> [1, 3, 6], each one of kernels.VERSIONS."""
    versions = [v.strip() for v in text.split(",")]
    if not all(v in map(str, kernels.VERSIONS) for v in versions):
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a list of versions from "
            f"{','.join(map(str, kernels.VERSIONS))}, e.g. 1,6"
        )
    return [int(v) for v in versions]


def add_arguments(parser) -> None:
    parser.add_argument(
        "--versions",
        type=version_list,
        default="1,2,3,4,5,6",
        help="decode kernel versions to time, comma-separated (default %(default)s)",
    )
    parser.add_argument(
        "--repeats",
        type=number(int, 1),
        default=20,
        help="timed runs per version; the median is reported (default %(default)s)",
    )


def bench_kernel(args) -> list:
    """Each version is first checked against dense attention, then timed on four shapes
    (SmolLM2 and Llama 3 8B batches, long contexts, an fp32 cache); one row per (shape,
    version). See minipaged/tools/bench/kernel.py."""
    versions = args.versions
    rows = []
    for shape in tqdm(SHAPES, desc="kernel", unit="shape", delay=1):
        rows += run(
            shapes=(shape,), versions=versions, repeats=args.repeats, verbose=False
        )
    if not args.json:
        print(table(rows))
    return rows


# python -m minipaged.tools.bench.kernel kernel.json: the table
if __name__ == "__main__":
    import json
    import sys

    print(table(json.load(open(sys.argv[1]))))
