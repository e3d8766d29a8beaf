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
# # 12. The drum: a slower tier behind the KV pool
#
# **What you will see** (about 20 minutes):
# - Atlas's one-level store (Kilburn et al. 1962), core in front and a drum behind, applied to
#   the prefix cache: a block the KV pool evicts is copied to a **tier** of host frames instead
#   of being forgotten (`kv_offload_frames`, as vLLM's KV offloading and LMCache do);
# - the frame map of a tiny pool and the tier behind it, before and after a prompt comes back
#   for its blocks, and the copies of that step in the order they must be made;
# - returning chat turns on SmolLM2, with and without the tier: the same tokens, more of the
#   prompt cached, a shorter time to first token;
# - where each returning prompt's tokens came from (the pool, the tier, or computed again), and
#   the tier's share against its size.

# %%
from IPython.display import Markdown, display

from minipaged import LLM, SamplingParams
from minipaged.paging import BlockManager, KVCache, MemoryMoves
from minipaged.tools.bench.drum import make_trace, replay, run_trace, sources_chart
from minipaged.tools.bench.workload import chat_trace
from minipaged.tools.viz import FrameMap, LineChart

# %% [markdown]
# ## Core and drum
#
# The Atlas computer had 16K words of core and 96K words of drum, and its programs saw the two
# as one store: when a program touched a page that was not in core, the supervisor copied a
# page out to the drum to make room and the wanted page in. Core was fast and small,
# the drum slow and large; the one-level store made the pair look like one big fast memory as
# long as the pages in use fitted in core.
#
# The KV pool is today's core. The prefix cache keeps blocks that no sequence maps any more
# (parked frames), so a returning conversation finds its history already computed; but a pool
# is small, and when it needs a frame the replacement policy gives a parked block up and its
# K and V are lost. A later prompt with that prefix computes them again. With a tier behind
# the pool, the block's K and V are copied to a tier frame in host memory (or a file) when it
# is evicted, and copied back into a new frame when a prompt finds it there: a copy of a few
# hundred kilobytes instead of a forward pass over its tokens.
#
# A pool of 6 frames of 4 tokens, a tier of 6 frames behind it. Prompt `a` (9 tokens: two
# full blocks and one token) runs and finishes; its two full blocks stay cached (`c`).

# %%
pool = BlockManager(num_blocks=6, block_size=4)
pool.add_tier(6)
kv = KVCache(
    num_layers=1,
    num_blocks=6,
    num_kv_heads=1,
    head_dim=2,
    block_size=4,
    num_tier_blocks=6,
    dtype="float32",
    device="cpu",
)
a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
pool.allocate("a", a)
pool.free("a")
FrameMap(pool, per_row=6)

# %% [markdown]
# Two other prompts need all six frames: the pool gives up a's blocks (its least recently
# used parked frames), and the tier keeps them. `take_tier_moves` hands over the copies the
# block manager decided; the engine puts them into the step's `MemoryMoves`.

# %%
pool.allocate("b", list(range(20, 33)))
pool.allocate("c", [40, 41, 42, 43, 44])
moves = pool.take_tier_moves()
print("the step's tier moves:", moves)
print(
    "tier frames hold:",
    [pool.tier.key_of.get(f, (None, "free"))[1] for f in range(pool.num_tier_frames)],
)
FrameMap(pool, per_row=6)

# %% [markdown]
# `b` finishes, and `a` comes back with a new last token. The pool has none of a's blocks; the
# tier has both, so `allocate` takes new frames for them, the free one first, then frames that
# b's parked blocks give up (to the tier in turn: its moves interleave stores and loads), and
# says the first 8 tokens are cached: only the last one is computed.

# %%
pool.free("b")
cached = pool.allocate("a again", a[:8] + [99])
moves = pool.take_tier_moves()
print(
    f"cached: {cached} of 9 tokens; from the tier: {pool.tier_hits} tokens; tier moves: {moves}"
)
FrameMap(pool, per_row=6)

# %% [markdown]
# ## The order of the copies
#
# Within one step the block manager may evict a frame and hand it to a prompt, and may store a
# block in a tier frame that a load of the same step reads. `KVCache.apply` therefore makes the
# step's moves in one order: swap-outs, then the tier's stores and loads **in the order they
# were decided** (so an evicted frame is read before a load writes it, and a tier frame is
# read before a store reuses it), then swap-ins and copy-on-write; the forward writes the new
# tokens last. A run of moves of one kind into distinct frames becomes one copy.

# %%
kv.data[:, :, 0] = 1.0  # frame 0 holds block X
kv.tier[:, :, 0] = 2.0  # tier frame 0 holds block Y
step = [
    ("load", 0, 1),
    ("store", 0, 0),
]  # Y back into frame 1, then X out over Y's tier frame
kv.apply(MemoryMoves(tier=step), copy_blocks=None)
print(
    "frame 1 got",
    kv.data[0, 0, 1, 0, 0, 0],
    "(Y); tier frame 0 now holds",
    kv.tier[0, 0, 0, 0, 0, 0],
    "(X)",
)

# %% [markdown]
# ## Returning conversations on SmolLM2
#
# A chat trace (minipaged.tools.bench.workload): two conversations over one system prompt take four
# turns each, each prompt the whole conversation so far, one request at a time, through a pool
# just large enough for the longest turn: between two turns of one conversation, the other
# pushes its history out. The same trace runs without and with a tier.

# %%
trace = chat_trace(
    num_conversations=2,
    turns=4,
    num_system_prompts=1,
    system_len=16,
    question_mean=8,
    answer_mean=32,
    active=2,
    vocab=49152,
    seed=7,
)
llm = LLM(device="cpu", num_blocks=16, block_size=16)
params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
frames = (
    max(len(t.prompt) for t in trace) + params.max_tokens + 15
) // 16  # the longest turn, no more
runs = {}
for label, options in {"pool": {}, "pool + tier": {"kv_offload_frames": 64}}.items():
    engine = llm.new_engine(num_blocks=frames, block_size=16, **options)
    runs[label] = run_trace(engine, trace, params)
returning = [
    i
    for i, t in enumerate(trace)
    if any(u.conversation == t.conversation for u in trace[:i])
]
lines = [
    "| turn | prompt tokens | cached, pool only | cached, with tier | TTFT pool only | TTFT with tier |",
    "| --- | --- | --- | --- | --- | --- |",
]
for i in returning:
    lines.append(
        f"| {i} | {len(trace[i].prompt)} | {runs['pool']['cached'][i]} | {runs['pool + tier']['cached'][i]} "
        f"| {1e3 * runs['pool']['ttft'][i]:.0f} ms | {1e3 * runs['pool + tier']['ttft'][i]:.0f} ms |"
    )
display(Markdown("\n".join(lines)))
print(
    "same tokens:",
    runs["pool"]["outputs"] == runs["pool + tier"]["outputs"],
    "| tier stores:",
    runs["pool + tier"]["tier"]["stores"],
    "loads:",
    runs["pool + tier"]["tier"]["loads"],
)

# %% [markdown]
# ## Where the prompt tokens came from
#
# The benchmark's trace (`python -m minipaged.bench drum`), replayed through block managers
# alone (`replay`: allocate the prompt, append two tokens, free; no model), gives each
# returning turn's tokens by source. The pool keeps the shared system prompt, which every
# conversation uses; a conversation's own history is pushed out between its turns, and the
# tier gives it back.

# %%
bench_trace = (
    make_trace()
)  # the benchmark's default: 4 conversations of 4 turns, SmolLM2's vocabulary
sources_chart(bench_trace, num_blocks=28, tier_frames=256)

# %% [markdown]
# And the whole trace's cached tokens against the tier's size, beside a pool holding the
# tier's frames itself (the most a tier could give, with none of its copies):

# %%
sizes = [0, 8, 16, 32, 64, 128, 256]
cached_with = [
    sum(r["pool"] + r["tier"] for r in replay(bench_trace, 28, n)) for n in sizes
]
cached_large = [sum(r["pool"] for r in replay(bench_trace, 28 + n)) for n in sizes]
LineChart(
    "cached prompt tokens of the trace against extra frames",
    sizes,
    {"tier of that size": cached_with, "pool that much larger": cached_large},
    x_label="frames",
    y_label="tokens",
    digits=0,
)

# %% [markdown]
# ## Exercises

# %% [markdown]
# **Exercise 1.** Make the tier smaller than the trace's working set: replay `bench_trace` with
# tiers of 8 and 32 frames and print the tier's stores, evictions and the cached tokens. Which
# blocks does the tier give up first?

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# for n in (8, 32):
#     manager = BlockManager(28, 16)
#     manager.add_tier(n)
#     for i, turn in enumerate(bench_trace):
#         manager.allocate(i, turn.prompt)
#         manager.free(i)
#         manager.take_tier_moves()
#     print(f"tier {n}: {manager.tier.stores} stores, {manager.tier.evictions} evictions, "
#           f"{manager.tier_hits} tokens from the tier")
# # The tier keeps the blocks the pool gave up most recently: the one the pool gave up longest
# # ago goes first (an LRU of the pool's evictions). A tier smaller than the conversations'
# # histories between two turns loses them before they return, as a pool would.
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** A block loaded back stays in the tier (it never changes: a clean page). Show
# that when the pool evicts it again, nothing is copied: count the stores of a block that
# goes out, comes back and goes out again.

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# small = BlockManager(num_blocks=2, block_size=4)
# small.add_tier(4)
# small.allocate("x", [1, 2, 3, 4, 5])
# for i, first in enumerate((20, 1, 20)):  # x's block and another take turns in the pool
#     small.free(list(small.seq_ids())[0])
#     small.allocate(f"y{i}", list(range(first, first + 4)) + [50 + i])
# print("stores:", small.tier.stores, "loads:", small.tier.loads, small.take_tier_moves())
# # Three evictions (x's block twice, the other once) but two stores: the second time x's
# # block leaves the pool, the tier already holds it, and nothing is copied.
# ```
#
# </details>

# %% [markdown]
# **Exercise 3.** The tier in a file: `kv_offload_path` puts the tier's frames in a
# `numpy.memmap`, the drum proper. Run the returning turns of the SmolLM2 trace with the tier in
# a temporary file and check the tokens and cached counts against the tier in memory.

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# import os
# import tempfile
# with tempfile.TemporaryDirectory() as folder:
#     engine = llm.new_engine(num_blocks=frames, block_size=16, kv_offload_frames=64,
#                             kv_offload_path=os.path.join(folder, "drum.bin"))
#     on_file = run_trace(engine, trace, params)
#     size = os.path.getsize(os.path.join(folder, "drum.bin"))
# print(on_file["outputs"] == runs["pool + tier"]["outputs"], on_file["cached"] == runs["pool + tier"]["cached"],
#       f"{size / 2**20:.0f} MiB file")
# # The same tokens and the same cached counts: where the tier lives changes only how long the
# # copies take (the operating system's page cache keeps a file this small in memory anyway).
# ```
#
# </details>

# %% [markdown]
# ## Lab
#
# Now write it yourself (lab 12, [labs/README.md](../labs/README.md)). In a terminal, at the top of
# the repository, with the project's environment active (`source .venv/bin/activate`), copy the
# starter, fill in the bodies, and grade it:
#
# - **Lab 12** (about 25 minutes): the drum: the tier's store and load, where an evicted block waits and how it comes back.
#
#   ```
#   cp labs/lab12_drum.py my_drum.py
#   python -m minipaged.lab check 12 my_drum.py
#   ```
#
# The check names each property your code breaks, on an input that shows it. Once they all
# hold, it runs SmolLM2 with your code plugged in, next to the engine's own, and draws the
# lab's picture. Stuck? `python -m minipaged.lab hint 12` shows the next hint, one at a time, from the idea to the code.
