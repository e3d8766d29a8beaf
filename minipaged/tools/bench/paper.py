"""The paper's measurements, reproduced: `python -m minipaged.bench
{fragmentation,chunked} [--json]`.

fragmentation is Figure 2 of the vLLM paper, simulated; chunked runs the real engine,
with and without chunked prefill. Each prints a text chart (and draws an SVG with --svg
FILE).
"""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from minipaged.llm import number
from minipaged.tools.bench.common import (
    OptionError,
    load,
    model_arguments,
    random_prompts,
    show,
)
from minipaged.tools.bench.simulate import PROFILES, fragmentation
from minipaged.tools.bench.workload import RequestSpec
from minipaged.tools.viz import BarChart

PAPER_TOKEN_STATES = {
    "contiguous-max": 0.204,
    "contiguous-pow2": 0.268,
    "contiguous-oracle": 0.382,
    "paged": 0.963,
}  # Kwon et al., SOSP 2023, Figure 2 (Orca Max / Pow2 / Oracle, vLLM)
SHARES = ("token_states", "reserved", "internal", "external")


def fragmentation_arguments(parser) -> None:
    parser.add_argument(
        "--requests",
        type=number(int, 1),
        default=1000,
        help="requests in the trace (default %(default)s)",
    )
    parser.add_argument(
        "--block-size",
        type=number(int, 1, PROFILES["opt-13b-a100"].max_model_len),
        default=16,
        help="paging's block size, at most a request's context (default %(default)s)",
    )
    parser.add_argument(
        "--svg", default=None, help="also write the stacked bars to this SVG file"
    )


def bench_fragmentation(args) -> dict:
    """One ShareGPT-like trace through each allocator (Orca's max / pow2 / oracle
    chunks, and paging) with the real scheduler (minipaged.simulate): where the KV slots
    are while requests wait: token states, reserved, internal, external."""
    result = fragmentation(args.requests, args.block_size, desc="fragmentation")
    show(args, fragmentation_chart(result), fragmentation_table(result))
    return result


def fragmentation_chart(result: dict) -> BarChart:
    return BarChart(
        "where the KV slots are while requests wait (% of the pool; ShareGPT-like"
        " trace)",
        list(result),
        {
            name.replace("_", " "): [100 * r[name] for r in result.values()]
            for name in SHARES
        },
        unit="%",
    )


def fragmentation_table(result: dict) -> str:
    lines = [f"{'allocator':<18} {'token states':>12} {'paper':>7} {'refusals':>9}"]
    for name, r in result.items():
        lines.append(
            f"{name:<18} {100 * r['token_states']:>11.1f}%"
            f" {100 * PAPER_TOKEN_STATES[name]:>6.1f}% {r['refusals']:>9}"
        )
    lines.append(
        "refusals: admissions refused while enough slots were free in total (external"
        " fragmentation)"
    )
    return "\n".join(lines)


def chunked_arguments(parser) -> None:
    model_arguments(parser)
    parser.add_argument(
        "--decodes",
        type=number(int, 1),
        default=4,
        help="requests decoding throughout (default %(default)s)",
    )
    parser.add_argument(
        "--prompts",
        type=number(int, 1),
        default=4,
        help="long prompts arriving (default %(default)s)",
    )
    parser.add_argument(
        "--prompt-len",
        type=number(int, 1),
        default=768,
        help="tokens of each long prompt (default %(default)s)",
    )
    parser.add_argument(
        "--budget",
        type=number(int, 1),
        default=64,
        help="max_num_batched_tokens with chunking (default %(default)s)",
    )


def bench_chunked(args) -> dict:
    """Decodes run throughout; every few steps a long prompt arrives. Time per output
    token of the decoding requests (the steps' durations, as they see them) with and
    without chunks.
    """
    result = {}
    for name, options in (
        ("one-step prefill", {}),
        (
            "chunked prefill",
            {"enable_chunked_prefill": True, "max_num_batched_tokens": args.budget},
        ),
    ):
        llm = load(args, num_blocks=512, block_size=16, **options)[0]
        if args.prompt_len >= llm.max_model_len:
            raise OptionError(
                f"--prompt-len {args.prompt_len} does not fit this model's context"
                f" here, {llm.max_model_len} tokens (one token must be generated)"
            )
        result[name] = decode_tpot(
            llm, args.decodes, args.prompts, args.prompt_len, desc=f"chunked: {name}"
        )
    if not args.json:
        for name, r in result.items():
            print(
                f"{name:>17}: decode time per output token p50"
                f" {1000 * r['tpot_p50']:.1f} ms, p99 {1000 * r['tpot_p99']:.1f} ms,"
                f" max {1000 * r['tpot_max']:.1f} ms ({r['decode_steps']} decode steps,"
                f" {r['seconds']:.1f} s)"
            )
    return result


def decode_tpot(
    llm, num_decodes: int, num_prompts: int, prompt_len: int, desc: str | None = None
) -> dict:
    """The decoding requests' time per output token, a long prompt arriving every 40
    steps; a progress bar titled `desc` (none without) counts their decode steps."""
    from minipaged.sampling import SamplingParams

    engine, vocab = llm.engine, llm.model.config.vocab_size
    long_answer = SamplingParams(
        temperature=0, max_tokens=40 * (num_prompts + 1), ignore_eos=True
    )
    long_prompts = random_prompts([RequestSpec(prompt_len, 1)] * num_prompts, 1, vocab)
    for i, ids in enumerate(
        random_prompts(
            [RequestSpec(16, long_answer.max_tokens)] * num_decodes, 0, vocab
        )
    ):
        engine.add_request(f"decode-{i}", {"prompt_token_ids": ids}, long_answer)
    gaps, step, arrived = [], 0, 0
    # a decode step per token of the answers but the first, which their prefill gives
    bar = tqdm(
        total=long_answer.max_tokens - 1, desc=desc, unit="step", disable=desc is None
    )
    while engine.has_unfinished_requests():
        if step % 40 == 20 and arrived < num_prompts:
            engine.add_request(
                f"long-{arrived}",
                {"prompt_token_ids": long_prompts[arrived]},
                SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
            )
            arrived += 1
        report = engine.step()
        if any(
            rid.startswith("decode") and kind == "decode"
            for rid, _, kind, _ in report.ran
        ):
            # every decoding request waited this step for its token
            gaps.append(report.seconds)
            bar.update()
        step += 1
    bar.close()
    gaps = np.array(gaps)
    return {
        "tpot_p50": float(np.percentile(gaps, 50)),
        "tpot_p99": float(np.percentile(gaps, 99)),
        "tpot_max": float(gaps.max()),
        "decode_steps": len(gaps),
        "seconds": float(gaps.sum()),
    }
