"""Every numeric option of every command, poked as a stranger would (issue 18): zero, a
negative value, nan and a missing value each get one line on stderr, `PROG: error: ...`
naming the option, and exit code 2, before any work starts.

The options are read from the parsers themselves (chat, simulate, serve, and each
benchmark of `python -m minipaged.bench`), so a new option is poked as soon as it
exists. Zero is refused unless ZERO_IS_VALID says what it means there. Most cases call
parse_args in-process (the battery takes about a second); a few run `python -m ...` to
show the one line end to end.
"""

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

from minipaged.llm import CommandParser
from minipaged.model import cpu
from minipaged.tools import chat, simulate
from minipaged.tools.bench import cli as bench_cli
from minipaged.tools.bench import projections
from minipaged.tools.bench.common import random_prompts
from minipaged.tools.bench.workload import RequestSpec
from minipaged.tools.serve import cli as serve_cli


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(
        a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    )


# name -> (module run by `python -m`, its parser, the arguments before the options)
BENCH = bench_cli.build_parser()
COMMANDS = {
    "chat": ("minipaged.chat", chat.build_parser(), []),
    "simulate": ("minipaged.simulate", simulate.build_parser(), []),
    "serve": ("minipaged.serve", serve_cli.build_parser(), []),
    **{
        f"bench {name}": ("minipaged.bench", BENCH, [name])
        for name in subcommands(BENCH)
    },
}
SUBPARSERS = {
    name: subcommands(BENCH)[name.split()[1]] if name.startswith("bench ") else parser
    for name, (_, parser, _) in COMMANDS.items()
}

SEED = "a seed: 0 is as good as any other"
ZERO_IS_VALID = {  # (command, option) -> what zero means there
    ("chat", "--temperature"): "greedy decoding",
    ("chat", "--seed"): SEED,
    (
        "simulate",
        "--threshold",
    ): "four times paging's normalized latency at the lowest rate",
    ("serve", "--port"): "the system picks a free port",
    ("serve", "--max-waiting"): "no request queues beyond --max-num-seqs",
    ("serve", "--max-concurrent-per-client"): "no bound on one client's share",
    ("serve", "--kv-offload-frames"): "no drum: evicted prefix blocks are dropped",
    ("serve", "--max-decode-rows"): "every running row decodes each step",
    **{
        (f"bench {name}", "--seed"): SEED
        for name in (
            "memory",
            "throughput",
            "sharing",
            "serve",
            "latency",
            "replacement",
        )
    },
}


def is_numeric(action: argparse.Action) -> bool:
    """An option whose value is a number: int, float, llm.number(...), or a size in
    bytes."""
    if not action.option_strings or action.type is None:
        return False
    # llm.number keeps its kind
    if getattr(action.type, "kind", action.type) in (
        int,
        float,
    ):
        return True
    try:
        return type(action.type("1")) in (int, float)
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False


OPTIONS = [
    (name, action.option_strings[-1], action.nargs)
    for name, parser in SUBPARSERS.items()
    for action in parser._actions
    if is_numeric(action)
]


def parse(
    name: str, args: list[str]
) -> tuple[int | None, str, argparse.Namespace | None]:
    """(exit code or None, stderr, namespace) of parsing `args` as command `name`
    in-process."""
    _, parser, before = COMMANDS[name]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            return None, stderr.getvalue(), parser.parse_args(before + args)
        except SystemExit as stop:
            return stop.code, stderr.getvalue(), None


def assert_one_line(code, stderr: str, prog: str, option: str) -> None:
    assert code == 2, f"exit code {code}, stderr {stderr!r}"
    assert stderr.endswith("\n") and stderr.count("\n") == 1, (
        f"not one line: {stderr!r}"
    )
    assert (
        stderr.startswith(f"{prog}: error: ")
        and option in stderr
        and "Traceback" not in stderr
    ), stderr


def cases():
    for name, option, nargs in OPTIONS:
        values = {"zero": ["0"], "negative": ["-1"], "nan": ["nan"], "missing": []}
        if nargs == "+":  # a list: each element is checked, not only the first
            values["nan as the second element"] = ["1", "nan"]
        for what, args in values.items():
            yield pytest.param(name, option, what, args, id=f"{name} {option} {what}")


@pytest.mark.parametrize("name, option, what, values", list(cases()))
def test_a_bad_number_is_one_line_and_exit_code_2(name, option, what, values):
    code, stderr, namespace = parse(name, [option, *values])
    if what == "zero" and (name, option) in ZERO_IS_VALID:
        assert code is None and getattr(namespace, option[2:].replace("-", "_")) == 0, (
            stderr
        )
        return
    assert_one_line(code, stderr, SUBPARSERS[name].prog, option)


def test_the_battery_finds_every_kind_of_option():
    found = {(name, option) for name, option, _ in OPTIONS}
    for expected in [
        ("chat", "--kv-cache-memory"),
        ("chat", "--top-p"),
        ("simulate", "--rates"),
        ("simulate", "--threshold"),
        ("serve", "--port"),
        ("bench decode", "--batch"),
        ("bench serve", "--request-rate"),
        ("bench latency", "--rates"),
        ("bench kernel", "--repeats"),
    ]:
        assert expected in found, expected
    assert set(ZERO_IS_VALID) <= found, "ZERO_IS_VALID names an option no parser has"
    # every command has numeric options
    assert {name for name, _, _ in OPTIONS} == set(COMMANDS)
    # errors in one line
    assert all(isinstance(parser, CommandParser) for parser in SUBPARSERS.values())


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--rate", "inf"],
            "not a finite number",
        ),  # simulate: only bench serve takes inf
        (["--rates", "1e-9"], "below the smallest allowed value, 1e-06"),
        (["--requests", "1.5"], "'1.5' is not a whole number"),
        (
            ["--requests", "9" * 5000],
            "is not a whole number",
        ),  # int() refuses 5,000 digits: one short line
    ],
)
def test_values_past_the_edges_say_what_is_wrong(args, message):
    code, stderr, _ = parse("simulate", args)
    assert_one_line(code, stderr, "python -m minipaged.simulate", args[0])
    assert message in stderr and len(stderr) < 200


def test_bounds_that_are_not_zero():
    # all at once
    assert parse("bench serve", ["--request-rate", "inf"])[2].request_rate == float(
        "inf"
    )
    for name, args in [
        (
            "bench decode",
            ["--tokens", "1"],
        ),  # one token is the prefill's: nothing timed
        ("bench sharing", ["--width", "1"]),  # one sequence shares nothing
        ("chat", ["--top-p", "1.5"]),
        ("bench fragmentation", ["--block-size", "4096"]),  # above the trace's context
        ("bench kernel", ["--versions", "1,9"]),
        ("bench kernel", ["--versions", "0"]),
    ]:
        assert_one_line(*parse(name, args)[:2], SUBPARSERS[name].prog, args[0])


# ---- end to end: `python -m ...` -----------------------------------------------------


def run(*args, timeout=60, env=None) -> subprocess.CompletedProcess:
    """python -m *args, its environment this one's with `env` on top."""
    return subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )


@pytest.mark.parametrize(
    "command, line",
    [
        (
            ["minipaged.simulate", "--rate", "nan"],  # hung
            (
                "python -m minipaged.simulate: error: argument --rate: 'nan' is not a"
                " finite number"
            ),
        ),
        (
            ["minipaged.simulate", "--threshold", "-1"],  # hung
            (
                "python -m minipaged.simulate: error: argument --threshold: -1 is below"
                " the smallest allowed value, 0"
            ),
        ),
        (
            ["minipaged.simulate", "--requests", "0"],  # printed nan and exit code 0
            (
                "python -m minipaged.simulate: error: argument --requests: 0 is below"
                " the smallest allowed value, 1"
            ),
        ),
        (
            ["minipaged.bench", "decode", "--batch", "0"],
            (
                "python -m minipaged.bench decode: error: argument --batch: 0 is below"
                " the smallest allowed value, 1"
            ),
        ),
        (
            ["minipaged.bench", "latency", "--rates", "1", "0"],
            (
                "python -m minipaged.bench latency: error: argument --rates: 0 is below"
                " the smallest allowed value, 1e-06"
            ),
        ),
        (
            ["minipaged.chat", "--top-p", "0"],
            (
                "python -m minipaged.chat: error: argument --top-p: 0 must be greater"
                " than 0"
            ),
        ),
        (
            ["minipaged.serve", "--port", "-1"],
            (
                "python -m minipaged.serve: error: argument --port: -1 is below the"
                " smallest allowed value, 0"
            ),
        ),
        (
            [
                "minipaged.serve",
                "--speculative-config",
                '{"method": "ngram", "num_speculative_tokens": 0}',
            ],
            (
                "python -m minipaged.serve: error: argument --speculative-config:"
                " speculative_config needs num_speculative_tokens, an integer from 1 to"
                " 16 (the tokens guessed per step), got 0"
            ),
        ),
        (
            [
                "minipaged.bench",
                "memory",
                "--max-model-len",
                "100",
            ],  # found after parsing: the workload's
            (
                "python -m minipaged.bench memory: error: --max-model-len 100 is"
                " shorter than the workload's longest request, 2000 tokens (prompt +"
                " output)"
            ),
        ),
        (
            [
                "minipaged.bench",
                "decode",
                "--model",
                "/nonexistent",
            ],  # found after parsing: no such model
            (
                "python -m minipaged.bench decode: error: model '/nonexistent' is"
                " neither a folder nor a hub id like"
                " 'HuggingFaceTB/SmolLM2-135M-Instruct'"
            ),
        ),
    ],
    ids=lambda value: " ".join(value[:4]) if isinstance(value, list) else None,
)
def test_the_command_prints_one_line_and_exits_2(command, line):
    result = run(*command)
    assert (result.returncode, result.stderr, result.stdout) == (2, line + "\n", "")


def test_a_threshold_no_rate_meets_is_one_line_not_a_hang(capsys):
    """--threshold 1e-9 s/token: no rate, however low, gets there; the search stops and
    says so."""
    with pytest.raises(SystemExit) as stop:
        simulate.main(
            [
                "--trace",
                "alpaca",
                "--requests",
                "20",
                "--rates",
                "1",
                "--threshold",
                "1e-9",
            ]
        )
    stderr = capsys.readouterr().err
    assert stop.value.code == 2 and stderr.count("\n") == 1, stderr
    assert stderr.startswith(
        "python -m minipaged.simulate: error: argument --threshold: no request rate"
        " keeps"
    )


# ---- the model's vocabulary ----------------------------------------------------------


def test_random_prompts_stay_inside_a_small_vocabulary():
    for vocab in (2, 67, 500, 49_152):
        ids = [
            i
            for prompt in random_prompts([RequestSpec(400, 1)] * 3, 0, vocab)
            for i in prompt
        ]
        assert 0 <= min(ids) and max(ids) < vocab and len(set(ids)) > 1


def test_bench_decode_runs_a_model_whose_vocabulary_is_under_10000(tiny):
    model = tiny()  # 67 tokens
    result = run(
        "minipaged.bench",
        "decode",
        "--model",
        str(model),
        "--batch",
        "2",
        "--tokens",
        "3",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["decode_steps"] == 2
    too_long = run(
        "minipaged.bench", "decode", "--model", str(model), "--prompt-len", "300"
    )
    assert (
        too_long.returncode == 2
        and too_long.stderr
        == "python -m minipaged.bench decode: error: --prompt-len 300 + --tokens 64 is"
        " longer than this model's context here, 256 tokens\n"
    )


@pytest.mark.parametrize(
    "panels, gemm_rows, three",
    [
        ("1", "", "panels, split"),
        ("1", "3", "blas gemm"),
        ("0", "", "blas gemm"),
    ],
)
def test_bench_projections_times_every_way_and_marks_the_engines(
    tiny, panels, gemm_rows, three, tmp_path
):
    """Each row count gets every way once, the engine's way marked once: the rule of
    model/cpu.projection_path where the model holds panels (up to the GEMM's row count,
    timed at load or MINIPAGED_GEMM_ROWS), BLAS for every row count where it does not
    (MINIPAGED_CPU_PANELS decides here, as panels_pay does at load); the table names the
    rows, the ways and why."""
    from minipaged.model import team

    # with MINIPAGED_GEMM_ROWS the helpers' GEMM starts at 3 rows too
    server_three = "gemm, helper processes" if gemm_rows else "panels, helper processes"
    model = tiny()
    env = {
        "MINIPAGED_CPU_PANELS": panels,
        "MINIPAGED_GEMM_ROWS": gemm_rows,
        "MINIPAGED_CACHE": str(tmp_path),  # choose_gemm_rows keeps its answer there
    }
    result = run(
        "minipaged.bench",
        "projections",
        "--model",
        str(model),
        "--rows",
        "1",
        "3",
        "--repeats",
        "1",
        "--json",
        env=env,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    # helper processes where they can run and a second core is free
    helpers = out["helpers_gemm_rows"] is not None
    assert helpers or team.supported() or "one core" in out["helpers"], out["helpers"]
    ways = [w for w in projections.WAYS if "helper processes" not in w or helpers]
    assert [(r["rows"], r["way"]) for r in out["results"]] == [
        (n, way) for n in (1, 3) for way in ways
    ]
    chosen = {r["rows"]: r["way"] for r in out["results"] if r["engine"]}
    assert chosen == {1: "blas gemm", 3: three}
    # a server's way: its helper processes' panels below their GEMM's row count
    served = {r["rows"]: r["way"] for r in out["results"] if r["server"]}
    assert served == (
        {1: "panels, helper processes", 3: server_three} if helpers else {}
    )
    assert out["engine_uses_panels"] is (panels == "1")
    if gemm_rows:
        assert out["gemm_rows"] == 3
        assert (
            "2 to 2 rows take them, 3 and more the GEMM (MINIPAGED_GEMM_ROWS)"
            in (out["why"])
        )
    elif panels == "1":
        assert out["gemm_rows"] in (*cpu.GEMM_ROW_CHOICES, cpu.GEMM_ROWS)
        kept = tmp_path / cpu.GEMM_ROWS_FILE
        assert f"(timed at load, kept in {kept})" in out["why"]
        assert out["gemm_rows"] in json.loads(kept.read_text()).values()
    else:
        assert out["gemm_rows"] is None
    assert all(r["ms"] > 0 and r["gb_per_s"] > 0 for r in out["results"])
    table = run(
        "minipaged.bench",
        "projections",
        "--model",
        str(model),
        "--rows",
        "3",
        "--repeats",
        "1",
        env=env,
    )
    assert table.returncode == 0, table.stderr
    marked = [line for line in table.stdout.splitlines() if "<- the engine's" in line]
    assert len(marked) == 1 and three in marked[0], table.stdout
    assert f"MINIPAGED_CPU_PANELS={panels} chose" in table.stdout
