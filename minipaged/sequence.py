"""What the scheduler schedules: a `Request` (a user's prompt and parameters) and its
`Sequence`s (the n samples, or the live beams), each with its tokens so far and how many
of them have their K and V in the cache. The scheduler moves requests between queues by
`Status`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from minipaged.outputs import CompletionOutput, Logprob
from minipaged.sampling import SamplingParams, log_softmax, most_likely


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """One continuation of a prompt. The KV of token_ids[:num_computed] is in the
    cache."""

    seq_id: int
    token_ids: list[int]
    prompt_len: int
    index: int = 0  # which sample / beam of its request
    num_computed: int = 0
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    # vLLM's: the stop string or stop token id that ended it
    stop_reason: int | str | None = None
    generator: object = None  # the sampler's random stream
    detokenizer: object = None  # the engine's incremental detokenizer
    text: str = ""
    # characters of `text` handed out (the rest may start a stop string)
    released: int = 0
    # asked for: per output token, its own and the top ones
    logprobs: list[dict[int, Logprob]] | None = None
    # structured output: the automaton's state (allowed, advance), or None
    constraint: object = None

    def keep_until_stop(
        self, tokens: list[int], params: SamplingParams, eos_token_ids, logits=None
    ) -> tuple[list[int], bool]:
        """Add the tokens' text up to the first token that ends it (eos, a stop token,
        or a stop string, cut off there), as one token at a time would have stopped:
        those tokens, and whether one ended it. Row i of `logits` is the model's at
        tokens[i]: its logprobs, if asked. As vLLM, no stop string is looked for within
        the first min_tokens tokens. A
        constraint (structured output's automaton) takes each kept token."""
        for i, token in enumerate(tokens):
            if self.constraint is not None:
                self.constraint.advance(token)  # the automaton walks every token kept
            if params.logprobs is not None:
                self.add_logprobs(logits[i], token, params.logprobs)
            stops = params.stop if len(self.output_ids) + i >= params.min_tokens else []
            # vLLM's stop_reason: a stop token's id, None for eos
            if params.ends(token, eos_token_ids):
                self.stop_reason = (
                    None if token in eos_token_ids and not params.ignore_eos else token
                )
                return list(tokens[: i + 1]), True
            if self.add_text(token, stops):
                return list(tokens[: i + 1]), True
        return list(tokens), False

    def add_logprobs(self, logits, token: int, num: int) -> None:
        """The logprobs of the token picked from `logits` (vocab,), and of the `num`
        likeliest."""
        entry = token_logprobs(logits, token, num, self.detokenizer)
        self.logprobs = [] if self.logprobs is None else self.logprobs
        self.logprobs.append(entry)
        self.cumulative_logprob += entry[token].logprob

    def add_text(self, token: int, stops: list[str]) -> bool:
        """Append the token's text; True when a stop string now appears in it (cut off
        there). A stop string that appears now ends in the new text: look only where it
        could start.
        """
        new = self.detokenizer.add(token)
        self.text += new
        start = max(0, len(self.text) - len(new) - max(map(len, stops), default=1) + 1)
        found = [(i, stop) for stop in stops if (i := self.text.find(stop, start)) >= 0]
        if found:
            # the one that starts first
            at, self.stop_reason = min(found, key=lambda f: f[0])
            self.text = self.text[:at]
        return bool(found)

    def release(self, stops: list[str]) -> None:
        """Hand out the text so far, but for an end that could still become a stop
        string."""
        self.released = (
            len(self.text)
            if self.finished
            else len(self.text) - held_back(self.text, stops)
        )

    @property
    def released_text(self) -> str:
        """The text handed out so far (what follows may still turn out to be a stop
        string)."""
        return self.text[: self.released]

    def completion(self, params: SamplingParams) -> CompletionOutput:
        """Its output so far, vLLM's shape (logprobs and their sum only when asked
        for)."""
        asked = params.logprobs is not None
        return CompletionOutput(
            self.index,
            self.text,
            self.output_ids,
            self.finish_reason,
            self.cumulative_logprob if asked else None,
            (self.logprobs or []) if asked else None,
            self.stop_reason,
        )

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True, eq=False)
class Request:
    """A user's request: a prompt and its sequences (n samples, or the live beams)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    status: Status = Status.WAITING
    # prompt tokens found in the prefix cache at first admission
    num_cached_tokens: int = 0
    # vLLM's `priority=` (lower first), for a waiting order that reads it
    priority: int = 0
    # the scheduler's step count when it was added (waiting orders read it)
    arrival: int = 0
    # who asked (the server's API key, else address): a fair order reads it
    client: str = ""
    done_beams: list[Sequence] = field(default_factory=list)  # finished beam hypotheses
    # asked for: per prompt token, from the prefill
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None

    def __post_init__(self):
        if self.params.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = [None]  # the first token has nothing before it

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Asked for prompt logprobs, and not all in yet (a recompute reads no more)."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(
            self.prompt_token_ids
        )

    def num_logits(self, num_new_tokens: int) -> int:
        """Rows of logits its prompt or its next token needs in a step that computes
        num_new_tokens of them: the last one's (to sample from), or every one's while
        prompt logprobs are read.
        """
        return num_new_tokens if self.wants_prompt_logprobs else 1

    def take_prompt_logprobs(self, start: int, logits):
        """Keep the prompt logprobs in a row's logits (num_logits rows, vocab), the
        model's at positions start, start + 1, ...: each gives the next prompt token's.
        Returns the rows after the prompt's: the one to sample from, once the prompt's
        last token is in.
        """
        if not self.wants_prompt_logprobs:
            return logits
        prompt, detokenizer = (
            self.prompt_token_ids,
            (self.seqs[0].detokenizer if self.seqs else None),
        )
        for p in range(start, min(start + len(logits), len(prompt) - 1)):
            self.prompt_logprobs.append(
                token_logprobs(
                    logits[p - start],
                    prompt[p + 1],
                    self.params.prompt_logprobs,
                    detokenizer,
                )
            )
        return logits[len(prompt) - 1 - start :]

    @property
    def live(self) -> list[Sequence]:
        return [s for s in self.seqs if not s.finished]

    @property
    def beam_search(self) -> bool:
        return self.params.beam_width > 1

    @property
    def width(self) -> int:
        """Sequences it may run at once: its live samples, or beam_width (beams fork
        later)."""
        return self.params.beam_width if self.beam_search else len(self.live)


def token_logprobs(
    logits, token: int, num: int, detokenizer=None
) -> dict[int, Logprob]:
    """vLLM's logprobs of one position, from the model's raw logits (vocab,): the
    token's own, then the `num` likeliest (-1: all), each with its rank and (with a
    detokenizer) its text. vLLM's default logprobs_mode is "raw_logprobs": the model's
    own distribution, before any penalty, logit_bias, temperature, top-k or top-p, so
    they never depend on how one samples.
    """
    logprobs = log_softmax(logits[None])[0]  # (vocab,) float64
    k = len(logprobs) if num == -1 else min(num, len(logprobs))
    top = [int(t) for t in most_likely(logprobs, k)] if k else []  # the likeliest first
    ranks = {t: r for r, t in enumerate(top, 1)} | {
        token: int((logprobs > logprobs[token]).sum()) + 1
    }

    def text(t: int) -> str | None:
        return (
            detokenizer.tokenizer.decode([t], skip_special_tokens=False)
            if detokenizer
            else None
        )

    return {
        t: Logprob(float(logprobs[t]), ranks[t], text(t))
        for t in dict.fromkeys([token, *top])
    }


def held_back(text: str, stops: list[str]) -> int:
    """How many characters at the end of `text` could be the start of a stop string."""
    return max(
        (
            k
            for stop in stops
            for k in range(min(len(stop) - 1, len(text)), 0, -1)
            if text.endswith(stop[:k])
        ),
        default=0,
    )
