"""Lab 8, working-set admission: the participant's WorkingSet.growth, its properties
(small requests over a real block manager, then a burst that makes greedy admission
thrash, run by the engine's Scheduler with dummy tokens), and the engine run beside the
built-in 'working-set'.
"""

from __future__ import annotations

from pathlib import Path

from minipaged.paging import BlockManager
from minipaged.paging.contiguous import ContiguousBlockManager
from minipaged.policies import Greedy, WorkingSet
from minipaged.sampling import SamplingParams
from minipaged.scheduler import Scheduler, SchedulerConfig
from minipaged.sequence import Request, Sequence
from minipaged.tools.lab.grading import Failed, Property, in_one_line, time_limit
from minipaged.tools.viz import LineChart
from minipaged.tools.viz.pages import plural

BLOCK = 4  # slots per frame in every case


def solution() -> dict:
    return {"WorkingSet": WorkingSet}


def request(
    lengths: list[int], prompt_len: int, max_tokens: int, finished: int = 0
) -> Request:
    """A request of len(lengths) samples, sample i holding lengths[i] tokens (prompt +
    output); the first `finished` samples are done."""
    prompt = [7] * prompt_len
    seqs = [
        Sequence(i, [7] * length, prompt_len, index=i)
        for i, length in enumerate(lengths)
    ]
    for seq in seqs[:finished]:
        seq.finish_reason = "length"
    params = SamplingParams(
        n=len(lengths), max_tokens=max_tokens, ignore_eos=True, seed=0
    )
    return Request("r0", None, prompt, params, seqs)


def said(
    lengths: list[int], prompt_len: int, max_tokens: int, window: int, finished: int = 0
) -> str:
    samples = (
        f"one sequence of {lengths[0]} tokens"
        if len(lengths) == 1
        else f"{len(lengths)} samples of {lengths[0]} tokens"
        + (f" ({finished} of them finished)" if finished else "")
    )
    return (
        f"WorkingSet({window}).growth on {samples} (prompt {prompt_len}, max_tokens"
        f" {max_tokens}, final length {prompt_len + max_tokens}), frames of {BLOCK}"
        " slots"
    )


def expect_growth(m, cases, blocks=None, why: str = "") -> None:
    """Each case (lengths, prompt_len, max_tokens, window[, finished]) against the
    engine's growth."""
    for lengths, prompt_len, max_tokens, window, *finished in cases:
        finished = finished[0] if finished else 0
        manager = blocks or BlockManager(256, BLOCK, enable_prefix_caching=False)
        final_len = prompt_len + max_tokens
        expected = WorkingSet(window).growth(
            request(lengths, prompt_len, max_tokens, finished), manager, final_len
        )
        got = m.WorkingSet(window).growth(
            request(lengths, prompt_len, max_tokens, finished), manager, final_len
        )
        if got != expected:
            given = said(lengths, prompt_len, max_tokens, window, finished)
            if blocks is not None:
                given += f", over {type(blocks).__name__}"
            raise Failed(
                given,
                f"growth(...) should be {plural(int(expected), 'frame')}{why}; it"
                f" returned {got!r}",
            )


def the_next_window_of_tokens(m) -> None:
    for n, w in [
        (10, 8),
        (9, 6),
        (12, 6),
        (16, 16),
        (13, 5),
        (20, 1),
    ]:  # aligned and not, window above and below a frame
        expect_growth(
            m,
            [([n], 6, 200, w)],
            why=(
                f" ({n} tokens fill {-(-n // BLOCK)} frames, {n + w} tokens "
                f"{-(-(n + w) // BLOCK)})"
            ),
        )


def capped_at_the_final_length(m) -> None:
    expect_growth(
        m,
        [([30], 10, 24, 16)],
        why=": the sequence ends at 34 tokens, so only tokens 30 to 34 count",
    )
    expect_growth(m, [([21], 5, 20, 32)], why=": the sequence ends at 25 tokens")
    expect_growth(
        m,
        [([40], 8, 32, 16)],
        why=": the sequence is at its final length, it will take no frame more",
    )


def every_live_sample(m) -> None:
    expect_growth(m, [([10, 10, 10], 6, 200, 8)], why=": each of the 3 samples grows")
    expect_growth(
        m,
        [([10, 10, 10], 6, 200, 8, 1)],
        why=": a finished sample grows no more (request.width counts the live ones)",
    )


def a_reserved_chunk_grows_by_nothing(m) -> None:
    chunks = ContiguousBlockManager(256, BLOCK, "oracle", max_model_len=256)
    expect_growth(
        m,
        [([10], 6, 40, 16)],
        blocks=chunks,
        why=(
            ": a contiguous allocator reserved the whole run at admission "
            "(blocks.frames_to_admit(num_tokens, final_len) says so)"
        ),
    )


# ---- the payoff: a burst that makes greedy admission thrash --------------------------

BURST = dict(frames=18, prompts=[4] * 10, max_tokens=32, max_num_seqs=16)
BURST_SAID = (
    "a burst of 10 requests (prompts of 4 tokens, 32 tokens each) on 18 frames of 4"
    " slots"
)


def serve_burst(
    admission, frames: int, prompts: list[int], max_tokens: int, max_num_seqs: int
) -> dict:
    """The engine's Scheduler over a real block manager, dummy tokens: preemptions per
    step."""
    blocks = BlockManager(frames, BLOCK, enable_prefix_caching=False)
    scheduler = Scheduler(
        SchedulerConfig(
            max_model_len=128,
            watermark=0.0,
            max_num_seqs=max_num_seqs,
            admission=admission,
        ),
        blocks,
    )
    work = []
    for i, length in enumerate(prompts):
        prompt = [10 + i] * length
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=0)
        work.append(
            Request(f"r{i}", None, prompt, params, [Sequence(i, list(prompt), length)])
        )
        scheduler.add(work[-1])
    preempted = []
    while scheduler.has_unfinished() and len(preempted) < 2000:
        batch = scheduler.schedule()
        preempted.append(len(batch.preempted))
        scheduler.update(batch, {seq: 1 for s in batch.scheduled for seq in s.samplers})
    short = [r.request_id for r in work if len(r.seqs[0].output_ids) != max_tokens]
    return {"preempted": preempted, "short": short, "free": blocks.num_free_frames}


def no_thrashing(m) -> None:
    greedy = sum(serve_burst(Greedy(), **BURST)["preempted"])
    for window, most in [(16, greedy // 3), (32, 0)]:
        mine = serve_burst(m.WorkingSet(window), **BURST)
        given = f"{BURST_SAID}, WorkingSet({window})"
        if mine["short"] or mine["free"] != BURST["frames"]:
            raise Failed(
                given,
                "not every request finished with its 32 tokens (short:"
                f" {mine['short']}), or {BURST['frames'] - mine['free']} frames stayed"
                " taken",
            )
        count = sum(mine["preempted"])
        if count > most:
            limit = (
                "none: the window covers every request's whole run"
                if most == 0
                else f"at most {plural(most, 'preemption')}, a third of greedy's"
            )
            raise Failed(
                given,
                f"greedy admission preempts {plural(greedy, 'time')}; yours preempted "
                f"{plural(count, 'time')}, expected {limit}",
            )


WORKING_SET = [
    Property(
        "growth is the frames the next `window` tokens take, beyond the frames"
        " held now",
        the_next_window_of_tokens,
        "WorkingSet(window).growth on one sequence, frames of 4 slots",
    ),
    Property(
        "growth stops at the request's final length (prompt + max_tokens)",
        capped_at_the_final_length,
        "WorkingSet(window).growth near the final length, frames of 4 slots",
    ),
    Property(
        "growth counts every live sample of the request (its width)",
        every_live_sample,
        "WorkingSet(8).growth on 3 samples, frames of 4 slots",
    ),
    Property(
        "a contiguous chunk, reserved whole at admission, promises no growth",
        a_reserved_chunk_grows_by_nothing,
        "WorkingSet(16).growth over a ContiguousBlockManager",
    ),
    Property(
        "a burst that makes greedy admission thrash runs with far fewer preemptions, to"
        " the end",
        no_thrashing,
        BURST_SAID,
    ),
]


# ---- the engine run: the participant's admission beside the built-in one -------------

QUESTIONS = [
    "What is a page table ?",
    "Why do frames have a fixed size ?",
    "What does fork copy ?",
    "What is a frame ?",
    "Why does a page table help ?",
    "What is a kind teacher ?",
    "What does a page copy ?",
    "Why is a frame a page ?",
]
ENGINE = dict(num_blocks=16, block_size=4, max_num_seqs=8, enable_prefix_caching=False)
WINDOW, MAX_TOKENS = 16, 24


def serve(engine) -> dict:
    """Every request to its end: tokens per request, and preemptions per step."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for i, question in enumerate(QUESTIONS):
        engine.add_request(f"r{i}", question, params)
    tokens, preempted = {}, []
    while engine.has_unfinished_requests():
        if len(preempted) > 1000:
            raise RuntimeError("the engine had not finished after 1000 steps")
        report = engine.step()
        preempted.append(len(report.preempted))
        for output in report.finished:
            tokens[output.request_id] = list(output.outputs[0].token_ids)
    return {"tokens": tokens, "preempted": preempted}


def run(pieces, llm, pictures: Path) -> list[str]:
    """Greedy, the built-in 'working-set' and the participant's WorkingSet on the same
    burst: the same tokens everywhere, and the participant's preemptions equal the
    built-in rule's.
    """
    try:
        with time_limit(120):
            mine = serve(llm.new_engine(**ENGINE, admission=pieces.WorkingSet(WINDOW)))
    except Exception as error:
        raise RuntimeError(
            f"the engine with your WorkingSet failed: {in_one_line(error)}"
        ) from None
    built_in = serve(
        llm.new_engine(**ENGINE, admission="working-set", admission_window=WINDOW)
    )
    greedy = serve(llm.new_engine(**ENGINE, admission="greedy"))
    for request_id, tokens in greedy["tokens"].items():
        if mine["tokens"].get(request_id) != tokens:
            raise RuntimeError(
                f"request {request_id}: your engine gave tokens"
                f" {mine['tokens'].get(request_id)}, the built-in one {tokens}"
            )
    counts = {
        name: sum(r["preempted"])
        for name, r in [("greedy", greedy), ("built-in", built_in), ("yours", mine)]
    }
    if counts["yours"] != counts["built-in"]:
        raise RuntimeError(
            f"your WorkingSet({WINDOW}) preempted {plural(counts['yours'], 'time')},"
            f" the built-in 'working-set' {plural(counts['built-in'], 'time')}: the"
            " same rule should preempt the same"
        )
    lines = [
        f"  {len(QUESTIONS)} greedy requests of {MAX_TOKENS} tokens on"
        f" {ENGINE['num_blocks']} frames of {ENGINE['block_size']} slots: the same"
        " tokens under all three admissions"
    ]
    lines += [
        f"  {name + ':':<28} {plural(counts[key], 'preemption')} in"
        f" {len(r['preempted'])} steps"
        for name, key, r in [
            ("greedy admission", "greedy", greedy),
            ("the built-in 'working-set'", "built-in", built_in),
            (f"your WorkingSet({WINDOW})", "yours", mine),
        ]
    ]
    pictures.mkdir(parents=True, exist_ok=True)
    picture = pictures / "lab8_thrashing.svg"
    chart = thrashing_chart(
        {"greedy": greedy["preempted"], f"your WorkingSet({WINDOW})": mine["preempted"]}
    )
    picture.write_text(chart.svg())
    return lines + [f"picture: {picture}"]


def thrashing_chart(preempted: dict[str, list[int]]) -> LineChart:
    """Preemptions so far against the step, one line per admission rule (each held at
    its total after its last step)."""
    steps = max(map(len, preempted.values()))
    series = {}
    for name, per_step in preempted.items():
        total, so_far = 0, []
        for step in range(steps):
            total += per_step[step] if step < len(per_step) else 0
            so_far.append(total)
        series[name] = so_far
    return LineChart(
        f"preemptions so far, {len(QUESTIONS)} requests on {ENGINE['num_blocks']}"
        " frames",
        list(range(1, steps + 1)),
        series,
        x_label="step",
        y_label="preemptions",
        digits=0,
    )
