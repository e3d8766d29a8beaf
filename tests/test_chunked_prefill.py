"""Chunked prefill: a long prompt computed a few tokens per step, beside running
decodes, gives the same greedy tokens as one-step prefill, and never makes a step bigger
than its budget.

The equivalence suites written before it (test_scheduler, test_engine_defects,
test_bad_input) run again here with every engine chunking prompts into 5-token pieces
(chunked_prefill_plugin).
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minipaged import LLM, SamplingParams
from minipaged.model.oracle import greedy_generate

TESTS = Path(__file__).parent
# They assert the shape of one-step prefill (a step's rows, peak frames, that a
# preemption happens), not tokens: chunking changes that shape on purpose.
SCHEDULE_SHAPE = [
    "test_step_report_prints_what_happened",
    "test_parallel_samples_share_the_prompt_frames",
    "test_equivalence_with_prefix_caching_and_shared_prefixes",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from checkpoints import write_checkpoint

    return write_checkpoint(
        tmp_path_factory.mktemp("tiny"),
        hidden=64,
        heads=4,
        kv_heads=2,
        max_positions=256,
    )


def oracle_tokens(llm, prompt, max_tokens):
    return greedy_generate(llm.model, prompt, max_tokens)


def test_equivalence_suites_pass_with_every_prompt_chunked(tmp_path):
    counter = tmp_path / "chunks"
    env = os.environ | {"PYTHONPATH": str(TESTS), "MINIPAGED_CHUNKS_FILE": str(counter)}
    deselect = [
        arg
        for name in SCHEDULE_SHAPE
        for arg in ("--deselect", f"tests/test_scheduler.py::{name}")
    ]
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "chunked_prefill_plugin",
            "-p",
            "no:cacheprovider",
            "tests/test_scheduler.py",
            "tests/test_engine_defects.py",
            "tests/test_bad_input.py",
            *deselect,
        ],
        cwd=TESTS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert int(counter.read_text()) > 1000  # prompts really were cut into chunks


@pytest.mark.parametrize("budget", [3, 4, 16])
def test_long_prompts_in_chunks_beside_decodes_give_the_oracle_tokens(folder, budget):
    llm = LLM(
        str(folder),
        device="cpu",
        num_blocks=48,
        block_size=4,
        enable_chunked_prefill=True,
        max_num_batched_tokens=budget,
    )
    rng = np.random.default_rng(budget)
    prompts = [rng.integers(5, 60, int(n)).tolist() for n in (3, 40, 7, 61, 2)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine, outputs, steps = llm.engine, {}, []
    for i, prompt in enumerate(prompts[:2]):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    while engine.has_unfinished_requests():
        if len(steps) == 4:  # long prompts arrive while the first ones decode
            for i, prompt in enumerate(prompts[2:], start=2):
                engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
        report = engine.step()
        steps.append(report.ran)
        outputs |= {o.request_id: o for o in report.finished}
    for i, prompt in enumerate(prompts):
        assert outputs[str(i)].outputs[0].token_ids == oracle_tokens(llm, prompt, 12), (
            f"request {i}"
        )
    for ran in steps:
        decodes = sum(kind == "decode" for *_, kind, _ in ran)
        prefill = sum(n for *_, kind, n in ran if kind == "prefill")
        assert prefill <= max(budget - decodes, 0) or (
            decodes == 0 and prefill <= budget
        ), ran
    chunked = [ran for ran in steps if any(kind == "prefill" for *_, kind, _ in ran)]
    assert len(chunked) >= 61 // budget  # the 61-token prompt took several steps
    # decodes ran meanwhile
    assert any(kind == "decode" for ran in chunked for *_, kind, _ in ran)


def test_prompt_aborted_between_chunks_leaves_no_unwritten_block_in_the_prefix_cache(
    folder,
):
    """Its blocks were named when mapped, before their K and V were computed: the abort
    makes the prefix cache forget them, so the same prompt later is computed, not read
    as garbage.
    """
    llm = LLM(
        str(folder),
        device="cpu",
        num_blocks=32,
        block_size=4,
        enable_chunked_prefill=True,
        max_num_batched_tokens=4,
    )
    prompt = list(range(5, 45))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    llm.engine.add_request("a", {"prompt_token_ids": prompt}, params)
    for _ in range(3):
        llm.engine.step()
    llm.engine.abort_request("a")
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    assert out.num_cached_tokens == 12  # the 3 chunks that were computed, found again
    assert out.outputs[0].token_ids == oracle_tokens(llm, prompt, 6)


def test_chunked_prefill_options_are_checked(folder):
    with pytest.raises(
        ValueError, match="enable_chunked_prefill must be True or False"
    ):
        LLM(str(folder), device="cpu", num_blocks=8, enable_chunked_prefill="yes")
    with pytest.raises(ValueError, match="needs scheduler='continuous'"):
        LLM(
            str(folder),
            device="cpu",
            num_blocks=8,
            enable_chunked_prefill=True,
            scheduler="static",
        )
    with pytest.raises(ValueError, match="unless enable_chunked_prefill=True"):
        LLM(str(folder), device="cpu", num_blocks=64, max_num_batched_tokens=8)
    llm = LLM(
        str(folder),
        device="cpu",
        num_blocks=64,
        enable_chunked_prefill=True,
        max_num_batched_tokens=8,
    )
    assert llm.engine.scheduler.config.max_num_batched_tokens == 8
