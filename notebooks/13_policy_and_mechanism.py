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
# # 13. The separation of policy and mechanism
#
# **What you will see** (about 15 minutes):
# - the seams of minipaged, printed from their registry (`minipaged.policies.SEAMS`): each option
#   a policy plugs into, and the policies that ship with it; the three defaults of the scheduler,
#   whole, a few lines each;
# - the lines of the core that ask a policy, and nothing more: the core is mechanism (queues,
#   frames, the step), as Brinch Hansen's RC 4000 nucleus (1970) and Hydra (1974) kept theirs;
# - the same waiting requests admitted under `"fcfs"`, `"sjf"` and a policy written here,
#   longest job first, plugged in as an object with no base class;
# - what that policy does under load, in the simulator with the real Scheduler at the vLLM
#   paper's scale: the short requests' latency and the longest wait;
# - what the core lost: the size of `engine.py`, `scheduler.py` and `runner.py` beside the
#   policies' files.

# %%
import inspect
import itertools
import re
from pathlib import Path

from IPython.display import Markdown, display

import minipaged
from minipaged import SamplingParams, policies
from minipaged.paging import BlockManager
from minipaged.policies import defaults
from minipaged.scheduler import Request, Scheduler, SchedulerConfig, Sequence
from minipaged.tools.bench.scheduling import PrioritySimulator, latency_by_size
from minipaged.tools.bench.simulate import PROFILES, poisson_trace, trace_specs
from minipaged.tools.bench.workload import RequestSpec
from minipaged.tools.viz import BarChart

for option, table in policies.SEAMS.items():
    print(f"{option:>19}: {', '.join(table)}")

# %% [markdown]
# ## A nucleus of mechanisms, and seams for policy
#
# The RC 4000's nucleus gave processes and messages, and decided nothing: which process runs,
# how memory is shared out, were the business of the operating systems built on it. Hydra made
# it a principle, the separation of policy and mechanism: the kernel provides mechanisms, and
# policy modules outside it decide, through a narrow interface.
#
# In minipaged the core (`engine.py`, `scheduler.py`, `runner.py`) keeps the queues, the frames,
# the page tables and the step. Every decision an idea of the series changes is asked of a
# policy on a named seam: the option above, which takes a name from its table, an object, or a
# `"module:Class"` path. Three seams are not in this registry because each is a whole
# component: speculation (`speculative_config`, `minipaged/speculative/`), the host tier
# (`kv_offload_frames`, `minipaged/paging/tier.py`) and the KV storage (`kv_cache_dtype`, a
# codec of `minipaged/attention/codecs.py`).
#
# A policy is a few lines. Here are the scheduler's three defaults, the whole file: first come
# first served, admit what fits now, preempt the newest.

# %%
print(inspect.getsource(defaults))

# %% [markdown]
# No base class: a waiting order is any object with `pick(waiting, now)` and `uses_priority`
# (does it read a request's `priority=`?); an admission has `growth`, a victim `choose`
# (`minipaged/policies/protocols.py` states each as a `Protocol`). And here is everywhere the
# core asks them, read from its files: each line a question put to a seam (`lookahead` is
# speculation's, `batching` the continuous or static batcher's).

# %%
CORE = [
    Path(minipaged.__file__).parent / name
    for name in ("engine.py", "scheduler.py", "runner.py")
]
asks = re.compile(r"self\.(order|admission|victim|batching|lookahead)\.\w+")
for path in CORE:
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if asks.search(line):
            print(f"{path.name}:{number}: {line.strip()}")

# %% [markdown]
# ## The core asks, the policy answers
#
# Longest job first, the opposite of meeting 11's shortest job first: the waiting request with
# the most prompt plus `max_tokens` tokens goes next. Four lines, plugged in as an object through
# `SchedulerConfig(scheduling_policy=LongestFirst())` (or `LLM(scheduling_policy=LongestFirst())`,
# the same option).
#
# One seat, held by a request that is already running; three jobs wait behind it, arriving in
# the order written: a question, a summary, a chat turn. The scheduler runs without a model
# (a dummy token for every row, as in the simulator); who does it admit, in which order?


# %%
class LongestFirst:
    uses_priority = False

    def pick(self, waiting, now):
        return max(waiting, key=lambda r: len(r.prompt_token_ids) + r.params.max_tokens)


seq_ids = itertools.count()


def job(name: str, prompt_len: int, max_tokens: int) -> Request:
    prompt = [3] * prompt_len
    return Request(
        name,
        None,
        prompt,
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        [Sequence(next(seq_ids), list(prompt), prompt_len)],
    )


def dummy_tokens(batch) -> dict:
    return {seq: 0 for s in batch.scheduled for seq in s.samplers}


def admitted(order, jobs: dict) -> list[str]:
    """`jobs` (name -> prompt tokens, max_tokens) wait behind one running request, one seat:
    the names in the order the scheduler admits them under the waiting order `order`."""
    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs=1, max_model_len=256, scheduling_policy=order),
        BlockManager(64, 4, enable_prefix_caching=False),
    )
    scheduler.add(job("running", 4, 2))
    first = scheduler.schedule()
    scheduler.update(first, dummy_tokens(first))
    for name, (prompt_len, max_tokens) in jobs.items():
        scheduler.add(job(name, prompt_len, max_tokens))
    names = []
    while scheduler.has_unfinished():
        batch = scheduler.schedule()
        names += [s.request.request_id for s in batch.scheduled if s.kind == "prefill"]
        scheduler.update(batch, dummy_tokens(batch))
    return names


jobs = {"question": (16, 8), "summary": (40, 16), "chat": (8, 4)}
print("sizes (prompt + max_tokens):", {name: p + m for name, (p, m) in jobs.items()})
for label, order in (
    ("fcfs", "fcfs"),
    ("sjf", "sjf"),
    ("LongestFirst", LongestFirst()),
):
    print(f"{label:>12}: {admitted(order, jobs)}")

# %% [markdown]
# The scheduler did not change: the same `_admit` loop asked `self.order.pick(self.waiting,
# self.steps)` each time, and each policy answered. The running request kept its seat until it
# finished; only then did each order choose, and the seat went to one waiting job at a time.
#
# ## Measured, on the simulator
#
# The simulator drives the real Scheduler on a virtual clock, each step timed by a step-time
# model: here OPT-13B on an A100 (profile `opt-13b-a100`, notebook 7), 200 ShareGPT-like
# requests arriving at 6 per second, past the knee, so a queue forms. The same trace under first
# come first served, shortest job first, and the policy above: the latency of the shortest
# quarter of requests (by prompt plus output tokens), and the longest any request waited before
# it first ran. This is the run of `python -m minipaged.bench scheduling --engine no
# --sim-requests 200 --policies fcfs sjf my_orders:LongestFirst`.

# %%
specs = trace_specs("sharegpt", 200, seed=0)
trace = poisson_trace(specs, 6.0, 0)


def serve(order) -> dict:
    """The trace under one waiting order: latency_by_size's row (quarters by prompt + output tokens)."""
    r = PrioritySimulator(
        PROFILES["opt-13b-a100"],
        "paged",
        None,
        scheduler_options={"scheduling_policy": order},
    ).run(trace)
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
    "fcfs": serve("fcfs"),
    "sjf": serve("sjf"),
    "LongestFirst": serve(LongestFirst()),
}
lines = [
    "| waiting order | short p50 | short p99 | long p50 | longest wait | preemptions |",
    "| --- | --- | --- | --- | --- | --- |",
]
lines += [
    f"| {name} | {r['short_p50']:.2f} s | {r['short_p99']:.2f} s | {r['long_p50']:.2f} s | "
    f"{r['max_wait']:.2f} s | {r['preemptions']} |"
    for name, r in rows.items()
]
display(Markdown("\n".join(lines)))
display(
    BarChart(
        "shortest quarter's p99 e2e latency (simulated, opt-13b-a100)",
        list(rows),
        {"short p99": [r["short_p99"] for r in rows.values()]},
        unit=" s",
        digits=1,
    )
)
display(
    BarChart(
        "longest wait before running (simulated, opt-13b-a100)",
        list(rows),
        {"longest wait": [r["max_wait"] for r in rows.values()]},
        unit=" s",
        digits=1,
    )
)
fcfs, longest = rows["fcfs"], rows["LongestFirst"]
display(
    Markdown(
        f"Longest first multiplies the short quarter's p99 by {longest['short_p99'] / fcfs['short_p99']:.1f} "
        f"and the longest wait by {longest['max_wait'] / fcfs['max_wait']:.1f} against first come, "
        "first served."
    )
)

# %% [markdown]
# The long jobs go first, so a short one that arrives behind them waits for all of them: its
# tail and the longest wait grow. SJF goes the other way for the short requests, whose tail
# drops, and makes the long ones pay with a longer wait. A bad policy, on purpose, and it took
# no change to the core: the mechanism serves whatever order it is given, and the comparison is
# one more name on the command line.
#
# ## What the core lost
#
# Moving every decision out of the core left it mechanism only. The line counts of the three
# core files, beside the files of the policies they ask:

# %%
policy_files = sorted((Path(minipaged.__file__).parent / "policies").glob("*.py"))
counts = {f"minipaged/{p.name}": len(p.read_text().splitlines()) for p in CORE}
table = ["| file | lines |", "| --- | --- |"]
table += [f"| `{name}` | {n} |" for name, n in counts.items()]
table += [f"| the core, together | {sum(counts.values())} |"]
table += [
    f"| `minipaged/policies/{p.name}` | {len(p.read_text().splitlines())} |"
    for p in policy_files
]
display(Markdown("\n".join(table)))

# %% [markdown]
# `tests/test_architecture.py` holds the core to this: a budget of lines for the three files
# together, a budget for the functions `LLMEngine.step` reaches through them, and a check that
# no idea of the series is named in them outside their option lists (no `sjf`, no `lru`, no
# `draft`, no `"priority"`). An idea that needs the core to grow goes onto a seam instead.
#
# The price of the separation: options that combine badly can no longer be refused where each
# is used. They are checked in one function, `minipaged.policies.check_options`, and each
# refusal names both options.

# %%
try:
    SchedulerConfig(batching="static", chunked_prefill=True)
except ValueError as refused:
    print(refused)

# %% [markdown]
# ## Exercises

# %% [markdown]
# **Exercise 1.** A victim of one's own: `class Oldest` whose `choose(candidates)` returns
# `candidates[0]` (the request that must grow, the oldest of those not yet scheduled this step),
# plugged in with `preemption_victim=`. Three requests of 4 prompt tokens and `max_tokens=24`
# arrive 8 steps apart in a pool of 12 frames of 4 tokens: under the default victim and under
# `Oldest`, who is preempted, and how many tokens are computed again?

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# class Oldest:
#     def choose(self, candidates):
#         return candidates[0]
#
#
# def preempted(victim):
#     scheduler = Scheduler(SchedulerConfig(max_num_seqs=4, max_model_len=64, preemption_victim=victim),
#                           BlockManager(12, 4, enable_prefix_caching=False))
#     victims, recomputed, step = [], 0, 0
#     while step <= 16 or scheduler.has_unfinished():
#         if step % 8 == 0 and step <= 16:
#             scheduler.add(job("abc"[step // 8], 4, 24))  # a at step 0, b at 8, c at 16
#         batch = scheduler.schedule()
#         recomputed += sum(s.num_new_tokens for s in batch.scheduled
#                           if s.kind == "prefill" and s.request.request_id in victims)
#         victims += [rid for rid, _ in batch.preempted]
#         scheduler.update(batch, dummy_tokens(batch))
#         step += 1
#     return victims, recomputed
#
#
# for label, victim in (("newest (default)", None), ("Oldest", Oldest())):
#     victims, recomputed = preempted(victim)
#     print(f"{label:>16}: preempted {victims}, {recomputed} tokens computed again")
# # The oldest has generated the most tokens: preempting it by recompute throws away the most
# # work (its prompt and all it generated are computed again), and the pool is no emptier for
# # long, so the newest is preempted next anyway. The default, like vLLM, preempts the newest.
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** Write a waiting order that serves the request with the longest *prompt* first
# (whatever its `max_tokens`), and compare it with `LongestFirst` on the jobs above plus an
# essay: a prompt of 12 tokens and `max_tokens=60`.

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# class LongestPrompt:
#     uses_priority = False
#
#     def pick(self, waiting, now):
#         return max(waiting, key=lambda r: len(r.prompt_token_ids))
#
#
# more = jobs | {"essay": (12, 60)}
# for label, order in (("LongestFirst", LongestFirst()), ("LongestPrompt", LongestPrompt())):
#     print(f"{label:>13}: {admitted(order, more)}")
# # The essay is the biggest job (72 tokens) but has a short prompt: LongestFirst takes it
# # first, LongestPrompt after the summary and the question. The prompt is all a server knows
# # for sure; max_tokens is only a bound on the answer.
# ```
#
# </details>

# %% [markdown]
# **Exercise 3.** The server and the benchmark take a policy by its path, `module:Class`
# (`python -m minipaged.serve --scheduling-policy my_orders:LongestFirst`). Save `LongestFirst`
# as `my_orders.py` in a temporary folder, put the folder on `sys.path`, and plug the class in
# by its path: check that `policies.make` builds it and that it admits the jobs as the object did.

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# import sys
# import tempfile
#
# folder = Path(tempfile.mkdtemp())
# (folder / "my_orders.py").write_text(
#     "class LongestFirst:\n"
#     "    uses_priority = False\n"
#     "\n"
#     "    def pick(self, waiting, now):\n"
#     "        return max(waiting, key=lambda r: len(r.prompt_token_ids) + r.params.max_tokens)\n")
# sys.path.insert(0, str(folder))
# built = policies.make("scheduling_policy", "my_orders:LongestFirst")
# print(type(built).__module__, type(built).__name__)
# assert admitted("my_orders:LongestFirst", jobs) == admitted(LongestFirst(), jobs)
# print(admitted("my_orders:LongestFirst", jobs))
# ```
#
# </details>
