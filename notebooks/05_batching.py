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
# # 5. Continuous batching
#
# **What you will see** (about 25 minutes):
# - the engine driven by hand, `engine.step()` after `engine.step()`: each step's report says
#   who ran, prefill or decode, which frames were taken and freed, who finished;
# - the batch timeline: requests join the batch the step after another leaves, instead of
#   waiting for the whole batch to end (iteration-level scheduling, from Orca);
# - a pool too small for everyone: the scheduler preempts the newest request, by
#   *recompute* (its frames freed, its tokens computed again later) or by *swap* (its frames
#   copied to host memory and back), and the answers do not change;
# - continuous against static batching on the same requests and the same memory, in tokens
#   per second. The paper reports 2–4× the throughput of FasterTransformer and Orca at the
#   same latency, from paging and continuous batching together.

# %%
import time

import numpy as np
from IPython.display import Markdown, display

from minipaged import LLM, SamplingParams
from minipaged.tools.viz import BarChart, Timeline

llm = LLM(
    num_blocks=64
)  # its own engine stays idle: each section below makes a fresh one
print(f"{llm.model_name} on {llm.device}, loaded in {llm.load_seconds:.1f} s")

# %% [markdown]
# ## One step at a time
#
# Six questions, each with a fixed answer length (`ignore_eos=True`, so that every answer has
# exactly `max_tokens` tokens and the pictures do not depend on what the model says), on an
# engine that runs at most 4 sequences at once (`max_num_seqs=4`). `add_request` only queues
# them: everything happens in `step()`.

# %%
questions = [
    "What is a page table?",
    "Name three fruits.",
    "What is 2 + 2?",
    "Say hello in French.",
    "Why is the sky blue?",
    "Write a haiku about memory.",
]
prompts = [
    {"prompt_token_ids": llm.tokenizer.encode_chat([{"role": "user", "content": q}])}
    for q in questions
]
answer_lengths = [24, 8, 16, 4, 32, 12]


def add_questions(engine) -> None:
    for i, (prompt, length) in enumerate(zip(prompts, answer_lengths)):
        engine.add_request(
            f"q{i}",
            prompt,
            SamplingParams(temperature=0, max_tokens=length, ignore_eos=True),
        )


engine = llm.new_engine(max_num_seqs=4, num_blocks=64)
add_questions(engine)
print("waiting:", [r.request_id for r in engine.scheduler.waiting])
reports = []
for _ in range(6):
    reports.append(engine.step())
    print(reports[-1])
print(
    "running:",
    [r.request_id for r in engine.scheduler.running],
    "| waiting:",
    [r.request_id for r in engine.scheduler.waiting],
)

# %% [markdown]
# Each line is a `StepReport`. Step 0 admits as many waiting requests as fit, here the limit
# of 4 sequences, and **prefills** them: every prompt token goes through the model in one
# forward pass, and each request gets its first token. The later steps **decode**: one token
# for each running sequence, all in one forward pass. A frame is taken when a sequence's last
# one fills up, and freed when it finishes. "cached tokens": SmolLM2's chat template starts
# every prompt with the same default system prompt, so after the first prompt the others find
# its full blocks in the prefix cache (notebook 4), even within the same step.
#
# Now run to the end, and draw the **batch timeline**: one row per batch slot, one column per
# step, a letter per request, upper case for its prefill step.

# %%
while engine.has_unfinished_requests():
    reports.append(engine.step())
outputs = {o.request_id: o for r in reports for o in r.finished}
Timeline(reports)

# %%
finished_at = {o.request_id: r.step for r in reports for o in r.finished}
started_at = {}
for r in reports:
    for rid, *_ in r.ran:
        started_at.setdefault(rid, r.step)
first_done = min(finished_at, key=finished_at.get)
joined = [
    rid for rid, step in started_at.items() if step == finished_at[first_done] + 1
]
display(
    Markdown(
        f"{first_done} was the shortest answer: it finished at step {finished_at[first_done]}, and "
        f"{', '.join(joined)} joined at step {finished_at[first_done] + 1}, the very next step, while the "
        f"others went on decoding. {len(reports)} steps in all for {len(questions)} requests; the "
        f"longest answer alone needs {max(answer_lengths)}."
    )
)

# %% [markdown]
# ## When memory runs out: preemption
#
# Paging lets the scheduler admit requests without reserving their whole future, so the pool
# can fill up while everyone is still growing. Then a running sequence needs a frame and none
# is free. The scheduler (`minipaged/scheduler.py`) takes the frames of the most recently
# admitted request, and either
#
# - **recomputes**: frees its frames, puts it back at the front of the waiting queue, and later
#   prefills its prompt *and* the tokens it had generated, in one pass; or
# - **swaps**: copies its frames to a pool in host memory (`swap_out`), and when frames are
#   free again copies them back (`swap_in`) and carries on decoding.
#
# Recompute costs computation, swap costs transfers between host and GPU memory. The paper
# found them comparable end to end at the usual block sizes; vLLM recomputes by default, and
# so does minipaged. The same six questions, on a pool of only 12 frames of 8 slots:

# %%
runs = {}
for mode in ("recompute", "swap"):
    small = llm.new_engine(
        num_blocks=12, block_size=8, preemption_mode=mode, enable_prefix_caching=False
    )
    add_questions(small)
    runs[mode] = []
    while small.has_unfinished_requests():
        runs[mode].append(small.step())
    print(f"preemption by {mode}:")
    print(Timeline(runs[mode]), end="\n\n")

# %%
display(Timeline(runs["swap"]))
for mode, run in runs.items():
    preempted = [rid for r in run for rid, how in r.preempted]
    same = sum(
        o.outputs[0].token_ids == outputs[o.request_id].outputs[0].token_ids
        for r in run
        for o in r.finished
    )
    display(
        Markdown(
            f"**{mode}**: {len(preempted)} preemptions ({', '.join(preempted)}), {len(run)} steps; "
            f"{sum(r.swapped_out for r in run)} frames swapped out and {sum(r.swapped_in for r in run)} "
            f"back in; {same} of {len(questions)} answers token for token the same as in the roomy "
            f"run above."
        )
    )

# %% [markdown]
# In both timelines `!` marks the step a request lost its frames. After a recompute it comes
# back in upper case: a prefill, of its prompt and everything it had generated so far. After a
# swap it comes back in lower case: its keys and values were kept, in host memory, so it just
# decodes on. Either way the greedy answers are the ones the roomy engine gave: preemption
# changes when tokens are computed, not what they are.
#
# ## Continuous against static batching
#
# Before Orca, serving systems batched at the granularity of requests: a batch was formed,
# ran until its *longest* member finished, and only then did the next batch start. Finished
# members stayed in the batch as padding, computed and thrown away (`_` in the timeline), and
# each request had its maximum length reserved (notebook 1). `scheduler="static"` is that
# baseline. Both engines below get the same requests and the same KV memory: 32 frames of 16
# slots, and a maximum length of 128 tokens, so the static engine reserves room for 4 requests
# at a time.

# %%
rng = np.random.default_rng(0)
topics = [
    "page tables",
    "the moon",
    "bread",
    "rivers",
    "chess",
    "rain",
    "trains",
    "cats",
    "volcanoes",
    "bees",
    "maps",
    "tea",
]
workload = [
    (
        {
            "prompt_token_ids": llm.tokenizer.encode_chat(
                [{"role": "user", "content": f"Tell me about {t}."}]
            )
        },
        SamplingParams(temperature=0, max_tokens=int(n), ignore_eos=True),
    )
    for t, n in zip(topics, rng.integers(4, 40, len(topics)))
]

results = {}
for scheduler in ("continuous", "static"):
    engine = llm.new_engine(
        scheduler=scheduler, num_blocks=32, block_size=16, max_model_len=128
    )
    for i, (prompt, params) in enumerate(workload):
        engine.add_request(f"r{i}", prompt, params)
    start, steps = time.perf_counter(), []
    while engine.has_unfinished_requests():
        steps.append(engine.step())
    seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for r in steps for o in r.finished for c in o.outputs)
    results[scheduler] = {
        "seconds": seconds,
        "tokens": tokens,
        "reports": steps,
        "tokens_per_s": tokens / seconds,
        "padding": sum(r.padding for r in steps),
        "rows": sum(len(r.ran) + r.padding for r in steps),
    }  # sequences computed
    print(
        f"{scheduler:>10}: {tokens} tokens in {seconds:.1f} s, {len(steps)} steps, "
        f"{tokens / seconds:.1f} tokens/s"
    )

# %%
display(
    Timeline(results["static"]["reports"]), Timeline(results["continuous"]["reports"])
)

# %%
cont, static = results["continuous"], results["static"]
ratio = cont["tokens_per_s"] / static["tokens_per_s"]
display(
    BarChart(
        "the same requests and memory: generated tokens per second",
        list(results),
        {"tokens/s": [r["tokens_per_s"] for r in results.values()]},
        unit=" tok/s",
    )
)
display(
    Markdown(
        f"Continuous batching served the same {cont['tokens']} tokens **{ratio:.1f}×** as fast "
        f"({cont['tokens_per_s']:.1f} against {static['tokens_per_s']:.1f} tokens/s), in {len(cont['reports'])} "
        f"steps against {len(static['reports'])}. Two causes, both in the timelines. The static engine computed "
        f"{static['rows'] / len(static['reports']):.1f} sequences per step on average, because its reservations "
        f"left room for 4 requests at a time, and {static['padding']} of its {static['rows']} rows were padding "
        f"for requests already done. The continuous engine computed {cont['rows'] / len(cont['reports']):.1f} per "
        f"step, every one useful, because paging let it admit requests as long as their frames fit. A step over a "
        f"larger batch costs little more than over a small one, on a CPU's BLAS and even more so on a GPU, so "
        f"more tokens per step means more tokens per second."
    )
)

# %% [markdown]
# ## Exercises
#
# Try each one before you open its solution: click **Solution** under it. To run a solution,
# copy it into a new cell below.

# %% [markdown]
# **Exercise 1.** Abort requests: add the six questions to a fresh engine, take three steps, then
# `engine.abort_request(...)` one that is running (q0) and one still waiting (q4). What does
# each return, and how many frames come back? Then watch the next step's report.

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# engine = llm.new_engine(max_num_seqs=4, num_blocks=64)
# add_questions(engine)
# for _ in range(3):
#     engine.step()
# for request_id in ("q0", "q4"):
#     free_before = engine.blocks.num_free_frames
#     aborted = engine.abort_request(request_id)
#     print(f"{request_id}: finish_reason {aborted.outputs[0].finish_reason!r}, "
#           f"{len(aborted.outputs[0].token_ids)} tokens so far; "
#           f"frames back: {engine.blocks.num_free_frames - free_before}")
# print(engine.step())
# # q0's private frames come back at once (its first frame, the shared system prompt, is still
# # mapped by the others); q4 had none yet. The freed batch slot goes to q5 at the next step.
# while engine.has_unfinished_requests():
#     engine.step()
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** Swap with too little host memory: `preemption_mode="swap"` and `swap_space=2` (host frames),
# on the 12-frame pool. What does the scheduler do when a victim does not fit in host memory?

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# tight = llm.new_engine(num_blocks=12, block_size=8, preemption_mode="swap", swap_space=2,
#                    enable_prefix_caching=False)
# add_questions(tight)
# modes = []
# while tight.has_unfinished_requests():
#     modes += [how for _, how in tight.step().preempted]
# print(modes)
# # It falls back to recompute: a victim's frames must all fit in the host pool to be swapped.
# ```
#
# </details>

# %% [markdown]
# **Exercise 3.** Where does the static engine's time go? From `results["static"]["reports"]`, count the rows
# it computed and how many were padding. If it had skipped the padding, how many tokens per
# second would it have reached, roughly (assume a step's time scales with its rows)?

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# rows = sum(len(r.ran) + r.padding for r in static["reports"])
# useful = rows - static["padding"]
# print(f"{rows} rows computed, {static['padding']} padding ({static['padding'] / rows:.0%}); without padding "
#       f"about {static['tokens_per_s'] * rows / useful:.1f} tokens/s, still below continuous "
#       f"({cont['tokens_per_s']:.1f}): the other cause is the small batch its reservations allow.")
# ```
#
# </details>

# %% [markdown]
# ## Lab
#
# Now write it yourself (lab 4, [labs/README.md](../labs/README.md)). In a terminal, at the top of
# the repository, with the project's environment active (`source .venv/bin/activate`), copy the
# starter, fill in the bodies, and grade it:
#
# - **Lab 4** (about 35 minutes): one step of the continuous batcher: decode slots, preemption, admission.
#
#   ```
#   cp labs/lab4_batcher.py my_batcher.py
#   python -m minipaged.lab check 4 my_batcher.py
#   ```
#
# The check names each property your code breaks, on an input that shows it. Once they all
# hold, it runs SmolLM2 with your code plugged in, next to the engine's own, and draws the
# lab's picture. Stuck? `python -m minipaged.lab hint 4` shows the next hint, one at a time, from the idea to the code.
