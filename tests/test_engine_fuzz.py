"""A fuzzer of the whole engine: every option drawn at random, checked after every step.

Each scenario is drawn from one seed: block size (1, 2, 5, 16), continuous or static
scheduler, preemption by recompute or swap, prefix caching on or off, paged or
contiguous memory (Orca's max / pow2 / oracle chunks: one request per sequence, so
greedy and sampled requests only), chunked prefill with a budget of a few tokens per
step, speculative decoding (n-gram or draft layers, k guesses; continuous and paged
only, no beams: refused), the prefix cache's replacement policy (LRU, FIFO, CLOCK,
random), the drum behind it (a host tier of 1 to 32 frames), the waiting queue's order
(FCFS, SJF, aging, priority, fair), the working-set admission rule, the KV storage
(kv_cache_dtype auto, int8, fp8), max_model_len, a KV pool from the smallest that
`add_request` accepts upwards, and a few requests with shared prefixes: greedy, seeded
samples (n > 1), beams, stop strings and stop ids, arriving at random steps and aborted
at random steps (while waiting, running or swapped). The engine is driven by hand and
checked by code of this file only (it reads engine internals, never changes them):

- after every step, add and abort: each frame's ref count is the number of block tables
  that map it (device and host pools apart), free + used (+ reserved, contiguous) =
  total, every table has the frames its tokens need, a contiguous table's frames are
  consecutive within its chunk and no two chunks overlap; when the engine is idle, no
  table is left and every frame is free; every table holds its sequence's own tokens
  only (no rejected guess, no guess slot left) and every block the prefix cache names is
  a block of accepted tokens (also checked mid-step);
- on every write of K and V (a wrapper around the attention implementation's write_kv):
  each slot lies in a mapped frame that no other table maps. The one exception allowed
  is a write that every table mapping the frame wants, token for token (a prompt
  prefilled once for all its forked samples, or a block that a same-step request found
  in the prefix cache);
- at the end, every output equals the same request run alone with ample memory (same
  block size and max_model_len; continuous, no prefix caching, no speculation): token
  ids, text, finish_reason (with speculation, greedy requests only: a sampled one draws
  other random numbers, so its output obeys the rules below). An aborted request's
  tokens and text are prefixes of the alone run's, per sample index. Outputs also obey
  rules of their own (length limits, no stop string in the text, greedy samples equal,
  cached tokens fewer than the prompt).

A second test mixes `generate`, `stream` (consumed fully, closed early, abandoned) and
`engine.add_request` on one `LLM`, and checks that every later `generate` is still
right.

Every failure is collected, grouped by kind and printed with its seed and scenario, then
the run fails. Reproduce one: `MINIPAGED_FUZZ_ONLY=17 pytest tests/test_engine_fuzz.py
-k fuzz_engine` or call `run_scenario(llm, Scenario(...))` with the printed Scenario.
Named scenarios (NAMED) pin one feature pair each. The long run:
`MINIPAGED_FUZZ_SCALE=10 pytest tests/test_engine_fuzz.py -s` (and MINIPAGED_FUZZ_SEED=k
draws other scenarios). Each run prints its size and asserts that it exercised every
feature (preemptions of each mode, aborts in each state, copy-on-write, swaps,
prefix-cache hits), so the fuzzer cannot silently grow weak.
"""

from __future__ import annotations

import os
import re
import traceback
from collections import Counter
from dataclasses import dataclass, field, fields, replace

import numpy as np
import pytest

from minipaged import LLM, SamplingParams
from minipaged.paging import block_hash
from minipaged.sampling import StructuredOutputsParams

SCALE = float(os.environ.get("MINIPAGED_FUZZ_SCALE", "1"))
BASE_SEED = int(os.environ.get("MINIPAGED_FUZZ_SEED", "0"))
ONLY = [
    int(s) for s in os.environ.get("MINIPAGED_FUZZ_ONLY", "").replace(",", " ").split()
]
NUM_SCENARIOS = max(1, round(500 * SCALE))
NUM_INTERLEAVINGS = max(1, round(20 * SCALE))
BLOCK_SIZES = (1, 2, 5, 16)


def picker(rng):
    """pick(options): one of the options, drawn from rng."""

    def pick(options):
        return options[int(rng.integers(len(options)))]

    return pick


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from checkpoints import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("fuzz"), max_positions=256)


@pytest.fixture(scope="module")
def llm(folder):
    return LLM(str(folder), device="cpu", num_blocks=64, block_size=16)


# ---- scenarios -----------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """Everything one run draws; the requests come from `seed` too (see
    draw_requests)."""

    seed: int
    block_size: int = 16
    scheduler: str = "continuous"  # or "static"
    preemption_mode: str = "recompute"  # or "swap"
    prefix_caching: bool = True
    max_model_len: int = 40
    max_num_seqs: int = 64
    # frames above the smallest accepted pool, as a fraction of it
    pool_slack: float = 0.0
    num_requests: int = 6
    kinds: tuple = ("greedy", "sampled", "samples", "beam")
    abort_rate: float = 0.05  # chance per step that one live request is aborted
    arrival_spread: int = 8  # half the requests arrive at step 0, the rest by this step
    stops: bool = True  # stop strings and stop token ids
    long_rate: float = 0.2  # requests asking for more than max_model_len holds
    allocator: str = "paged"  # or "contiguous-max" / "-pow2" / "-oracle"
    chunked_prefill: bool = False
    max_num_batched_tokens: int = 0  # with chunked_prefill: the token budget of a step
    speculative: str = ""  # "ngram" or "draft_layers": speculative decoding
    num_speculative_tokens: int = 0
    # which parked cached frame is evicted first (issue 22)
    prefix_cache_policy: str = "lru"
    # the waiting queue's order: "sjf", "aging", "priority", "fair"
    scheduling_policy: str = "fcfs"
    # the drum: host frames behind the prefix cache (0: none)
    kv_offload_frames: int = 0
    # or "working-set": admit while the running sequences' growth fits
    admission: str = "greedy"
    admission_window: int = 16
    # or "int8" / "fp8": the 8-bit KV cache (compressed memory)
    kv_cache_dtype: str = "auto"
    # decode rows per step while several clients run (0: every row); requests then
    # come from three clients
    max_decode_rows: int = 0

    @classmethod
    def draw(cls, seed: int) -> Scenario:
        rng = np.random.default_rng([BASE_SEED, seed, 0])
        pick = picker(rng)
        sc = cls(
            seed=seed,
            block_size=pick(BLOCK_SIZES),
            scheduler="static" if rng.random() < 0.2 else "continuous",
            preemption_mode=pick(("recompute", "swap")),
            prefix_caching=bool(rng.random() < 0.6),
            max_model_len=pick((12, 24, 40, 64)),
            max_num_seqs=pick((64, 64, 4)),
            pool_slack=pick((0.0, 0.0, 0.1, 0.3, 1.0)),
            num_requests=int(rng.integers(2, 9)),
            abort_rate=pick((0.0, 0.03, 0.1)),
            arrival_spread=int(rng.integers(0, 12)),
            stops=bool(rng.random() < 0.7),
            long_rate=pick((0.0, 0.2)),
        )
        # a stream of its own: the draws above stay
        more = np.random.default_rng([BASE_SEED, seed, 4])
        pick = picker(more)
        changes = {}
        if more.random() < 0.25:
            changes |= {
                "allocator": pick(
                    ("contiguous-max", "contiguous-pow2", "contiguous-oracle")
                ),
                "kinds": ("greedy", "sampled"),
            }
        if sc.scheduler == "continuous" and more.random() < 0.35:
            changes |= {
                "chunked_prefill": True,
                "max_num_batched_tokens": pick((1, 2, 3, 5, 8, 16)),
            }
        # another stream: the draws above stay
        spec = np.random.default_rng([BASE_SEED, seed, 5])
        if (
            sc.scheduler == "continuous"
            and "allocator" not in changes
            and spec.random() < 0.3
        ):
            changes |= {
                "speculative": ("ngram", "draft_layers")[int(spec.integers(2))],
                "num_speculative_tokens": int(spec.choice([1, 2, 3, 5])),
                "kinds": tuple(k for k in sc.kinds if k != "beam"),
            }
        # the old ideas' options, a stream of their own
        policies = np.random.default_rng([BASE_SEED, seed, 6])
        pick = picker(policies)
        changes |= {
            "prefix_cache_policy": pick(("lru", "lru", "fifo", "clock", "random")),
            "scheduling_policy": pick(("fcfs", "fair", "sjf", "aging", "priority")),
        }
        if (
            sc.prefix_caching
            and sc.scheduler == "continuous"
            and "allocator" not in changes
        ):
            # 1 and 4: the tier evicts too
            changes["kv_offload_frames"] = pick((0, 0, 1, 4, 32))
        if policies.random() < 0.3:
            changes |= {
                "admission": "working-set",
                "admission_window": pick((1, 4, 16, 256)),
            }
        # how K/V are stored, a stream of its own
        storage = np.random.default_rng([BASE_SEED, seed, 7])
        if storage.random() < 0.25:
            changes["kv_cache_dtype"] = ("int8", "fp8")[int(storage.integers(2))]
        # who sits a step out, a stream of its own
        width = np.random.default_rng([BASE_SEED, seed, 8])
        if sc.scheduler == "continuous" and width.random() < 0.3:
            changes["max_decode_rows"] = int(width.choice([1, 2, 3]))
        return replace(sc, **changes)

    def short(self) -> str:
        """Only the fields that differ from the defaults (what a bug report needs)."""
        default = Scenario(seed=self.seed)
        diff = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if f.name == "seed" or getattr(self, f.name) != getattr(default, f.name)
        ]
        return f"Scenario({', '.join(diff)})"


# One feature pair each: the places where defects were found before (see issue 10).
NAMED = {
    # issue 41: requests sitting a step out while frames run short
    "decode-rows-tight-swap": Scenario(
        0, max_decode_rows=1, preemption_mode="swap", num_requests=8, abort_rate=0.05
    ),
    "decode-rows-chunked-speculative": Scenario(
        0,
        max_decode_rows=2,
        chunked_prefill=True,
        max_num_batched_tokens=3,
        speculative="ngram",
        num_speculative_tokens=2,
        kinds=("greedy", "sampled", "samples"),
        num_requests=8,
    ),
    "tight-samples-recompute": Scenario(
        0,
        kinds=("samples",),
        preemption_mode="recompute",
        abort_rate=0,
        num_requests=3,
        stops=False,
    ),
    "tight-samples-swap": Scenario(
        0,
        kinds=("samples",),
        preemption_mode="swap",
        abort_rate=0,
        num_requests=3,
        stops=False,
    ),
    "static-samples": Scenario(
        0, scheduler="static", kinds=("samples",), abort_rate=0, pool_slack=1.0
    ),
    "static-beams": Scenario(
        0, scheduler="static", kinds=("beam",), abort_rate=0, pool_slack=1.0
    ),
    "static-aborts": Scenario(
        0, scheduler="static", kinds=("greedy",), abort_rate=0.3, num_requests=8
    ),
    "beams-long": Scenario(
        0, kinds=("beam",), long_rate=1.0, abort_rate=0, pool_slack=1.0
    ),
    "beams-aborted": Scenario(
        0, kinds=("beam",), abort_rate=0.3, pool_slack=1.0, num_requests=4
    ),
    "stops-tiny-blocks": Scenario(
        0, block_size=1, kinds=("greedy", "sampled"), abort_rate=0.1
    ),
    "swap-prefix-cache": Scenario(
        0,
        block_size=2,
        preemption_mode="swap",
        kinds=("greedy", "samples"),
        num_requests=8,
        abort_rate=0.05,
    ),
    "recompute-cached-tokens": Scenario(
        0, block_size=2, kinds=("greedy",), num_requests=8, abort_rate=0, stops=False
    ),
    "chunked-samples-prefix-cache": Scenario(
        0,
        block_size=2,
        kinds=("samples", "greedy"),
        chunked_prefill=True,
        max_num_batched_tokens=3,
        num_requests=8,
        abort_rate=0.1,
    ),
    "chunked-beams-swap": Scenario(
        0,
        kinds=("beam", "greedy"),
        chunked_prefill=True,
        max_num_batched_tokens=2,
        preemption_mode="swap",
        abort_rate=0.05,
        num_requests=6,
    ),
    "chunked-beams-recompute": Scenario(
        321,
        block_size=2,
        max_model_len=24,
        pool_slack=0.3,
        num_requests=5,
        abort_rate=0.0,
        arrival_spread=11,
        long_rate=0.0,
        chunked_prefill=True,
        max_num_batched_tokens=5,
    ),  # recomputed beams sample together
    "chunked-tight-recompute": Scenario(
        0,
        block_size=1,
        kinds=("greedy", "samples"),
        chunked_prefill=True,
        max_num_batched_tokens=5,
        abort_rate=0.05,
        num_requests=8,
    ),
    "contiguous-oracle-chunked": Scenario(
        0,
        allocator="contiguous-oracle",
        kinds=("greedy", "sampled"),
        block_size=2,
        chunked_prefill=True,
        max_num_batched_tokens=4,
        num_requests=8,
        abort_rate=0.05,
    ),
    "contiguous-max-static": Scenario(
        0,
        allocator="contiguous-max",
        scheduler="static",
        block_size=5,
        kinds=("greedy", "sampled"),
        num_requests=8,
        abort_rate=0.05,
    ),
    "contiguous-pow2-tight": Scenario(
        0,
        allocator="contiguous-pow2",
        block_size=1,
        kinds=("greedy",),
        num_requests=8,
        abort_rate=0,
        stops=False,
    ),
    "spec-ngram-tight-recompute": Scenario(
        0,
        block_size=2,
        kinds=("greedy", "samples"),
        speculative="ngram",
        num_speculative_tokens=3,
        num_requests=8,
        abort_rate=0.05,
    ),
    "spec-draft-swap-prefix-cache": Scenario(
        0,
        block_size=2,
        preemption_mode="swap",
        kinds=("greedy", "samples"),
        speculative="draft_layers",
        num_speculative_tokens=2,
        num_requests=8,
    ),
    "spec-chunked-tiny-blocks": Scenario(
        0,
        block_size=1,
        kinds=("greedy", "sampled", "samples"),
        chunked_prefill=True,
        max_num_batched_tokens=8,
        speculative="ngram",
        num_speculative_tokens=5,
    ),
    "spec-stops-aborts": Scenario(
        0,
        block_size=5,
        kinds=("greedy", "sampled"),
        abort_rate=0.1,
        speculative="draft_layers",
        num_speculative_tokens=3,
        pool_slack=0.3,
    ),
}
NAMED_SEEDS = max(1, round(3 * SCALE))


@dataclass
class Req:
    rid: str
    prompt: list[int]
    params: SamplingParams
    arrival: int
    kind: str


def stop_strings(rng, words) -> list[str]:
    """A word, a piece of a word, two words in a row, or the end of one word and the
    start of the next (a stop string across two tokens): some hit often, some rarely."""
    out = []
    for _ in range(int(rng.integers(1, 3))):
        word, other = (
            words[int(rng.integers(len(words)))],
            words[int(rng.integers(len(words)))],
        )
        roll = rng.random()
        if roll < 0.3:
            out.append(word)
        elif roll < 0.6:
            start = int(rng.integers(len(word)))
            out.append(word[start : start + int(rng.integers(1, 3))])
        elif roll < 0.8:
            out.append(
                f"{word[-int(rng.integers(1, 3)) :]} {other[: int(rng.integers(1, 3))]}"
            )
        else:
            out.append(f"{word} {other}")
    return out


def draw_params(
    rng, kind: str, prompt_len: int, max_model_len: int, sc: Scenario, vocab: int, words
):
    room = max_model_len - prompt_len
    if rng.random() < sc.long_rate:
        max_tokens = room + int(rng.integers(1, 20))  # max_model_len ends it first
    else:
        max_tokens = int(rng.integers(1, max(2, min(16, room) + 1)))
    extra = {}
    if sc.stops and rng.random() < 0.3:
        extra["stop_token_ids"] = rng.integers(
            5, vocab, int(rng.integers(1, 3))
        ).tolist()
    extra["ignore_eos"] = bool(rng.random() < 0.5)
    if kind == "beam":
        width = int(rng.integers(2, 5))
        if rng.random() < 0.5:
            extra["temperature"] = 0.0
        return SamplingParams(
            beam_width=width,
            n=int(rng.integers(1, width + 1)),
            max_tokens=max_tokens,
            **extra,
        )
    if sc.stops and rng.random() < 0.4:
        extra["stop"] = stop_strings(rng, words)
    extra |= draw_controls(
        [sc.seed, prompt_len, max_tokens, len(extra)],
        max_tokens,
        vocab,
        "stop" in extra,
    )
    if kind == "greedy":
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, **extra)
    if kind == "samples" and rng.random() < 0.4:
        return SamplingParams(
            n=int(rng.integers(2, 5)), temperature=0.0, max_tokens=max_tokens, **extra
        )
    if rng.random() < 0.3:
        extra["top_k"] = int(rng.integers(1, 20))
    if rng.random() < 0.3:
        extra["top_p"] = float(rng.choice([0.5, 0.9]))
    n = int(rng.integers(2, 5)) if kind == "samples" else 1
    return SamplingParams(
        n=n,
        temperature=float(rng.choice([0.7, 1.0, 1.5])),
        seed=int(rng.integers(1000)),
        max_tokens=max_tokens,
        **extra,
    )


def draw_controls(
    key: list[int], max_tokens: int, vocab: int, stop_strings: bool
) -> dict:
    """vLLM's controls of the logits and logprobs for a third of the requests that are
    not beams, one to three at a time, drawn from a generator of their own (`key`: what
    was drawn before), so the scenarios' other draws stay as they were. min_tokens never
    meets stop strings (the rule 'no stop string in the text' does not hold within the
    first min_tokens tokens).
    """
    rng = np.random.default_rng(key)
    if rng.random() > 0.33:
        return {}
    options = [
        {"presence_penalty": float(rng.uniform(-2, 2))},
        {"frequency_penalty": float(rng.uniform(-2, 2))},
        {"repetition_penalty": float(rng.choice([0.5, 1.3, 2.0]))},
        {
            "logit_bias": {
                int(t): float(rng.uniform(-5, 5)) for t in rng.integers(0, vocab, 3)
            }
        },
        {"min_p": float(rng.choice([0.05, 0.3]))},
        {"logprobs": int(rng.integers(0, 3))},
        {"prompt_logprobs": int(rng.integers(0, 3))},
    ]
    options += (
        [] if stop_strings else [{"min_tokens": int(rng.integers(0, max_tokens + 1))}]
    )
    chosen = rng.choice(len(options), int(rng.integers(1, 4)), replace=False)
    return {k: v for i in chosen for k, v in options[i].items()}


def draw_requests(sc: Scenario, vocab: int, words) -> list[Req]:
    rng = np.random.default_rng([BASE_SEED, sc.seed, 1])
    limit = sc.max_model_len - 2  # longest prompt
    prefixes = [
        rng.integers(
            5, vocab, int(rng.integers(1, max(2, min(3 * sc.block_size + 2, limit))))
        ).tolist()
        for _ in range(2)
    ]
    reqs: list[Req] = []
    for i in range(sc.num_requests):
        if reqs and rng.random() < 0.15:
            # the very same prompt again
            prompt = list(reqs[int(rng.integers(len(reqs)))].prompt)
        else:
            prefix = prefixes[int(rng.integers(2))] if rng.random() < 0.6 else []
            prompt = (
                prefix
                + rng.integers(
                    5, vocab, int(rng.integers(1, max(2, limit // 2)))
                ).tolist()
            )[:limit]
        kind = sc.kinds[int(rng.integers(len(sc.kinds)))]
        params = draw_params(rng, kind, len(prompt), sc.max_model_len, sc, vocab, words)
        if kind != "beam":
            params.structured_outputs = draw_structure(
                np.random.default_rng([BASE_SEED, sc.seed, 8, i]), words
            )
        arrival = (
            0 if rng.random() < 0.5 else int(rng.integers(0, sc.arrival_spread + 1))
        )
        reqs.append(Req(f"r{i}", prompt, params, arrival, kind))
    return reqs


def draw_structure(rng, words) -> StructuredOutputsParams | None:
    """For one request in eight that is not a beam search, structured output: a choice
    of three words, or one or more of them as a regex (a stream of its own: the other
    draws stay).
    """
    if rng.random() > 0.125:
        return None
    picks = [
        w for w in (words[int(rng.integers(len(words)))] for _ in range(3)) if w.strip()
    ] or ["a"]
    if rng.random() < 0.5:
        return StructuredOutputsParams(choice=picks)
    return StructuredOutputsParams(regex="(" + "|".join(map(re.escape, picks)) + ")+")


# ---- failures and statistics ---------------------------------------------------------


class FuzzFailure(AssertionError):
    """An invariant or an output check failed; `kind` groups failures of the same
    cause."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"[{kind}] {message}")
        self.kind = kind


def describe(error: BaseException) -> str:
    """The error, and for the engine's own exceptions where in minipaged it was
    raised."""
    message = "".join(traceback.format_exception_only(error)).strip()
    if not isinstance(error, FuzzFailure):
        frames = traceback.extract_tb(error.__traceback__)
        ours = [f for f in frames if "minipaged" in f.filename] or frames
        message += "\n" + "".join(traceback.format_list(ours[-4:]))
    return message


def failure_kind(error: BaseException) -> str:
    if isinstance(error, FuzzFailure):
        return error.kind
    first = (str(error).splitlines() or [""])[0]
    return f"{type(error).__name__}: " + re.sub(r"\d+", "N", first)[:90]


@dataclass
class Stats:
    scenarios: int = 0
    requests: int = 0
    steps: int = 0
    preempted: Counter = field(default_factory=Counter)  # by mode
    aborts: Counter = field(default_factory=Counter)  # by state when aborted
    copies: int = 0
    swapped_out: int = 0
    swapped_in: int = 0
    cached_tokens: int = 0
    shared_writes: int = 0  # allowed writes into a frame several tables want written
    guessed: int = 0  # speculative decoding: guesses checked
    accepted: int = 0  # and accepted
    # prefill rows that continue the previous step's prefill (chunked)
    prompt_chunks: int = 0
    tier_hits: int = 0  # prompt tokens copied back from the drum instead of recomputed
    finish_reasons: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)  # request kinds run
    options: Counter = field(default_factory=Counter)  # scenario options run
    failures: list = field(default_factory=list)  # (kind, label, message)

    def line(self) -> str:
        return (
            f"{self.scenarios} scenarios, {self.requests} requests, {self.steps} steps,"
            f" preemptions {dict(self.preempted)}, aborts {dict(self.aborts)},"
            f" {self.copies} copy-on-write copies, swaps out/in"
            f" {self.swapped_out}/{self.swapped_in}, {self.cached_tokens} cached"
            f" tokens, {self.shared_writes} writes into frames shared by identical"
            f" tables, {self.prompt_chunks} prompt chunks after the first,"
            f" {self.accepted} of {self.guessed} guesses accepted, {self.tier_hits}"
            f" tokens from the drum, finish reasons {dict(self.finish_reasons)}, kinds"
            f" {dict(self.kinds)}"
        )

    def report(self, report) -> None:
        self.steps += 1
        self.copies += report.copies
        self.swapped_out += report.swapped_out
        self.swapped_in += report.swapped_in
        self.cached_tokens += report.cached_tokens
        self.preempted.update(mode for _, mode in report.preempted)
        self.guessed += report.guessed
        self.accepted += report.accepted


def failure_summary(stats: Stats, repro: str) -> str:
    groups: dict[str, list] = {}
    for kind, label, message in stats.failures:
        groups.setdefault(kind, []).append((label, message))
    lines = [
        f"{len(stats.failures)} failing runs in {len(groups)} kinds ({stats.line()})"
    ]
    for kind, runs in sorted(groups.items(), key=lambda g: -len(g[1])):
        lines.append(f"\n== {kind}: {len(runs)} runs; first: {runs[0][0]}")
        lines.append("   " + runs[0][1][:1500].replace("\n", "\n   "))
        lines.append("   other runs: " + "; ".join(label for label, _ in runs[1:6]))
    lines.append(f"\nreproduce one: {repro}")
    return "\n".join(lines)


# ---- invariants, checked with code of our own ----------------------------------------


class Checker:
    """Reads engine.blocks after every step: ref counts, free lists, table sizes, leaks.
    Wraps the attention implementation so that every K/V write is checked against the
    tables.
    """

    def __init__(self, engine, stats: Stats, label: str = ""):
        self.engine, self.stats, self.label = engine, stats, label
        attention = engine.runner.attention
        attention.impl = WriteGuard(attention.impl, self)
        # (prev hash, block tokens) of every sequence's real tokens
        self.accepted_blocks: set = set()
        self.hashed: dict = {}  # sequence -> (full blocks hashed so far, last hash)

    @property
    def blocks(self):
        # read each time: an engine may rebuild its block manager
        return self.engine.blocks

    def check(self, when: str, finished=()) -> None:
        self.check_prefix_cache(when, finished)
        self.check_tables_hold_real_tokens(when)
        blocks = self.blocks
        pools = (("device", blocks.device), ("host", blocks.host))
        counts = {
            name: np.zeros(pool.num_blocks, dtype=np.int64) for name, pool in pools
        }
        # contiguous: chunks over each frame
        chunks = np.zeros(blocks.device.num_blocks, dtype=np.int64)
        for seq_id, table in blocks.tables.items():
            # a contiguous chunk: frames start, start + 1, ... of its own
            if hasattr(table, "start"):
                chunks[table.start : table.start + table.size] += 1
                if (
                    table.frames
                    != list(range(table.start, table.start + len(table.frames)))
                    or len(table.frames) > table.size
                ):
                    raise FuzzFailure(
                        "chunk-not-consecutive",
                        f"{when}: sequence {seq_id} maps {table.frames} "
                        f"in a chunk of {table.size} frames at {table.start}",
                    )
            name = next((n for n, pool in pools if table.allocator is pool), None)
            if name is None:
                raise FuzzFailure(
                    "table-in-no-pool",
                    f"{when}: the table of sequence {seq_id} is in neither pool",
                )
            size = table.allocator.block_size
            if len(table.frames) != -(-len(table.token_ids) // size):
                raise FuzzFailure(
                    "table-size",
                    f"{when}: sequence {seq_id} holds {len(table.token_ids)} tokens "
                    f"in {len(table.frames)} frames of {size}",
                )
            if len(set(table.frames)) != len(table.frames):
                raise FuzzFailure(
                    "table-maps-a-frame-twice",
                    f"{when}: sequence {seq_id}: {table.frames}",
                )
            for frame in table.frames:
                counts[name][frame] += 1
        if chunks.max(initial=0) > 1:
            raise FuzzFailure(
                "chunks-overlap",
                f"{when}: frame {int(chunks.argmax())} is in two chunks",
            )
        reserved = getattr(blocks.device, "num_reserved", 0)
        if reserved != int(chunks.sum()) - int(
            np.count_nonzero(counts["device"])
        ) * bool(chunks.any()):
            raise FuzzFailure(
                "reserved-count",
                f"{when}: {reserved} frames counted reserved, the chunks hold"
                f" {int(chunks.sum())} of which"
                f" {int(np.count_nonzero(counts['device']))} mapped",
            )
        for name, pool in pools:
            ref_counts = np.asarray(pool.ref_counts)
            wrong = np.flatnonzero(ref_counts != counts[name])
            if wrong.size:
                f = int(wrong[0])
                raise FuzzFailure(
                    "ref-count",
                    f"{when}: {name} frame {f} has ref count {ref_counts[f]} "
                    f"but {counts[name][f]} tables map it ({wrong.size} frames wrong)",
                )
            used = int(np.count_nonzero(ref_counts)) + (
                reserved if name == "device" else 0
            )
            if pool.num_free + used != pool.num_blocks:
                raise FuzzFailure(
                    "free+used!=total",
                    f"{when}: {name} pool: {pool.num_free} free + {used} "
                    f"used (or reserved) != {pool.num_blocks} frames",
                )
        tier = getattr(blocks, "tier", None)
        if tier is not None and tier.moves:
            raise FuzzFailure(
                "tier-moves-left",
                f"{when}: the drum's copies {tier.moves[:4]} were decided "
                "but no step took them",
            )
        if not self.engine.has_unfinished_requests():
            self.check_idle(when)

    def collect_accepted_blocks(self, finished=()) -> None:
        """The blocks of tokens that really are some sequence's (prompts and outputs,
        never a
        rejected guess): live sequences' tokens, and the outputs that just finished."""
        size = self.blocks.block_size
        token_lists = [
            (seq, seq.token_ids)
            for r in self.engine.requests.values()
            for seq in r.seqs
        ]
        token_lists += [
            (None, list(out.prompt_token_ids) + list(c.token_ids))
            for out in finished
            for c in out.outputs
        ]
        for seq, tokens in token_lists:
            done, prev = (
                self.hashed.get(seq, (0, None)) if seq is not None else (0, None)
            )
            for i in range(done, len(tokens) // size):
                block = tuple(tokens[i * size : (i + 1) * size])
                self.accepted_blocks.add((prev, block))
                prev = block_hash(prev, block)
            if seq is not None:
                self.hashed[seq] = (max(done, len(tokens) // size), prev)

    def check_prefix_cache(self, when: str, finished=()) -> None:
        """Every block the prefix cache names holds tokens some sequence really has."""
        cache = getattr(self.blocks.device, "prefix_cache", None)
        if cache is None:
            return
        self.collect_accepted_blocks(finished)
        for frame, key in cache.key_of.items():
            if key not in self.accepted_blocks:
                raise FuzzFailure(
                    "cached-block-not-accepted",
                    f"{when}: the prefix cache names frame {frame} as tokens"
                    f" {list(key[1])}, which no sequence holds (a rejected guess?)",
                )

    def check_tables_hold_real_tokens(self, when: str) -> None:
        """Between steps a table holds no guess slot, and only its sequence's own
        tokens."""
        blocks = self.blocks
        for request in self.engine.requests.values():
            for seq in request.seqs:
                table = blocks.tables.get(seq.seq_id)
                if table is None:
                    continue
                if getattr(table, "guesses", 0):
                    raise FuzzFailure(
                        "guess-slots-left",
                        f"{when}: sequence {seq.seq_id} keeps "
                        f"{table.guesses} guess slots after the step",
                    )
                if (
                    table.token_ids != seq.token_ids[: len(table.token_ids)]
                    or len(table.token_ids) < seq.num_computed
                ):
                    raise FuzzFailure(
                        "table-tokens",
                        f"{when}: sequence {seq.seq_id}'s table holds"
                        f" {table.token_ids}, its tokens are {seq.token_ids}"
                        f" ({seq.num_computed} computed)",
                    )

    def check_idle(self, when: str) -> None:
        blocks = self.blocks
        if blocks.tables:
            raise FuzzFailure(
                "leak",
                f"{when}: the engine is idle but sequences "
                f"{sorted(blocks.tables, key=str)[:8]} still have tables",
            )
        for name, pool in (("device", blocks.device), ("host", blocks.host)):
            if np.asarray(pool.ref_counts).any() or pool.num_free != pool.num_blocks:
                raise FuzzFailure(
                    "leak",
                    f"{when}: the engine is idle but the {name} pool has "
                    f"{pool.num_free} of {pool.num_blocks} frames free",
                )

    def check_write(self, slots: np.ndarray, block_size: int) -> None:
        blocks = self.blocks
        slots = slots[slots >= 0]
        frames, offsets = slots // block_size, slots % block_size
        ref_counts = np.asarray(blocks.device.ref_counts)
        if frames.size and frames.max() >= ref_counts.size:
            raise FuzzFailure(
                "write-outside-pool",
                f"write to frame {frames.max()} of {ref_counts.size}",
            )
        for i in np.flatnonzero(ref_counts[frames] != 1):
            frame, offset = int(frames[i]), int(offsets[i])
            if ref_counts[frame] == 0:
                raise FuzzFailure(
                    "write-to-free-frame",
                    f"K/V written into frame {frame}, which no table maps",
                )
            wanted = set()
            for seq_id, table in blocks.tables.items():
                if table.allocator is blocks.device and frame in table.frames:
                    position = table.frames.index(frame) * block_size + offset
                    wanted.add(
                        tuple(table.token_ids[: position + 1])
                        if position < len(table.token_ids)
                        else ("not yet", seq_id)
                    )
            if len(wanted) != 1:
                raise FuzzFailure(
                    "write-to-shared-frame",
                    f"K/V written at offset {offset} of frame {frame} (ref count"
                    f" {ref_counts[frame]}), which the tables mapping it do not all"
                    " hold with the same tokens",
                )
            self.stats.shared_writes += 1


class WriteGuard:
    """The attention implementation with write_kv checked first; everything else
    forwarded."""

    def __init__(self, impl, checker: Checker):
        self._impl, self._checker, self._step_slots = impl, checker, None

    def __getattr__(self, name):
        return getattr(self._impl, name)

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping, **scales):
        slots = slot_mapping.get() if hasattr(slot_mapping, "get") else slot_mapping
        # the first layer of a forward: guesses are in the tables
        if slot_mapping is not self._step_slots:
            self._step_slots = slot_mapping
            self._checker.check_prefix_cache("during a forward")
        self._checker.check_write(
            np.asarray(slots).astype(np.int64), int(k_cache.shape[1])
        )
        return self._impl.write_kv(k, v, k_cache, v_cache, slot_mapping, **scales)


# ---- checks on outputs ---------------------------------------------------------------


def check_output(
    out,
    prompt,
    params: SamplingParams,
    max_model_len: int,
    prefix_caching: bool,
    aborted: bool,
    where: str,
) -> None:
    """Rules every output obeys, whatever else ran beside it."""

    def fail(kind, message):
        raise FuzzFailure(
            kind, f"{where}: {message} (prompt {len(prompt)} tokens, {params})"
        )

    if list(out.prompt_token_ids) != list(prompt):
        fail(
            "prompt-ids",
            f"prompt_token_ids {list(out.prompt_token_ids)[:8]}... differ from the"
            " prompt",
        )
    if not 0 <= out.num_cached_tokens < len(prompt) or (
        out.num_cached_tokens and not prefix_caching
    ):
        fail(
            "num_cached_tokens",
            f"num_cached_tokens={out.num_cached_tokens} for a prompt of {len(prompt)} "
            f"tokens (prefix caching {'on' if prefix_caching else 'off'})",
        )
    beam = params.beam_width > 1
    if not out.outputs:
        fail(
            "no-outputs", f"{'aborted ' if aborted else ''}request returned outputs=[]"
        )
    if (not aborted or not beam) and sorted(c.index for c in out.outputs) != list(
        range(params.n)
    ):
        fail(
            "outputs-count",
            f"{len(out.outputs)} outputs (indexes {[c.index for c in out.outputs]}),"
            f" n={params.n}",
        )
    for c in out.outputs:
        reasons = ("stop", "length", "abort") if aborted else ("stop", "length")
        if c.finish_reason not in reasons:
            fail(
                "finish_reason",
                f"output {c.index} has finish_reason {c.finish_reason!r} (error:"
                f" {out.error})",
            )
        if len(c.token_ids) > params.max_tokens:
            fail(
                "max_tokens",
                f"output {c.index} has {len(c.token_ids)} tokens > max_tokens",
            )
        if len(prompt) + len(c.token_ids) > max_model_len:
            fail(
                "max_model_len",
                f"output {c.index}: {len(prompt)} + {len(c.token_ids)} tokens > "
                f"max_model_len={max_model_len}",
            )
        if (
            c.finish_reason == "length"
            and len(c.token_ids) != params.max_tokens
            and len(prompt) + len(c.token_ids) != max_model_len
        ):
            fail(
                "length-too-early",
                f"output {c.index} ended 'length' after {len(c.token_ids)} tokens",
            )
        if any(s in c.text for s in params.stop):
            fail(
                "stop-string-in-text",
                f"output {c.index} text {c.text!r} contains a stop string",
            )
        if params.logprobs is not None and (
            len(c.logprobs) != len(c.token_ids)
            or any(t not in step for t, step in zip(c.token_ids, c.logprobs))
        ):
            fail(
                "logprobs",
                f"output {c.index}: {len(c.logprobs)} logprobs for {len(c.token_ids)}"
                " tokens",
            )
        # a whole match may end it sooner: the automaton wins
        held = params.structured_outputs is not None
        if (
            c.finish_reason == "stop"
            and len(c.token_ids) < params.min_tokens
            and not held
        ):
            fail(
                "min_tokens",
                f"output {c.index} ended after {len(c.token_ids)} < min_tokens tokens",
            )
    if (
        params.prompt_logprobs is not None
        and not aborted
        and len(out.prompt_logprobs or ()) != len(prompt)
    ):
        fail(
            "prompt_logprobs",
            f"{len(out.prompt_logprobs or ())} prompt logprobs for {len(prompt)}"
            " tokens",
        )
    if (
        params.temperature == 0
        and not beam
        and not aborted
        and len({(tuple(c.token_ids), c.text) for c in out.outputs}) > 1
    ):
        fail(
            "greedy-samples-differ",
            "greedy samples of one prompt differ: "
            + "; ".join(f"{c.index}: {c.token_ids}" for c in out.outputs),
        )


def compare(out, ref, params: SamplingParams, aborted: bool, where: str) -> None:
    """`out` against the same request run alone (`ref`); aborted: prefixes of it."""
    ref_by_index = {c.index: c for c in ref.outputs}
    if aborted and params.beam_width > 1:
        return  # live beams at an abort need not lead to the final beams
    for c in out.outputs:
        r = ref_by_index.get(c.index)
        if r is None:
            raise FuzzFailure(
                "outputs-count", f"{where}: output index {c.index} not in the alone run"
            )
        if aborted and c.finish_reason == "abort":
            if list(c.token_ids) != list(r.token_ids[: len(c.token_ids)]):
                raise FuzzFailure(
                    "aborted-tokens-not-prefix",
                    f"{where}: sample {c.index} aborted with "
                    f"{c.token_ids}, alone {r.token_ids} ({params})",
                )
            # its text is a prefix of the alone run's; or longer, when the alone run cut
            # its text at a stop string that the aborted one had only begun
            if not (
                r.text.startswith(c.text)
                or (c.text.startswith(r.text) and r.finish_reason == "stop")
            ):
                raise FuzzFailure(
                    "aborted-text-not-prefix",
                    f"{where}: sample {c.index} aborted with "
                    f"text {c.text!r}, alone {r.text!r} ({params})",
                )
            continue
        for name in ("token_ids", "text", "finish_reason"):
            got, want = getattr(c, name), getattr(r, name)
            if (list(got) if name == "token_ids" else got) != (
                list(want) if name == "token_ids" else want
            ):
                raise FuzzFailure(
                    f"differs-from-alone:{name}",
                    f"{where}: sample {c.index} {name} {got!r}, alone {want!r} (tokens"
                    f" {list(c.token_ids)} vs {list(r.token_ids)}; {params})",
                )
        if (
            c.logprobs is not None
            and list(c.token_ids) == list(r.token_ids)
            and not np.allclose(
                [s[t].logprob for t, s in zip(c.token_ids, c.logprobs)],
                [s[t].logprob for t, s in zip(r.token_ids, r.logprobs)],
                atol=1e-3,
            )
        ):
            raise FuzzFailure(
                "differs-from-alone:logprobs",
                f"{where}: sample {c.index}'s logprobs ({params})",
            )
    if not aborted and len(out.outputs) != len(ref.outputs):
        raise FuzzFailure(
            "outputs-count",
            f"{where}: {len(out.outputs)} outputs, alone {len(ref.outputs)}",
        )


# (block_size, max_model_len, prompt, params) -> RequestOutput of the request alone
ALONE: dict = {}


def alone(
    llm,
    block_size: int,
    max_model_len: int,
    prompt: list[int],
    params: SamplingParams,
    stats: Stats,
    kv_cache_dtype: str = "auto",
):
    """The request alone in an ample pool (continuous, no prefix caching), checked like
    any run; with the scenario's KV storage (an 8-bit run is compared with an 8-bit run
    alone).
    """
    key = (block_size, max_model_len, tuple(prompt), repr(params), kv_cache_dtype)
    if key not in ALONE:
        width = max(params.n, params.beam_width)
        # room even if max_model_len were ignored
        longest = len(prompt) + params.max_tokens + 1
        frames = (
            max(width * -(-longest // block_size), -(-max_model_len // block_size)) + 4
        )
        engine = llm.new_engine(
            num_blocks=frames,
            block_size=block_size,
            kv_cache_dtype=kv_cache_dtype,
            max_model_len=max_model_len,
            enable_prefix_caching=False,
        )
        checker = Checker(engine, stats)
        engine.add_request("alone", {"prompt_token_ids": list(prompt)}, params)
        finished, steps = [], 0
        while engine.has_unfinished_requests():
            report = engine.step()
            finished += report.finished
            checker.check(f"alone run, step {steps}", report.finished)
            steps += 1
            if steps > 4 * longest + 20:
                raise FuzzFailure(
                    "alone-run-never-ends",
                    f"{steps} steps for {len(prompt)} + {params}",
                )
        if len(finished) != 1:
            raise FuzzFailure(
                "alone-run-outputs", f"alone run gave {len(finished)} outputs"
            )
        check_output(
            finished[0], prompt, params, engine.max_model_len, False, False, "alone run"
        )
        ALONE[key] = finished[0]
    return ALONE[key]


# ---- one scenario --------------------------------------------------------------------


def engine_options(sc: Scenario) -> dict:
    return {
        "block_size": sc.block_size,
        "max_model_len": sc.max_model_len,
        "scheduler": sc.scheduler,
        "preemption_mode": sc.preemption_mode,
        "enable_prefix_caching": sc.prefix_caching,
        "max_num_seqs": sc.max_num_seqs,
        "allocator": sc.allocator,
        "enable_chunked_prefill": sc.chunked_prefill,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "speculative_config": (
            SPECULATION[sc.speculative]
            | {"num_speculative_tokens": sc.num_speculative_tokens}
            if sc.speculative
            else None
        ),
        "prefix_cache_policy": sc.prefix_cache_policy,
        "max_decode_rows": sc.max_decode_rows,
        "scheduling_policy": sc.scheduling_policy,
        "kv_offload_frames": sc.kv_offload_frames,
        "admission": sc.admission,
        "admission_window": sc.admission_window,
        "kv_cache_dtype": sc.kv_cache_dtype,
    }


SPECULATION = {
    "ngram": {"method": "ngram", "prompt_lookup_max": 3, "prompt_lookup_min": 1},
    "draft_layers": {"method": "draft_layers", "num_draft_layers": 1},
}


def accepts(llm, reqs: list[Req], options: dict, num_blocks: int) -> bool:
    try:
        engine = llm.new_engine(num_blocks=num_blocks, **options)
        for r in reqs:
            engine.add_request(r.rid, {"prompt_token_ids": r.prompt}, r.params)
    except ValueError:
        return False
    return True


def smallest_pool(llm, reqs: list[Req], options: dict) -> int:
    """The fewest frames with which add_request accepts every request (found by
    trying)."""
    high = 1
    while not accepts(llm, reqs, options, high):
        high *= 2
        if high > 1 << 16:
            raise FuzzFailure(
                "never-accepted", "no pool up to 65536 frames accepts these requests"
            )
    low = high // 2  # rejected (or 0)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (
            (low, middle) if accepts(llm, reqs, options, middle) else (middle, high)
        )
    return high


def run_scenario(llm, sc: Scenario, stats: Stats | None = None) -> Stats:
    """Run one scenario; raises FuzzFailure (or the engine's exception) at the first
    problem."""
    stats = stats or Stats()
    vocab = llm.model.config.vocab_size
    words = [llm.tokenizer.decode([t]) for t in range(5, vocab)]
    reqs = draw_requests(sc, vocab, words)
    options = engine_options(sc)
    num_blocks = smallest_pool(llm, reqs, options)
    num_blocks += int(np.ceil(sc.pool_slack * num_blocks))
    engine = llm.new_engine(num_blocks=num_blocks, **options)
    checker = Checker(engine, stats)
    stats.scenarios += 1
    stats.options.update(
        [
            f"block_size={sc.block_size}",
            sc.scheduler,
            sc.preemption_mode,
            f"prefix_caching={sc.prefix_caching}",
            sc.allocator,
            f"chunked_prefill={sc.chunked_prefill}",
            f"speculative={sc.speculative}",
            f"prefix_cache_policy={sc.prefix_cache_policy}",
            f"scheduling_policy={sc.scheduling_policy}",
            f"kv_offload={bool(sc.kv_offload_frames)}",
            f"admission={sc.admission}",
            f"kv_cache_dtype={sc.kv_cache_dtype}",
        ]
    )
    stats.options.update(
        ["structured_outputs"]
        * sum(r.params.structured_outputs is not None for r in reqs)
    )
    rng = np.random.default_rng([BASE_SEED, sc.seed, 2])
    pending = sorted(reqs, key=lambda r: r.arrival)
    by_id = {r.rid: r for r in reqs}
    # live request -> waiting / running / swapped (from the reports)
    state: dict[str, str] = {}
    outputs, aborted = {}, set()
    budget = 50 + 6 * sum(len(r.prompt) + r.params.max_tokens for r in reqs)
    step, last_prefills = 0, set()
    while pending or engine.has_unfinished_requests():
        while pending and (
            pending[0].arrival <= step or not engine.has_unfinished_requests()
        ):
            r = pending.pop(0)
            urgency = (
                {"priority": int(r.rid[1:]) % 3}
                if sc.scheduling_policy == "priority"
                else {}
            )
            urgency |= (
                {"client": f"c{int(r.rid[1:]) % 3}"}
                if sc.scheduling_policy == "fair" or sc.max_decode_rows
                else {}
            )
            engine.add_request(
                r.rid, {"prompt_token_ids": list(r.prompt)}, r.params, **urgency
            )
            state[r.rid] = "waiting"
            stats.requests += 1
            stats.kinds[r.kind] += 1
            checker.check(f"after add_request({r.rid}) at step {step}")
        if state and rng.random() < sc.abort_rate * (
            4 if "swapped" in state.values() else 1
        ):
            groups: dict[str, list] = {}
            for rid, where in state.items():
                groups.setdefault(where, []).append(rid)
            # swapped requests are few and short-lived: aim at them when there are some
            where = (
                "swapped"
                if "swapped" in groups and rng.random() < 0.7
                else sorted(groups)[int(rng.integers(len(groups)))]
            )
            rid = groups[where][int(rng.integers(len(groups[where])))]
            outputs[rid] = engine.abort_request(rid)
            aborted.add(rid)
            del state[rid]
            stats.aborts[where] += 1
            checker.check(f"after abort_request({rid}) ({where}) at step {step}")
            if not engine.has_unfinished_requests():
                continue
        report = engine.step()
        stats.report(report)
        if len(report.ran) + report.padding > sc.max_num_seqs:
            raise FuzzFailure(
                "over-max-num-seqs",
                f"step {step} ran {len(report.ran) + report.padding} "
                f"sequences with max_num_seqs={sc.max_num_seqs}: {report.ran}",
            )
        prefills = {(rid, i) for rid, i, kind, _ in report.ran if kind == "prefill"}
        stats.prompt_chunks += len(prefills & last_prefills)
        last_prefills = prefills
        for rid, *_ in report.ran:
            if rid in state:
                state[rid] = "running"
        for rid, mode in report.preempted:
            if rid in state:
                state[rid] = "swapped" if mode == "swap" else "waiting"
        for out in report.finished:
            if out.request_id not in state:
                raise FuzzFailure(
                    "unexpected-finished-output",
                    f"step {step}: output for {out.request_id!r}, "
                    "which is not live (finished twice, aborted, or never added)",
                )
            del state[out.request_id]
            outputs[out.request_id] = out
        checker.check(f"after step {step}", report.finished)
        step += 1
        if step > budget:
            raise FuzzFailure(
                "no-progress", f"{step} steps and requests {sorted(state)} still live"
            )
    checker.check_idle("at the end")
    stats.tier_hits += getattr(engine.blocks, "tier_hits", 0)
    missing = set(by_id) - set(outputs)
    if missing:
        raise FuzzFailure("lost-request", f"no output for {sorted(missing)}")
    max_model_len = engine.max_model_len
    for rid, out in outputs.items():
        r = by_id[rid]
        where = f"request {rid} ({r.kind}{', aborted' if rid in aborted else ''})"
        check_output(
            out,
            r.prompt,
            r.params,
            max_model_len,
            sc.prefix_caching and sc.scheduler != "static",
            rid in aborted,
            where,
        )
        ref = alone(
            llm,
            sc.block_size,
            max_model_len,
            r.prompt,
            r.params,
            stats,
            sc.kv_cache_dtype,
        )
        # speculation draws other random numbers
        if r.params.greedy or not sc.speculative:
            compare(out, ref, r.params, rid in aborted, where)
        stats.finish_reasons.update(c.finish_reason for c in out.outputs)
    return stats


def run_many(llm, scenarios, stats: Stats) -> None:
    for sc in scenarios:
        try:
            run_scenario(llm, sc, stats)
        except Exception as error:  # noqa: BLE001 - every failure is collected, then reported
            stats.failures.append((failure_kind(error), sc.short(), describe(error)))


def print_size(capsys, name: str, stats: Stats) -> None:
    with capsys.disabled():
        print(f"\n{name}: {stats.line()}; {len(stats.failures)} failing")


def test_fuzz_engine(llm, capsys):
    seeds = ONLY or range(NUM_SCENARIOS)
    stats = Stats()
    run_many(llm, [Scenario.draw(seed) for seed in seeds], stats)
    print_size(capsys, "engine fuzz", stats)
    repro = (
        "MINIPAGED_FUZZ_ONLY=<seed> .venv/bin/python -m pytest"
        " tests/test_engine_fuzz.py -k fuzz_engine"
        + (f" (with MINIPAGED_FUZZ_SEED={BASE_SEED})" if BASE_SEED else "")
    )
    assert not stats.failures, failure_summary(stats, repro)
    if ONLY or SCALE < 1:
        return
    # the run must have exercised what it claims to test
    assert stats.preempted["recompute"] and stats.preempted["swap"], stats.line()
    assert (
        stats.aborts["waiting"] and stats.aborts["running"] and stats.aborts["swapped"]
    ), stats.line()
    assert stats.copies and stats.cached_tokens and stats.swapped_in, stats.line()
    assert all(stats.options[f"block_size={b}"] for b in BLOCK_SIZES), stats.options
    assert stats.options["static"] and stats.kinds["beam"] and stats.kinds["samples"], (
        stats.line()
    )
    assert all(stats.options[f"contiguous-{r}"] for r in ("max", "pow2", "oracle")), (
        stats.options
    )
    assert stats.options["chunked_prefill=True"] and stats.prompt_chunks, stats.line()
    assert (
        stats.options["speculative=ngram"] and stats.options["speculative=draft_layers"]
    ), stats.options
    assert all(
        stats.options[f"prefix_cache_policy={p}"]
        for p in ("lru", "fifo", "clock", "random")
    ), stats.options
    assert all(
        stats.options[f"scheduling_policy={p}"]
        for p in ("fcfs", "sjf", "aging", "priority", "fair")
    ), stats.options
    assert stats.options["admission=working-set"], stats.options
    assert stats.options["kv_offload=True"] and stats.tier_hits, stats.line()
    assert (
        stats.options["kv_cache_dtype=int8"] and stats.options["kv_cache_dtype=fp8"]
    ), stats.options
    assert stats.options["structured_outputs"], stats.options
    assert 0 < stats.accepted < stats.guessed, stats.line()
    assert (
        stats.finish_reasons["stop"]
        and stats.finish_reasons["length"]
        and stats.finish_reasons["abort"]
    )


def test_fuzz_engine_on_helper_processes(llm, capsys, monkeypatch):
    """Scenarios again (a fifth as many) with every product split between this process
    and a helper process (model/team.py), as a server's on Linux x86-64: the same
    checks, and each request's tokens against its run alone, on the team too."""
    from minipaged.model import cpu, team

    if team.supported() is not None:
        pytest.skip(team.supported())
    if not isinstance(llm.model.lm_head, cpu.PanelWeight):
        pytest.skip("this machine's BLAS took no weight panels (panels_pay)")
    monkeypatch.setattr(cpu._cores, "now", 2)
    monkeypatch.setattr(cpu._cores, "period", float("inf"))
    monkeypatch.delenv("MINIPAGED_CPU_HELPERS", raising=False)
    assert cpu.start_team(llm.model.projection_weights(), 1).startswith("1 helper")
    stats = Stats()
    try:
        seeds = ONLY or range(max(1, NUM_SCENARIOS // 5))
        run_many(llm, [Scenario.draw(seed) for seed in seeds], stats)
    finally:
        cpu.stop_team()
    print_size(capsys, "engine fuzz on helper processes", stats)
    assert not stats.failures, failure_summary(stats, "(see test_fuzz_engine)")


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_scenario(llm, name, capsys):
    """One feature pair at a time, over a few seeds (failures of the fuzzer land here
    too)."""
    stats = Stats()
    base = NAMED[name]
    run_many(
        llm,
        [
            Scenario(
                **{f.name: getattr(base, f.name) for f in fields(base)} | {"seed": s}
            )
            for s in range(NAMED_SEEDS)
        ],
        stats,
    )
    repro = (
        f".venv/bin/python -m pytest tests/test_engine_fuzz.py -k 'named and {name}'"
    )
    assert not stats.failures, failure_summary(stats, repro)


# ---- generate / stream / add_request interleavings on one LLM ------------------------


def run_interleaving(folder, seed: int, stats: Stats) -> list[FuzzFailure]:
    """Random generate / stream / add_request calls on one LLM. Output checks that fail
    are collected and the run goes on (the LLM must stay usable); an exception from the
    engine ends the run."""
    rng = np.random.default_rng([BASE_SEED, seed, 3])
    pick = picker(rng)
    block_size, max_model_len = pick((2, 5, 16)), 40
    prefix_caching = bool(rng.random() < 0.5)
    llm = LLM(
        str(folder),
        device="cpu",
        block_size=block_size,
        max_model_len=max_model_len,
        num_blocks=4 * -(-max_model_len // block_size),
        preemption_mode=pick(("recompute", "swap")),
        enable_prefix_caching=prefix_caching,
    )
    engine = llm.engine
    checker = Checker(engine, stats)
    original_step, idle_steps = engine.step, [0]

    def checked_step():
        idle_steps[0] = 0 if engine.has_unfinished_requests() else idle_steps[0] + 1
        if idle_steps[0] > 20:
            raise FuzzFailure(
                "steps-an-idle-engine",
                "more than 20 steps of an idle engine: "
                "a loop waits for an output that will never come",
            )
        report = original_step()
        stats.report(report)
        checker.check(f"step {report.step}", report.finished)
        return report

    engine.step = checked_step  # the engine instance only: every step is checked

    vocab = llm.model.config.vocab_size
    words = [llm.tokenizer.decode([t]) for t in range(5, vocab)]
    sc = Scenario(seed, max_model_len=max_model_len, long_rate=0.1)
    shared = rng.integers(5, vocab, 12).tolist()
    soft: list[FuzzFailure] = []

    def checked(function, *args):
        try:
            function(*args)
        except FuzzFailure as failure:
            soft.append(failure)

    def request():
        prompt = (
            shared[: int(rng.integers(0, 13))]
            + rng.integers(5, vocab, int(rng.integers(1, 12))).tolist()
        )
        kind = pick(("greedy", "sampled", "samples", "beam"))
        stats.kinds[kind] += 1
        return prompt, draw_params(
            rng, kind, len(prompt), max_model_len, sc, vocab, words
        )

    def expect(prompt, params):
        return alone(llm, block_size, llm.max_model_len, prompt, params, stats)

    def check_final(out, prompt, params, label):
        check_output(
            out, prompt, params, llm.max_model_len, prefix_caching, False, label
        )
        compare(out, expect(prompt, params), params, False, label)

    def stop_inside(prompt, p):
        """The same request with a stop string that its own text holds across two tokens
        (so the text before it must be held back while the stream cannot know yet)."""
        plain = SamplingParams(
            **{f.name: getattr(p, f.name) for f in fields(p)} | {"stop": [], "n": 1}
        )
        texts = [
            llm.tokenizer.decode([t])
            for t in expect(prompt, plain).outputs[0].token_ids
        ]
        # special tokens: ''
        pairs = [k for k in range(1, len(texts) - 1) if texts[k] and texts[k + 1]]
        if not pairs:
            return p
        k = pairs[int(rng.integers(len(pairs)))]
        left, right = texts[k], texts[k + 1]
        stop = (
            f"{left[-int(rng.integers(1, len(left) + 1)) :]}"
            f" {right[: int(rng.integers(1, len(right) + 1))]}"
        )
        stats.kinds["stop-inside"] += 1
        return SamplingParams(
            **{f.name: getattr(p, f.name) for f in fields(p)}
            | {"stop": [stop], "min_tokens": 0}
        )

    def generate(label):
        batch = [request() for _ in range(int(rng.integers(1, 4)))]
        prompts, params = (
            [{"prompt_token_ids": p} for p, _ in batch],
            [p for _, p in batch],
        )
        # a prompt add_request refuses: the others must still come back right
        bad = [vocab + 5]
        if rng.random() < 0.3:
            at = int(rng.integers(len(prompts) + 1))
            prompts.insert(at, {"prompt_token_ids": bad})
            params.insert(at, SamplingParams(max_tokens=3))
        outs = llm.generate(prompts, params, use_tqdm=False)
        stats.requests += len(prompts)
        if len(outs) != len(prompts):
            raise FuzzFailure(
                "generate-count",
                f"{label}: {len(outs)} outputs for {len(prompts)} prompts",
            )
        for i, (prompt, p, out) in enumerate(zip(prompts, params, outs)):
            if prompt["prompt_token_ids"] == bad:
                if out.outputs[0].finish_reason != "rejected" or not out.error:
                    soft.append(
                        FuzzFailure(
                            "generate-bad-prompt", f"{label}: a bad prompt got {out}"
                        )
                    )
            else:
                checked(
                    check_final,
                    out,
                    prompt["prompt_token_ids"],
                    p,
                    f"{label}: generate output {i}",
                )

    def stream(op, label, abandoned):
        prompt, p = request()
        if p.beam_width == 1 and rng.random() < 0.5:
            p = stop_inside(prompt, p)
        ref = expect(prompt, p)
        pieces, stream = [], llm.stream({"prompt_token_ids": prompt}, p)
        stats.requests += 1
        # >= 1: the request is added
        wanted = None if op == "stream-full" else int(rng.integers(1, 4))
        try:
            while wanted is None or len(pieces) < wanted:
                pieces.append(next(stream))
        except StopIteration:
            wanted = None
        text = "".join(pieces)
        if wanted is None:  # it ran to its end
            if llm.last_output is None:
                soft.append(
                    FuzzFailure(
                        "stream-no-last-output",
                        f"{label}: no last_output after the end",
                    )
                )
            else:
                checked(check_final, llm.last_output, prompt, p, label)
            if text != ref.outputs[0].text:
                kind = "stream-sent-nothing" if not text else "stream-text-differs"
                soft.append(
                    FuzzFailure(
                        kind,
                        f"{label}: a finished stream sent {text!r}, the final "
                        f"text is {ref.outputs[0].text!r} ({p})",
                    )
                )
            return
        if not ref.outputs[0].text.startswith(text):
            soft.append(
                FuzzFailure(
                    "stream-text-beyond-final",
                    f"{label}: streamed {text!r}, which the final "
                    f"text {ref.outputs[0].text!r} does not start with ({p})",
                )
            )
        if op == "stream-close":
            stream.close()
            last = llm.last_output
            if last is not None and p.beam_width == 1:
                checked(compare, last, ref, p, True, label + " (closed early)")
        elif op == "stream-abandon":
            # still referenced: its request stays in the engine
            abandoned.append(stream)
        # stream-drop: the last reference goes now; CPython closes the generator

    abandoned, direct = [], 0
    for op_index in range(int(rng.integers(4, 9))):
        op = pick(
            (
                "generate",
                "stream-full",
                "stream-close",
                "stream-abandon",
                "stream-drop",
                "add-direct",
            )
        )
        label = f"op {op_index} ({op})"
        if op == "generate":
            generate(label)
        elif op == "add-direct":
            prompt, p = request()
            rid = pick(
                (
                    f"mine-{direct}",
                    f"gen-{int(rng.integers(0, 4))}",
                    f"stream-{int(rng.integers(0, 4))}",
                )
            )
            direct += 1
            try:
                engine.add_request(rid, {"prompt_token_ids": prompt}, p)
                stats.requests += 1
            except ValueError:
                pass  # an id in use may be refused, saying so: the user's mistake
        else:
            stream(op, label, abandoned)
    generate("final generate")
    for generator in abandoned:
        generator.close()
    steps = 0
    while engine.has_unfinished_requests():  # requests added directly may still run
        engine.step()
        steps += 1
        if steps > 1000:
            raise FuzzFailure("no-progress", "1000 steps draining the engine")
    checker.check_idle("after draining")
    stats.scenarios += 1
    return soft


def test_generate_stream_interleavings(folder, capsys):
    stats = Stats()
    for seed in ONLY or range(NUM_INTERLEAVINGS):
        label = f"interleaving seed={seed}"
        try:
            soft = run_interleaving(folder, seed, stats)
        except Exception as error:  # noqa: BLE001
            stats.failures.append((failure_kind(error), label, describe(error)))
            continue
        stats.failures += [(failure.kind, label, str(failure)) for failure in soft]
    print_size(capsys, "generate/stream interleavings", stats)
    repro = (
        "MINIPAGED_FUZZ_ONLY=<seed> .venv/bin/python -m pytest"
        " tests/test_engine_fuzz.py -k interleavings"
    )
    assert not stats.failures, failure_summary(stats, repro)


# python tests/test_engine_fuzz.py 22 80 | static-aborts: one run, told step by step
if __name__ == "__main__":
    import sys
    import tempfile

    from checkpoints import write_checkpoint

    model = LLM(str(write_checkpoint(tempfile.mkdtemp())), device="cpu", num_blocks=64)
    vocab_size = model.model.config.vocab_size
    vocabulary = [model.tokenizer.decode([t]) for t in range(5, vocab_size)]
    for arg in sys.argv[1:] or ["0"]:
        scenarios = [NAMED[arg]] if arg in NAMED else [Scenario.draw(int(arg))]
        for scenario in scenarios:
            print(scenario.short())
            for r in draw_requests(scenario, vocab_size, vocabulary):
                print(
                    f"  {r.rid} at step {r.arrival}: {r.kind}, prompt {r.prompt},"
                    f" {r.params}"
                )
            try:
                print("  ok:", run_scenario(model, scenario).line())
            except Exception as error:  # noqa: BLE001
                print("  FAILED:", describe(error))
