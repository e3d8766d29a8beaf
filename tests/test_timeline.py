"""The batch timeline picture follows the engine's StepReports."""

import numpy as np

from minipaged import LLM, SamplingParams
from minipaged.tools.viz import Timeline


def run(folder, n_requests=8, **options):
    llm = LLM(str(folder), device="cpu", **options)
    rng = np.random.default_rng(0)
    for i in range(n_requests):
        prompt = rng.integers(5, 60, rng.integers(2, 12)).tolist()
        llm.engine.add_request(
            f"r{i}",
            {"prompt_token_ids": prompt},
            SamplingParams(
                temperature=0, max_tokens=int(rng.integers(2, 15)), ignore_eos=True
            ),
        )
    reports = []
    while llm.engine.has_unfinished_requests():
        reports.append(llm.engine.step())
    return reports


def test_timeline_shows_every_sequence_of_every_step(tiny):
    reports = run(tiny(), num_blocks=12, block_size=4, max_num_seqs=4)
    rows, colors = Timeline(reports).grid()
    assert len(rows) == 4 and set(colors) == {f"r{i}" for i in range(8)}
    for step, report in enumerate(reports):
        column = [row[step] for row in rows if row[step] is not None]
        kinds = sorted(kind for _, kind in column if kind != "preempted")
        assert kinds == sorted(kind for *_, kind, _ in report.ran)
        assert sum(kind == "preempted" for _, kind in column) >= len(report.preempted)
    text = str(Timeline(reports))
    assert text.splitlines()[1].startswith("slot   0 |A")  # r0's prefill opens slot 0
    assert "!" in text  # this pool is small enough to preempt
    assert Timeline(reports)._repr_html_() == Timeline(reports).svg() and Timeline(
        reports
    ).svg().startswith("<svg")


def test_static_batches_show_padding(tiny):
    reports = run(
        tiny(max_positions=64),
        scheduler="static",
        num_blocks=16,
        block_size=16,
        max_model_len=64,
    )
    text = str(Timeline(reports))
    assert "_" in text.split("\n", 1)[1] and sum(r.padding for r in reports) > 0
