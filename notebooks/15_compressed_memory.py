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
# # 15. Compressed memory: more frames in the same bytes
#
# **What you will see** (about 15 minutes):
# - compressed caching (Wilson, Kaplan and Smaragdakis, USENIX 1999; today's zswap and macOS's
#   compressed memory) applied to the KV cache: K and V stored as **8-bit codes** with a scale per
#   row, `kv_cache_dtype="int8"` or `"fp8"` (vLLM's option name);
# - one key row coded and decoded, and how far each value moves;
# - the frames the same bytes hold in float32, float16, int8 and fp8, and the pool the engine
#   sizes from them;
# - SmolLM2's greedy answers with the 8-bit cache beside the full-precision one: where they agree,
#   and where the first token differs;
# - the decode kernel's version 7, which reads the codes through the page table and decodes them
#   in registers, run on the CPU through the emulation against the NumPy reference.

# %%
import numpy as np
from IPython.display import Markdown, display

from minipaged import LLM, SamplingParams
from minipaged.attention import emulated, reference
from minipaged.tools.bench.kv_dtype import (
    PROMPTS,
    first_divergence,
    frames_per_gib,
    greedy_tokens,
)

# %% [markdown]
# ## One row, coded
#
# A row is one token's `head_dim` numbers for one KV head. Its scale is its largest |value| over
# 127 (int8) or 448 (fp8 e4m3, the largest value with 4 exponent and 3 mantissa bits); each value
# is stored as the code nearest to value / scale, and read back as code × scale. A row's codes
# depend on that row alone: not on its neighbours, not on the step that wrote it.

# %%
rng = np.random.default_rng(0)
row = (
    rng.standard_normal((1, 1, 8)).astype(np.float32) * 3
)  # (tokens, kv_heads, head_dim), 8 dims to show
for name, dtype in (("int8", np.int8), ("fp8", np.uint8)):
    cache = np.zeros((1, 1, 1, 8), dtype)  # one frame of one slot
    scales = np.zeros((1, 1, 1), np.float16)
    reference.write_coded(row, cache, scales, np.array([0]))
    back = reference.decode_codes(cache, scales)[0, 0]
    print(
        f"{name:5} scale {float(scales[0, 0, 0]):.4f}  codes {cache[0, 0, 0].tolist()}"
    )
    print(
        f"      largest error {np.abs(back - row[0]).max():.4f} of values up to {np.abs(row).max():.2f}"
    )
print("value", [round(float(x), 3) for x in row[0, 0]])

# %% [markdown]
# ## The same bytes, more frames
#
# A frame of SmolLM2 holds block_size tokens' K and V for every layer; in 8 bits each number
# takes one byte instead of four (float32) or two (float16), plus a float16 scale per row.

# %%
llm = LLM()  # SmolLM2-135M-Instruct, float32 on a CPU
rows = frames_per_gib(llm.model.config)
lines = [
    "| storage | frames per GiB | vs float32 | vs float16 |",
    "| --- | --- | --- | --- |",
]
lines += [
    f"| {r['kv_cache_dtype']} | {r['frames_per_gib']:,} | {r['vs_float32']:.2f}× | {r['vs_float16']:.2f}× |"
    for r in rows
]
display(Markdown("\n".join(lines)))
engines = {dtype: llm.new_engine(kv_cache_dtype=dtype) for dtype in ("auto", "int8")}
display(
    Markdown(
        f"The engine sizes its pool by bytes (512 MiB on a CPU): "
        f"**{engines['auto'].blocks.num_frames:,}** frames in float32, "
        f"**{engines['int8'].blocks.num_frames:,}** in int8, the longest context "
        f"{engines['auto'].max_model_len:,} tokens either way (the model's limit)."
    )
)

# %% [markdown]
# ## The same answers?
#
# Three of the benchmark's prompts, 24 greedy tokens each, with the full-precision cache and the
# 8-bit ones. `None` means the answers are the same token for token; a number is the position of
# the first token that differs.

# %%
prompts = [
    llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS[5:8]
]
answers = {
    dtype: greedy_tokens(
        llm.new_engine(num_blocks=64, kv_cache_dtype=dtype), prompts, 24
    )
    for dtype in ("auto", "int8", "fp8")
}
for i, prompt in enumerate(PROMPTS[5:8]):
    print(prompt)
    for dtype in ("int8", "fp8"):
        print(
            f"   {dtype}: first divergence {first_divergence(answers['auto'][i], answers[dtype][i])}"
        )
print("\nfull precision, last prompt:", llm.tokenizer.decode(answers["auto"][2]))
print("int8, last prompt:          ", llm.tokenizer.decode(answers["int8"][2]))

# %% [markdown]
# Where the 8-bit answer differs from the first token on, look at the first token's choices: two
# candidates nearly tied at full precision, and the small error of the codes is enough to swap
# them. Both answers are the model's.

# %%
firsts = {}
for dtype in ("auto", "int8"):
    engine = llm.new_engine(num_blocks=64, kv_cache_dtype=dtype)
    engine.add_request(
        "tie",
        {"prompt_token_ids": prompts[2]},
        SamplingParams(temperature=0, max_tokens=1, logprobs=2),
    )
    while engine.has_unfinished_requests():
        for out in engine.step().finished:
            firsts[dtype] = out.outputs[0].logprobs[0]
for dtype, choices in firsts.items():
    ranked = sorted(choices.items(), key=lambda item: -item[1].logprob)
    print(dtype, [(llm.tokenizer.decode([t]), round(p.logprob, 3)) for t, p in ranked])

# %% [markdown]
# ## Decoding inside the kernel
#
# SGLang's documentation warns that turning an 8-bit cache back into full precision *before* the
# attention kernel cancels the gain: decode is bound by memory bandwidth, and the float copy is
# written and read again. Version 7 of `cuda/paged_attention.cu` loads 8 codes per lane in one
# 8-byte load and decodes them in registers. Here it runs on the CPU through the emulation, on a
# small paged batch, against the NumPy reference.

# %%
batch_rng = np.random.default_rng(1)
num_blocks, block_size, kv_heads, head_dim = 8, 16, 3, 64
caches = [
    np.zeros((num_blocks, block_size, kv_heads, head_dim), np.int8) for _ in range(2)
]
scales = [np.zeros((num_blocks, block_size, kv_heads), np.float16) for _ in range(2)]
block_tables = np.array([[5, 2, 7], [0, 3, -1]], np.int32)  # two sequences' page tables
context_lens = np.array([40, 20], np.int32)
for table, n in zip(block_tables, context_lens):
    slots = table[np.arange(n) // block_size] * block_size + np.arange(n) % block_size
    k, v = batch_rng.standard_normal((2, n, kv_heads, head_dim)).astype(np.float32)
    reference.write_kv(k, v, *caches, slots, *scales)
q = batch_rng.standard_normal((2, 9, head_dim)).astype(
    np.float32
)  # 9 query heads, 3 per KV head
kernel = emulated.decode(
    q,
    *caches,
    block_tables,
    context_lens,
    0.125,
    k_scales=scales[0],
    v_scales=scales[1],
)
numpy = reference.decode(
    q,
    *caches,
    block_tables,
    context_lens,
    0.125,
    k_scales=scales[0],
    v_scales=scales[1],
)
print(
    "largest difference, kernel v7 vs the NumPy reference:",
    float(np.abs(kernel - numpy).max()),
)

# %% [markdown]
# ## Exercises

# %% [markdown]
# **Exercise 1.** Measure the perplexity of `minipaged.tools.bench.kv_dtype.TEXT` with each
# `kv_cache_dtype` (the function `perplexity` of that module reads it teacher-forced). Which
# 8 bits cost more, and why would fp8's 3 mantissa bits lose to int8's 7 here?

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# from minipaged.tools.bench.kv_dtype import TEXT, perplexity
#
# ids = llm.tokenizer.encode(TEXT)
# for dtype in ("auto", "int8", "fp8"):
#     print(dtype, round(perplexity(llm.new_engine(num_blocks=64, kv_cache_dtype=dtype), ids), 3))
# # fp8 keeps a relative precision of 1/16 for every value, int8 a step of 1/254 of the row's
# # largest value: with a scale per row the values sit in a narrow range, where int8's even
# # steps are finer; fp8's exponent buys range that the scale already gives.
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** Preemption must not change an 8-bit run either. Run the three prompts with the
# int8 cache in a pool too small for them together (`num_blocks=6`, `preemption_mode="swap"`),
# and compare with the answers above.

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# tight = llm.new_engine(num_blocks=6, kv_cache_dtype="int8", preemption_mode="swap")
# print(greedy_tokens(tight, prompts, 24) == answers["int8"])
# # True: the swapped frames go to the host with their scales and come back with them, and a
# # row's codes never depend on when it was written.
# ```
#
# </details>

# %% [markdown]
# ## Lab
#
# Now write it yourself (lab 11, [labs/README.md](../labs/README.md)). In a terminal, at the top of
# the repository, with the project's environment active (`source .venv/bin/activate`), copy the
# starter, fill in the bodies, and grade it:
#
# - **Lab 11** (about 25 minutes): the int8 codec of the KV cache: a scale per row, codes, and back.
#
#   ```
#   cp labs/lab11_compressed_memory.py my_codec.py
#   python -m minipaged.lab check 11 my_codec.py
#   ```
#
# The check names each property your code breaks, on an input that shows it. Once they all
# hold, it runs SmolLM2 with your code plugged in, next to the engine's own, and draws the
# lab's picture. Stuck? `python -m minipaged.lab hint 11` shows the next hint, one at a time, from the idea to the code.
