"""`python -m minipaged.chat`, driven the way scripts and people drive it: through a
pipe and through a pseudo-terminal, with the real offline SmolLM2 answering greedily
(--temperature 0).

The conversations check what a user relies on: the second answer knows the first turn,
the earlier turns come from the prefix cache, /stats and /pages report the real pool,
/reset forgets, Ctrl-C stops an answer and frees its frames, a too-long conversation
loses its oldest turns instead of crashing.
"""

import os
import re
import shlex
import subprocess
import sys

import pexpect
import pytest

from minipaged.backend import cuda_available
from minipaged.model.offline import offline_default_model
from minipaged.model.weights import resolve_model
from minipaged.paging import BlockManager
from minipaged.tools.chat import parse_args, parse_size

BLOCK = 16  # the chat's default block size
# One BLAS thread: on a 2-core machine shared with the pytest process (or other test
# runs), OpenBLAS threads spinning against each other make a prefill many times slower.
ENV = os.environ | {"OPENBLAS_NUM_THREADS": "1", "NO_COLOR": "1"}


@pytest.fixture(scope="module")
def model():
    return str(offline_default_model())


def chat_command(model, *options) -> list[str]:
    return [
        sys.executable,
        "-m",
        "minipaged.chat",
        "--model",
        model,
        "--temperature",
        "0",
        *options,
    ]


def run_pipe(model, lines, *options) -> subprocess.CompletedProcess:
    return subprocess.run(
        chat_command(model, *options),
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=240,
        env=ENV,
    )


def turn_notes(stderr: str) -> list[tuple[int, int, int]]:
    """(output tokens, cached prompt tokens, prompt tokens) of each answer, from its
    note."""
    return [
        tuple(map(int, m))
        for m in re.findall(
            r"^\[\D*(\d+) tokens.*; (\d+) of (\d+) prompt tokens cached\]$",
            stderr,
            re.M,
        )
    ]


# ---- the options, the size parser, the block manager's cached_frames -----------------


def test_help_explains_every_option(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    for option in [
        "--model",
        "--device",
        "--max-tokens",
        "--temperature",
        "--top-p",
        "--seed",
        "--system",
        "--block-size",
        "--kv-cache-memory",
        "--max-model-len",
    ]:
        assert re.search(rf"^\s+{option} \S+\s+\w", text, re.M), (
            f"{option} is not explained"
        )
    for command in ["/stats", "/pages", "/reset", "/help", "/quit"]:
        assert command in text
    description = text.split("\n\n")[1]
    assert description.startswith("Chat in the terminal") and "`" not in description


def test_sizes_read_as_people_write_them():
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("2G") == 2 * 2**30
    assert parse_size("1.5k") == 1536
    assert parse_size("1000000") == 1_000_000
    with pytest.raises(Exception, match="not a size"):
        parse_size("lots")


def test_cached_frames_is_the_page_table_the_prefix_cache_keeps():
    manager = BlockManager(num_blocks=8, block_size=4)
    manager.allocate("a", range(10))  # blocks [0..3] and [4..7] get full
    frames = manager.block_table("a")
    manager.free("a")
    # kept after the sequence is gone
    assert manager.cached_frames(range(10)) == frames[:2]
    # a whole last block counts too
    assert manager.cached_frames(range(8)) == frames[:2]
    assert manager.cached_frames([*range(4), 9, 9, 9, 9]) == frames[:1]
    # the chain breaks at the first block
    assert manager.cached_frames([1, 0, 2, 3, 4]) == []
    before = list(manager.device.prefix_cache.evictable)
    manager.cached_frames(range(10))
    # looking changes no LRU order
    assert list(manager.device.prefix_cache.evictable) == before
    # allocate still computes the last token
    assert manager.allocate("b", range(8)) == 4
    assert BlockManager(8, 4, enable_prefix_caching=False).cached_frames(range(8)) == []


def test_a_bad_option_is_one_line_saying_what_to_fix(model):
    result = subprocess.run(
        chat_command(model, "--max-tokens", "0"),
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    assert result.returncode == 2
    assert (
        result.stderr == "python -m minipaged.chat: error: argument --max-tokens: "
        "0 is below the smallest allowed value, 1\n"
    )  # before the model loads


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The chat's error line, after checking it is the only thing besides the loading
    notes."""
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    notes = [
        line
        for line in result.stderr.splitlines()
        if not line.startswith(("loading ", "  files: "))
    ]
    assert len(notes) == 1 and notes[0].startswith("python -m minipaged.chat: "), (
        result.stderr
    )
    return notes[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "option, value, named",
    [
        ("--kv-cache-memory", "1k", "kv_cache_memory"),  # < 1 frame
        ("--block-size", "0", "argument --block-size"),
    ],
)  # the parser's
def test_an_engine_setting_the_engine_refuses_is_one_line(model, option, value, named):
    # LLM(...) raises ValueError: one line
    result = run_pipe(model, ["hello"], option, value)
    assert named in one_line_error(result)


@pytest.mark.skipif(cuda_available(), reason="this machine has a GPU")
def test_a_missing_gpu_is_one_line(model):
    result = subprocess.run(
        chat_command(model),
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV | {"MINIPAGED_DEVICE": "cuda"},
    )
    assert "no CUDA device is usable" in one_line_error(result)


def test_a_model_that_cannot_be_found_is_one_short_message():
    result = subprocess.run(
        chat_command("does/not-exist"),
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    line = one_line_error(result)
    assert "model 'does/not-exist' is not a local folder" in line and len(line) < 400
    # and through the Python API: no chain
    with pytest.raises(FileNotFoundError) as caught:
        resolve_model("does/not-exist")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


@pytest.mark.slow
def test_bytes_that_are_not_utf8_do_not_end_the_chat(model):
    """Issue 10, defect 10: invalid UTF-8 on stdin reached the tokenizer and ended the
    chat."""
    result = subprocess.run(
        chat_command(model, "--max-tokens", "4"),
        input=b"\xff\xfe x\nhi\n",
        capture_output=True,
        timeout=240,
        env=ENV,
    )
    stderr = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in stderr, stderr
    # both lines answered, the first with U+FFFD for its bytes
    assert len(turn_notes(stderr)) == 2


# ---- through a pipe: what scripts see ------------------------------------------------

STATS = re.compile(
    r"^last answer:.*?^prefix-cache hits this conversation:[^\n]*\n", re.S | re.M
)


def stats_numbers(block: str) -> dict:
    numbers = {
        "output": r"last answer: (\d+) tokens in [\d.]+ s",
        "first_s": r"first token after ([\d.]+) s",
        "tokens_per_s": r"then ([\d.]+) tokens/s",
        "prompt": r"prompt: (\d+) tokens",
        "cached": r"(\d+) from the prefix cache",
        "used": r"KV frames now: (\d+) used",
        "free": r"(\d+) free of \d+",
        "total": r"free of (\d+)",
        "utilization": r"utilization ([\d.]+)%",
    }
    return {
        name: float(re.search(pattern, block)[1]) for name, pattern in numbers.items()
    }


@pytest.mark.slow
def test_a_piped_conversation_remembers_reuses_its_pages_and_resets(model):
    result = run_pipe(
        model,
        [
            "My name is Ada. Please remember it.",
            "/stats",
            "What is my name?",
            "/stats",
            "/pages",
            "/reset",
            "What is my name?",
            "/stats",
        ],
        "--max-tokens",
        "48",
    )
    assert result.returncode == 0, result.stderr
    assert "loading" in result.stderr and re.search(
        r"ready on cpu in [\d.]+ s", result.stderr
    )
    assert "you>" not in result.stdout  # a pipe gets answers only, no prompts
    blocks = STATS.findall(result.stdout)
    answer1, answer2, rest, _ = STATS.split(result.stdout)
    pages, answer3 = rest.split("conversation forgotten")
    s1, s2, s3 = map(stats_numbers, blocks)

    # the second answer depends on the first turn
    assert answer1.strip() and "Ada" in answer2
    assert "Ada" not in answer3  # ... and after /reset the same question cannot know
    # every full block of turn 1 (its prompt and its answer but the last, unwritten,
    # token) was mapped again from the prefix cache instead of being computed
    assert (
        s2["cached"]
        == BLOCK * ((s1["prompt"] + s1["output"] - 1) // BLOCK)
        > s1["prompt"] - BLOCK
    )
    # the history is gone
    assert s3["prompt"] < s2["prompt"] and s3["prompt"] < s1["prompt"] + BLOCK
    # the system prompt's blocks outlive the /reset
    assert 0 < s3["cached"] < s3["prompt"]
    assert [n[1:] for n in turn_notes(result.stderr)] == [
        (s["cached"], s["prompt"]) for s in (s1, s2, s3)
    ]
    for s in (s1, s2, s3):
        assert s["tokens_per_s"] > 0 and s["first_s"] > 0 and 0 < s["output"] <= 48
        # while answering: only the last block has unused slots
        assert 50 < s["utilization"] <= 100
        # finished answers keep no frame mapped
        assert s["used"] == 0 and s["free"] == s["total"]
    assert (
        f"this conversation: {s3['cached']:.0f} of {s3['prompt']:.0f} prompt tokens"
        in blocks[2]
    )

    # /pages: the conversation's page table, and those frames marked cached in the frame
    # map
    conversation = int(re.search(r"the conversation so far: (\d+) tokens", pages)[1])
    assert conversation == s2["prompt"] + s2["output"]
    frames = [
        int(f)
        for row in re.findall(r"blocks\s+\d+-\d+ -> frames ([\d ]+)", pages)
        for f in row.split()
    ]
    assert len(frames) == (conversation - 1) // BLOCK and len(set(frames)) == len(
        frames
    )
    rows = {
        int(start): cells.split(" ")
        for start, cells in re.findall(
            r"^\s*(\d+)  ([.cA-Z0-9](?: [.cA-Z0-9])*)$", pages, re.M
        )
    }
    assert all(rows[f - f % 32][f % 32] == "c" for f in frames)
    # the unused rest of the pool is folded
    assert re.search(r"frames \d+-\d+ free", pages)
    assert all(len(line) <= 80 for line in pages.splitlines())


@pytest.mark.slow
def test_a_conversation_longer_than_the_context_drops_its_oldest_turns(model):
    topics = ["cats", "dogs", "birds"]
    messages = [f"Tell me about {t} and why people like them as pets." for t in topics]
    result = run_pipe(
        model,
        messages + [" ".join(["word"] * 150), "Say hi.", "/quit", "Hello"],
        "--max-tokens",
        "16",
        "--max-model-len",
        "128",
    )
    assert result.returncode == 0, result.stderr
    notes = turn_notes(result.stderr)
    assert len(notes) == 4  # cats, dogs, birds, "Say hi."; nothing after /quit
    assert all(prompt + 16 <= 128 for _, _, prompt in notes)
    assert result.stderr.count("dropped the oldest exchange") >= 1
    assert re.search(
        r"not sent: your message makes a \d+-token prompt; the context holds 128",
        result.stderr,
    )
    assert notes[-1][1] > 0  # the kept turns were still served from the cache


def test_a_reader_that_leaves_early_ends_the_chat_quietly(tiny):
    """Issue 18, defect 12: `... | python -m minipaged.chat | head -1` ended in a
    BrokenPipeError traceback. Here the reader takes the first answer's line and closes
    the pipe before the second message is sent, so the second answer is written into a
    closed pipe every time.
    """
    chat = subprocess.Popen(
        chat_command(str(tiny()), "--max-tokens", "3"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    chat.stdin.write("hello\n")
    chat.stdin.flush()
    first = chat.stdout.readline()
    chat.stdout.close()  # what `head -1` does after its line
    chat.stdin.write("and again\n")
    chat.stdin.close()
    stderr = chat.stderr.read()
    # 128 + SIGPIPE, as a shell reports such a writer
    assert chat.wait(timeout=60) == 141, stderr
    assert (
        len(first.split()) == 3 and "Traceback" not in stderr and "Error" not in stderr
    ), stderr


def test_stats_and_pages_count_the_same_conversation(tiny):
    """Issue 42: /stats said "5 frames for 71 tokens" where /pages said "73 tokens = 4
    full blocks of 16 + 9" for the same conversation (/stats sampled the pool a step
    before the answer's last). Both now count the conversation's tokens; the frames
    hold all of them but the last, whose K and V the next turn writes."""
    result = run_pipe(
        str(tiny()), ["hello there", "/stats", "/pages"], "--max-tokens", "20"
    )
    assert result.returncode == 0, result.stderr
    fullest = re.search(
        r"at its fullest: (\d+) frames for the conversation's (\d+) tokens \((\d+)"
        r" written.*utilization ([\d.]+)%",
        result.stdout,
    )
    pages = re.search(
        r"the conversation so far: (\d+) tokens = (\d+) full blocks of 16"
        r"(?: \+ (\d+))?",
        result.stdout,
    )
    assert fullest and pages, result.stdout
    frames, tokens, written = (int(n) for n in fullest.groups()[:3])
    conversation, full, tail = int(pages[1]), int(pages[2]), int(pages[3] or 0)
    assert tokens == conversation == 16 * full + tail and written == tokens - 1
    assert (frames - 1) * BLOCK < written <= frames * BLOCK
    assert float(fullest[4]) == round(100 * written / (frames * BLOCK), 1)


@pytest.mark.parametrize("stdin", ["< /dev/null", "0<&-"])
def test_an_empty_or_closed_standard_input_is_the_end_of_the_conversation(tiny, stdin):
    """Issue 18, defect 12: with standard input closed (`0<&-`), sys.stdin is None and
    the chat failed on `sys.stdin.isatty()`; now it reads as an empty input, as
    /dev/null does.
    """
    command = " ".join(map(shlex.quote, chat_command(str(tiny())))) + " " + stdin
    result = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=60, env=ENV
    )
    assert result.returncode == 0 and result.stdout == "", result.stderr
    assert "Traceback" not in result.stderr and "ready on cpu" in result.stderr


# ---- through a terminal: what people see ---------------------------------------------


@pytest.mark.slow
def test_a_terminal_session_streams_stops_on_ctrl_c_and_leaves_on_ctrl_d(model):
    # room for a long story: Ctrl-C must land before it ends, even when this test
    # process is starved of CPU while the chat keeps generating (a 48-token cap once
    # lost that race)
    python, *args = chat_command(model, "--max-tokens", "256")
    child = pexpect.spawn(
        python, args, env=ENV, encoding="utf-8", timeout=90, dimensions=(40, 80)
    )
    try:
        child.expect(r"ready on cpu in [\d.]+ s")
        child.expect("you> ")
        child.sendline("The secret code is 7351.")
        child.expect(r"prompt tokens cached\]")
        child.expect("you> ")
        child.sendline("What is the secret code?")
        child.expect("assistant> ")
        child.expect(r"\[\D*(\d+) tokens.*; (\d+) of (\d+) prompt tokens cached\]")
        assert "7351" in child.before  # the answer depends on the first turn
        assert int(child.match[2]) >= BLOCK

        child.expect("you> ")
        child.sendline("Tell me a long story about a dragon.")
        child.expect("assistant> ")
        child.expect(r"\w\w")  # the answer has begun streaming
        child.sendintr()  # Ctrl-C mid-answer
        child.expect(r"\[stopped: (\d+) tokens", timeout=10)
        assert int(child.match[1]) < 256
        child.expect("you> ")  # back at the prompt, still alive
        child.sendline("/stats")
        # the stopped answer freed its frames
        child.expect(r"KV frames now: 0 used, (\d+) free of (\d+)")
        assert child.match[1] == child.match[2]
        child.expect("you> ")
        child.sendline("/pages")
        child.expect(r"blocks\s+0-\d+ -> frames\s+\d+")
        child.expect(r"frame map: \d+ frames")
        child.expect("you> ")
        child.sendline("/reset")
        child.expect("conversation forgotten")
        child.expect("you> ")
        child.sendline("/help")
        child.expect("/pages")
        child.expect("you> ")
        child.sendintr()  # Ctrl-C at the prompt: a fresh prompt, not an exit
        child.expect(r"Ctrl-D or /quit leaves")
        child.expect("you> ")
        child.sendeof()  # Ctrl-D
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
