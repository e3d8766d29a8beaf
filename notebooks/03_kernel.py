# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 3. The paged-attention kernel
#
# **What you will see** (about 20 minutes):
# - the kernel that makes paging possible, version 1 of `cuda/paged_attention.cu`, read line
#   by line: how each thread finds a token's key through the block table, the page table of
#   notebook 2;
# - a tiny batch laid out by a `BlockManager`, its page tables drawn, its free slots filled
#   with NaN so that a wrong read would show;
# - that CUDA source compiled for this CPU (a small shim stands in for the GPU) and run:
#   its output against the NumPy reference and against attention worked out by hand;
# - all six versions of the kernel, checked the same way, and the launches each makes;
# - napkin math: the bytes one decode step must read, and how long that takes at an H200's
#   4.8 TB/s of memory bandwidth;
# - on a GPU only, the versions timed in GB/s and % of peak. Those cells print
#   "skipped: needs a GPU" anywhere else; everything before them runs on any laptop.

# %%
import dataclasses

import numpy as np
from IPython.display import Markdown, display

from minipaged.attention import emulated, kernels, reference
from minipaged.backend import cuda_available
from minipaged.model.config import ModelConfig
from minipaged.model.weights import load_weights, resolve_model
from minipaged.runner import step_inputs
from minipaged.tools.bench.kernel import Shape
from minipaged.tools.viz import BarChart, PageTableView
from minipaged.tools.viz.demo import two_sequences

SOURCE = kernels.SOURCES["paged_attention"].read_text().splitlines()


def show(first: str, before: str) -> None:
    """Print cuda/paged_attention.cu from the line holding `first` up to the next line holding `before`."""
    start = next(i for i, line in enumerate(SOURCE) if first in line)
    end = next(i for i in range(start + 1, len(SOURCE)) if before in SOURCE[i])
    print("\n".join(f"{n + 1:4d}  {SOURCE[n]}" for n in range(start, end)))


print(
    f"{kernels.SOURCES['paged_attention'].name}: {len(SOURCE)} lines; a GPU is "
    f"{'here' if cuda_available() else 'not here: the GPU cells will be skipped'}"
)

# %% [markdown]
# ## One file, six versions
#
# The file follows llm.c's habit: numbered versions of one kernel, v1 the obvious one, each
# later version adding one idea and saying in its header what it buys and what it costs. All
# of them compute the same thing, the attention of one new query per sequence over the keys
# and values of its context: a **decode** step. The file's opening comment:

# %%
show("Paged attention: attention whose keys", "#include <cuda_fp16.h>")

# %% [markdown]
# ## Where a key lives
#
# In notebook 2, token `p` of a sequence lived at slot `block_table[p // block_size] *
# block_size + p % block_size`. In the kernel that lookup is a small struct, `PagedRows`: a
# view of one sequence's keys (or values) for one KV head, where `rows[pos]` is a pointer to
# the `HEAD_DIM` numbers of the token at position `pos`. The cache is one array
# `[num_blocks, block_size, num_kv_heads, HEAD_DIM]`, so a slot's row for a KV head starts
# `(slot * num_kv_heads + kv_head) * HEAD_DIM` numbers in. This is the memory-management
# unit of paging, in software: one integer load from the block table, then a multiply-add.

# %%
# the struct's fields; its lookup, operator[], is what lab 5 asks you to write
show("// One sequence's K (or V) rows", "operator[](int pos)")
print(
    "          __device__ const T* operator[](int pos) const;  // the lookup: lab 5\n      };"
)

# %% [markdown]
# ## Version 1, line by line
#
# First its header: the plan, and what it costs. A CUDA kernel runs as a **grid** of
# **blocks** of threads; the blocks run independently on the GPU's streaming multiprocessors
# (SMs), the threads of a block together, sharing fast on-chip memory. v1 gives each
# (query head, sequence) pair one block of 128 threads.

# %%
show("// v1: the obvious kernel.", "template <typename T, int HEAD_DIM>")

# %% [markdown]
# The signature and the set-up. `blockIdx.x` is the query head and `blockIdx.y` the sequence;
# `gridDim.x`, the number of blocks along x, is therefore the number of query heads. Query
# head `head` reads KV head `head / (num_heads / num_kv_heads)`: the query heads of a
# grouped-query-attention (GQA) group share their keys and values. `keys` and `values` are
# `PagedRows` over this sequence's row of `block_tables`. `s` is this block's stretch of the
# `logits` scratch buffer in global (device) memory.

# %%
show("__global__ void paged_attention_v1", "// 1. logits s[t]")

# %% [markdown]
# The three passes of a softmax:
#
# 1. **Logits.** Thread `t` takes tokens `t`, `t + 128`, …; for each it computes the dot
#    product of the query with the key, one element at a time, `keys[t][d]` going through
#    the block table, and writes `scale * q·k` to `s[t]`. Each thread keeps the largest logit
#    it saw, and `block_reduce_tree` finds the largest of all (printed below).
# 2. **Softmax numerators.** `exp_logits` replaces each `s[t]` by `exp(s[t] - max)` (minus the
#    max, so that no exponential overflows) and returns this thread's share of their sum; a
#    second reduction adds the shares.
# 3. **Weighted sum of values.** Now thread `d` computes output element `d`: it walks over
#    every token, adding `s[t] * v_t[d]`, and divides by the sum.

# %%
show("// 1. logits s[t]", "// ====")

# %%
show("// v1, v2: a block-wide reduction", "// v3+: combine")

# %% [markdown]
# The header said what this costs, and later versions remove it one idea at a time: in pass 1
# the 32 threads of a warp read 32 different key rows one number each (v2 makes neighbouring
# threads share a row and load 16 bytes at once); the reductions take barriers of the whole
# block (v3 uses warp shuffles); the logits go out to global memory and back (v4 keeps a
# running softmax instead); each query head of a GQA group reads the same keys again (v5
# reads them once for the group); and a long context gets only one block (v6 splits it).

# %% [markdown]
# ## A tiny batch, laid out by a block manager
#
# To run the kernel we need what the engine would hand it: a KV cache holding two sequences'
# keys and values in scattered frames, their block tables and context lengths, and one query
# per sequence. A `BlockManager` decides where the tokens go: the very batch of notebook 2,
# s1 (a 6-token prompt and 8 generated tokens) and s2 (a 5-token prompt), then both decoding
# in turn, so that their frames interleave (`minipaged.tools.viz.demo.two_sequences()` builds it again).
# The sizes are SmolLM2's where it matters, 3 query heads per KV head and `head_dim` 64, with
# one KV head and blocks of 4 slots so that the pictures fit.

# %%
block_size, num_kv_heads, num_heads, head_dim = 4, 1, 3, 64
manager = (
    two_sequences()
)  # notebook 2's pool: 12 frames of 4 slots, s1 and s2 interleaved
assert manager.block_size == block_size
seqs = ["s1", "s2"]
PageTableView(manager, seqs)

# %% [markdown]
# Now the cache. Every slot starts as NaN (not a number); then the keys and values of the
# tokens, random numbers here, are written into their slots by `write_kv`, the engine's other
# kernel (`cuda/cache_ops.cu`), also run on the CPU. Any slot no token owns stays NaN, and
# NaN spreads through arithmetic: a kernel that read a slot outside a sequence, or followed a
# wrong frame, would return NaN.

# %%
rng = np.random.default_rng(0)
cache_shape = (manager.num_frames, block_size, num_kv_heads, head_dim)
k_cache = np.full(
    cache_shape, np.nan, np.float32
)  # (num_blocks, block_size, num_kv_heads, head_dim)
v_cache = np.full(cache_shape, np.nan, np.float32)
lengths = [manager.table_view(s).num_tokens for s in seqs]
every_token = step_inputs(
    manager, seqs, lengths
)  # the slot of every token of both sequences
k = rng.standard_normal((sum(lengths), num_kv_heads, head_dim)).astype(
    np.float32
)  # (tokens, kv_heads, head_dim)
v = rng.standard_normal((sum(lengths), num_kv_heads, head_dim)).astype(np.float32)
emulated.write_kv(k, v, k_cache, v_cache, every_token.slot_mapping)

arrays = step_inputs(
    manager, seqs, [1, 1]
)  # a decode step: each sequence's last token asks
q = rng.standard_normal((len(seqs), num_heads, head_dim)).astype(
    np.float32
)  # (num_seqs, num_heads, head_dim)
scale = 1 / np.sqrt(head_dim)
print("block_tables:\n", arrays.block_tables)
print("context_lens:", arrays.context_lens)
nan_slots = int(np.isnan(k_cache[:, :, 0, 0]).sum())
display(
    Markdown(
        f"{sum(lengths)} tokens written; {nan_slots} of the {k_cache.shape[0] * block_size} "
        f"slots still hold NaN: the free frames and the empty tails of the last blocks."
    )
)

# %% [markdown]
# ## v1 on this CPU
#
# `minipaged.attention.emulated` compiles `cuda/paged_attention.cu`, unchanged, with the
# system's C++ compiler and a small header (`cuda/emulate/cuda_shim.h`) that provides what
# the GPU would: `threadIdx` and `blockIdx`, `__syncthreads`, shared memory, warp shuffles.
# Every CUDA thread becomes a lightweight thread of the CPU, the blocks run one after another.
# It is slow, and exact: the very code a GPU runs, checked on any machine. (The first call
# compiles the file, a few seconds; the result is cached.)
#
# `reference.decode` is the specification in NumPy: gather each sequence's keys and values
# through its block table, then `softmax(q kᵀ · scale) v`.

# %%
out_v1 = emulated.decode(
    q, k_cache, v_cache, arrays.block_tables, arrays.context_lens, scale, version=1
)
expected = reference.decode(
    q, k_cache, v_cache, arrays.block_tables, arrays.context_lens, scale
)
error_v1 = float(np.abs(out_v1 - expected).max())
assert np.isfinite(out_v1).all() and error_v1 < 1e-5
grid = (num_heads, len(seqs))
busy = int(arrays.context_lens.max())
display(
    Markdown(
        f"v1 ran a grid of {grid[0]} × {grid[1]} blocks (query heads × sequences) of "
        f"{kernels.NUM_THREADS} threads. Its output is finite, so no NaN slot was read, and it "
        f"differs from the reference by at most **{error_v1:.1e}**: float32 rounding, summed in "
        f"another order. With contexts of {busy} tokens or fewer, only {busy} of the "
        f"{kernels.NUM_THREADS} threads of a block have a token in pass 1: a decode kernel "
        f"needs long contexts or many sequences to keep a GPU busy."
    )
)

# %% [markdown]
# The same attention by hand, for one sequence and one query head, following the block table
# one token at a time as `PagedRows` does:

# %%
seq, head = 1, 2  # s2, its third query head
kv_head = head // (num_heads // num_kv_heads)
table, n = arrays.block_tables[seq], int(arrays.context_lens[seq])
keys = np.stack(
    [k_cache[table[p // block_size], p % block_size, kv_head] for p in range(n)]
)  # (n, head_dim)
values = np.stack(
    [v_cache[table[p // block_size], p % block_size, kv_head] for p in range(n)]
)  # (n, head_dim)
logits = keys @ q[seq, head] * scale  # (n,)
weights = np.exp(logits - logits.max())
weights /= weights.sum()  # (n,) the softmax: attention weights
by_hand = weights @ values  # (head_dim,)
error_by_hand = float(np.abs(by_hand - out_v1[seq, head]).max())
assert error_by_hand < 1e-5
print(
    f"attention weights of {seqs[seq]}, head {head}, over its tokens:",
    np.round(weights, 3),
)
display(
    Markdown(
        f"By hand and by v1, {seqs[seq]}'s head {head}: they differ by at most {error_by_hand:.1e}. "
        f"Its {n} tokens were read from frames {table[: -(-n // block_size)].tolist()}, "
        "in the order its page table lists them."
    )
)

# %% [markdown]
# ## Six versions, one contract
#
# Every version takes the same arrays and must give the same answer; only the launches
# differ. `kernels.Launcher` holds those launches, shared by the GPU path and the emulation.
# Below, a `Launcher` whose `launch` records instead of running shows what each version asks
# the GPU to do, and the emulation runs it for real. v6 gets partitions of 8 tokens (its
# default is 512) so that these short contexts are split too.

# %%
summaries = {
    line.split()[0]: line.split(maxsplit=1)[1]
    for line in SOURCE[:30]
    if line.startswith("    v") and line.split()[0][1:].isdigit()
}  # the header's list
table_rows, errors = [], {}
for version in kernels.VERSIONS:
    launches = []
    recorder = dataclasses.replace(
        emulated.LAUNCHER, launch=lambda *call, launches=launches: launches.append(call)
    )
    args = (q, k_cache, v_cache, arrays.block_tables, arrays.context_lens, scale)
    recorder.decode(*args, version=version, partition_size=8)
    out = emulated.decode(*args, version=version, partition_size=8)
    errors[version] = float(np.abs(out - expected).max())
    grids = ", ".join(
        f"`{name.split('<')[0]}` {' × '.join(map(str, grid))}"
        for name, grid, _, _ in launches
    )
    table_rows.append(
        f"| v{version} | {summaries[f'v{version}']} | {grids} | {errors[version]:.1e} |"
    )
assert max(errors.values()) < 1e-5
display(
    Markdown(
        "| version | idea | launches: kernel, grid of blocks | max error |\n|---|---|---|---|\n"
        + "\n".join(table_rows)
    )
)

# %%
default = kernels.pick_version(
    len(seqs),
    num_kv_heads,
    num_heads // num_kv_heads,
    int(arrays.block_tables.shape[1]) * block_size,
    num_sms=132,
)
display(
    Markdown(
        f"All six agree with the reference within {max(errors.values()):.1e}. v5 and v6 launch one "
        f"block per KV head instead of one per query head: {num_heads // num_kv_heads} query heads "
        f"share each key read. With no version asked for, the engine runs **v{default}** here "
        f"(`kernels.pick_version`, as on an H200's 132 SMs); v6 is chosen when there are fewer "
        f"blocks than SMs and the contexts are long enough to split."
    )
)

# %% [markdown]
# ## Napkin math: what one decode step must read
#
# A decode step does little arithmetic per byte. For every token of its context, a query
# reads that token's key and value (`head_dim` numbers each, per KV head) and does one
# multiply-add per number read for each of its query heads. A GPU does dozens of
# multiply-adds (hundreds on its tensor cores) in the time it loads one number from memory,
# so the kernel waits on memory, and its floor is simple: bytes that must be read ÷ memory
# bandwidth. An H200 moves 4.8 TB/s. Take SmolLM2 serving a full batch: 64 sequences with
# 1,024 tokens of context each, in float16 as on a GPU.

# %%
folder = resolve_model()  # SmolLM2-135M-Instruct, as in LLM()
config = ModelConfig.from_folder(folder)
shape = Shape(
    num_seqs=64,
    context_len=1024,
    num_heads=config.num_heads,
    num_kv_heads=config.num_kv_heads,
    head_dim=config.head_dim,
    dtype="float16",
)
H200 = 4.8e12  # bytes per second, peak
itemsize = np.dtype(shape.dtype).itemsize
kv_layer = (
    2
    * shape.num_seqs
    * shape.context_len
    * shape.num_kv_heads
    * shape.head_dim
    * itemsize
)
kv_step = kv_layer * config.num_layers  # every layer reads its own cache
weights = itemsize * sum(
    w.size for w in load_weights(folder).values()
)  # read once per step, any batch
display(
    Markdown(
        f"- One layer's kernel reads the K and V of {shape.num_seqs} × {shape.context_len:,} tokens × "
        f"{shape.num_kv_heads} KV heads × {shape.head_dim} numbers × 2 bytes × 2 (K and V) = "
        f"**{kv_layer / 1e6:.1f} MB**: at 4.8 TB/s, at least **{kv_layer / H200 * 1e6:.1f} µs**.\n"
        f"- The {config.num_layers} layers of one decode step read {kv_step / 1e9:.2f} GB of KV cache, "
        f"{kv_step / H200 * 1e6:.0f} µs at the least; the weights, {weights / 1e6:.0f} MB, read once per step "
        f"whatever the batch, add {weights / H200 * 1e6:.0f} µs.\n"
        f"- So at this batch the KV cache is {kv_step / weights:.1f}× the weights in memory traffic: serving "
        f"many long conversations is a memory-bandwidth problem, and the attention kernel's share of it "
        f"grows with every token."
    )
)

# %%
paper = {"FlashInfer (dense, MHA)": 88, "vLLM paged, MHA": 85, "vLLM paged, GQA": 28}
display(
    BarChart(
        f"time of one layer's decode attention, {shape.num_seqs} × {shape.context_len:,} tokens "
        "of SmolLM2 on an H200, at the fraction of peak each reached on an H100",
        list(paper),
        {"µs": [kv_layer / (H200 * p / 100) * 1e6 for p in paper.values()]},
        unit=" µs",
    )
)

# %% [markdown]
# The fractions in that chart are published measurements on an H100, quoted by this project's
# brief: FlashInfer's kernels reach about 88% of peak memory bandwidth, vLLM's paged kernels
# about 85% with multi-head attention but only about 28% with grouped-query attention, where
# several query heads share a KV head (SmolLM2 has 3 per KV head). A kernel that gives each
# query head its own block, as v1–v4 here and vLLM's paged kernels do, reads each key once
# per query head rather than once per group; minipaged's v5 reads it once for the group.
# `python -m minipaged.bench kernel` measures minipaged's own versions against this floor.
#
# ## On a GPU
#
# These two cells need an NVIDIA GPU and CuPy (`pip install -e '.[gpu]'`). The first runs the
# same tiny batch through the kernels compiled by NVRTC for the real device; the second runs
# the bandwidth benchmark on the SmolLM2 shape above: each version checked against a dense
# attention, then timed with CUDA events.

# %%
if not cuda_available():
    print("skipped: needs a GPU")
else:
    import cupy

    from minipaged.attention import cuda

    on_gpu = [
        cupy.asarray(a)
        for a in (q, k_cache, v_cache, arrays.block_tables, arrays.context_lens)
    ]
    for version in kernels.VERSIONS:
        out = cupy.asnumpy(
            cuda.decode(*on_gpu, scale, version=version, partition_size=8)
        )
        print(
            f"v{version} on the GPU: max error against the reference {np.abs(out - expected).max():.1e}"
        )

# %%
if not cuda_available():
    print("skipped: needs a GPU")
else:
    from minipaged.tools.bench import kernel as kernel_bench

    rows = kernel_bench.run(shapes=[shape], repeats=10)
    display(
        BarChart(
            f"decode attention, {shape.num_seqs} × {shape.context_len:,} tokens, SmolLM2 heads: "
            f"% of {rows[0]['device']}'s peak bandwidth",
            [r["version"] for r in rows],
            {"% of peak": [100 * r["peak_fraction"] for r in rows]},
            unit="%",
        )
    )
    best = max(
        (r for r in rows if r["version"].startswith("v")), key=lambda r: r["gbps"]
    )
    v1 = next(r for r in rows if r["version"] == "v1")
    display(
        Markdown(
            f"The fastest version, {best['version']}, reads {best['gbps']:,.0f} GB/s, "
            f"{best['peak_fraction']:.0%} of peak, {v1['seconds'] / best['seconds']:.1f}× "
            f"faster than v1."
        )
    )

# %% [markdown]
# ## Exercises
#
# Try each one before you open its solution: click **Solution** under it. To run a solution,
# copy it into a new cell below.

# %% [markdown]
# **Exercise 1.** Compaction is never needed. Move s2 to other frames: copy its frames into free ones with
# `emulated.copy_blocks(k_cache, v_cache, pairs)` (the copy-on-write kernel; `pairs` is a list
# of (source, destination) frames), change s2's row of the block table to match, and run v1
# again. Does anything in the output change?

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# used = {int(f) for f in arrays.block_tables.ravel() if f >= 0}
# free = [f for f in range(k_cache.shape[0]) if f not in used]
# old = manager.block_table("s2")
# pairs = list(zip(old, free))
# assert len(pairs) == len(old), "not enough free frames to move s2"
# moved_k, moved_v = k_cache.copy(), v_cache.copy()
# emulated.copy_blocks(moved_k, moved_v, pairs)
# moved_tables = arrays.block_tables.copy()
# moved_tables[1, :len(old)] = [dst for _, dst in pairs]
# out = emulated.decode(q, moved_k, moved_v, moved_tables, arrays.context_lens, scale, version=1)
# print(f"s2 moved from frames {old} to {[dst for _, dst in pairs]}; "
#       f"largest change in the output: {np.abs(out - out_v1).max():.1e}")
# # Nothing changes (up to zero): the kernel only ever sees frames through the block table.
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** Break a page table: point the last entry of s2's block table at a free frame (one full of
# NaN) and run v1. What happens to s2's output, and to s1's?

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# broken = arrays.block_tables.copy()
# last = -(-int(arrays.context_lens[1]) // block_size) - 1
# free_frame = next(f for f in range(k_cache.shape[0]) if f not in set(arrays.block_tables.ravel().tolist()))
# broken[1, last] = free_frame
# out = emulated.decode(q, k_cache, v_cache, broken, arrays.context_lens, scale, version=1)
# print("s1 all finite:", np.isfinite(out[0]).all(), "| s2 all NaN:", np.isnan(out[1]).all())
# # s2 reads NaN through its wrong entry, and a single NaN logit makes its softmax NaN; s1 is
# # untouched: each block reads only its own sequence's frames.
# ```
#
# </details>

# %% [markdown]
# **Exercise 3.** Napkin math for Llama 3 8B (32 layers, 32 query heads, 8 KV heads, `head_dim` 128), serving
# 64 sequences of 2,048 tokens in float16: how many bytes of K and V does one decode step read
# over all layers, and how long does that take at 4.8 TB/s? How many frames of 16 tokens does
# that cache hold?

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# llama = Shape(num_seqs=64, context_len=2048, num_heads=32, num_kv_heads=8, head_dim=128, dtype="float16")
# per_layer = 2 * llama.num_seqs * llama.context_len * llama.num_kv_heads * llama.head_dim * 2
# llama_weights = 8.03e9 * 2                     # 8 billion parameters, 2 bytes each
# print(f"{per_layer * 32 / 1e9:.1f} GB of K and V per step, at least {per_layer * 32 / H200 * 1e3:.2f} ms; "
#       f"the weights are {llama_weights / 1e9:.0f} GB; {llama.num_seqs * llama.context_len // 16:,} "
#       "frames of 16 tokens")
# # A full batch of long Llama chats reads more KV cache per step than weights.
# ```
#
# </details>

# %% [markdown]
# ## Lab
#
# Now write it yourself (lab 5, [labs/README.md](../labs/README.md)). In a terminal, at the top of
# the repository, with the project's environment active (`source .venv/bin/activate`), copy the
# starter, fill in the bodies, and grade it:
#
# - **Lab 5** (about 30 minutes): the page-table lookup inside the kernel (`struct PagedRows`), in CUDA that the CPU emulation runs.
#
#   ```
#   cp labs/lab5_kernel.cu my_kernel.cu
#   python -m minipaged.lab check 5 my_kernel.cu
#   ```
#
# The check names each property your code breaks, on an input that shows it. Once they all
# hold, it runs SmolLM2 with your code plugged in, next to the engine's own, and draws the
# lab's picture. Stuck? `python -m minipaged.lab hint 5` shows the next hint, one at a time, from the idea to the code.
