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
# # 11. Short and long requests: the order of the waiting queue
#
# **What you will see** (about 20 minutes):
# - the waiting queue of a serving engine as the ready queue of a time-sharing system: first
#   come first served, shortest job first (Schrage, 1968), priorities, aging;
# - `scheduling_policy` (`"fcfs"`, `"sjf"`, `"aging"`, `"priority"`) admitting the same requests
#   in different orders, and vLLM's `priority=` on a request;
# - the latency of the shortest and the longest quarter of requests under each policy, in the
#   simulator with SmolLM2's step times on a CPU (the benchmark adds the real engine, and the
#   vLLM paper's scale);
# - starvation: a stream of short jobs that keeps a long one waiting forever under SJF, and the
#   bound aging puts on its wait;
# - the same tokens under every order.

# %%
import dataclasses

from IPython.display import Markdown, display

from minipaged import LLM, SamplingParams
from minipaged.paging import BlockManager
from minipaged.scheduler import (
    WAITING_ORDERS,
    Request,
    Scheduler,
    SchedulerConfig,
    Sequence,
)
from minipaged.tools.bench.scheduling import (
    PrioritySimulator,
    latency_by_size,
    mixed_workload,
    priorities_of,
)
from minipaged.tools.bench.simulate import PROFILES, poisson_trace
from minipaged.tools.bench.workload import RequestSpec
from minipaged.tools.viz import BarChart

print(WAITING_ORDERS)

# %% [markdown]
# ## A ready queue of requests
#
# Continuous batching (notebook 5) runs every admitted request at every step, so once a request
# runs, nobody waits for it. Waiting happens *before*: in the `waiting` queue, while the batch
# has no free seat (`max_num_seqs`) or the KV cache no free frames. Which waiting request goes
# next is the oldest question of time-sharing. First come, first served is fair and simple, but
# a short request that arrives behind long ones waits for all of them. Shortest job first
# minimizes the mean wait (the shortest-remaining-time rule is optimal for it: Schrage, "A
# proof of the optimality of the shortest remaining processing time discipline", Operations
# Research, 1968), but a long job can wait forever if short ones keep coming. CTSS (Corbató,
# Merwin-Daggett and Daley, 1962) put jobs in queues of different priority, so short
# interactive ones went first and long ones sank; *aging* lets a waiting job's priority rise
# with the time it waited, so that nobody starves.
#
# In minipaged the job's size is what is known before it runs: its prompt plus its
# `max_tokens`. `"aging"` takes the smallest size after forgiving `aging_rate` tokens per step
# waited; `"priority"` is vLLM's: the smallest `priority=` given to `add_request` first.
#
# One seat, a short request running, and three waiting, of 44, 8 and 24 tokens: who is admitted
# in which order? The scheduler runs here without a model (dummy tokens, as in the simulator).


# %%
def request(i: int, prompt_len: int, max_tokens: int = 4) -> Request:
    prompt = [i + 1] * prompt_len
    return Request(
        str(i),
        None,
        prompt,
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        [Sequence(i, list(prompt), prompt_len)],
    )


def admission_order(policy: str, sizes, priorities=(0, 0, 0)) -> list[str]:
    """Request 0 holds the only seat; then 1, 2, 3 arrive: the order they are admitted in."""
    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs=1, max_model_len=256, scheduling_policy=policy),
        BlockManager(64, 4, enable_prefix_caching=False),
    )
    scheduler.add(request(0, 4))
    order = []
    for step in range(200):
        batch = scheduler.schedule()
        order += [s.request.request_id for s in batch.scheduled if s.kind == "prefill"]
        scheduler.update(batch, {seq: 0 for s in batch.scheduled for seq in s.samplers})
        if step == 0:
            for i, (size, priority) in enumerate(zip(sizes, priorities), start=1):
                scheduler.add(request(i, size), priority)
    return order


sizes, priorities = (40, 4, 20), (0, 2, 1)
for policy in WAITING_ORDERS:
    print(f"{policy:>8}: {admission_order(policy, sizes, priorities)}")

# %% [markdown]
# ## Under load
#
# The mix of `python -m minipaged.bench scheduling`: three quarters short chat turns, one
# quarter long jobs (a document to summarize), 200 of them arriving at 4 per second, a little
# more than 4 seats serve, so a queue builds. The simulator runs the real Scheduler with
# SmolLM2's step times on a CPU (profile `cpu-smollm2`, notebook 7). Every policy serves the same
# trace; for `"priority"`, the client marks the longest quarter of its jobs `priority=1` (batch
# work) and the rest 0. Then the end-to-end latency of the shortest and the longest quarter, and
# the longest any request waited before it first ran.

# %%
specs = mixed_workload(200, seed=0)
trace = poisson_trace(specs, 4.0, seed=0)
cpu = dataclasses.replace(PROFILES["cpu-smollm2"], max_num_seqs=4)


def serve(policy: str, priorities=None, aging_rate: float = 4.0) -> dict:
    """The trace under one policy: latency_by_size's row (quarters by prompt + output tokens)."""
    sim = PrioritySimulator(
        cpu,
        "paged",
        priorities,
        scheduler_options={"scheduling_policy": policy, "aging_rate": aging_rate},
    )
    r = sim.run(trace)
    served = {
        "e2e": r.latencies,
        "waits": r.waits,
        "seconds": r.clock,
        "preemptions": r.preemptions,
    }
    return latency_by_size(
        [RequestSpec(p, o) for p, o in zip(r.prompt_lens, r.output_lens)], served
    )


rows = {
    policy: serve(policy, priorities_of(specs) if policy == "priority" else None)
    for policy in WAITING_ORDERS
}

lines = [
    "| policy | short p50 | short p99 | long p50 | long p99 | longest wait |",
    "| --- | --- | --- | --- | --- | --- |",
]
lines += [
    f"| {p} | {r['short_p50']:.2f} s | {r['short_p99']:.2f} s | {r['long_p50']:.2f} s | {r['long_p99']:.2f} s | "
    f"{r['max_wait']:.2f} s |"
    for p, r in rows.items()
]
display(Markdown("\n".join(lines)))
display(
    BarChart(
        "shortest quarter's p50 e2e latency (simulated, cpu-smollm2)",
        list(rows),
        {"short p50": [r["short_p50"] for r in rows.values()]},
        unit=" s",
        digits=2,
    )
)
display(
    BarChart(
        "longest wait before running (simulated, cpu-smollm2)",
        list(rows),
        {"longest wait": [r["max_wait"] for r in rows.values()]},
        unit=" s",
        digits=1,
    )
)

# %% [markdown]
# SJF lets short requests pass the long ones: their latency drops, and the tail of the long
# ones pays for it (their p99, and the longest wait of all). Aging sits in between: part of the
# gain for the short requests, and a longest wait close to first come, first served's.
# Priorities do what the client said: short work first, batch work when there is room.
#
# ## Starvation, and its bound
#
# A long job of 50 tokens waits with one seat, and a short job of 4 tokens arrives at every
# step, each holding the seat for 2 steps: faster than the seat serves them. Under SJF the long
# job is never the smallest. Under aging it waits only for requests that arrived fewer than
# (50 - 1) / `aging_rate` steps after it (the bound in `Aging`'s docstring, `minipaged/policies/sjf.py`).


# %%
def stream(policy: str, aging_rate: float, steps: int = 400):
    """(steps the long job waited before it ran, or None if it never ran; short jobs run before it)."""
    scheduler = Scheduler(
        SchedulerConfig(
            max_num_seqs=1,
            max_model_len=256,
            scheduling_policy=policy,
            aging_rate=aging_rate,
        ),
        BlockManager(256, 4, enable_prefix_caching=False),
    )

    def dummy(batch):  # (no model: a token 0 each)
        return {seq: 0 for s in batch.scheduled for seq in s.samplers}

    scheduler.add(request(0, 2, 2))
    first = scheduler.schedule()
    scheduler.update(first, dummy(first))
    scheduler.add(request(1, 40, 10))  # the long job: 50 tokens
    arrived, ran = scheduler.steps, 0
    for i in range(2, steps + 2):
        scheduler.add(request(i, 2, 2))  # a short job: 4 tokens, every step
        batch = scheduler.schedule()
        admitted = [
            s.request.request_id for s in batch.scheduled if s.kind == "prefill"
        ]
        if "1" in admitted:
            return scheduler.steps - arrived, ran
        ran += len(admitted)
        scheduler.update(batch, dummy(batch))
    return None, ran


for policy, rate in (("sjf", 1.0), ("aging", 1.0), ("aging", 4.0)):
    waited, ahead = stream(policy, rate)
    waited = "never ran in 400 steps" if waited is None else f"ran after {waited} steps"
    print(
        f"{policy:>5} (aging_rate {rate:g}): the long job {waited}; {ahead} short jobs ran before it; "
        f"bound on who may pass it: arrivals within {(50 - 1) / rate:g} steps after it"
    )

# %% [markdown]
# ## The same tokens
#
# A policy changes when a request runs, never what it computes: greedy tokens are the same under
# every order (the tests check each against the request run alone).

# %%
llm = LLM()
prompts = [
    llm.tokenizer.encode_chat([{"role": "user", "content": q}])
    for q in (
        "What is a page table?",
        "Name three colours.",
        "Explain copy-on-write in one sentence.",
    )
]
outputs = {}
for policy in WAITING_ORDERS:
    engine = llm.new_engine(max_num_seqs=1, scheduling_policy=policy)
    for i, ids in enumerate(prompts):
        engine.add_request(
            str(i),
            {"prompt_token_ids": ids},
            SamplingParams(temperature=0, max_tokens=12),
            **({"priority": -i} if policy == "priority" else {}),
        )
    done = {}
    while engine.has_unfinished_requests():
        done |= {o.request_id: o.outputs[0].text for o in engine.step().finished}
    outputs[policy] = done
assert all(o == outputs["fcfs"] for o in outputs.values())
display(
    Markdown("\n".join(f"- {outputs['fcfs'][str(i)]!r}" for i in range(len(prompts))))
)

# %% [markdown]
# ## Exercises

# %% [markdown]
# **Exercise 1.** Aging's rate is a trade: sweep `aging_rate` over a quarter, 1, 4, 16 and 64 on
# the trace above and print the shortest quarter's p50 and the longest wait. Which end is SJF,
# and which is first come, first served?

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# for rate in (0.25, 1, 4, 16, 64):
#     row = serve("aging", aging_rate=rate)
#     print(f"aging_rate {rate:>5}: short p50 {row['short_p50']:.2f} s, longest wait {row['max_wait']:.2f} s")
# # A slow rate forgives little: SJF, short requests fast and the longest wait long. A fast rate
# # makes the waiting time count more than the size: first come, first served.
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** In the admission example above, give the 40-token request `priority=-1` under
# `"priority"`. Then explain why, under `"sjf"`, a request preempted by recompute still goes
# back in first even when a smaller one waits (look at `SJF.pick` in
# `minipaged/policies/sjf.py`).

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# print(admission_order("priority", (40, 4, 20), (-1, 0, 0)))
# # ['0', '1', '2', '3']: the smallest priority value goes first, ties in arrival order.
# # A preempted request has done work that is lost until it runs again, and it holds the
# # place it had when it was admitted: putting it behind newcomers would make every preemption
# # a new wait, and under SJF a long preempted job could starve after it had already started.
# ```
#
# </details>

# %% [markdown]
# **Exercise 3.** A two-level queue in the spirit of CTSS with vLLM's `priority=`: mark every
# request whose `max_tokens` is over 24 as `priority=1`, the rest 0, and compare its
# shortest-quarter p50 and longest wait with SJF's on the trace above.

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# row = serve("priority", [int(s.output_len > 24) for s in specs])
# print(f"two levels: short p50 {row['short_p50']:.2f} s, longest wait {row['max_wait']:.2f} s")
# print(f"SJF:        short p50 {rows['sjf']['short_p50']:.2f} s, longest wait {rows['sjf']['max_wait']:.2f} s")
# # Two classes get most of SJF's gain for the short requests without its starvation: what matters
# # is not to queue a short request behind a long one; within a class the oldest goes first, so
# # no long job is passed by other long jobs forever.
# ```
#
# </details>

# %% [markdown]
# ## Lab
#
# Now write it yourself (lab 7, [labs/README.md](../labs/README.md)). In a terminal, at the top of
# the repository, with the project's environment active (`source .venv/bin/activate`), copy the
# starter, fill in the bodies, and grade it:
#
# - **Lab 7** (about 25 minutes): shortest job first with aging: the waiting order that bounds a long job's wait.
#
#   ```
#   cp labs/lab7_aging.py my_aging.py
#   python -m minipaged.lab check 7 my_aging.py
#   ```
#
# The check names each property your code breaks, on an input that shows it. Once they all
# hold, it runs SmolLM2 with your code plugged in, next to the engine's own, and draws the
# lab's picture. Stuck? `python -m minipaged.lab hint 7` shows the next hint, one at a time, from the idea to the code.
