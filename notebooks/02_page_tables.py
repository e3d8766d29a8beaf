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
# # 2. Page tables
#
# **What you will see** (about 20 minutes):
# - a pool of frames and a sequence's page table, drawn: which logical block of the sequence
#   lives in which physical frame;
# - tokens appended one at a time, a frame taken only when the last one is full (demand paging);
# - two sequences growing in turn: their frames interleave in the pool while each page table
#   keeps its own order, and the flat arrays the attention kernel receives;
# - a full pool refusing a request, then a finished sequence's frames going straight to the
#   next one, wherever they lie: no compaction, no external fragmentation;
# - what the block size trades: wasted slots against page-table length (and kernel speed).
#
# The words are the operating system's, from virtual memory as the Atlas computer introduced it
# (1962): a **page** is a logical block of one sequence's tokens, a **frame** a physical block of
# the KV cache, and the **page table** (`BlockTable`) maps the first to the second.

# %%
from IPython.display import Markdown, display

from minipaged.paging import BlockManager, NoFreeFramesError
from minipaged.runner import step_inputs
from minipaged.tools.bench.workload import make_workload, simulate_memory
from minipaged.tools.viz import FrameMap, LineChart, PageTableView

# %% [markdown]
# ## A pool of frames
#
# A `BlockManager` owns the pool and one page table per sequence. A real pool has thousands of
# frames of 16 token slots; this one has 12 frames of 4, so that every picture fits. The token
# ids below are made-up numbers: paging never looks at them (only the prefix cache does, and
# it is switched off here; a later notebook turns it on).

# %%
block_size = 4
manager = BlockManager(
    num_blocks=12, block_size=block_size, enable_prefix_caching=False
)
FrameMap(manager)

# %% [markdown]
# ## Allocating a prompt
#
# `allocate` maps a new sequence's prompt onto as many frames as its tokens need: the number of
# tokens divided by the block size, rounded up. The pictures letter the sequences they show A, B,
# … in order, with their ids in the legend; each also prints as text: `print(...)`.

# %%
manager.allocate("s1", [101, 102, 103, 104, 105, 106])  # a 6-token prompt
display(PageTableView(manager, ["s1"]), FrameMap(manager))
print(PageTableView(manager, ["s1"]))

# %%
usage = manager.usage()
display(
    Markdown(
        f"s1 holds {manager.table_view('s1').num_tokens} tokens in {len(manager.block_table('s1'))} frames: "
        f"{usage.allocated_slots} slots allocated, {usage.internal_waste} of them empty. That empty tail "
        f"of the last block is the only memory paging ever wastes."
    )
)

# %% [markdown]
# ## Demand paging
#
# Now the model generates. `append_slot` places each new token and returns its **slot**,
# `frame * block_size + offset`: where its key and value will be written. Watch when a frame
# is taken.

# %%
rows = []
for token in range(200, 208):  # 8 generated tokens
    before = len(manager.block_table("s1"))
    slot, _ = manager.append_slot(
        "s1", token
    )  # _: a copy-on-write pair, for shared frames
    rows.append(
        (
            manager.table_view("s1").num_tokens,
            slot,
            len(manager.block_table("s1")) > before,
        )
    )
display(
    Markdown(
        "| tokens | slot | frame | offset | new frame? |\n|---|---|---|---|---|\n"
        + "\n".join(
            f"| {n} | {slot} | {slot // block_size} | {slot % block_size} | {'**yes**' if taken else ''} |"
            for n, slot, taken in rows
        )
    )
)

# %%
taken = [n for n, _, new_frame in rows if new_frame]
assert all((n - 1) % block_size == 0 for n in taken)
display(
    Markdown(
        f"Frames were taken for tokens {taken}: each time the count passed a multiple of {block_size}. "
        f"The other {len(rows) - len(taken)} appends cost no memory at all."
    )
)

# %% [markdown]
# ## Two sequences, taking turns
#
# In a batch, many sequences grow at once, one token each per step. s2 arrives with a 5-token
# prompt; then s1 and s2 generate in turn.

# %%
manager.allocate("s2", [301, 302, 303, 304, 305])
for step in range(6):
    manager.append_slot("s1", 400 + step)
    manager.append_slot("s2", 500 + step)
display(PageTableView(manager, ["s1", "s2"]), FrameMap(manager))

# %%
display(
    Markdown(
        f"s1's frames, in logical order: {manager.block_table('s1')}; s2's: {manager.block_table('s2')}. "
        f"Neither run is contiguous in the pool, and nothing needs it to be: each page table lists its "
        f"frames in its own order."
    )
)

# %% [markdown]
# ## What the kernel gets
#
# The model never sees these objects. For each forward step, the model runner asks the block
# manager for each page table and slot and flattens them (`minipaged.runner.step_inputs`) into arrays: `block_tables`, one row of frames per sequence padded with -1; `slot_mapping`,
# where each new token's key and value go; `context_lens`, how many tokens each sequence
# attends to.

# %%
arrays = step_inputs(
    manager, ["s1", "s2"], num_new_tokens=[1, 1]
)  # a decode step: one new token each
print("block_tables:\n", arrays.block_tables)
print("slot_mapping:", arrays.slot_mapping)
print("context_lens:", arrays.context_lens)

# %% [markdown]
# The paged-attention kernel finds token `p` of sequence `i` at slot
# `block_tables[i, p // block_size] * block_size + p % block_size`: the address translation a
# processor's memory-management unit does for every load, here a few integer operations per block.

# %%
p = int(arrays.context_lens[1]) - 1  # s2's newest token
frame = int(arrays.block_tables[1, p // block_size])
assert frame * block_size + p % block_size == arrays.slot_mapping[1]
display(
    Markdown(
        f"s2's newest token, position {p}, is in logical block {p // block_size} → frame {frame}, offset "
        f"{p % block_size}: slot {frame * block_size + p % block_size}, the slot `step_inputs` gave for it "
        f"({arrays.slot_mapping[1]})."
    )
)

# %% [markdown]
# ## When the pool is full
#
# A third request, s3, arrives with a 20-token prompt. Every call of the block manager is
# all-or-nothing: when the frames are not there it raises `NoFreeFramesError` and changes
# nothing, so the scheduler can wait, or preempt someone, and try again.

# %%
s3_prompt = list(range(600, 620))
print(
    f"free frames: {manager.num_free_frames}; can_allocate(20 tokens): {manager.can_allocate(len(s3_prompt))}"
)
try:
    manager.allocate("s3", s3_prompt)
except NoFreeFramesError as error:
    print("NoFreeFramesError:", error)

# %% [markdown]
# ## Freeing: holes that do not matter
#
# s1 finishes, and `free` gives its frames back. They lie between s2's frames; contiguous slabs
# would need those holes merged (compaction) before a large request fits. Frames need nothing:
# s3 takes whichever are free. (With s1 gone, the pictures now letter s2 A and s3 B.)

# %%
s1_frames = manager.block_table("s1")
manager.free("s1")
manager.allocate("s3", s3_prompt)
display(FrameMap(manager), PageTableView(manager, ["s2", "s3"]))

# %%
s3_frames = manager.block_table("s3")
reused = [f for f in s3_frames if f in s1_frames]
assert s3_frames != list(
    range(min(s3_frames), min(s3_frames) + len(s3_frames))
)  # not one run
display(
    Markdown(
        f"s3 got frames {s3_frames}: s1 had used {reused}, the others had never been used. They are "
        f"not one contiguous run, and nothing had to move: s3's page table keeps them in order."
    )
)

# %% [markdown]
# ## Block size: what it trades
#
# Block size 4 made the pictures fit; minipaged, like vLLM, defaults to 16. Smaller blocks waste
# less (a sequence's last block is half empty on average) but make page tables longer: more
# entries to keep, to send to the kernel and to look up. Larger blocks the opposite. Measure
# the first two on the thousand requests of notebook 1, in the same pool.

# %%
requests = make_workload(1000)
sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
num_slots = 64 * 2048  # notebook 1's pool: 64 slabs of 2,048 slots
runs = {
    size: simulate_memory(
        BlockManager(num_slots // size, size, enable_prefix_caching=False), requests
    )
    for size in sizes
}

# %%
waste = {s: 100 * (1 - runs[s]["utilization"]) for s in sizes}
entries = {
    s: runs[s]["slots_per_request"] / s for s in sizes
}  # frames a running sequence maps
display(
    LineChart(
        "KV memory wasted, by block size",
        sizes,
        {"wasted": list(waste.values())},
        x_label="block size (tokens)",
        y_label="% of allocated slots",
        log_x=True,
    ),
    LineChart(
        "page-table length, by block size",
        sizes,
        {"entries": list(entries.values())},
        x_label="block size (tokens)",
        y_label="frames per running sequence",
        log_x=True,
    ),
)

# %%
extra = {s: runs[s]["slots_per_request"] - runs[1]["slots_per_request"] for s in sizes}
assert all(abs(extra[s] - (s - 1) / 2) < 0.05 * s for s in sizes)
display(
    Markdown(
        f"- Block size 1 wastes nothing, but a running sequence's page table has {entries[1]:.0f} entries.\n"
        f"- Block size 16 wastes {waste[16]:.1f}% with {entries[16]:.0f} entries.\n"
        f"- Block size 256 wastes {waste[256]:.1f}% with {entries[256]:.1f} entries.\n\n"
        f"Why: at block size 16 a running sequence holds {extra[16]:.1f} slots more than at block size 1, "
        f"about half a block, (16 − 1) / 2 = {(16 - 1) / 2}: on average its last block is half full."
    )
)

# %% [markdown]
# The third side of the trade is the kernel. It reads each frame as one contiguous chunk of
# keys and values; with tiny blocks it jumps through the block table every few tokens and moves
# too little data per lookup to keep a GPU's memory busy. The paper's block-size experiment
# found 16 to 128 best on the ShareGPT traces and made 16 vLLM's default, large enough for the
# GPU and small enough to waste little. Notebook 3 times minipaged's own kernel.

# %% [markdown]
# ## Exercises
#
# Try each one before you open its solution: click **Solution** under it. To run a solution,
# copy it into a new cell below.

# %% [markdown]
# **Exercise 1.** A sequence of 37 tokens at block size 16: how many frames does it take, and how many slots
# stay empty? Predict, then check with a fresh `BlockManager`.

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# check = BlockManager(num_blocks=8, block_size=16)
# check.allocate("x", list(range(37)))
# print(f"{len(check.block_table('x'))} frames, {check.usage().internal_waste} empty slots")
# # 37 = 16 + 16 + 5: three frames, and 16 - 5 = 11 empty slots in the last one.
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** Where does token 9 (counting from 0) of s2 live? Work its slot out by hand from
# `manager.block_table("s2")` and the block size, then ask s2's page table:
# `manager.slots("s2", 9, 10)`.

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# frames = manager.block_table("s2")
# by_hand = frames[9 // block_size] * block_size + 9 % block_size
# print(f"s2's frames {frames}: block {9 // block_size}, offset {9 % block_size} -> slot {by_hand}; "
#       f"the page table says {manager.slots('s2', 9, 10)[0]}")
# ```
#
# </details>

# %% [markdown]
# **Exercise 3.** Short chats: rerun the block-size sweep on `make_workload(1000, prompt_mean=20, output_mean=30)`.
# From which block size on is more than a tenth of the memory wasted? Why sooner than above?

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# chats = make_workload(1000, prompt_mean=20, output_mean=30)
# chat_waste = {s: 1 - simulate_memory(BlockManager(num_slots // s, s, enable_prefix_caching=False),
#                                      chats)["utilization"] for s in sizes}
# print({s: f"{w:.1%}" for s, w in chat_waste.items()})
# print("over 10% from block size", next(s for s in sizes if chat_waste[s] > 0.1))
# # The tail of the last block is about half a block whatever the sequence's length, so it is a
# # larger share of a short sequence.
# ```
#
# </details>

# %% [markdown]
# ## Lab
#
# Now write it yourself (lab 1, [labs/README.md](../labs/README.md)). In a terminal, at the top of
# the repository, with the project's environment active (`source .venv/bin/activate`), copy the
# starter, fill in the bodies, and grade it:
#
# - **Lab 1** (about 25 minutes): the frame allocator and the page table's `append_slot`: a frame only when the last one is full.
#
#   ```
#   cp labs/lab1_demand_paging.py my_paging.py
#   python -m minipaged.lab check 1 my_paging.py
#   ```
#
# The check names each property your code breaks, on an input that shows it. Once they all
# hold, it runs SmolLM2 with your code plugged in, next to the engine's own, and draws the
# lab's picture. Stuck? `python -m minipaged.lab hint 1` shows the next hint, one at a time, from the idea to the code.
