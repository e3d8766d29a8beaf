"""`python -m minipaged.bench drum`: the drum, a tier behind the KV pool, on returning
chats.

A multi-turn chat trace runs one request at a time through a pool too small to keep the
other conversations' prefixes: without a tier, with one (kv_offload_frames), and with
that memory all in the pool (the bound). Reports time to first token of returning turns
and the tier's hit rate.
"""

from __future__ import annotations

import statistics
import tempfile
import time

from tqdm import tqdm

from minipaged.llm import number
from minipaged.tools.bench.common import OptionError, load, model_arguments
from minipaged.tools.bench.workload import chat_trace
from minipaged.tools.viz import BarChart

# the trace's shape: short questions after long answers, so that a returning turn's
# prompt is mostly history (what the tier can give back) and a little new text (what
# must be computed)
SYSTEM_LEN, QUESTION_MEAN, ANSWER_MEAN = 96, 16, 64
# the default model's: the trace's random token ids are drawn below it
SMOLLM2_VOCAB = 49152


def add_arguments(parser) -> None:
    parser.add_argument(
        "--conversations",
        type=number(int, 1),
        default=4,
        help="conversations in the chat trace (default %(default)s)",
    )
    parser.add_argument(
        "--turns",
        type=number(int, 2),
        default=4,
        help="turns of each (default %(default)s)",
    )
    parser.add_argument(
        "--active",
        type=number(int, 1),
        default=4,
        help=(
            "conversations taking turns at a time, in random order (default"
            " %(default)s)"
        ),
    )
    parser.add_argument(
        "--pool-frames",
        type=number(int, 1),
        default=28,
        help=(
            "frames of 16 tokens in the KV pool: small, so that the other conversations"
            " push a conversation's prefix out between its turns (default %(default)s:"
            " the longest turn of the default trace and one frame more)"
        ),
    )
    parser.add_argument(
        "--tier-frames",
        type=number(int, 1),
        default=256,
        help="frames in the tier behind it, kv_offload_frames (default %(default)s)",
    )
    parser.add_argument(
        "--file",
        action="store_true",
        help="also run the tier in a file (numpy.memmap in a temporary folder)",
    )
    parser.add_argument(
        "--max-tokens",
        type=number(int, 1),
        default=2,
        help=(
            "tokens generated per turn: the first is what is timed (default"
            " %(default)s)"
        ),
    )
    parser.add_argument(
        "--repeats",
        type=number(int, 1),
        default=2,
        help=(
            "runs of the trace per configuration; the median per request (default"
            " %(default)s)"
        ),
    )
    model_arguments(parser)


def configurations(args, folder: str) -> dict[str, dict]:
    """Label -> engine options: the small pool alone, with the tier (in memory, and in a
    file with --file), and the pool holding the tier's frames too (the most the tier can
    give).
    """
    pool = {"num_blocks": args.pool_frames, "block_size": 16}
    configs = {
        "pool": pool,
        "pool + tier": pool | {"kv_offload_frames": args.tier_frames},
    }
    if args.file:
        configs["pool + tier in a file"] = configs["pool + tier"] | {
            "kv_offload_path": f"{folder}/drum.bin"
        }
    configs["large pool"] = pool | {"num_blocks": args.pool_frames + args.tier_frames}
    return configs


def bench_drum(args) -> dict:
    """The trace's turns one at a time, greedy, --max-tokens each, through each
    configuration (--repeats times, interleaved; medians). Time to first token of
    returning turns is what the
    tier should cut: their prefixes come back from it instead of being recomputed."""
    from minipaged.sampling import SamplingParams

    llm, threads = load(args)
    trace = make_trace(
        args.conversations, args.turns, args.active, llm.model.config.vocab_size
    )
    if max(len(t.prompt) for t in trace) + args.max_tokens > args.pool_frames * 16:
        raise OptionError(
            f"--pool-frames {args.pool_frames} cannot hold the trace's longest prompt"
        )
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    with tempfile.TemporaryDirectory() as folder:
        configs = configurations(args, folder)
        runs = {label: [] for label in configs}
        for repeat in range(args.repeats):
            for label, options in configs.items():
                runs[label].append(
                    run_trace(
                        llm.new_engine(**options),
                        trace,
                        params,
                        f"{label} #{repeat + 1}",
                    )
                )
    first_turn = [
        not any(t.conversation == turn.conversation for t in trace[:i])
        for i, turn in enumerate(trace)
    ]
    rows = {label: summarize(r, first_turn) for label, r in runs.items()}
    tokens, pool, large = rows["pool"].pop("outputs"), rows["pool"], rows["large pool"]
    for row in list(rows.values())[1:]:
        row["identical_to_pool"] = row.pop("outputs") == tokens
        row["returning_speedup"] = (
            pool["ttft_returning_p50_ms"] / row["ttft_returning_p50_ms"]
        )
        # of the cached tokens the small pool lost against the large one, the share this
        # one got back
        lost = large["cached_tokens"] - pool["cached_tokens"]
        row["recovered"] = (
            (row["cached_tokens"] - pool["cached_tokens"]) / lost if lost else None
        )
    result = {
        "model": llm.model_name,
        "device": llm.device,
        "blas_threads": threads,
        "block_size": 16,
        "pool_frames": args.pool_frames,
        "tier_frames": args.tier_frames,
        "requests": len(trace),
        "returning": len(trace) - sum(first_turn),
        "conversations": args.conversations,
        "turns": args.turns,
        "active": args.active,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "seed": 0,
        "configs": rows,
    }
    if not args.json:
        print_table(result)
    return result


def make_trace(
    conversations: int = 4,
    turns: int = 4,
    active: int = 4,
    vocab: int = SMOLLM2_VOCAB,
    seed: int = 0,
):
    """The benchmark's chat trace (the defaults: its default run, on SmolLM2's
    vocabulary)."""
    return chat_trace(
        conversations,
        turns,
        active=active,
        system_len=SYSTEM_LEN,
        question_mean=QUESTION_MEAN,
        answer_mean=ANSWER_MEAN,
        vocab=vocab,
        seed=seed,
    )


def run_trace(engine, trace, params, desc: str | None = None) -> dict:
    """Each turn alone through the engine: its time to first token, cached tokens and
    tokens (a progress bar named `desc` on stderr; None: none)."""
    ttft, cached, outputs = [], [], []
    for i, turn in enumerate(
        tqdm(trace, desc=desc, unit="req", leave=False, disable=desc is None)
    ):
        start, first = time.perf_counter(), None
        engine.add_request(f"turn-{i}", {"prompt_token_ids": turn.prompt}, params)
        while engine.has_unfinished_requests():
            report = engine.step()
            # one request: its first step samples its first token
            first = first or time.perf_counter()
            for output in report.finished:
                cached.append(output.num_cached_tokens)
                outputs.append(output.outputs[0].token_ids)
        ttft.append(first - start)
    blocks, prompt_tokens = engine.blocks, sum(len(t.prompt) for t in trace)
    tier = (
        {
            "tier_hits": blocks.tier_hits,
            "tier_queries": blocks.tier_queries,
            "stores": blocks.tier.stores,
            "loads": blocks.tier.loads,
            "evictions": blocks.tier.evictions,
        }
        if blocks.tier
        else None
    )
    return {
        "ttft": ttft,
        "cached": cached,
        "outputs": outputs,
        "prompt_tokens": prompt_tokens,
        "pool_hits": blocks.prefix_cache_hits,
        "tier": tier,
    }


def summarize(runs: list[dict], first_turn: list[bool]) -> dict:
    """Per request the median TTFT over the runs; then medians over first and returning
    turns. Counts come from the first run (greedy and one at a time: every run does the
    same).
    """
    ttft = [
        statistics.median(r["ttft"][i] for r in runs) for i in range(len(first_turn))
    ]
    run = runs[0]
    returning = [t for t, first in zip(ttft, first_turn) if not first]
    row = {
        "ttft_first_p50_ms": (
            1e3 * statistics.median(t for t, f in zip(ttft, first_turn) if f)
        ),
        "ttft_returning_p50_ms": 1e3 * statistics.median(returning),
        "ttft_returning_p90_ms": (
            1e3 * statistics.quantiles(returning, n=10)[-1]
            if len(returning) > 1
            else 1e3 * returning[0]
        ),
        "ttft_ms": [1e3 * t for t in ttft],
        "prompt_tokens": run["prompt_tokens"],
        "cached_tokens": sum(run["cached"]),
        "computed_tokens": run["prompt_tokens"] - sum(run["cached"]),
        "pool_hit_tokens": run["pool_hits"],
        "tier": run["tier"],
        "outputs": run["outputs"],
    }
    if run["tier"]:
        row["tier"]["hit_rate"] = run["tier"]["tier_hits"] / max(
            1, run["tier"]["tier_queries"]
        )
    return row


def replay(
    trace,
    num_blocks: int,
    tier_frames: int = 0,
    block_size: int = 16,
    max_tokens: int = 2,
) -> list[dict]:
    """The trace through a block manager alone, no model, turn by turn as run_trace
    serves it (allocate the prompt, append the slots of the max_tokens - 1 tokens fed
    back, free): per turn, the prompt tokens found in the pool, loaded from the tier,
    and computed. Fast, and the same on every machine."""
    from minipaged.paging import BlockManager

    manager, rows = BlockManager(num_blocks, block_size), []
    if tier_frames:
        manager.add_tier(tier_frames)
    for i, turn in enumerate(trace):
        pool, tier = manager.prefix_cache_hits, manager.tier_hits
        cached = manager.allocate(i, turn.prompt)
        for _ in range(max_tokens - 1):  # the last token sampled is never fed back
            manager.append_slot(i, 0)
        manager.free(i)
        manager.take_tier_moves()
        rows.append(
            {
                "pool": manager.prefix_cache_hits - pool,
                "tier": manager.tier_hits - tier,
                "computed": len(turn.prompt) - cached,
            }
        )
    return rows


def print_table(result: dict) -> None:
    print(
        f"{result['model']} on {result['device']} ({result['blas_threads']} BLAS"
        f" threads): {result['requests']} turns of {result['conversations']}"
        f" conversations ({result['returning']} returning), one at a time; pool"
        f" {result['pool_frames']} frames of 16 tokens, tier {result['tier_frames']};"
        f" median of {result['repeats']} runs"
    )
    print(
        f"  {'':<22} {'TTFT first':>11} {'returning p50':>14} {'p90':>9}"
        f" {'speed-up':>9} {'computed':>9} {'cached':>7} {'tier hit rate':>14}"
        f" {'recovered':>10}  same tokens"
    )
    for label, r in result["configs"].items():
        rate = f"{100 * r['tier']['hit_rate']:.0f}%" if r["tier"] else "-"
        recovered = (
            "-" if r.get("recovered") is None else f"{100 * r['recovered']:.0f}%"
        )
        same = "yes" if r.get("identical_to_pool", True) else "NO"
        print(
            f"  {label:<22} {r['ttft_first_p50_ms']:9.0f}ms"
            f" {r['ttft_returning_p50_ms']:12.0f}ms {r['ttft_returning_p90_ms']:7.0f}ms"
            f" {r.get('returning_speedup', 1.0):8.2f}x {r['computed_tokens']:9d}"
            f" {r['cached_tokens']:7d} {rate:>14} {recovered:>10}  {same}"
        )
    print(
        "  (tier hit rate: of the prompt tokens the pool did not hold, the share the"
        " tier did; recovered: of the cached tokens the small pool lost against the"
        " large one, the share it got back)"
    )


def sources_chart(trace, num_blocks: int, tier_frames: int) -> BarChart:
    """Each returning turn's prompt tokens by where they came from (replay), as a
    stacked bar."""
    rows = replay(trace, num_blocks, tier_frames)
    turns = [
        i
        for i, t in enumerate(trace)
        if any(u.conversation == t.conversation for u in trace[:i])
    ]
    return BarChart(
        "returning turns' prompt tokens: from the pool, from the tier, computed (pool"
        f" {num_blocks} frames, tier {tier_frames})",
        [f"turn {i}" for i in turns],
        {
            source: [rows[i][source] for i in turns]
            for source in ("pool", "tier", "computed")
        },
        unit=" tok",
        digits=0,
    )


def ttft_chart(result: dict) -> BarChart:
    """Median time to first token of first and of returning turns, per configuration (a
    result of bench_drum)."""
    rows = [
        (label, kind) for label in result["configs"] for kind in ("first", "returning")
    ]
    return BarChart(
        f"time to first token, SmolLM2 on {result['device']}, pool"
        f" {result['pool_frames']} frames (median; ms)",
        [f"{label}, {kind}" for label, kind in rows],
        {
            "ms": [
                result["configs"][label][f"ttft_{kind}_p50_ms"] for label, kind in rows
            ]
        },
        unit=" ms",
        digits=0,
    )
