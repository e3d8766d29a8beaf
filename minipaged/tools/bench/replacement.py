"""`python -m minipaged.bench replacement`: page replacement for the prefix cache, each
policy beside MIN.

No model runs: a multi-turn chat trace is replayed through real block managers
(allocate, append the answer, free) per policy and pool size. Belady's MIN reads the
trace's future and bounds every policy (a brute force over eviction scripts checks it);
a search looks for FIFO's anomaly.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass

from tqdm import tqdm

from minipaged.llm import number
from minipaged.paging import REPLACEMENT_POLICIES, BlockManager, block_hash, make_policy
from minipaged.tools.bench.workload import ChatTurn, chat_trace
from minipaged.tools.viz import LineChart

POLICY_NAMES = tuple(REPLACEMENT_POLICIES)  # lru, fifo, clock, random
# apps of the chat trace, each with its own system prompt (the first most used)
SYSTEM_PROMPTS = 3


class Offline:
    """A policy that reads the trace: the replay tells it which request is being served
    (`at`) before that request's prompt is allocated. Its own lookups are done by then:
    every eviction during request i happens after i's prefix hits were taken."""

    def entered(self, frame: int, block: int) -> None:
        self.block_of[frame] = block

    def parked(self, frame: int) -> None:
        pass

    def left(self, frame: int) -> None:
        del self.block_of[frame]

    def at(self, request: int) -> None:
        raise NotImplementedError


class Belady(Offline):
    """MIN (Belady 1966): give up the parked block whose next use lies furthest in the
    future (one never used again first). Optimal, and impossible online: it reads the
    trace ahead. `uses` maps each block hash to the times a prompt looks it up, `starts`
    each request to the time of its first lookup; uses before `now` (the next request's
    first lookup) are past.
    """

    name = "min"

    def __init__(self, uses: dict[int, list[int]], starts: list[int]):
        self.uses, self.starts, self.block_of, self.now = uses, starts, {}, 0

    def at(self, request: int) -> None:
        self.now = self.starts[request + 1]

    def next_use(self, frame: int) -> float:
        times = self.uses.get(self.block_of[frame], [])
        i = bisect_left(times, self.now)
        return times[i] if i < len(times) else math.inf

    def victim(self, parked) -> int:
        # the first of equals: the least recently used
        return max(parked, key=self.next_use)


class Scripted(Offline):
    """Evicts by a script of choices, 0 past its end, and records how many candidates
    each decision had: the brute force walks every script. The candidates are the parked
    frames whose block some later prompt looks up (sorted), then one frame of those no
    later prompt looks up: which dead block goes is all the same (it is never hit
    again). `alive[i]` is the set of blocks that prompts after request i look up."""

    name = "scripted"

    def __init__(self, choices: list[int], alive: list[set[int]]):
        self.choices, self.alive, self.made, self.options = choices, alive, [], []
        self.block_of, self.later = {}, set()

    def at(self, request: int) -> None:
        self.later = self.alive[request]

    def victim(self, parked) -> int:
        live = sorted(f for f in parked if self.block_of[f] in self.later)
        dead = [f for f in parked if self.block_of[f] not in self.later]
        candidates = live + dead[:1]
        k = len(self.made)
        choice = self.choices[k] if k < len(self.choices) else 0
        self.made.append(choice)
        self.options.append(len(candidates))
        return candidates[choice]


@dataclass(slots=True)
class Replay:
    """What one policy hit on one trace and pool: prompt blocks looked up and found."""

    lookups: int = 0
    hits: int = 0
    block_size: int = 16
    peak_frames: int = 0  # the most frames in use or kept by the cache at once

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def saved_tokens(self) -> int:
        """Prefill tokens not computed: the hit blocks' tokens."""
        return self.hits * self.block_size


def lookups(trace: list[ChatTurn], block_size: int) -> list[list[int]]:
    """Per request, the hashes of the blocks its prompt looks up, in order (the full
    blocks of
    all but its last token: the last is always computed, the model needs its logits)."""
    per_request = []
    for turn in trace:
        prev, hashes = None, []
        for start in range(0, len(turn.prompt) - block_size, block_size):
            prev = block_hash(prev, turn.prompt[start : start + block_size])
            hashes.append(prev)
        per_request.append(hashes)
    return per_request


def belady(trace: list[ChatTurn], block_size: int) -> Belady:
    """MIN for this trace: every block's lookup times, numbered across the whole
    trace."""
    uses: dict[int, list[int]] = {}
    starts, t = [0], 0
    for hashes in lookups(trace, block_size):
        for h in hashes:
            uses.setdefault(h, []).append(t)
            t += 1
        starts.append(t)
    return Belady(uses, starts)


def replay(
    trace: list[ChatTurn],
    num_blocks: int,
    block_size: int = 16,
    policy="lru",
    concurrency: int = 4,
    track_peak: bool = False,
) -> Replay:
    """Serve the trace in order with `concurrency` requests in memory at once (the
    oldest is freed when the next arrives): allocate its prompt (prefix hits reused),
    append its answer. The same frees happen whatever the policy, so only the
    replacement decisions differ.
    """
    policy = belady(trace, block_size) if policy == "min" else make_policy(policy)
    manager = BlockManager(
        num_blocks, block_size, enable_prefix_caching=True, prefix_cache_policy=policy
    )
    result, live = Replay(block_size=block_size), deque()
    for i, turn in enumerate(trace):
        if len(live) == concurrency:
            manager.free(live.popleft())
        if isinstance(policy, Offline):
            policy.at(i)
        result.hits += manager.allocate(i, turn.prompt) // block_size
        result.lookups += (len(turn.prompt) - 1) // block_size
        for token in turn.answer:
            manager.append_slot(i, token)
        live.append(i)
        # frames are only taken within a request: its end is the peak so far
        if track_peak:
            held = sum(not state.free for state in manager.frame_states())
            result.peak_frames = max(result.peak_frames, held)
    return result


def min_pool(trace: list[ChatTurn], block_size: int = 16, concurrency: int = 4) -> int:
    """The fewest frames that hold the live requests with no sharing at all: any policy
    replays the trace in this pool without running out (a policy only changes what is
    shared).
    """

    def need(t: ChatTurn) -> int:
        return -(-(len(t.prompt) + len(t.answer)) // block_size)

    return max(
        sum(need(t) for t in trace[max(0, i - concurrency + 1) : i + 1])
        for i in range(len(trace))
    )


def no_eviction_pool(
    trace: list[ChatTurn], block_size: int = 16, concurrency: int = 4
) -> int:
    """The fewest frames in which nothing is ever evicted (every block stays cached):
    from there up, every policy is MIN, and only the misses no pool avoids remain
    (blocks looked up before any request computed them)."""
    roomy = sum(-(-(len(t.prompt) + len(t.answer)) // block_size) for t in trace)
    return replay(
        trace, roomy, block_size, "lru", concurrency, track_peak=True
    ).peak_frames


def brute_force_best(
    trace: list[ChatTurn],
    num_blocks: int,
    block_size: int,
    concurrency: int,
    max_runs: int = 20000,
) -> int:
    """The most hits any sequence of eviction choices gets (every choice at every
    eviction tried, dead blocks counted as one): the exact optimum MIN claims to reach.
    Small traces only: more than max_runs scripts is a ValueError."""
    per_request, alive, later = lookups(trace, block_size), [], set()
    for hashes in reversed(per_request):
        alive.append(set(later))
        later |= set(hashes)
    alive.reverse()  # alive[i]: the blocks requests after i look up
    best, stack, runs = 0, [[]], 0
    while stack:
        policy = Scripted(stack.pop(), alive)
        best = max(
            best, replay(trace, num_blocks, block_size, policy, concurrency).hits
        )
        runs += 1
        if runs > max_runs:
            raise ValueError(
                f"more than {max_runs} eviction scripts: use a smaller trace"
            )
        # the decisions taken by default
        for k in range(len(policy.choices), len(policy.made)):
            stack += [policy.made[:k] + [c] for c in range(1, policy.options[k])]
    return best


def page_trace(pages: list[int], block_size: int = 2) -> list[ChatTurn]:
    """A classic reference string as requests: page p is a one-block prompt of p's
    tokens (plus a last token, always computed), no answer. Served one at a time, a pool
    of k + 1 frames caches k pages (the last token's frame is the one more)."""
    return [ChatTurn(i, [p] * block_size + [0], []) for i, p in enumerate(pages)]


CLASSIC_ANOMALY = [
    1,
    2,
    3,
    4,
    1,
    2,
    5,
    1,
    2,
    3,
    4,
    5,
]  # Belady, Nelson and Shedler (1969)


def small_chat_trace(seed: int) -> list[ChatTurn]:
    """A chat trace small enough to replay at every pool size many times over: 4
    conversations of 3 turns, 2 system prompts of 8 tokens, questions and answers of
    about 4 (blocks of 4).
    """
    return chat_trace(
        num_conversations=4,
        turns=3,
        num_system_prompts=2,
        system_len=8,
        question_mean=4,
        answer_mean=4,
        active=2,
        seed=seed,
    )


def anomalies(
    policy: str, seeds: int, block_size: int = 4, extra: int = 16
) -> list[dict]:
    """Belady's anomaly searched for on `seeds` small chat traces, served one request at
    a time: the policy at every pool size from the floor up to `extra` more frames; an
    anomaly is a pool one frame bigger that hits less."""
    found = []
    for seed in range(seeds):
        trace = small_chat_trace(seed)
        floor = min_pool(trace, block_size, concurrency=1)
        hits = [
            replay(trace, n, block_size, policy, concurrency=1).hits
            for n in range(floor, floor + extra)
        ]
        found += [
            {
                "seed": seed,
                "frames": floor + i,
                "hits": hits[i],
                "hits_with_one_more": hits[i + 1],
            }
            for i in range(len(hits) - 1)
            if hits[i + 1] < hits[i]
        ]
    return found


def sweep(
    trace: list[ChatTurn],
    pools: list[int],
    block_size: int,
    concurrency: int,
    policies=POLICY_NAMES + ("min",),
    desc: str | None = None,
) -> dict:
    """Hit rate and prefill tokens saved of each policy at each pool size; a progress
    bar titled `desc` (none without) counts the replays."""
    out = {}
    # a replay of the whole trace per policy and pool: a minute and more at the defaults
    bar = tqdm(
        total=len(policies) * len(pools),
        desc=desc,
        unit="replay",
        disable=desc is None,
    )
    for name in policies:
        runs = []
        for n in pools:
            bar.set_postfix_str(f"{name}, {n} frames")
            runs.append(replay(trace, n, block_size, name, concurrency))
            bar.update()
        out[name] = {
            "hit_rate": [r.hit_rate for r in runs],
            "saved_tokens": [r.saved_tokens for r in runs],
            "hits": [r.hits for r in runs],
        }
    bar.close()
    return out


def pool_sizes(floor: int, top: int, points: int) -> list[int]:
    """`points` pool sizes from the floor to the top, closer together near the floor,
    where the policies differ most (spaced as the square of an even step)."""
    return sorted(
        {round(floor + (top - floor) * (i / (points - 1)) ** 2) for i in range(points)}
    )


def classic_faults(pages: list[int], policy: str, cached_pages: int) -> int:
    """Page faults of a policy on a reference string with room for `cached_pages`
    pages."""
    run = replay(page_trace(pages), cached_pages + 1, 2, policy, concurrency=1)
    return run.lookups - run.hits


def anomaly_report(curves: dict, pools: list[int], seeds: int) -> dict:
    """Belady's anomaly: FIFO and LRU on the classic string, the searched small chat
    traces where one more frame hits less, and the pools of this sweep where a bigger
    one hit less.
    """
    searched = {
        name: anomalies(name, seeds)
        for name in tqdm(curves, desc="Belady's anomaly, searched", unit="policy")
    }
    on_sweep = {
        name: [
            {
                "frames": pools[i],
                "hits": c["hits"][i],
                "frames_more": pools[i + 1],
                "hits_more": c["hits"][i + 1],
            }
            for i in range(len(pools) - 1)
            if c["hits"][i + 1] < c["hits"][i]
        ]
        for name, c in curves.items()
    }
    return {
        "classic_string": CLASSIC_ANOMALY,
        "fifo_faults_by_cached_pages": {
            k: classic_faults(CLASSIC_ANOMALY, "fifo", k) for k in (3, 4)
        },
        "lru_faults_by_cached_pages": {
            k: classic_faults(CLASSIC_ANOMALY, "lru", k) for k in (3, 4)
        },
        "small_chat_traces_searched": seeds,
        "traces_with_an_anomaly": {
            n: len({a["seed"] for a in found}) for n, found in searched.items()
        },
        "fifo_examples": searched["fifo"][:3],
        "on_the_sweep": on_sweep,
    }


def bench_replacement(args) -> dict:
    """A multi-turn chat trace with shared system prompts replayed through the block
    managers
    (no model) at each pool size, once per replacement policy and once with MIN."""
    trace = chat_trace(
        args.conversations,
        args.turns,
        num_system_prompts=SYSTEM_PROMPTS,
        seed=args.seed,
    )
    floor = min_pool(trace, args.block_size, args.concurrency)
    top = no_eviction_pool(trace, args.block_size, args.concurrency)
    pools = pool_sizes(floor, top, args.points)
    curves = sweep(trace, pools, args.block_size, args.concurrency, desc="replacement")
    looked_up = lookups(trace, args.block_size)
    bound = {
        name: all(h <= m for h, m in zip(c["hits"], curves["min"]["hits"]))
        for name, c in curves.items()
    }
    result = {
        "trace": {
            "conversations": args.conversations,
            "turns": args.turns,
            "requests": len(trace),
            "system_prompts": SYSTEM_PROMPTS,
            "block_size": args.block_size,
            "concurrency": args.concurrency,
            "seed": args.seed,
            "prompt_blocks_looked_up": sum(map(len, looked_up)),
            "distinct_blocks_looked_up": len(
                {h for hashes in looked_up for h in hashes}
            ),
        },
        "pool_frames": pools,
        "floor_frames": floor,
        "no_eviction_frames": top,
        "policies": curves,
        "every_policy_at_or_below_min": bound,
        "belady_anomaly": anomaly_report(curves, pools, args.anomaly_seeds),
    }
    if not args.json:
        print(text_table(result))
    return result


def text_table(result: dict) -> str:
    """Hit rate (%) and prefill tokens saved by pool size, a column per policy; the
    anomaly search."""
    names, curves = list(result["policies"]), result["policies"]
    lines = [
        "hit rate (%) of prompt blocks      |  prefill tokens saved",
        "frames  "
        + "  ".join(f"{n:>6}" for n in names)
        + "  |  "
        + "  ".join(f"{n:>7}" for n in names),
    ]
    for i, pool in enumerate(result["pool_frames"]):
        lines.append(
            f"{pool:>6}  "
            + "  ".join(f"{100 * curves[n]['hit_rate'][i]:6.1f}" for n in names)
            + "  |  "
            + "  ".join(f"{curves[n]['saved_tokens'][i]:7,}" for n in names)
        )
    lines.append(
        "every policy at or below MIN at every pool: "
        + ("yes" if all(result["every_policy_at_or_below_min"].values()) else "NO")
    )
    anomaly = result["belady_anomaly"]
    for name in ("fifo", "lru"):
        faults = anomaly[f"{name}_faults_by_cached_pages"]
        lines.append(
            f"{name.upper()} on {anomaly['classic_string']}: "
            + ", ".join(f"{k} pages -> {v} faults" for k, v in faults.items())
        )
    lines.append(
        "on this sweep, a bigger pool that hits less: "
        + (
            ", ".join(
                f"{n} {a['frames']}->{a['frames_more']} frames"
                for n, found in anomaly["on_the_sweep"].items()
                for a in found
            )
            or "none"
        )
    )
    lines.append(
        f"small chat traces (of {anomaly['small_chat_traces_searched']}) where one more"
        " frame hits less: "
        + ", ".join(f"{n} {k}" for n, k in anomaly["traces_with_an_anomaly"].items())
    )
    return "\n".join(lines)


def add_arguments(p) -> None:
    p.add_argument(
        "--conversations",
        type=number(int, 1),
        default=32,
        help="conversations in the trace (default %(default)s)",
    )
    p.add_argument(
        "--turns",
        type=number(int, 1),
        default=4,
        help="turns per conversation (default %(default)s)",
    )
    p.add_argument(
        "--block-size",
        type=number(int, 1),
        default=16,
        help="tokens per block (default %(default)s)",
    )
    p.add_argument(
        "--concurrency",
        type=number(int, 1),
        default=4,
        help="requests in memory at once (default %(default)s)",
    )
    p.add_argument(
        "--points",
        type=number(int, 2),
        default=12,
        help="pool sizes swept (default %(default)s)",
    )
    p.add_argument(
        "--seed",
        type=number(int, 0),
        default=0,
        help="the trace's seed (default %(default)s)",
    )
    p.add_argument(
        "--anomaly-seeds",
        type=number(int, 1),
        default=100,
        help="small chat traces searched for Belady's anomaly (default %(default)s)",
    )


def replacement_chart(result: dict) -> LineChart:
    """The hit-rate-against-memory curve: % of prompt blocks found, per policy and
    MIN."""
    series = {
        name: [100 * rate for rate in curve["hit_rate"]]
        for name, curve in result["policies"].items()
    }
    return LineChart(
        "prefix-cache hit rate against pool size, each policy beside MIN",
        result["pool_frames"],
        series,
        x_label="frames in the pool",
        y_label="% of prompt blocks found in the cache",
    )
