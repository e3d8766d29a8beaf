"""What one request's stop strings cost every other request (issue 18): two greedy
requests of 150 tokens decode side by side, the second with `--stops` stop strings of
`--length` characters that never match; prints the mean step time while both run, and
how much the stop strings add.

    # the largest list SamplingParams allows:
    python scripts/stop_strings_cost.py
    # the issue's (refused since):
    python scripts/stop_strings_cost.py --stops 20000 --length 40
"""

import argparse
import json
import random
import string
import time

from minipaged import LLM, SamplingParams, sampling

# the bounds SamplingParams enforces (an older minipaged had none: pass --stops and
# --length)
MAX_STOP_STRINGS, MAX_STOP_LEN = (
    getattr(sampling, "MAX_STOP_STRINGS", 16),
    getattr(sampling, "MAX_STOP_LEN", 256),
)


def step_time(llm, stops: list[str], tokens: int) -> float:
    """Mean seconds per engine step while both requests decode."""
    engine = llm.new_engine(num_blocks=64, max_num_seqs=2)
    plain = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    engine.add_request("other", "Tell me about paging.", plain)
    engine.add_request(
        "stops",
        "Tell me about paging.",
        SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, stop=stops),
    )
    engine.step()  # both prompts
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        report = engine.step()
        if len(report.ran) == 2:
            times.append(time.perf_counter() - start)
    return sum(times) / len(times)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops", type=int, default=MAX_STOP_STRINGS)
    parser.add_argument("--length", type=int, default=MAX_STOP_LEN)
    parser.add_argument("--tokens", type=int, default=150)
    args = parser.parse_args()
    rng = random.Random(0)
    stops = [
        "".join(rng.choices(string.ascii_uppercase, k=args.length))
        for _ in range(args.stops)
    ]
    llm = LLM()
    llm.generate(["warm up"], SamplingParams(max_tokens=4), use_tqdm=False)
    without, with_stops = (
        step_time(llm, [], args.tokens),
        step_time(llm, stops, args.tokens),
    )
    print(
        json.dumps(
            {
                "stops": args.stops,
                "length": args.length,
                "tokens": args.tokens,
                "step_ms_without": 1000 * without,
                "step_ms_with": 1000 * with_stops,
                "other_request_slowdown": with_stops / without,
            },
            indent=2,
        )
    )
