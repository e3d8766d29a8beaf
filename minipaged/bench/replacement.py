"""Page replacement for the prefix cache: hit rate against pool size, each policy beside MIN.

No model runs: a multi-turn chat trace is replayed through real block managers (allocate the
prompt, append the answer, free), once per policy and pool size. Belady's MIN, which reads the
trace's future, bounds what any policy can hit; a search shows FIFO's anomaly (Belady 1969).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass

from minipaged.bench.workload import ChatTurn, chat_trace
from minipaged.paging import REPLACEMENT_POLICIES, BlockManager, block_hash, make_policy

POLICY_NAMES = tuple(REPLACEMENT_POLICIES)  # lru, fifo, clock, random


class Belady:
    """MIN (Belady 1966): give up the parked block whose next use lies furthest in the future
    (one never used again first). Optimal, and impossible online: it reads the trace ahead.
    `uses` maps each block hash to the times a prompt looks it up; `now` is set by the replay
    to the first lookup time of the next request (uses before it are past)."""
    name = "min"

    def __init__(self, uses: dict[int, list[int]]):
        self.uses, self.block_of, self.now = uses, {}, 0

    def entered(self, frame: int, block: int) -> None:
        self.block_of[frame] = block

    def parked(self, frame: int) -> None: pass

    def left(self, frame: int) -> None:
        del self.block_of[frame]

    def next_use(self, frame: int) -> float:
        times = self.uses.get(self.block_of[frame], [])
        i = bisect_left(times, self.now)
        return times[i] if i < len(times) else math.inf

    def victim(self, parked) -> int:
        return max(parked, key=self.next_use)  # the first of equals: the least recently used


class Scripted:
    """Evicts by a script of choices (index into the parked frames, sorted), 0 past its end, and
    records how many candidates each decision had: the brute force walks every script."""
    name = "scripted"

    def __init__(self, choices: list[int]):
        self.choices, self.made, self.options = choices, [], []

    def entered(self, frame: int, block: int) -> None: pass
    def parked(self, frame: int) -> None: pass
    def left(self, frame: int) -> None: pass

    def victim(self, parked) -> int:
        k = len(self.made)
        choice = self.choices[k] if k < len(self.choices) else 0
        self.made.append(choice)
        self.options.append(len(parked))
        return sorted(parked)[choice]


@dataclass(slots=True)
class Replay:
    """What one policy hit on one trace and pool: prompt blocks looked up and found."""
    lookups: int = 0
    hits: int = 0
    block_size: int = 16

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def saved_tokens(self) -> int:
        """Prefill tokens not computed: the hit blocks' tokens."""
        return self.hits * self.block_size


def lookups(trace: list[ChatTurn], block_size: int) -> list[list[int]]:
    """Per request, the hashes of the blocks its prompt looks up, in order (the full blocks of
    all but its last token: the last is always computed, the model needs its logits)."""
    per_request = []
    for turn in trace:
        prev, hashes = None, []
        for start in range(0, len(turn.prompt) - block_size, block_size):
            prev = block_hash(prev, turn.prompt[start:start + block_size])
            hashes.append(prev)
        per_request.append(hashes)
    return per_request


def belady(trace: list[ChatTurn], block_size: int) -> Belady:
    """MIN for this trace: every block's lookup times, numbered across the whole trace."""
    uses: dict[int, list[int]] = {}
    t = 0
    for hashes in lookups(trace, block_size):
        for h in hashes:
            uses.setdefault(h, []).append(t)
            t += 1
    return Belady(uses)


def replay(trace: list[ChatTurn], num_blocks: int, block_size: int = 16, policy="lru",
           concurrency: int = 4) -> Replay:
    """Serve the trace in order with `concurrency` requests in memory at once (the oldest is
    freed when the next arrives): allocate its prompt (prefix hits reused), append its answer.
    The same frees happen whatever the policy, so only the replacement decisions differ."""
    policy = belady(trace, block_size) if policy == "min" else make_policy(policy)
    manager = BlockManager(num_blocks, block_size, enable_prefix_caching=True, prefix_cache_policy=policy)
    result, live, starts = Replay(block_size=block_size), deque(), [0]
    for hashes in lookups(trace, block_size):
        starts.append(starts[-1] + len(hashes))
    for i, turn in enumerate(trace):
        if len(live) == concurrency:
            manager.free(live.popleft())
        if isinstance(policy, Belady):
            policy.now = starts[i + 1]  # this request's own lookups are done before any eviction
        result.hits += manager.allocate(i, turn.prompt) // block_size
        result.lookups += (len(turn.prompt) - 1) // block_size
        for token in turn.answer:
            manager.append_slot(i, token)
        live.append(i)
    return result


def min_pool(trace: list[ChatTurn], block_size: int = 16, concurrency: int = 4) -> int:
    """The fewest frames that hold the live requests with no sharing at all: any policy replays
    the trace in this pool without running out (a policy only changes what is shared)."""
    need = lambda t: -(-(len(t.prompt) + len(t.answer)) // block_size)
    return max(sum(need(t) for t in trace[max(0, i - concurrency + 1):i + 1]) for i in range(len(trace)))


def brute_force_best(trace: list[ChatTurn], num_blocks: int, block_size: int, concurrency: int,
                     max_runs: int = 20000) -> int:
    """The most hits any sequence of eviction choices gets (every choice at every eviction
    tried): the exact optimum MIN claims to reach. Small traces only (max_runs replays)."""
    best, stack, runs = 0, [[]], 0
    while stack:
        policy = Scripted(stack.pop())
        best = max(best, replay(trace, num_blocks, block_size, policy, concurrency).hits)
        runs += 1
        if runs > max_runs:
            raise ValueError(f"more than {max_runs} eviction scripts: use a smaller trace")
        for k in range(len(policy.choices), len(policy.made)):  # the decisions taken by default
            stack += [policy.made[:k] + [c] for c in range(1, policy.options[k])]
    return best


def page_trace(pages: list[int], block_size: int = 2) -> list[ChatTurn]:
    """A classic reference string as requests: page p is a one-block prompt of p's tokens (plus
    a last token, always computed), no answer. Served one at a time, a pool of k + 1 frames
    caches k pages (the last token's frame is the one more)."""
    return [ChatTurn(i, [p] * block_size + [0], []) for i, p in enumerate(pages)]


CLASSIC_ANOMALY = [1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5]  # Belady, Nelson and Shedler (1969)


def fifo_anomalies(seeds: int = 200, block_size: int = 4) -> list[dict]:
    """Belady's anomaly searched systematically on small chat traces: for each seed, FIFO at
    every pool size from the floor up; an anomaly is a pool with more frames and fewer hits."""
    found = []
    for seed in range(seeds):
        trace = chat_trace(num_conversations=4, turns=3, num_system_prompts=2, system_len=8, question_mean=4,
                           answer_mean=4, active=2, seed=seed)
        floor = min_pool(trace, block_size, concurrency=1)
        hits = [replay(trace, n, block_size, "fifo", concurrency=1).hits for n in range(floor, floor + 16)]
        found += [{"seed": seed, "frames": floor + i, "hits": hits[i], "frames_more": floor + i + 1,
                   "hits_more": hits[i + 1]} for i in range(len(hits) - 1) if hits[i + 1] < hits[i]]
    return found


def sweep(trace: list[ChatTurn], pools: list[int], block_size: int, concurrency: int,
          policies=POLICY_NAMES + ("min",)) -> dict:
    """Hit rate and prefill tokens saved of each policy at each pool size."""
    out = {}
    for name in policies:
        runs = [replay(trace, n, block_size, name, concurrency) for n in pools]
        out[name] = {"hit_rate": [r.hit_rate for r in runs], "saved_tokens": [r.saved_tokens for r in runs],
                     "hits": [r.hits for r in runs]}
    return out


def pool_sizes(trace: list[ChatTurn], block_size: int, concurrency: int, points: int) -> list[int]:
    """From the floor (live requests only, nothing kept) to a pool that caches every block."""
    floor = min_pool(trace, block_size, concurrency)
    distinct = len({h for hashes in lookups(trace, block_size) for h in hashes})
    top = floor + distinct
    return sorted({round(floor + (top - floor) * i / (points - 1)) for i in range(points)})


def bench_replacement(args) -> dict:
    """A multi-turn chat trace with shared system prompts replayed through the block managers
    (no model) at each pool size, once per replacement policy and once with MIN."""
    trace = chat_trace(args.conversations, args.turns, seed=args.seed)
    pools = pool_sizes(trace, args.block_size, args.concurrency, args.points)
    curves = sweep(trace, pools, args.block_size, args.concurrency)
    classic = {n - 1: replay(page_trace(CLASSIC_ANOMALY), n, 2, "fifo", 1).lookups
               - replay(page_trace(CLASSIC_ANOMALY), n, 2, "fifo", 1).hits for n in (4, 5)}
    anomalies = fifo_anomalies(args.anomaly_seeds)
    result = {"trace": {"conversations": args.conversations, "turns": args.turns, "requests": len(trace),
                        "system_prompts": 3, "block_size": args.block_size, "concurrency": args.concurrency,
                        "seed": args.seed, "prompt_blocks_looked_up": replay(trace, pools[-1], args.block_size,
                                                                              "lru", args.concurrency).lookups},
              "pool_frames": pools, "policies": curves,
              "belady_anomaly": {"classic_string": CLASSIC_ANOMALY, "fifo_faults_by_cached_pages": classic,
                                 "chat_traces_searched": args.anomaly_seeds, "chat_traces_found": anomalies[:5],
                                 "chat_anomalies_total": len(anomalies)}}
    if not args.json:
        print(text_table(result))
    return result


def text_table(result: dict) -> str:
    """Hit rate (%) by pool size, a column per policy."""
    names = list(result["policies"])
    lines = ["frames  " + "  ".join(f"{n:>6}" for n in names)]
    for i, pool in enumerate(result["pool_frames"]):
        lines.append(f"{pool:>6}  " + "  ".join(f"{100 * result['policies'][n]['hit_rate'][i]:6.1f}" for n in names))
    faults = result["belady_anomaly"]["fifo_faults_by_cached_pages"]
    lines.append(f"FIFO on {result['belady_anomaly']['classic_string']}: "
                 + ", ".join(f"{k} pages -> {v} faults" for k, v in faults.items()))
    lines.append(f"FIFO anomalies on {result['belady_anomaly']['chat_traces_searched']} small chat traces: "
                 f"{result['belady_anomaly']['chat_anomalies_total']}")
    return "\n".join(lines)


def add_arguments(p) -> None:
    p.add_argument("--conversations", type=int, default=32, help="conversations in the trace (default 32)")
    p.add_argument("--turns", type=int, default=4, help="turns per conversation (default 4)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    p.add_argument("--concurrency", type=int, default=4, help="requests in memory at once (default 4)")
    p.add_argument("--points", type=int, default=12, help="pool sizes swept (default 12)")
    p.add_argument("--seed", type=int, default=0, help="the trace's seed (default 0)")
    p.add_argument("--anomaly-seeds", type=int, default=200,
                   help="small chat traces searched for FIFO's anomaly (default 200)")
