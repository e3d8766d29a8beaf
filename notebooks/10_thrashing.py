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
# # 10. Thrashing and the working set: how many sequences to admit
#
# **What you will see** (about 20 minutes):
# - Denning's thrashing (1968) in a KV cache: admit more sequences than the memory holds as they
#   grow, and preemptions by recompute do work that is thrown away;
# - goodput (output tokens of finished requests per second: work done twice counts once)
#   against `max_num_seqs`, with the preemptions and the recomputed tokens behind it, at three
#   memory sizes;
# - why vLLM's scheduler bends here instead of collapsing: it already does a little of what
#   Denning proposed;
# - `admission="working-set"`: admit a request only while every running sequence's working set
#   (its frames now and the frames it will take in the next few steps) still fits, and goodput
#   near the best hand-tuned `max_num_seqs` at every memory size, with nothing tuned.

# %%
import dataclasses

from IPython.display import Markdown, display

from minipaged import LLM, SamplingParams
from minipaged.tools.bench.simulate import PROFILES, Arrival, Simulator
from minipaged.tools.bench.workload import make_workload
from minipaged.tools.viz import LineChart, Timeline

llm = LLM()
print(f"{llm.model_name} on {llm.device}, loaded in {llm.load_seconds:.1f} s")

# %% [markdown]
# ## Thrashing, 1968
#
# A multiprogrammed machine runs several programs at once so that one computes while another
# waits for the drum. Admit one program too many and each gets fewer page frames than it uses:
# every program faults, waits for the drum, and the processor idles while the paging channel is
# saturated. Throughput does not level off, it **collapses**. Denning named it *thrashing*
# ("Thrashing: its causes and prevention", AFIPS 1968) and gave the cure in the same year ("The
# working set model for program behavior", CACM 1968): a program's **working set** W(t, τ) is
# the set of pages it referenced in the last τ time units; run a program only if its working set
# fits in the frames the others leave, and otherwise keep it out (load control).
#
# A serving engine meets the same trade. Every running sequence grows by one KV slot per step
# and takes a frame every `block_size` tokens. The scheduler admits a waiting request when its
# *prompt* fits; nobody knows how long the answer will be. When the frames run out, the newest
# request is preempted: by recompute, its frames are freed and its prompt and every token it
# generated are computed again later. That recomputation is the page fault of a KV cache.
#
# Below, the real Scheduler and BlockManager on the simulator's clock (notebook 7), with the
# step times fitted to SmolLM2 on a CPU (profile `cpu-smollm2`), serve a backlog of 48
# requests that all arrive at once, in a KV cache of 256, 512 or 1,024 token slots.

# %%
requests = make_workload(
    48, min_len=8, max_len=120, prompt_mean=24, output_mean=48, seed=0
)
backlog = [Arrival(0.0, spec) for spec in requests]
output_tokens = sum(spec.output_len for spec in requests)


def serve(
    kv_tokens: int, max_num_seqs: int, preemption_mode: str = "recompute", **options
) -> dict:
    """The backlog through the simulator: goodput, preemptions and recomputed tokens."""
    profile = dataclasses.replace(
        PROFILES["cpu-smollm2"],
        kv_slots=kv_tokens,
        max_num_seqs=max_num_seqs,
        max_model_len=kv_tokens,
    )
    result = Simulator(
        profile, "paged", preemption_mode=preemption_mode, scheduler_options=options
    ).run(backlog)
    return {
        "goodput": output_tokens / result.clock,
        "preemptions": result.preemptions,
        "recomputed": result.recomputed_tokens,
    }


memories, concurrency = [256, 512, 1024], [1, 2, 4, 8, 16, 32, 48]
greedy = {kv: {n: serve(kv, n) for n in concurrency} for kv in memories}
lines = [
    "| KV slots | max_num_seqs | goodput (tok/s) | preemptions | recomputed tokens |",
    "| --- | --- | --- | --- | --- |",
]
for kv, points in greedy.items():
    lines += [
        f"| {kv} | {n} | {p['goodput']:.1f} | {p['preemptions']} | {p['recomputed']} |"
        for n, p in points.items()
    ]
display(Markdown("\n".join(lines)))

# %%
display(
    LineChart(
        "goodput against max_num_seqs (simulated, cpu-smollm2)",
        concurrency,
        {
            f"{kv} KV slots": [p["goodput"] for p in points.values()]
            for kv, points in greedy.items()
        },
        x_label="max_num_seqs",
        y_label="tokens/s",
        log_x=True,
    )
)

# %% [markdown]
# Read each line from the left. More sequences per step is more tokens per step for the same
# weights read, so goodput rises: the batching of notebook 5. Then the memory is full before
# the answers are: preemptions start and the recomputed tokens pile up, and goodput falls off
# its best. It bends; it does not collapse as Denning's machines did. vLLM's scheduler (and
# minipaged's, which follows it) already applies two rules of load control. Admission takes a
# request only when its prompt fits, so the number admitted is bounded by memory whatever
# `max_num_seqs` says. And the victim is always the **newest** request, while the oldest keep
# their frames and finish: the one that loses its work has done the least of it. So the waste
# falls on one request at a time, again and again, and never on all of them at once.
#
# ## The same thing on the real engine, step by step
#
# Eight requests through SmolLM2 in 8 frames of 16 slots (128 tokens). In the timeline a letter
# is a request, UPPER case at its prefill, `!` where it was preempted: every `!` is followed,
# later, by an UPPER case letter that computes its whole context again.

# %%
import numpy as np

rng = np.random.default_rng(1)
prompts = [
    rng.integers(100, 10_000, int(rng.integers(8, 32))).tolist() for _ in range(8)
]
lengths = rng.integers(16, 40, len(prompts)).tolist()


def run_engine(num_blocks=8, **options):
    """The eight requests through a fresh engine: (StepReports, greedy tokens by request)."""
    engine = llm.new_engine(
        num_blocks=num_blocks,
        block_size=16,
        max_num_seqs=8,
        enable_prefix_caching=False,
        **options,
    )
    for i, (prompt, n) in enumerate(zip(prompts, lengths)):
        engine.add_request(
            f"{i}",
            {"prompt_token_ids": prompt},
            SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
        )
    reports, tokens = [], {}
    while engine.has_unfinished_requests():
        reports.append(engine.step())
        tokens |= {o.request_id: o.outputs[0].token_ids for o in reports[-1].finished}
    return reports, tokens


greedy_reports, greedy_tokens = run_engine()
display(Timeline(greedy_reports))
print(
    f"greedy admission: {len(greedy_reports)} steps, {sum(len(r.preempted) for r in greedy_reports)} preemptions"
)

# %% [markdown]
# ## The working set of a sequence
#
# Attention reads **every** frame of a sequence at every step: its whole page table is its
# working set, and none of it can be left on the drum. What is not known in advance is the
# growth. `admission="working-set"` counts it for a window of `admission_window` steps
# (default 16): each running sequence will take the frames its next `admission_window` tokens
# need (no more than its `max_tokens` allows), and a request is admitted only while those
# frames, its own prompt's and its own growth fit among the free ones. An idle engine still
# admits whatever fits alone, so nothing ever waits forever. `WorkingSet.growth`
# (`minipaged/policies/working_set.py`) is the whole rule, a few lines.

# %%
ws_reports, ws_tokens = run_engine(admission="working-set")
display(Timeline(ws_reports))
print(
    f"working-set admission: {len(ws_reports)} steps, {sum(len(r.preempted) for r in ws_reports)} preemptions"
)
assert ws_tokens == greedy_tokens  # the order of work changed, not one token

# %% [markdown]
# Back to the simulator: the working-set rule, with `max_num_seqs` left at the largest value
# of the sweep (nothing tuned), beside the best `max_num_seqs` found by hand at each size.

# %%
lines = [
    "| KV slots | best hand-tuned max_num_seqs | its goodput | working-set goodput | ratio | working-set preemptions |",
    "| --- | --- | --- | --- | --- | --- |",
]
working_set = {}
for kv, points in greedy.items():
    best = max(points, key=lambda n: points[n]["goodput"])
    working_set[kv] = ws = serve(kv, max(concurrency), admission="working-set")
    lines.append(
        f"| {kv} | {best} | {points[best]['goodput']:.1f} | {ws['goodput']:.1f} | "
        f"{ws['goodput'] / points[best]['goodput']:.2f} | {ws['preemptions']} |"
    )
display(Markdown("\n".join(lines)))

# %% [markdown]
# The rule is Denning's load control with a short window: a little of each sequence's future
# is counted as already in use. Too short a window and admission is greedy again; too long and
# it reserves memory ahead of its use, which is what paging was invented to stop (notebook 1).
# In production the same knobs appear under other names: vLLM keeps a `watermark` of free
# blocks at admission and caps `max_num_seqs`; schedulers such as Llumnix (OSDI 2024) migrate
# running requests between instances so that none of them has to preempt.

# %% [markdown]
# ## Exercises

# %% [markdown]
# **Exercise 1.** Sweep `admission_window` over 1, 4, 16, 64 and 256 at 256 KV slots (with
# `max_num_seqs` 48): goodput and preemptions. Where does the rule turn into greedy admission,
# and where into reserving the whole answer up front?

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# for window in (1, 4, 16, 64, 256):
#     p = serve(256, 48, admission="working-set", admission_window=window)
#     print(f"window {window:>3}: {p['goodput']:.1f} tok/s, {p['preemptions']} preemptions")
# # A window of one step counts at most one new frame per sequence: nearly greedy, and it still
# # preempts. From a window as long as the answers (48 tokens on average here), every sequence's
# # whole growth is counted: almost no preemption, but fewer sequences per step than fit most of
# # the time, and goodput falls below greedy's.
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** Preempt by swap instead of recompute (`serve(..., preemption_mode="swap")`).
# Does greedy admission still lose goodput past its best
# `max_num_seqs` at 256 KV slots? What does this CPU profile charge for a swap?

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# for n in (4, 16, 48):
#     recompute, swap = serve(256, n), serve(256, n, preemption_mode="swap")
#     print(f"max_num_seqs {n}: recompute {recompute['goodput']:.1f} tok/s, swap {swap['goodput']:.1f} tok/s")
# print(PROFILES["cpu-smollm2"].swap_per_frame, PROFILES["cpu-smollm2"].swap_per_slot)
# # The cpu-smollm2 profile charges nothing for moving a frame (on a CPU, "host memory" is the same
# # memory), so a swapped request comes back without recomputing: the loss past the best
# # max_num_seqs is the recomputation. On a GPU a swap crosses PCIe (profile opt-13b-a100).
# ```
#
# </details>

# %% [markdown]
# **Exercise 3.** The working-set rule admits fewer sequences only when it must. Count the most
# requests that ran in one step on the real engine above with 8 frames, then with 64 frames
# (`num_blocks=64`), greedy and working-set.

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# def most_running(reports):
#     return max(len({rid for rid, *_ in r.ran}) for r in reports)
#
# print("8 frames:", most_running(greedy_reports), "greedy,", most_running(ws_reports), "working-set")
# big_greedy, big_ws = run_engine(64)[0], run_engine(64, admission="working-set")[0]
# print("64 frames:", most_running(big_greedy), "greedy,", most_running(big_ws), "working-set")
# # With 64 frames every request's working set fits: both admit all eight at once.
# ```
#
# </details>

# %% [markdown]
# ## Lab
#
# Now write it yourself (lab 8, [labs/README.md](../labs/README.md)). In a terminal, at the top of
# the repository, with the project's environment active (`source .venv/bin/activate`), copy the
# starter, fill in the bodies, and grade it:
#
# - **Lab 8** (about 30 minutes): working-set admission: a request joins only while everyone's working set fits.
#
#   ```
#   cp labs/lab8_working_set.py my_working_set.py
#   python -m minipaged.lab check 8 my_working_set.py
#   ```
#
# The check names each property your code breaks, on an input that shows it. Once they all
# hold, it runs SmolLM2 with your code plugged in, next to the engine's own, and draws the
# lab's picture. Stuck? `python -m minipaged.lab hint 8` shows the next hint, one at a time, from the idea to the code.
