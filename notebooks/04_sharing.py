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
# # 4. fork() and copy-on-write
#
# **What you will see** (about 20 minutes):
# - four samples of one answer (`n=4`): the prompt is computed once and its frames are
#   mapped by all four page tables, reference count 4, as a Unix `fork()` shares a parent's
#   pages with its child;
# - the first decode step, when each sample writes its own token into the shared last frame:
#   three of them copy the frame first (**copy-on-write**), the last writer needs no copy;
# - beam search, where beams fork and die at every step: frames in use, against what a
#   private copy per beam would take;
# - the prefix cache, the page cache of this analogy: a second chat turn finds its first
#   turn's frames by their content, and only its new tokens are computed.
#
# The paper measured what this sharing saves on its traces: 6.1%–9.8% of KV memory for
# parallel sampling and 37.6%–55.2% for beam search with Alpaca's short prompts, 16.2%–30.5%
# and 44.3%–66.3% with ShareGPT's long ones. Here you see where such numbers come from, one
# request at a time.

# %%
from IPython.display import Markdown, display

from minipaged import LLM, SamplingParams
from minipaged.tools.viz import FrameMap, LineChart, PageTableView

llm = LLM(
    block_size=8, num_blocks=64
)  # small frames and a small pool, so the pictures fit
print(f"{llm.model_name} on {llm.device}, loaded in {llm.load_seconds:.1f} s")

# %% [markdown]
# ## Four samples of one prompt
#
# `SamplingParams(n=4)` asks for four different answers to the same prompt. A naive engine
# would run four sequences, each with its own copy of the prompt's keys and values. minipaged
# maps the prompt once, computes it once, and `fork()`s the other three sequences from the
# first (`BlockManager.fork`): a child's page table is a copy of the parent's list of frames,
# and each frame's reference count goes up by one. No key or value moves.
#
# We drive the engine one step at a time, on a fresh engine of 32 frames of 8 slots with the
# prefix cache off, so the pictures show only what fork shares (the last section turns the
# cache on).

# %%
engine = llm.new_engine(block_size=8, num_blocks=32, enable_prefix_caching=False)
blocks = engine.blocks
prompt_ids = llm.tokenizer.encode_chat(
    [{"role": "user", "content": "Give me a name for a pet cat."}]
)
engine.add_request(
    "cat",
    {"prompt_token_ids": prompt_ids},
    SamplingParams(n=4, temperature=0.8, top_p=0.95, seed=1, max_tokens=16),
)
print(engine.step())  # the prefill: one sequence computed, three forked from it
samples = blocks.seq_ids()  # the four samples' sequence ids
display(FrameMap(blocks), PageTableView(blocks, samples[:2]))

# %%
prompt_frames = blocks.block_table(samples[0])
assert all(blocks.block_table(s) == prompt_frames for s in samples)
tail = len(prompt_ids) % blocks.block_size
display(
    Markdown(
        f"The prompt's {len(prompt_ids)} tokens fill {len(prompt_frames)} frames, {prompt_frames}, the last "
        f"one {tail} of {blocks.block_size} slots full. All {len(samples)} page tables list the same frames, "
        f"and their reference counts are {blocks.table_view(samples[0]).ref_counts} "
        f"(`blocks.table_view(seq_id).ref_counts`): {len(prompt_frames)} frames hold what {len(samples)} copies would, "
        f"{len(samples) * len(prompt_frames)} frames."
    )
)

# %% [markdown]
# ## The first write: copy-on-write
#
# The prefill's logits gave each sample its first token, drawn by each sample's own random
# generator, so the four differ. At the next step each sample must write that token's key and
# value into slot `len(prompt)` of its sequence, which falls inside the shared last frame. If
# it wrote there, the others would read its token as theirs. So `append_slot` checks the
# frame's reference count: above 1, it takes a fresh frame, asks the KV cache to copy the old
# one into it (the `copy_blocks` kernel of notebook 3), points this sequence's page table at
# the copy and drops its reference to the old frame. The last writer finds the count down to
# 1: the frame is its own, and it writes in place. Full frames are never written again, so
# they stay shared for good.

# %%
report = engine.step()
print(report)
display(FrameMap(blocks), PageTableView(blocks, samples))

# %%
last = {s: blocks.block_table(s)[-1] for s in samples}
in_place = [s for s in samples if last[s] == prompt_frames[-1]]
assert report.copies == len(samples) - 1 and len(in_place) == 1
display(
    Markdown(
        f"This step made **{report.copies} copies** (`StepReport.copies`) and took {report.frames_taken} "
        f"frames: the samples' last frames are now {list(last.values())}. Sequence {in_place[0]} kept frame "
        f"{prompt_frames[-1]}, the last writer. The {len(prompt_frames) - 1} full frames "
        f"{prompt_frames[:-1]} still have reference count "
        f"{blocks.table_view(samples[0]).ref_counts[0]}."
    )
)


# %% [markdown]
# From here each sample writes only into its own frames. We run the request to its end and
# measure, at every step, the frames in use against the frames the same sequences would hold
# with a private copy each (the sum of their page tables' lengths). `serve` does that for any
# engine; it is used again for beam search below.


# %%
def serve(engine) -> tuple[dict, list[int], list[int]]:
    """Step until every request is done. Returns the outputs by request id, and per step the
    frames in use and the frames private copies would take."""
    outputs, used, private = {}, [], []
    while engine.has_unfinished_requests():
        report = engine.step()
        blocks = engine.blocks
        used.append(blocks.num_frames - blocks.num_free_frames)
        private.append(blocks.unshared_frames())
        outputs |= {output.request_id: output for output in report.finished}
    return outputs, used, private


outputs, sample_used, sample_private = serve(engine)
for completion in outputs["cat"].outputs:
    print(f"sample {completion.index}: {completion.text!r}")
assert blocks.num_free_frames == blocks.num_frames  # every frame came back

# %% [markdown]
# ## Beam search
#
# Beam search keeps the `beam_width` most likely continuations. At every step each beam
# proposes its best next tokens; the best `beam_width` of all proposals survive. A beam with
# two surviving children is forked, one with none is dropped and its frames freed. So beams
# share not only the prompt but long stretches of what they generated together: their page
# tables form a tree, and the copy-on-write happens at every branch inside a frame.

# %%
engine = llm.new_engine(block_size=8, num_blocks=64, enable_prefix_caching=False)
engine.add_request(
    "beams",
    {"prompt_token_ids": prompt_ids},
    SamplingParams(beam_width=4, n=4, max_tokens=16),
)
outputs, beam_used, beam_private = serve(engine)
for completion in outputs["beams"].outputs:
    print(
        f"beam {completion.index} (log p {completion.cumulative_logprob:.2f}): {completion.text!r}"
    )

# %%
steps = list(range(len(beam_used)))
display(
    LineChart(
        "beam search, width 4: KV frames at each step",
        steps,
        {
            "shared (fork + copy-on-write)": beam_used,
            "a private copy per beam": beam_private,
        },
        x_label="step",
        y_label="frames",
        digits=0,
    )
)
saving = {
    "parallel sampling, n=4": 1 - sum(sample_used) / sum(sample_private),
    "beam search, width 4": 1 - sum(beam_used) / sum(beam_private),
}
display(
    Markdown(
        "Frames saved by sharing, over the whole request (1 − frames in use / frames with private copies, "
        "summed over steps):\n\n"
        + "\n".join(f"- {name}: **{value:.1%}**" for name, value in saving.items())
        + f"\n\nThe samples share only the prompt, {len(prompt_ids)} tokens against "
        f"{len(outputs['beams'].outputs[0].token_ids)} generated each here; the beams also share what they "
        "generated together, so they save more, as in the paper. With longer answers the prompt's share, "
        "and the saving of parallel sampling, shrinks: on ShareGPT's long prompts the paper saved more "
        "than on Alpaca's short ones."
    )
)

# %% [markdown]
# ## The prefix cache: a page cache for prompts
#
# An operating system keeps file pages in memory after the process that read them exits, and
# finds them again by (file, offset). minipaged keeps full KV blocks after their sequence
# finishes, and finds them again by content: each full block is named by a hash of (the
# previous block's hash, its own tokens), so a name stands for the whole prefix up to that
# block. A new prompt looks its blocks up in order and maps every frame it finds, reference
# count + 1, without computing anything. A cached frame nobody maps is marked `c` in the
# frame map: reusable, and evicted, least recently used first, only when a free frame is needed.
#
# A chat is the common case: each turn sends the whole conversation again. `llm.chat` uses
# `llm`'s own engine, which has the prefix cache on (the default).

# %%
conversation = [
    {
        "role": "system",
        "content": "You are a concise assistant. Answer in one sentence.",
    },
    {"role": "user", "content": "What is a page table?"},
]
greedy = SamplingParams(temperature=0, max_tokens=40)
first = llm.chat(conversation, greedy)
conversation += [
    {"role": "assistant", "content": first.outputs[0].text},
    {"role": "user", "content": "And what is a frame?"},
]
second = llm.chat(conversation, greedy)
for turn in (first, second):
    print(
        f"{len(turn.prompt_token_ids)} prompt tokens, {turn.num_cached_tokens} from the cache: "
        f"{turn.outputs[0].text!r}"
    )
FrameMap(llm.engine.blocks)

# %%
computed = len(second.prompt_token_ids) - second.num_cached_tokens
display(
    Markdown(
        f"The first turn found nothing in the cache ({first.num_cached_tokens} tokens). The second turn's "
        f"prompt, {len(second.prompt_token_ids)} tokens, starts with the whole first turn: "
        f"**{second.num_cached_tokens}** of its tokens came from the cache "
        f"(`RequestOutput.num_cached_tokens`), whole blocks of {llm.engine.blocks.block_size}, and only "
        f"{computed} were computed. Both requests have finished, so nobody maps any frame now: the `c` "
        f"frames are the cache, kept until memory is needed."
    )
)

# %% [markdown]
# ## Exercises
#
# Try each one before you open its solution: click **Solution** under it. To run a solution,
# copy it into a new cell below.

# %% [markdown]
# **Exercise 1.** Take a prompt whose length is a multiple of the block size, say the first 32 tokens of
# `prompt_ids`, and ask for `n=4` samples on a fresh engine. How many copies does the first
# decode step make now, and how many frames does it take? Why?

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# engine = llm.new_engine(block_size=8, num_blocks=32, enable_prefix_caching=False)
# engine.add_request("even", {"prompt_token_ids": prompt_ids[:32]},
#                    SamplingParams(n=4, temperature=0.8, seed=1, max_tokens=4))
# engine.step()                      # prefill + fork
# report = engine.step()             # the first decode step
# print(f"copies: {report.copies}, frames taken: {report.frames_taken}")
# # No copy: the shared last frame is full, so each sample's token opens a new logical block
# # and takes a fresh frame of its own (demand paging). Copy-on-write only happens inside a
# # partly filled shared frame.
# _ = serve(engine)  # finish the request: its frames come back
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** A new conversation with the same system prompt but another question. How many of its tokens
# come from the cache? Predict it from the block size and the tokens the two prompts have in
# common, then ask `llm.chat`.

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# other = [conversation[0], {"role": "user", "content": "Why is the sky blue?"}]
# other_ids = llm.tokenizer.encode_chat(other)
# common = next(i for i, (a, b) in enumerate(zip(other_ids, first.prompt_token_ids)) if a != b)
# block_size = llm.engine.blocks.block_size
# answer = llm.chat(other, SamplingParams(temperature=0, max_tokens=8))
# print(f"{common} tokens in common -> {common // block_size * block_size} predicted; "
#       f"{answer.num_cached_tokens} cached")
# # Only whole blocks are cached: the common prefix rounded down to a multiple of the block size.
# ```
#
# </details>

# %% [markdown]
# **Exercise 3.** Parallel sampling with longer answers: the same prompt, `n=4`, `max_tokens=48` (and
# `ignore_eos=True`, so that no sample stops early). Does the fraction of frames saved go up
# or down against the 16-token run above?

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# engine = llm.new_engine(block_size=8, num_blocks=64, enable_prefix_caching=False)
# engine.add_request("long", {"prompt_token_ids": prompt_ids},
#                    SamplingParams(n=4, temperature=0.8, seed=1, max_tokens=48, ignore_eos=True))
# _, used, private = serve(engine)
# print(f"saved {1 - sum(used) / sum(private):.1%} (16 tokens: {saving['parallel sampling, n=4']:.1%})")
# # Down: only the prompt is shared, and it is a smaller part of longer sequences.
# ```
#
# </details>

# %% [markdown]
# ## Lab
#
# Now write it yourself (labs 2 and 3, [labs/README.md](../labs/README.md)). In a terminal, at the top of
# the repository, with the project's environment active (`source .venv/bin/activate`), copy the
# starter, fill in the bodies, and grade it:
#
# - **Lab 2** (about 25 minutes): reference counts, `fork` and copy-on-write.
#
#   ```
#   cp labs/lab2_fork_cow.py my_fork.py
#   python -m minipaged.lab check 2 my_fork.py
#   ```
#
# - **Lab 3** (about 30 minutes): the prefix cache: the hash chain, lookup and release.
#
#   ```
#   cp labs/lab3_prefix_cache.py my_cache.py
#   python -m minipaged.lab check 3 my_cache.py
#   ```
#
# The check names each property your code breaks, on an input that shows it. Once they all
# hold, it runs SmolLM2 with your code plugged in, next to the engine's own, and draws the
# lab's picture. Stuck? `python -m minipaged.lab hint 2` or `python -m minipaged.lab hint 3` shows the next hint, one at a time, from the idea to the code.
