"""Synthetic request workloads, and a memory-only run of one through a block manager.

Lengths vary like chat traffic (most requests short, a long tail of long ones), seeded
so every run sees the same requests: what the benchmarks, the simulator and the
notebooks send in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, astuple, dataclass

import numpy as np

from minipaged.paging.manager import BlockManager, MemoryUsage

# tokens; the vLLM paper's ShareGPT figures
SHAREGPT_PROMPT_MEAN, SHAREGPT_OUTPUT_MEAN = (
    161,
    338,
)


@dataclass(slots=True)
class RequestSpec:
    prompt_len: int
    output_len: int


def make_workload(
    num_requests: int = 1000,
    min_len: int = 10,
    max_len: int = 1000,
    prompt_mean: float = SHAREGPT_PROMPT_MEAN,
    output_mean: float = SHAREGPT_OUTPUT_MEAN,
    seed: int = 0,
) -> list[RequestSpec]:
    """Prompt and output lengths from log-normal distributions (sigma 1: long-tailed)
    with the given means, clipped to [min_len, max_len]."""
    rng = np.random.default_rng(seed)

    def lengths(mean: float) -> np.ndarray:  # (num_requests,)
        sigma = 1.0
        drawn = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, num_requests)
        return np.clip(np.round(drawn), min_len, max_len).astype(int)

    return [
        RequestSpec(int(p), int(o))
        for p, o in zip(lengths(prompt_mean), lengths(output_mean))
    ]


def simulate_memory(
    manager: BlockManager, requests: list[RequestSpec], max_num_seqs: int = 64
) -> dict:
    """Serve `requests` with at most `max_num_seqs` running: each step, waiting requests
    join while they fit, every running sequence appends one token, finished ones free.
    Returns the utilization time-averaged over steps (summed token slots / summed
    allocated slots), the mean slots a running request holds, the peak allocation and
    the mean of each usage figure.
    """
    # running: seq id -> tokens left to generate
    waiting, running = (
        deque(enumerate(requests)),
        {},
    )
    steps: list[MemoryUsage] = []
    seq_steps = 0
    while waiting or running:
        while (
            waiting
            and len(running) < max_num_seqs
            and manager.can_allocate(waiting[0][1].prompt_len)
        ):
            seq_id, request = waiting.popleft()
            # distinct per request: no sharing
            manager.allocate(seq_id, [seq_id] * request.prompt_len)
            running[seq_id] = request.output_len
        if not running:
            raise ValueError(
                f"a prompt of {waiting[0][1].prompt_len} tokens never fits this pool "
                f"of {manager.num_frames} frames: make the pool larger"
            )
        for seq_id in running:
            manager.append_slot(seq_id, seq_id)
            running[seq_id] -= 1
        steps.append(manager.usage())
        seq_steps += len(running)
        for seq_id in [s for s, left in running.items() if left == 0]:
            manager.free(seq_id)
            del running[seq_id]
    # summed over steps
    total = MemoryUsage(*(sum(field) for field in zip(*map(astuple, steps))))
    return {
        "utilization": total.utilization,
        "slots_per_request": total.allocated_slots / seq_steps,
        "peak_allocated_slots": max(usage.allocated_slots for usage in steps),
        "mean": {k: v / len(steps) for k, v in asdict(total).items()},
        "steps": len(steps),
    }


@dataclass(slots=True)
class ChatTurn:
    """One request of a multi-turn chat: the prompt is the conversation's system prompt,
    its turns so far (questions and answers) and the new question; the answer is what it
    generates.
    """

    conversation: int
    prompt: list[int]
    answer: list[int]


def chat_trace(
    num_conversations: int = 32,
    turns: int = 4,
    num_system_prompts: int = 3,
    system_len: int = 96,
    question_mean: int = 32,
    answer_mean: int = 64,
    active: int = 6,
    vocab: int = 32000,
    seed: int = 0,
) -> list[ChatTurn]:
    """A seeded multi-turn chat trace with shared system prompts (a few apps, the first
    most popular): `active` conversations at a time take turns in random order, and when
    one ends the next begins. Token ids are random, so two blocks are equal only when
    shared on purpose.
    """
    rng = np.random.default_rng(seed)
    systems = [
        rng.integers(1, vocab, system_len).tolist() for _ in range(num_system_prompts)
    ]
    # Zipf: app 0 is the most used
    popularity = 1 / np.arange(1, num_system_prompts + 1)
    history, left, started, trace = {}, {}, 0, []
    while left or started < num_conversations:
        while len(left) < active and started < num_conversations:
            app = rng.choice(num_system_prompts, p=popularity / popularity.sum())
            history[started], left[started] = list(systems[app]), turns
            started += 1
        c = int(rng.choice(sorted(left)))
        question = rng.integers(
            1, vocab, int(rng.integers(question_mean // 2, 3 * question_mean // 2 + 1))
        )
        answer = rng.integers(
            1, vocab, int(rng.integers(answer_mean // 2, 3 * answer_mean // 2 + 1))
        )
        history[c] += question.tolist()
        trace.append(ChatTurn(c, list(history[c]), answer.tolist()))
        history[c] += answer.tolist()
        left[c] -= 1
        if not left[c]:
            del left[c], history[c]
    return trace
