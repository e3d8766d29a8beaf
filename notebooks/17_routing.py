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
# # 17. Routing: locality-aware distribution and the directory
#
# **What you will see** (about 20 minutes):
# - three replicas of the engine in one process, each with its own prefix cache, and the KV
#   events one of them publishes when a conversation's blocks enter its cache (vLLM's
#   `BlockStored`, `BlockRemoved`, `AllBlocksCleared`);
# - a router's **directory** built from those events (Censier and Feautrier, 1978: which cache
#   holds which line), asked which replica holds the longest cached prefix of a prompt;
# - three routing rules written here, as a router writes them: round robin, consistent hashing
#   of a session id (Karger et al., 1997), and locality-aware request distribution (LARD, Pai et
#   al., 1998) on the directory; the same conversations through each, their prefix-cache hit
#   rate and the prompt tokens the replicas computed;
# - the directory drawn after each rule, and LARD's load thresholds moving a hot prompt;
# - vllm-router's `round_robin`, `cache_aware` and `kv_aware` in front of three real servers,
#   from the committed benchmark.

# %%
import bisect
import hashlib
import itertools
import json
from pathlib import Path

from IPython.display import Markdown, display

import minipaged
from minipaged import LLM, SamplingParams
from minipaged.tools.bench.route import chart as route_chart
from minipaged.tools.lab.directory_lab import (
    Cluster,
    Directory,
    DirectoryMap,
    conversations,
    converse,
)
from minipaged.tools.viz import BarChart

# the committed results (bench/results/ beside the package), wherever this runs from
RESULTS = Path(minipaged.__file__).resolve().parents[1] / "bench" / "results"

# %% [markdown]
# ## One laptop is not enough
#
# A room of thirty people outgrows one laptop; a service outgrows one GPU. The answer today is
# not a bigger engine but several **replicas** behind a **router**. Each replica has its own KV
# pool and its own prefix cache, and a conversation's next turn is cheap only where its last
# turn was served: there its history's K and V are cached, anywhere else they are computed
# again.
#
# Web servers met this in the 1990s. A cluster of back ends each had a file cache, and a front
# end spread the requests. Round robin spread the load well and the cache badly: every back end
# ended up caching every file, and each cache held only a slice of what it needed. Pai et
# al.'s **locality-aware request distribution** (LARD, ASPLOS 1998) sent each target (a file)
# to the back end that served it last, so each cache held its own share of the files, and moved
# a target only when that back end was overloaded. Karger et al.'s **consistent hashing** (STOC
# 1997) gave each key a place on a ring of servers, so that a server joining or leaving moves
# only the keys next to it.
#
# Here the replicas are three engines of SmolLM2 in this process (`Cluster`); a router in
# front of `python -m minipaged.serve` replicas does the same over HTTP.

# %%
llm = LLM(device="cpu")
cluster = Cluster(llm)
tokenizer = llm.tokenizer
systems, questions = conversations(tokenizer, 8)
print(f"{len(cluster.engines)} replicas, blocks of {cluster.block_size} tokens")
print(f"user 0's first turn: {tokenizer.decode(systems[0] + questions[0])!r}")

# %% [markdown]
# ## The page table, published
#
# To send a turn where its blocks are, the router must know where they are. Each replica's
# prefix cache tells its listeners when a full block gets a name (`stored`), when a cached
# block is dropped (`removed`) and when the cache is emptied (`cleared`); a replica started
# with `--kv-events-config` publishes them over ZMQ in vLLM's shape, and `Cluster` keeps them
# in a list per replica, in the same shape. User 0's first turn, run on replica 0:

# %%
params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
first_turn = systems[0] + questions[0]
engine = cluster.engines[0]
engine.add_request("u0", {"prompt_token_ids": first_turn}, params)
while engine.has_unfinished_requests():
    engine.step()
events = cluster.recorders[0].take()
for event in events:
    if event["type"] == "BlockStored":
        names = [f"{h:016x}"[:8] for h in event["block_hashes"]]
        print(f"BlockStored: {len(names)} blocks {names}")
        parent = event["parent_block_hash"]
        print(
            f"  parent {parent}, {len(event['token_ids'])} token ids,"
            f" block size {event['block_size']}"
        )
    else:
        print(event)

# %% [markdown]
# One `BlockStored` names a run of blocks: each block's name is a hash of its parent's name and
# its token ids, so a name stands for the whole prefix up to that block. The prompt's last
# tokens, which do not fill a block, have no name yet.
#
# ## The directory
#
# Censier and Feautrier (IEEE Transactions on Computers, 1978) kept the caches of a
# multiprocessor coherent with a **directory** beside memory: for each line, one presence bit
# per cache. A router keeps the same table for KV blocks: for each block, the replicas that hold
# it, kept up to date by their events. `Directory` (the piece lab 13 asks you to write) follows
# the names the events gave: it never computes a hash itself.

# %%
directory = Directory(len(cluster.engines), cluster.block_size)
directory.feed(0, events)
second_turn = first_turn + questions[1]  # user 0 back with another question
print(
    "blocks of user 0's next turn each replica holds:", directory.matches(second_turn)
)
print(
    "what the replicas' own prefix caches say:      ",
    cluster.cached_blocks(second_turn),
)
print("another user's first turn:", directory.matches(systems[1] + questions[0]))

# %% [markdown]
# ## Three routers
#
# A rule takes the user, the prompt's token ids and the replicas' loads (requests sent and not
# finished: what a router knows) and names a replica. Round robin knows nothing. Consistent
# hashing knows a session id: each replica sits at 64 points of a ring of hashes, and a
# session goes to the first point after its own hash (vllm-router's `consistent_hash` on a
# session header). LARD asks the directory.


# %%
def round_robin_rule():
    turn = itertools.count()

    def route(user, token_ids, loads):
        return next(turn) % 3

    return route


def ring_hash(text):
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


RING = sorted(
    (ring_hash(f"replica {r} point {p}"), r) for r in range(3) for p in range(64)
)


def consistent_hash(user, token_ids, loads):
    point = ring_hash(f"session {user}")
    i = bisect.bisect(RING, (point, 3)) % len(RING)
    return RING[i][1]


def lard_rule(directory):
    def route(user, token_ids, loads):
        return directory.route(token_ids, loads)

    return route


# %% [markdown]
# The workload: 8 users, each with a system prompt of its own (the same words, in an order of
# its own), 4 turns each; a turn is the conversation so far and a new question, answered in 4
# tokens. In each round every user sends its next turn, then the replicas run them. Every run
# starts on three fresh engines, and a directory listens to each so that we can draw it.

# %%
drawn = {
    name: Directory(3, cluster.block_size)
    for name in ("round robin", "consistent hash", "LARD")
}
routes = {
    "round robin": round_robin_rule(),
    "consistent hash": consistent_hash,
    "LARD": lard_rule(drawn["LARD"]),
}
served = {}
for name, route in routes.items():
    served[name] = converse(Cluster(llm), route, directory=drawn[name])

rows = ["| rule | prefix-cache hit rate | prompt tokens computed | users per replica |"]
rows.append("| --- | --- | --- | --- |")
for name, run in served.items():
    rows.append(
        f"| {name} | {run.hit_rate:.0%} | {run.computed:,} of {run.prompt_tokens:,}"
        f" | {run.users_per_replica()} |"
    )
display(Markdown("\n".join(rows)))

# %%
BarChart(
    "prompt tokens computed, 8 users x 4 turns on 3 replicas",
    list(served),
    {"computed": [run.computed for run in served.values()]},
    unit=" tokens",
    digits=0,
)

# %% [markdown]
# Round robin sends user 0's turns to replicas 0, 2, 1 and 0: only its fourth turn finds some
# of its history (its first turn's), and every replica ends up caching a slice of every
# conversation. Consistent hashing and LARD keep each conversation on one replica, and every
# turn after the first finds its history cached; what is left to compute is the new question
# and the end of the last turn that did not fill a block.
#
# The directory after each rule: one row per conversation, one cell per block of it in order,
# coloured by the replica that holds it.

# %%
histories = {f"user {u}": ids for u, ids in served["LARD"].history.items()}
DirectoryMap(drawn["round robin"], histories, "after round robin")

# %%
DirectoryMap(drawn["LARD"], histories, "after LARD")

# %% [markdown]
# Consistent hashing keeps each session on one replica without a directory, and on this
# workload does as well as LARD. But the ring knows neither the load nor the caches: where it
# puts a session is chance, and eight sessions can crowd one replica (in the team's run of
# vllm-router's `consistent_hash` on a session header, 5 of 8 users shared one replica), and a
# system prompt shared by many sessions is cached on every replica their hashes reach. LARD's
# other half is the load: a target stays where it is cached until its replica is over `high`
# while another is under `low`, or at twice `high`.
#
# ## A hot prompt
#
# Ten requests for the same conversation arrive together (a shared system prompt, a demo
# everyone runs at once). The directory says replica 0 holds it; LARD keeps the requests there
# until the thresholds say that replica is overloaded.

# %%
hot = Directory(3, cluster.block_size, low=2, high=4)
hot.feed(0, events)
loads = [0, 0, 0]
sent = []
for _ in range(10):
    replica = hot.route(second_turn, loads)
    loads[replica] += 1
    sent.append(replica)
print("sent to:", sent)
print("loads:  ", loads)

# %% [markdown]
# The first ones stay on replica 0, which holds the blocks: at a load of `high`, LARD still
# prefers the cache to an idle replica. Once replica 0 is over `high`, the next go to the least
# loaded while it is under `low` (each computes the prefix once, then caches it too); when every
# other replica has reached `low`, replica 0 takes them again, up to twice `high`.
#
# ## Today's routers
#
# - **SGLang's router** (`sglang-router`, its `cache_aware` policy) keeps one radix tree of
#   token text per worker, updated from the requests it sent there (not from the workers' own
#   events), and sends a request to the worker with the longest match when the match rate is
#   over `cache_threshold`, else to the worker with the smallest tree; when the loads differ by
#   more than `balance_abs_threshold` and `balance_rel_threshold`, it sends to the least loaded,
#   LARD's thresholds.
# - **vllm-router**, vLLM's production router, has `round_robin`, `power_of_two`,
#   `cache_aware` (SGLang's tree), `consistent_hash` and `kv_aware`: a directory fed by the
#   workers' KV events over ZMQ, exactly this notebook's. minipaged's server publishes them
#   (`--kv-events-config`, `GET /kv_event_sources`).
# - **llm-d**'s precise prefix-cache scorer does the same for Kubernetes: an index of block
#   hashes per pod, fed by vLLM's KV events, scoring each pod by its longest cached prefix.
#
# ## On real servers
#
# The experiment of the meeting runs the same question on real servers: three `python -m
# minipaged.serve` replicas, each publishing its KV events, behind vllm-router from PyPI,
# `python -m minipaged.bench route --replicas 3 --router vllm-router --policies round_robin
# cache_aware kv_aware`; 8 users of 4 turns, each with a system prompt of about 270 tokens, and
# a last run with every conversation on one replica and no router, the hit rate no routing can
# pass. Here is its committed run on a 2-core CPU.

# %%
result = json.loads((RESULTS / "2026-12-03-cpu-2core-route" / "route.json").read_text())
runs = {**result["policies"], "one replica (ceiling)": result["ceiling"]}
rows = [
    "| policy | hit rate | prompt tokens computed | later turns' TTFT (p50) | users per replica |",
    "| --- | --- | --- | --- | --- |",
]
for name, run in runs.items():
    rows.append(
        f"| {name} | {run['hit_rate']:.3f} | {run['computed_tokens']:,} of"
        f" {run['prompt_tokens']:,} | {run['ttft_later_p50_ms'] / 1000:.1f} s |"
        f" {run['users_per_replica']} |"
    )
display(Markdown("\n".join(rows)))
route_chart(result)

# %% [markdown]
# `cache_aware` (the router's own tree of the prompts it sent) and `kv_aware` (the directory of
# this notebook, fed by the replicas' events) both reach the ceiling; round robin spreads each
# user over several replicas (users per replica counts each user on every replica it reached).

# %% [markdown]
# ## Exercises

# %% [markdown]
# **Exercise 1.** Consistent hashing's ring moves few sessions when a replica leaves. Build the
# ring without replica 2 and count the users whose replica changes; then do the same for the
# rule `user % 3` against `user % 2`.

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# two = sorted((ring_hash(f"replica {r} point {p}"), r) for r in range(2) for p in range(64))
# def on(ring, user):
#     return ring[bisect.bisect(ring, (ring_hash(f"session {user}"), 3)) % len(ring)][1]
# users = range(1000)
# moved_ring = sum(on(RING, u) != on(two, u) for u in users)
# moved_mod = sum(u % 3 != u % 2 for u in users)
# print(f"ring: {moved_ring} of 1000 sessions move, modulo: {moved_mod} of 1000")
# # Only the sessions that sat on replica 2 move (about a third); with the modulo rule most
# # sessions change replica, and each loses its cached history.
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** A replica restarts and its cache is empty: feed the LARD directory an
# `AllBlocksCleared` from replica 0 and ask where user 0's next turn goes now, and how many
# blocks each replica holds of it.

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# d = drawn["LARD"]
# nxt = served["LARD"].history[0] + questions[0]
# print("before:", d.matches(nxt), "->", d.route(nxt, [0, 0, 0]))
# d.feed(0, [{"type": "AllBlocksCleared"}])
# print("after: ", d.matches(nxt), "->", d.route(nxt, [0, 0, 0]))
# # Nobody holds it any more: LARD sends it to the least loaded replica (the first of equals),
# # which computes the whole history once and caches it there.
# ```
#
# </details>

# %% [markdown]
# **Exercise 3.** Make LARD eager to balance: route the ten hot requests again with `low=1`
# and `high=1`, then with `low=4` and `high=8`. How many replicas compute the hot prefix in
# each case?

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# for low, high in ((1, 1), (4, 8)):
#     d = Directory(3, cluster.block_size, low=low, high=high)
#     d.feed(0, events)
#     loads = [0, 0, 0]
#     for _ in range(10):
#         loads[d.route(second_turn, loads)] += 1
#     print(f"low {low}, high {high}: loads {loads}")
# # With high 1 the ten spread almost evenly: all three replicas compute the prefix. With high
# # 8, nine stay on replica 0 and the tenth goes to replica 1: two compute it, the third
# # idles. The thresholds trade the cache's hits against the replicas' queues.
# ```
#
# </details>

# %% [markdown]
# ## Lab
#
# Now write it yourself (lab 13, [labs/README.md](../labs/README.md)). In a terminal, at the top of
# the repository, with the project's environment active (`source .venv/bin/activate`), copy the
# starter, fill in the bodies, and grade it:
#
# - **Lab 13** (about 30 minutes): the router's directory: which replica holds which block, from their KV events, and LARD's route.
#
#   ```
#   cp labs/lab13_directory.py my_directory.py
#   python -m minipaged.lab check 13 my_directory.py
#   ```
#
# The check names each property your code breaks, on an input that shows it. Once they all
# hold, it runs SmolLM2 with your code plugged in, next to the engine's own, and draws the
# lab's picture. Stuck? `python -m minipaged.lab hint 13` shows the next hint, one at a time, from the idea to the code.
