"""Lab 5, the kernel's page-table lookup: the participant's `struct PagedRows` replaces the
engine's in cuda/paged_attention.cu, the CPU emulation compiles the result (with a probe kernel
that records where each position's row is found), and the kernels are held to the reference.
"""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from minipaged.attention import emulated, kernels, reference
from minipaged.lab.grading import Failed, NotLoadable, Property
from minipaged.runner import ModelRunner

STRUCT = re.compile(r"template <typename T, int HEAD_DIM>\s*struct PagedRows \{.*?\n\};", re.S)
BODY = re.compile(r"(operator\[\]\(int pos\) const \{).*?\n    \}", re.S)
PROBE = """
// lab 5's probe: where PagedRows finds each position's row (elements from the cache's start)
template <typename T, int HEAD_DIM>
__global__ void lab5_probe(long long* out, const T* cache, const int* block_table, int num_positions,
                           int block_size, int num_kv_heads, int kv_head) {
    const PagedRows<T, HEAD_DIM> rows{cache, block_table, block_size, num_kv_heads, kv_head};
    for (int pos = threadIdx.x; pos < num_positions; pos += NUM_THREADS) out[pos] = rows[pos] - cache;
}
"""
HEAD_DIM = 64
NAMES = ("lab5_probe<float, 64>", "paged_attention_v1<float, 64>", "paged_prefill<float, 64>",
         *(kernels.decode_kernel(5, np.float32, HEAD_DIM, g) for g in (1, 2, 3)))  # the GQA groups used


def declaration(struct: str) -> str:
    """The struct without comments, its operator's body and spacing: what must stay the engine's."""
    code = re.sub(r"//[^\n]*", "", BODY.sub(r"\1 }", struct))
    return " ".join(code.split())


def engine_struct() -> str:
    return STRUCT.search(kernels.SOURCES["paged_attention"].read_text()).group(0)


def load(path: Path) -> SimpleNamespace:
    """The participant's struct inside the engine's kernels, compiled for the CPU."""
    if not path.is_file():
        raise NotLoadable(f"{path} is not a file: copy the starter first (cp labs/lab5_kernel.cu {path.name})")
    found = STRUCT.search(path.read_text())
    if found is None:
        raise NotLoadable(f"{path.name} has no `template <typename T, int HEAD_DIM> struct PagedRows {{ ... }};` "
                          "(keep the starter's first and last lines of the struct)")
    if declaration(found.group(0)) != declaration(engine_struct()):
        raise NotLoadable(f"{path.name} changed the struct's fields or operator[]'s declaration: keep them as "
                          "in the starter, the kernels build it with {cache, block_table, block_size, "
                          "num_kv_heads, kv_head}")
    return build(found.group(0))


def solution() -> dict:
    return vars(build(engine_struct()))


def build(struct: str) -> SimpleNamespace:
    source = kernels.SOURCES["paged_attention"].read_text()
    text = source.replace(engine_struct(), struct) + PROBE
    folder = emulated.cache_dir() / "lab5"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"paged_attention_{hashlib.sha256(text.encode()).hexdigest()[:12]}.cu"
    if not path.exists():
        path.write_text(text)
    try:
        compiled = emulated.library(path, NAMES)
    except RuntimeError as error:
        raise NotLoadable(f"your struct does not compile: {first_error(str(error))}") from None
    launch = functools.partial(emulated.launch_on, compiled)
    launcher = kernels.Launcher(launch=launch, xp=np, num_sms=emulated.NUM_SMS)
    # in the engine run, decode steps read K and V through the participant's lookup; prompts go
    # through the reference (the prefill kernel emulated for 30 layers takes most of a minute;
    # the properties hold it to the reference instead), and so do the writes
    attention = SimpleNamespace(write_kv=reference.write_kv, copy_blocks=reference.copy_blocks,
                                decode=launcher.decode, prefill=reference.prefill)
    return SimpleNamespace(launch=launch, launcher=launcher,
                           ModelRunner=functools.partial(ModelRunner, attention=attention))


def first_error(log: str) -> str:
    lines = [line for line in log.splitlines() if "error" in line and ".cu:" in line]
    return re.sub(r"^.*?\.cu:", "line of the kernel file ", lines[0]) if lines else log.splitlines()[-1]


# ---- the properties ------------------------------------------------------------------------------

def _where(offset: int, block_size: int, num_kv_heads: int) -> str:
    slot, rest = divmod(offset, num_kv_heads * HEAD_DIM)
    head, element = divmod(rest, HEAD_DIM)
    return (f"frame {slot // block_size}, offset {slot % block_size}, KV head {head}"
            + (f", element {element}" if element else ""))


def rows_are_found_through_the_block_table(m) -> None:
    for block_size, num_kv_heads, kv_head, table in ((4, 2, 1, [7, 2, 9, 0]), (8, 3, 2, [1, 3, 0]),
                                                     (16, 1, 0, [2, 0])):
        num_positions = len(table) * block_size - 1
        cache = np.zeros((10, block_size, num_kv_heads, HEAD_DIM), np.float32)
        out = np.zeros(num_positions, np.int64)
        m.launch("lab5_probe<float, 64>", (1,), (kernels.NUM_THREADS,),
                 (out, cache, np.array(table + [-1], np.int32), np.int32(num_positions), np.int32(block_size),
                  np.int32(num_kv_heads), np.int32(kv_head)))
        for pos, got in enumerate(out):
            want = ((table[pos // block_size] * block_size + pos % block_size) * num_kv_heads + kv_head) * HEAD_DIM
            if got != want:
                raise Failed(f"block_size {block_size}, {num_kv_heads} KV heads, kv_head {kv_head}, block table "
                             f"{table}", f"position {pos} should read {_where(want, block_size, num_kv_heads)}; "
                             f"yours read {_where(int(got), block_size, num_kv_heads)}"
                             if got >= 0 else f"position {pos} read {got} elements before the cache's start")


def _lookup_first(m) -> None:
    """The kernels dereference what the lookup returns: a wrong lookup reads outside the cache
    and could crash the whole emulation, so they run only once the lookup is right."""
    try:
        rows_are_found_through_the_block_table(m)
    except Failed:
        raise Failed("the cases of the first property", "not run until the lookup is right (a wrong lookup "
                     "reads outside the cache, which could crash the emulation)") from None


def _case(seed: int, context_lens: list[int], num_heads: int, num_kv_heads: int, block_size: int = 4):
    rng = np.random.default_rng(seed)
    num_blocks = sum(-(-n // block_size) for n in context_lens) + 3
    k, v = (rng.standard_normal((num_blocks, block_size, num_kv_heads, HEAD_DIM)).astype(np.float32) for _ in "kv")
    frames = list(rng.permutation(num_blocks))  # scattered frames, not in order
    width = max(-(-n // block_size) for n in context_lens)
    tables = np.full((len(context_lens), width), -1, np.int32)
    for i, n in enumerate(context_lens):
        for b in range(-(-n // block_size)):
            tables[i, b] = frames.pop()
    given = (f"block_size {block_size}, contexts of {context_lens} tokens in scattered frames, "
             f"{num_heads} query heads over {num_kv_heads} KV heads")
    return k, v, tables, np.array(context_lens, np.int32), rng, given


def _compare(got, want, given: str, what: str, rows: str) -> None:
    error = float(np.abs(got - want).max())
    if not error < 1e-4:
        row, head, element = map(int, np.unravel_index(int(np.nanargmax(np.abs(got - want))), got.shape))
        raise Failed(given, f"{what} differs from the NumPy reference by {error:.3g} (worst at {rows} {row}, "
                     f"query head {head}, element {element})")


def decode_matches_the_reference(version: int):
    def check(m) -> None:
        _lookup_first(m)
        k, v, tables, lens, rng, given = _case(version, [5, 13, 1], num_heads=6, num_kv_heads=2)
        q = rng.standard_normal((len(lens), 6, HEAD_DIM)).astype(np.float32)
        want = reference.decode(q, k, v, tables, lens, 0.125)
        _compare(m.launcher.decode(q, k, v, tables, lens, 0.125, version=version), want, given,
                 f"decode version {version}'s output", "sequence")
    return check


def prefill_matches_the_reference(m) -> None:
    _lookup_first(m)
    k, v, tables, lens, rng, given = _case(7, [6, 11], num_heads=3, num_kv_heads=1)
    starts = np.array([0, 4, 7], np.int32)  # the last 4 and 3 tokens of each are queries
    q = rng.standard_normal((7, 3, HEAD_DIM)).astype(np.float32)
    want = reference.prefill(q, k, v, tables, lens, starts, 0.125)
    _compare(m.launcher.prefill(q, k, v, tables, lens, starts, 0.125), want, given, "the prefill kernel's output",
             "query row")


LAB5 = [
    Property("rows[pos] is the row of kv_head in slot block_table[pos / block_size] * block_size + "
             "pos % block_size", rows_are_found_through_the_block_table, "block tables of 2 to 4 frames"),
    Property("decode version 1 (one thread per token) equals the NumPy reference", decode_matches_the_reference(1),
             "block_size 4, contexts of [5, 13, 1] tokens in scattered frames"),
    Property("decode version 5 (the engine's default) equals the NumPy reference", decode_matches_the_reference(5),
             "block_size 4, contexts of [5, 13, 1] tokens in scattered frames"),
    Property("the prefill kernel (causal, many queries) equals the NumPy reference", prefill_matches_the_reference,
             "block_size 4, contexts of [6, 11] tokens in scattered frames"),
]
