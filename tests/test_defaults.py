"""Every option works with its default memory (issue 19): the real model, no num_blocks
given, for each scheduler, allocator, preemption mode and chunked prefill; and the
server started as
the workshop's "before" picture tells a lecturer to (`--scheduler static`)."""

import itertools
import re
import subprocess
import sys
import time

import httpx
import pytest

from minipaged import SamplingParams
from minipaged.paging import ALLOCATORS

pytestmark = pytest.mark.slow

COMBINATIONS = [
    dict(scheduler=s, allocator=a, preemption_mode=p, enable_chunked_prefill=c)
    for s, a, p, c in itertools.product(
        ("continuous", "static"), ALLOCATORS, ("recompute", "swap"), (False, True)
    )
    if not (c and s == "static")
]


@pytest.mark.parametrize(
    "options", COMBINATIONS, ids=lambda o: "-".join(str(v) for v in o.values())
)
def test_each_option_answers_with_the_default_memory(smollm2, options):
    engine = smollm2.new_engine(**options)
    kv_bytes = engine.kv.data.nbytes + engine.kv.host.nbytes
    # device + host
    assert kv_bytes <= 2 * 512 * 2**20, (
        f"{kv_bytes / 2**30:.1f} GiB of KV memory by default"
    )
    engine.add_request(
        "r",
        {"prompt_token_ids": smollm2.tokenizer.encode("The capital of France is")},
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
    )
    outputs = []
    for _ in range(50):
        if not engine.has_unfinished_requests():
            break
        outputs += engine.step().finished
    assert len(outputs) == 1 and len(outputs[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize(
    "flags",
    [
        ["--scheduler", "static", "--max-model-len", "1024"],
        ["--scheduler", "static"],
        ["--preemption-mode", "swap"],
    ],
)
def test_the_server_starts_with_its_default_memory(flags):
    command = [sys.executable, "-m", "minipaged.serve", "--port", "0", *flags]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        lines, deadline = [], time.monotonic() + 120
        while not any("/v1" in line for line in lines):
            assert process.poll() is None and time.monotonic() < deadline, "".join(
                lines
            )
            lines.append(process.stdout.readline())
        url = re.search(r"(http://127\.0\.0\.1:\d+)/v1", "".join(lines))[1]
        answer = httpx.post(
            f"{url}/v1/completions",
            timeout=120,
            json={
                "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
                "prompt": "Hello",
                "max_tokens": 4,
                "temperature": 0,
            },
        ).json()
        assert answer["usage"]["completion_tokens"] == 4, answer
    finally:
        process.kill()
        process.wait()


def test_the_workshops_static_picture_batches_several_requests_with_padding_rows(
    smollm2,
):
    """`--scheduler static --max-model-len 1024`, as the docs say: a real batch, not one
    region."""
    engine = smollm2.new_engine(scheduler="static", max_model_len=1024)
    assert engine.blocks.num_frames >= 8  # regions of 1,024 slots in the default pool
    for i in range(6):
        engine.add_request(
            f"r{i}",
            f"Count to {i + 3}",
            SamplingParams(max_tokens=4 + 6 * i, ignore_eos=True),
        )
    most = padding = 0
    while engine.has_unfinished_requests():
        report = engine.step()
        most, padding = (
            max(most, len(report.ran) + report.padding),
            padding + report.padding,
        )
    assert most == 6 and padding > 0
