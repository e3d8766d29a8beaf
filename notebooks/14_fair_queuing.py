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
# # 14. Fair queuing
#
# **What you will see** (about 15 minutes):
# - the waiting order of fair queuing, what each of its methods promises
#   (`minipaged/policies/fair.py`): Nagle's (1987) and Demers, Keshav and Shenker's (1989) idea,
#   counted in tokens as the Virtual Token Counter of Sheng et al. (OSDI 2024) counts it; lab 10
#   asks you to write their bodies, so this notebook shows what they do, not how;
# - a flooding client and two participants on a scheduler of three rows, without a model:
#   how long each short request waits under first come first served and under fair queuing;
# - each client's counter, step by step, and the lift rule that keeps an idle client from
#   banking its idle time;
# - what it did on a real server with a room's workload, from the committed benchmark, and why
#   an order cannot make a step cheaper.

# %%
import inspect
import itertools
import json
from pathlib import Path

from IPython.display import Markdown, display

import minipaged
from minipaged import SamplingParams
from minipaged.paging import BlockManager
from minipaged.policies import fair
from minipaged.scheduler import Request, Scheduler, SchedulerConfig, Sequence
from minipaged.tools.bench.serve import room_chart
from minipaged.tools.viz import BarChart, LineChart

# the committed results (bench/results/ beside the package), wherever this runs from
RESULTS = Path(minipaged.__file__).resolve().parents[1] / "bench" / "results"

# what the scheduler asks of the order, and what each answer means: the signatures and the
# docstrings, without the bodies (lab 10 is to write them)
print(
    f"class Fair:\n    {inspect.getdoc(fair.Fair).replace(chr(10), chr(10) + '    ')}\n"
)
said = {
    "pick": "The next waiting request to admit: the seam's question (`pick(waiting, now)`)."
}
for name in ("pick", "served", "lift"):
    method = getattr(fair.Fair, name)
    doc = inspect.getdoc(method) or said[name]
    print(f"    def {name}{inspect.signature(method)}:")
    print("        " + doc.replace("\n", "\n        ") + "\n")

# %% [markdown]
# ## The flow that has had least goes next
#
# A switch with one queue serves whoever sends most. Fair queuing keeps, for each source, how
# much it has been served, and sends next for the one served least; it is work conserving (a
# line with one sender gives it all of the line). In a serving engine the source is a client
# (the server names it by its API key and address), the service is tokens, a generated token
# costing twice a prompt token, and the scheduler tells the order what each row ran after every
# step (`served`, the waiting-order seam's one optional method).
#
# Three rows, no model (a dummy token for every row, as in the simulator). One client queues
# twelve long requests at step 0; alice and bob each send a short one every ten steps.

# %%
seq_ids = itertools.count()


def job(name: str, client: str, prompt_len: int, max_tokens: int) -> Request:
    prompt = [3] * prompt_len
    return Request(
        name,
        None,
        prompt,
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        [Sequence(next(seq_ids), list(prompt), prompt_len)],
        client=client,
    )


def room(order, steps: int = 200) -> tuple[dict, dict, dict]:
    """Each short request's wait (steps from arrival to its prefill), each client's tokens, and
    each client's counter after every step (when the order keeps counters)."""
    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs=3, max_model_len=256, scheduling_policy=order),
        BlockManager(256, 4, enable_prefix_caching=False),
    )
    for i in range(12):
        scheduler.add(job(f"flood{i}", "flood", 24, 20))
    arrived, waits, tokens, service = {}, {}, {}, {}
    for step in range(steps):
        if step % 10 == 2 and step < 80:
            for client in ("alice", "bob"):
                name = f"{client}{step // 10}"
                scheduler.add(job(name, client, 8, 4))
                arrived[name] = step
        batch = scheduler.schedule()
        for s in batch.scheduled:
            if s.kind == "prefill" and s.request.request_id in arrived:
                waits.setdefault(
                    s.request.request_id, step - arrived[s.request.request_id]
                )
            tokens[s.request.client] = (
                tokens.get(s.request.client, 0) + s.num_new_tokens
            )
        scheduler.update(batch, {seq: 0 for s in batch.scheduled for seq in s.samplers})
        counters = getattr(scheduler.order, "counters", {})
        for client in ("flood", "alice", "bob"):
            service.setdefault(client, []).append(counters.get(client, 0.0))
    return waits, tokens, service


fcfs_waits, fcfs_tokens, _ = room("fcfs")
fair_waits, fair_tokens, service = room("fair")
names = list(fcfs_waits)
lines = [
    "| short request | " + " | ".join(names) + " |",
    "| --- |" + " --- |" * len(names),
]
lines += [
    f"| {label} | " + " | ".join(str(w[n]) for n in names) + " |"
    for label, w in (("fcfs", fcfs_waits), ("fair", fair_waits))
]
display(
    Markdown(
        "Steps each short request waited before its prompt ran:\n\n" + "\n".join(lines)
    )
)
display(
    BarChart(
        "the longest wait of a short request (steps)",
        ["fcfs", "fair"],
        {"steps": [max(fcfs_waits.values()), max(fair_waits.values())]},
        digits=0,
    )
)
print("tokens computed per client, fcfs:", fcfs_tokens)
print("tokens computed per client, fair:", fair_tokens)

# %% [markdown]
# Under first come first served, every short request waits for the flood ahead of it: the longer
# the flood, the longer the wait. Under fair queuing each one goes in at the next free row,
# ahead of the flood's requests that still wait, because alice and bob have been served far
# less. The flood is not refused and loses no row: every row the participants do not use is
# its, and it gets the same tokens in the end.
#
# ## The counters, step by step

# %%
display(
    LineChart(
        "each client's counter (tokens served, prompt 1, output 2)",
        list(range(len(service["flood"]))),
        service,
        x_label="step",
        y_label="weighted tokens",
        digits=0,
    )
)

# %% [markdown]
# The flood's counter climbs with its three rows; alice's and bob's jump to the flood's when they
# come (the lift: they start level with the least served active client, not at zero) and then
# grow only by their short requests. Without the lift, a client that was away for an hour would
# come back at its old counter, far below everyone, and take every free row until it caught up:
# fair over the whole day, unfair now. Here is the same room with a client, carol, who was served
# once at the start, then came back at step 60, with and without the lift.


# %%
class NoLift(fair.Fair):
    def lift(self, client: str) -> None:
        self.counters.setdefault(client, 0.0)


def carol_returns(order) -> list[str]:
    """Who got the rows the step after carol came back with 6 requests: the first 12 admissions."""
    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs=3, max_model_len=256, scheduling_policy=order),
        BlockManager(256, 4, enable_prefix_caching=False),
    )
    scheduler.add(job("carol-early", "carol", 8, 2))
    for i in range(60):  # enough to keep the three rows busy past step 60
        scheduler.add(job(f"flood{i}", "flood", 24, 8))
    admitted = []
    for step in range(300):
        if step == 60:
            for i in range(6):
                scheduler.add(job(f"carol{i}", "carol", 24, 8))
        batch = scheduler.schedule()
        admitted += [
            s.request.client
            for s in batch.scheduled
            if s.kind == "prefill" and step >= 60
        ]
        scheduler.update(batch, {seq: 0 for s in batch.scheduled for seq in s.samplers})
    return admitted[:12]


print("with the lift:   ", carol_returns(fair.Fair()))
print("without the lift:", carol_returns(NoLift()))

# %% [markdown]
# With the lift carol and the flood take turns; without it carol's six requests all go first.
#
# ## On a real server: an order cannot make a step cheaper
#
# `python -m minipaged.bench serve --workload room` sends 8 participants' 32 short streamed
# requests, alone and beside one client keeping 32 long chats in flight, to `python -m
# minipaged.serve` on three servers: fcfs with at most 4 sequences per client, more answered 429
# (the server's defaults when this ran; fair queuing with no bound is the default now), fcfs with
# no bound, and `--scheduling-policy fair`. Here is its committed run on a 2-core CPU.

# %%
result = json.loads(
    (RESULTS / "2026-12-03-cpu-2core-numpy-fair" / "room-1.json").read_text()
)
runs = {
    "alone": "alone (no flood)",
    "flood": "fcfs, bound 4",
    "flood_no_bound": "fcfs, no bound",
    "flood_fair": "fair queuing",
}
lines = [
    "| server | participants' median | x alone | flood 429s | flooder tok/s | of its tok/s on an idle server |",
    "| --- | --- | --- | --- | --- | --- |",
]
for name, label in runs.items():
    r, flood = result[name], result[name].get("flood")
    extra = (
        (
            f"{result[f'{name}_vs_alone_e2e_p50']:.2f}x | {flood['refused_429']} | {flood['tokens_per_s']:.1f} | "
            f"{result[f'{name}_flooder_share_of_idle']:.0%}"
        )
        if flood
        else " | | |"
    )
    lines.append(f"| {label} | {r['short_e2e_p50']:.2f} s | {extra} |")
display(Markdown("\n".join(lines)))
display(room_chart(result))

# %% [markdown]
# Fair queuing does what the unbounded server does: no refusals, the flooder keeps most of what
# an idle server gives it, and the participants' median grows as much. The default pool and batch
# hold all 32 chats and every participant at once, so nobody waits and there is no queue for an
# order to order. What the participants share is the step, and a CPU's step costs more the more
# rows it has: their 16 tokens take as long as the batch is wide. The bound keeps the batch narrow
# by refusing. Fair queuing pays where requests wait (a small pool, few rows, a flood larger than
# the batch), as above.
#
# ## A bound on the step's rows, which the order fills
#
# So the server bounds the step's width instead: `--max-decode-rows N`. While several clients'
# requests run, each client's first decodes and the others in the waiting order's rank, at most N
# rows in all; the rest keep their frames and sit the step out. Its default on a CPU is 12. The
# same room at several bounds, committed from a 2-core Xeon (`docs/14_fair_queuing.md`):

# %%
rows = json.loads(
    (RESULTS / "2026-12-05-cpu-2core-room-rows" / "sweep-2.json").read_text()
)
display(room_chart(rows))
bounded = [name for name in rows["runs"] if name.startswith("flood_rows_")][1:]
display(
    Markdown(
        f"With every row the participants take {rows['flood_rows_0_vs_alone_e2e_p50']:.1f}x"
        f" their time alone and the flooder keeps {rows['flood_rows_0_flooder_share_of_idle']:.0%}"
        " of its idle rate; bounded, "
        + "; ".join(
            f"{rows['runs'][name]}: {rows[f'{name}_vs_alone_e2e_p50']:.2f}x and"
            f" {rows[f'{name}_flooder_share_of_idle']:.0%}"
            for name in bounded
        )
        + "."
    )
)

# %% [markdown]
# The bound brings the participants back near their time alone, and the flooder pays while they
# run (alone it decodes every row). No bound meets both aims on a CPU whose step costs more the
# more rows it has.

# %% [markdown]
# ## Exercises

# %% [markdown]
# **Exercise 1.** VTC's weights make an output token cost twice a prompt token. Run the room above
# with an output weight of 1 (as much as a prompt token) and of 8, `fair.Fair(prompt_weight,
# output_weight)`: do the short requests' waits change, and why (or why not)?

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# for weights in ((1.0, 1.0), (1.0, 2.0), (1.0, 8.0)):
#     waits, _, _ = room(fair.Fair(*weights))
#     print(weights, "longest short wait:", max(waits.values()), "steps")
# # The waits barely move: alice and bob are served so much less than the flood that they win
# # under any weights. Weights matter between clients of similar service: one sending long
# # prompts and short answers against one sending short prompts and long answers.
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** Fair queuing is work conserving. Check it: run the room with the flood alone
# (no participants) under `"fcfs"` and `"fair"`, and compare the flood's tokens after 100 steps.

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# def flood_alone(order, steps=100):
#     scheduler = Scheduler(SchedulerConfig(max_num_seqs=3, max_model_len=256, scheduling_policy=order),
#                           BlockManager(256, 4, enable_prefix_caching=False))
#     for i in range(12):
#         scheduler.add(job(f"flood{i}", "flood", 24, 20))
#     tokens = 0
#     for _ in range(steps):
#         batch = scheduler.schedule()
#         tokens += batch.num_tokens
#         scheduler.update(batch, {seq: 0 for s in batch.scheduled for seq in s.samplers})
#     return tokens
#
#
# print("fcfs:", flood_alone("fcfs"), "fair:", flood_alone("fair"))
# # The same: with one client every counter comparison is a tie, ties go to the oldest, and
# # fair queuing admits exactly what first come first served does.
# ```
#
# </details>

# %% [markdown]
# ## Lab
#
# Now write it yourself (lab 10, [labs/README.md](../labs/README.md)). In a terminal, at the top of
# the repository, with the project's environment active (`source .venv/bin/activate`), copy the
# starter, fill in the bodies, and grade it:
#
# - **Lab 10** (about 25 minutes): fair queuing: the virtual token counter's waiting order.
#
#   ```
#   cp labs/lab10_fair_queuing.py my_fair.py
#   python -m minipaged.lab check 10 my_fair.py
#   ```
#
# The check names each property your code breaks, on an input that shows it. Once they all
# hold, it runs SmolLM2 with your code plugged in, next to the engine's own, and draws the
# lab's picture. Stuck? `python -m minipaged.lab hint 10` shows the next hint, one at a time, from the idea to the code.
