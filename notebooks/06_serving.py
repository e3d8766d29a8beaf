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
# # 6. Everything together: serving many chats
#
# **What you will see** (about 20 minutes):
# - 24 chat requests served at once by SmolLM2, all sharing one system prompt, each with its
#   own question: the whole engine of notebooks 1–5 at work in one loop of `engine.step()`;
# - what it costs and what it buys: tokens per second, against answering the same requests
#   one at a time; and the same greedy answers either way;
# - the KV memory at its peak: the frame map, how much of the allocated memory holds tokens,
#   what sharing the system prompt saved, and what reserving a maximum-length slab per request
#   would have needed instead;
# - the prefix cache's hits: prompt tokens that were never computed.
#
# The paper's headline, 2–4× the throughput of FasterTransformer and Orca at the same
# latency, comes from exactly this combination: paging keeps almost no memory idle, so more
# requests fit in a batch, and continuous batching keeps the batch full.

# %%
import copy
import time

from IPython.display import Markdown, display

from minipaged import LLM, SamplingParams
from minipaged.paging import bytes_per_frame
from minipaged.tools.viz import FrameMap, LineChart, Timeline

llm = LLM(
    num_blocks=128
)  # a pool of 128 frames of 16 token slots: small enough to see whole
engine, blocks = llm.engine, llm.engine.blocks
print(
    f"{llm.model_name} on {llm.device} ({llm.dtype}), loaded in {llm.load_seconds:.1f} s; "
    f"KV pool of {blocks.num_frames} frames x {blocks.block_size} slots"
)

# %% [markdown]
# ## The requests
#
# A tutoring service: one system prompt, then each student's question. Answers are greedy
# (`temperature=0`) and at most 32 tokens, to keep the run short on a CPU.

# %%
system = (
    "You are a friendly tutor for an operating systems course. "
    "Answer in two short sentences, plainly, without lists."
)
questions = [
    "What is a page table?",
    "What is a frame?",
    "What is demand paging?",
    "What does fork() do?",
    "What is copy-on-write?",
    "What is swapping?",
    "What is a page cache?",
    "What is a TLB?",
    "What is virtual memory?",
    "What is a page fault?",
    "Why do pages have a fixed size?",
    "What is thrashing?",
    "What is a working set?",
    "What is memory fragmentation?",
    "What is a scheduler?",
    "What is a context switch?",
    "What is a process?",
    "What is a thread?",
    "What is a kernel?",
    "What is a system call?",
    "What is a mutex?",
    "What is a deadlock?",
    "What is an interrupt?",
    "What is DMA?",
]
prompts = [
    llm.tokenizer.encode_chat(
        [{"role": "system", "content": system}, {"role": "user", "content": q}]
    )
    for q in questions
]
params = SamplingParams(temperature=0, max_tokens=32)
common = next(
    i for i in range(min(map(len, prompts))) if len({p[i] for p in prompts}) > 1
)
display(
    Markdown(
        f"{len(prompts)} prompts of {min(map(len, prompts))}–{max(map(len, prompts))} tokens. The first "
        f"{common}, the chat template and the system prompt, are the same in all of them, and most questions "
        f"go on alike ('What is a…'): the prefix cache can share every full block of {blocks.block_size} "
        f"tokens that two prompts have in common."
    )
)

# %% [markdown]
# ## Serving them all at once
#
# All 24 go into the waiting queue; then `step()` until every one is done. At each step we
# note the frames in use and the frames the same sequences would hold without sharing (the
# sum of their page tables' lengths), and keep a copy of the block manager at the step when
# the most frames were in use.

# %%
for i, prompt in enumerate(prompts):
    engine.add_request(f"q{i}", {"prompt_token_ids": prompt}, params)
reports, used, unshared, outputs = [], [], [], {}
peak = None
start = time.perf_counter()
while engine.has_unfinished_requests():
    reports.append(engine.step())
    used.append(blocks.num_frames - blocks.num_free_frames)
    unshared.append(blocks.unshared_frames())
    outputs |= {o.request_id: o for o in reports[-1].finished}
    if used[-1] == max(used):
        peak = (reports[-1].step, blocks.usage(), copy.deepcopy(blocks))
batched_seconds = time.perf_counter() - start
generated = sum(len(o.outputs[0].token_ids) for o in outputs.values())
batched_rate = generated / batched_seconds
for i in range(3):
    print(f"{questions[i]} -> {outputs[f'q{i}'].outputs[0].text!r}")
display(
    Markdown(
        f"**{len(outputs)} answers, {generated} tokens in {batched_seconds:.1f} s: {batched_rate:.1f} tokens/s**, "
        f"in {len(reports)} steps. Step 0 admitted {len(reports[0].ran)} requests, and each got its first token "
        f"after {reports[0].seconds:.2f} s: the prefill of all their prompts was one forward pass."
    )
)

# %%
Timeline(reports)

# %% [markdown]
# ## Memory at the peak
#
# The frame map at the step with the most frames in use: a letter per sequence, a digit for a
# frame several sequences map (`+` for ten or more: the system prompt's), `.` for free.

# %%
peak_step, peak_usage, peak_blocks = peak
FrameMap(peak_blocks)

# %%
max_len = llm.max_model_len
frame_bytes = bytes_per_frame(
    llm.model.config.num_layers,
    llm.model.config.num_kv_heads,
    llm.model.config.head_dim,
    blocks.block_size,
    dtype="float16",
)
slabs = (
    len(prompts) * max_len // blocks.block_size
)  # frames a max_model_len slab per request takes
display(
    Markdown(
        f"- At step {peak_step}, **{max(used)} frames** were in use for {len(peak_blocks.seq_ids())} sequences; without "
        f"sharing they would have taken {unshared[peak_step]}. {peak_usage.shared_frames} frames were mapped by "
        f"several sequences.\n"
        f"- Of the slots allocated then, **{peak_usage.utilization:.1%}** held a token's key and value "
        f"(`blocks.usage()`); the rest, {peak_usage.internal_waste} slots, were the unfilled tails of last blocks, "
        f"under one block per sequence.\n"
        f"- Reserving a slab of `max_model_len` = {max_len:,} tokens per request, as before paging, would have "
        f"taken {slabs:,} frames for these {len(prompts)} requests, {slabs / max(used):.0f}× the peak here: "
        f"{slabs * frame_bytes / 2**20:,.0f} MiB in float16 on a GPU against "
        f"{max(used) * frame_bytes / 2**20:,.1f} MiB."
    )
)
display(
    LineChart(
        "KV frames in use at each step",
        list(range(len(used))),
        {"in use (shared prefix)": used, "without sharing": unshared},
        x_label="step",
        y_label="frames",
        digits=0,
    )
)

# %% [markdown]
# ## The prefix cache's hits

# %%
prompt_tokens = sum(len(p) for p in prompts)
cached = sum(o.num_cached_tokens for o in outputs.values())
hits = sum(o.num_cached_tokens > 0 for o in outputs.values())
display(
    Markdown(
        f"{hits} of {len(outputs)} requests found the system prompt in the prefix cache: **{cached:,} of "
        f"{prompt_tokens:,} prompt tokens ({cached / prompt_tokens:.0%})** were never computed. The first "
        f"request admitted computed the shared blocks; the others, admitted in the same step, mapped its "
        f"frames at once (their keys and values are written before any attention reads them, layer by "
        f"layer)."
    )
)

# %% [markdown]
# ## Against one request at a time
#
# The first four requests again, each alone: `llm.generate` with one prompt runs the same
# engine with a batch of one. (Their prompts' shared blocks are still in the prefix cache, as
# they would be in a server; the decode steps dominate anyway.)

# %%
alone, start = [], time.perf_counter()
for prompt in prompts[:4]:
    alone += llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
alone_seconds = time.perf_counter() - start
alone_rate = sum(len(o.outputs[0].token_ids) for o in alone) / alone_seconds
same = sum(
    a.outputs[0].token_ids == outputs[f"q{i}"].outputs[0].token_ids
    for i, a in enumerate(alone)
)
display(
    Markdown(
        f"One at a time: **{alone_rate:.1f} tokens/s**; all {len(prompts)} at once: {batched_rate:.1f} tokens/s, "
        f"**{batched_rate / alone_rate:.1f}×** as many. A decode step reads every weight of the model once, "
        f"whatever the batch, so a batch of {len(prompts)} shares that cost {len(prompts)} ways. And "
        f"{same} of {len(alone)} answers are token for token the ones the batched run gave: batching, paging "
        f"and sharing change when and where things are computed, not what."
    )
)

# %% [markdown]
# ## Exercises
#
# Try each one before you open its solution: click **Solution** under it. To run a solution,
# copy it into a new cell below.

# %% [markdown]
# **Exercise 1.** Without the prefix cache: serve the same prompts on an engine with
# `enable_prefix_caching=False` (`llm.new_engine(...)` makes one over the model already
# loaded, as in notebooks 4 and 5), with `max_tokens=2` to keep it short. How many frames does step 0
# take now, against the run above?

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# plain = llm.new_engine(num_blocks=128, enable_prefix_caching=False)
# for i, prompt in enumerate(prompts):
#     plain.add_request(f"q{i}", {"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=2))
# first = plain.step()
# print(f"without the cache: {first.frames_taken} frames, {first.cached_tokens} cached tokens; "
#       f"with it: {reports[0].frames_taken} frames, {reports[0].cached_tokens} cached tokens")
# while plain.has_unfinished_requests():
#     plain.step()
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** A pool too small: serve the 24 requests again, with the same `params`, on a new engine of
# only 48 frames (`llm.new_engine(num_blocks=48)`). Count the preemptions and measure
# tokens/s. Are the answers still the same?

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# small = llm.new_engine(num_blocks=48)
# for i, prompt in enumerate(prompts):
#     small.add_request(f"q{i}", {"prompt_token_ids": prompt}, params)
# squeezed, start, preempted = {}, time.perf_counter(), 0
# while small.has_unfinished_requests():
#     report = small.step()
#     preempted += len(report.preempted)
#     squeezed |= {o.request_id: o for o in report.finished}
# seconds = time.perf_counter() - start
# tokens = sum(len(o.outputs[0].token_ids) for o in squeezed.values())
# same = sum(squeezed[r].outputs[0].token_ids == outputs[r].outputs[0].token_ids for r in outputs)
# print(f"{preempted} preemptions, {tokens / seconds:.1f} tokens/s (roomy pool: {batched_rate:.1f}); "
#       f"{same} of {len(outputs)} answers the same")
# ```
#
# </details>
