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
# # 9. Page replacement for the prefix cache: LRU, FIFO, CLOCK and Belady's MIN
#
# **What you will see** (about 20 minutes):
# - the prefix cache as a page cache: frames nobody maps any more stay **parked**, findable by
#   their content, until the pool needs their memory; then a **replacement policy** picks the
#   one to give up (`prefix_cache_policy`: `lru`, `fifo`, `clock`, `random`);
# - each policy's eviction order on four frames, and CLOCK's ring with its hand and its
#   referenced bits, turn by turn;
# - Belady's **MIN**, the optimum that reads the future, checked against a brute force over
#   every eviction script, and FIFO's **anomaly**: more frames, more misses;
# - the classic hit-rate-against-memory curve on a multi-turn chat trace with shared system
#   prompts, every policy beside MIN;
# - SmolLM2 giving the same answers under every policy, with different hits.

# %%
from IPython.display import Markdown, display

from minipaged import LLM, SamplingParams
from minipaged.paging import REPLACEMENT_POLICIES, PrefixCache
from minipaged.tools.bench import replacement as rp
from minipaged.tools.bench.workload import chat_trace

print("policies:", ", ".join(REPLACEMENT_POLICIES))

# %% [markdown]
# ## Which parked frame goes?
#
# A frame whose last sequence let go (ref count 0) is not wiped: the prefix cache keeps its
# block's name (the hash of its tokens chained to everything before), so a later prompt that
# starts the same way maps it again instead of computing its K and V. Only when the free list
# is empty does the allocator take a parked frame back, and someone must choose which. That is
# page replacement, the question Belady asked of the IBM M44/44X in 1966:
#
# - **LRU** gives up the frame used least recently (vLLM's and SGLang's choice);
# - **FIFO** the frame whose content came in first, however often it was hit since;
# - **CLOCK** (Corbató, Multics, 1968) keeps the frames in a ring with a *referenced* bit; the
#   hand clears set bits as it passes and stops at the first parked frame whose bit is clear:
#   a second chance for each recently used frame, at FIFO's cost;
# - **random** is Belady's RAND, the baseline to beat.
#
# Four frames below get their content in the order 0, 1, 2, 3, are parked in the order 3, 2,
# 1, 0, and frame 3 is then hit once (mapped by a sequence, and parked again):


# %%
def eviction_order(policy: str) -> list[int]:
    cache = PrefixCache(policy)
    for frame in range(4):
        cache.insert(frame, None, [frame])  # the content of frame f: a one-token block
    for frame in (3, 2, 1, 0):
        cache.park(frame)
    cache.revive(3)  # a prompt maps frame 3 again...
    cache.park(3)  # ...and lets it go
    return [cache.evict() for _ in range(4)]


display(
    Markdown(
        "| policy | frames given up, first to last |\n| --- | --- |\n"
        + "\n".join(f"| {p} | {eviction_order(p)} |" for p in REPLACEMENT_POLICIES)
    )
)

# %% [markdown]
# ## CLOCK's ring
#
# The ring is the cached frames in the order their content entered; `*` marks a set referenced
# bit and `>` the hand. Every frame was just parked, so every bit is set: the hand's first
# sweep clears them all and comes back to frame 0. Then frame 1 is used again (its bit set),
# and the hand skips it once.


# %%
def ring(cache: PrefixCache) -> str:
    return "  ".join(
        ("> " if i == 0 else "") + f"{frame}{'*' if referenced else ' '}"
        for i, (frame, referenced) in enumerate(cache.policy.ring.items())
    )


clock = PrefixCache("clock")
for frame in range(5):
    clock.insert(frame, None, [frame])
    clock.park(frame)
print(f"{'ring:':<32}{ring(clock)}")
print(f"{f'evict -> frame {clock.evict()}':<32}{ring(clock)}")
clock.revive(1)
clock.park(1)
print(f"{'frame 1 used again:':<32}{ring(clock)}")
for _ in range(3):
    print(f"{f'evict -> frame {clock.evict()}':<32}{ring(clock)}")

# %% [markdown]
# ## MIN, and FIFO's anomaly
#
# Belady's MIN gives up the block whose next use lies furthest in the future. No online policy
# can run it (it reads the trace ahead), but on a recorded trace it is the bound every policy is
# measured against. `minipaged.tools.bench.replacement` replays traces through real block managers:
# here a classic reference string, each page a one-block prompt served one at a time.
#
# The string is the one of Belady, Nelson and Shedler (1969): with FIFO, a fourth frame makes
# *more* faults than three. LRU and MIN are *stack algorithms* (the pages cached with `k`
# frames are always among those cached with `k + 1`), so they cannot do that.

# %%
rows = [
    f"| {p} | "
    + " | ".join(str(rp.classic_faults(rp.CLASSIC_ANOMALY, p, k)) for k in (3, 4))
    + " |"
    for p in ("fifo", "lru", "clock", "min")
]
display(
    Markdown(
        f"reference string {rp.CLASSIC_ANOMALY}\n\n| policy | faults, 3 frames | faults, 4 frames |\n"
        "| --- | --- | --- |\n" + "\n".join(rows)
    )
)

# %% [markdown]
# Is MIN really the optimum here? A prefix cache is not quite a page cache: a block is found
# only after every block before it in the prompt, and frames that running sequences map are
# pinned. So we check it the hard way on small chat traces: `brute_force_best` replays the trace
# once for every sequence of eviction choices and keeps the best.

# %%
small = chat_trace(
    num_conversations=6,
    turns=2,
    num_system_prompts=3,
    system_len=8,
    question_mean=2,
    answer_mean=2,
    active=3,
    seed=7,
)
for frames in (9, 10, 11):
    best = rp.brute_force_best(small, frames, 4, concurrency=2)
    got = {
        p: rp.replay(small, frames, 4, p, concurrency=2).hits
        for p in (*REPLACEMENT_POLICIES, "min")
    }
    print(
        f"{frames} frames: best of every eviction script {best} hits; "
        + ", ".join(f"{p} {h}" for p, h in got.items())
    )

# %% [markdown]
# ## The curve: hit rate against memory
#
# Now a multi-turn chat trace: conversations of four turns with one of three system prompts
# (the first the most popular), each turn's prompt the whole conversation so far. Four
# requests are in memory at once. The pool goes from the floor (the live requests' frames,
# nothing shared) to the pool in which nothing is ever evicted; at each size every policy is
# replayed, and MIN.

# %%
trace = chat_trace(16, 4, num_system_prompts=3, seed=0)
floor, top = rp.min_pool(trace, 16, 4), rp.no_eviction_pool(trace, 16, 4)
pools = rp.pool_sizes(floor, top, 8)
curves = rp.sweep(trace, pools, 16, 4)
chart = rp.replacement_chart({"pool_frames": pools, "policies": curves})
print(chart)
chart

# %%
above = {
    p: [
        pools[i]
        for i, (h, m) in enumerate(zip(c["hits"], curves["min"]["hits"]))
        if h > m
    ]
    for p, c in curves.items()
}
print("pools where a policy beats MIN:", above)
print(
    f"at the floor ({floor} frames) MIN saves {curves['min']['saved_tokens'][0]:,} prefill tokens, "
    f"LRU {curves['lru']['saved_tokens'][0]:,}, FIFO {curves['fifo']['saved_tokens'][0]:,}"
)
print(
    "a bigger pool that hits less:",
    {
        p: [
            (pools[i], pools[i + 1])
            for i in range(len(pools) - 1)
            if c["hits"][i + 1] < c["hits"][i]
        ]
        for p, c in curves.items()
    },
)

# %% [markdown]
# Reading it: at the top every policy meets MIN (nothing is evicted, only first-time misses
# remain). Below, LRU stays close to MIN: a chat's next turn reuses the blocks its previous turn
# just let go, and the system prompts are hit all the time, so "used recently" predicts "used
# soon". FIFO throws out the popular system prompt as soon as it is the oldest content, and its
# curve is not even monotone: the anomaly turns up in a real trace, not only in the textbook
# string. The search below counts small chat traces where one more frame makes a policy hit less.

# %%
found = {
    p: len({a["seed"] for a in rp.anomalies(p, 20)})
    for p in ("lru", "fifo", "clock", "min")
}
print("of 20 small chat traces, those where one more frame hits less:", found)

# %% [markdown]
# ## The real engine
#
# `prefix_cache_policy` is an option of `LLM(...)` and of every engine. The answers cannot
# depend on it (a hit maps the same K and V a miss would compute); only the hits do. Six
# questions to two apps, one at a time, in a pool of twelve frames of eight tokens:

# %%
llm = LLM(block_size=8, num_blocks=12)
SYSTEMS = [
    "You are a helpful assistant for a railway company. Answer questions about trains, tickets "
    "and timetables briefly and politely.",
    "You are a cooking assistant. Suggest simple recipes with few ingredients, and answer in one "
    "or two sentences.",
]
QUESTIONS = [
    (0, "When does the first train leave?"),
    (1, "What can I cook with eggs?"),
    (0, "Can I bring a bike?"),
    (1, "How long do I boil pasta?"),
    (0, "Is there a discount for students?"),
    (1, "What goes well with rice?"),
]
prompts = [
    llm.tokenizer.encode_chat(
        [{"role": "system", "content": SYSTEMS[app]}, {"role": "user", "content": q}]
    )
    for app, q in QUESTIONS
]


def serve(policy: str):
    engine = llm.new_engine(block_size=8, num_blocks=12, prefix_cache_policy=policy)
    answers = []
    for i, prompt in enumerate(prompts):
        engine.add_request(
            str(i),
            {"prompt_token_ids": prompt},
            SamplingParams(temperature=0, max_tokens=6),
        )
        while engine.has_unfinished_requests():
            answers += [out.outputs[0].text for out in engine.step().finished]
    return answers, engine.blocks.prefix_cache_hits, engine.blocks.prefix_cache_queries


served = {policy: serve(policy) for policy in ("lru", "fifo")}
for policy, (answers, hits, queries) in served.items():
    print(
        f"{policy}: {hits} of {queries} prompt tokens found in the cache; first answers {answers[:2]}"
    )
print("the same answers:", served["lru"][0] == served["fifo"][0])

# %% [markdown]
# ## Exercises

# %% [markdown]
# **Exercise 1.** A policy is an object with four methods (`entered`, `parked`, `left`,
# `victim`), and `prefix_cache_policy` takes one. Write MRU (give up the most recently parked
# frame) and put it on the curve beside LRU and MIN. Where does it beat LRU, and why?

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# class MRU:
#     name = "mru"
#     def entered(self, frame, block): pass
#     def parked(self, frame): pass
#     def left(self, frame): pass
#     def victim(self, parked):
#         return next(reversed(parked))  # parked is in parking order: the last is the most recent
#
# mru = [rp.replay(trace, n, 16, MRU(), 4).hit_rate for n in pools]
# print([f"{100 * h:.1f}" for h in mru])
# print([f"{100 * h:.1f}" for h in curves["lru"]["hit_rate"]])
# # MRU loses almost everywhere here: the block parked last (a conversation's newest turn) is the
# # one its next turn needs. MRU wins on loops larger than the pool, where LRU evicts each page
# # just before it comes back (try rp.page_trace([1, 2, 3, 4] * 4) with 3 pages).
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** Move the floor: replay the same trace with one request in memory at a time and
# with eight. How do the floor and MIN's hit rate at the floor change?

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# for concurrency in (1, 8):
#     low = rp.min_pool(trace, 16, concurrency)
#     run = rp.replay(trace, low, 16, "min", concurrency)
#     print(f"{concurrency} at once: floor {low} frames, MIN hits {100 * run.hit_rate:.1f}% there")
# # The floor counts every live request's frames as if nothing were shared. One at a time it
# # is a single request's frames, and MIN can keep little else. With eight at once the floor
# # is much higher, and since the live requests share their system prompts, much of it is
# # left for parked blocks: even the floor then hits about as much as an unbounded pool.
# ```
#
# </details>

# %% [markdown]
# **Exercise 3.** Only full blocks are named and shared. Replay the trace with blocks of 4, 16
# and 64 tokens in a pool that never evicts: which share of all prompt tokens is saved, and
# why does it fall as the blocks grow?

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# prompt_tokens = sum(len(turn.prompt) for turn in trace)
# for block_size in (4, 16, 64):
#     run = rp.replay(trace, rp.no_eviction_pool(trace, block_size, 4), block_size, "lru", 4)
#     print(f"blocks of {block_size}: {100 * run.saved_tokens / prompt_tokens:.1f}% of prompt tokens saved")
# # A turn's prompt ends in a partly filled block, and the block where the shared part ends
# # (the system prompt, the previous turn) holds tokens of what follows: neither is named, so
# # up to a block's worth of shared tokens per prompt is computed again. Bigger blocks waste
# # more of each prefix (vLLM and SGLang hash blocks of 16, SGLang's radix tree single tokens).
# ```
#
# </details>

# %% [markdown]
# ## Lab
#
# Now write it yourself (lab 6, [labs/README.md](../labs/README.md)). In a terminal, at the top of
# the repository, with the project's environment active (`source .venv/bin/activate`), copy the
# starter, fill in the bodies, and grade it:
#
# - **Lab 6** (about 25 minutes): CLOCK, the second-chance replacement of the prefix cache's parked frames.
#
#   ```
#   cp labs/lab6_clock.py my_clock.py
#   python -m minipaged.lab check 6 my_clock.py
#   ```
#
# The check names each property your code breaks, on an input that shows it. Once they all
# hold, it runs SmolLM2 with your code plugged in, next to the engine's own, and draws the
# lab's picture. Stuck? `python -m minipaged.lab hint 6` shows the next hint, one at a time, from the idea to the code.
