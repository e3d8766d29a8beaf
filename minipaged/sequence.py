"""What the scheduler schedules: a `Request` (a user's prompt and parameters) and its
`Sequence`s (the n samples, or the live beams), each with its tokens so far and how many of
them have their K and V in the cache. The scheduler moves requests between queues by `Status`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from minipaged.sampling import SamplingParams


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """One continuation of a prompt. The KV of token_ids[:num_computed] is in the cache."""
    seq_id: int
    token_ids: list[int]
    prompt_len: int
    index: int = 0                # which sample / beam of its request
    num_computed: int = 0
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    generator: object = None      # the sampler's random stream
    detokenizer: object = None    # the engine's incremental detokenizer
    text: str = ""
    released: int = 0             # characters of `text` handed out (the rest may start a stop string)

    def keep_until_stop(self, tokens: list[int], params: SamplingParams, eos_token_ids) -> tuple[list[int], bool]:
        """Add the tokens' text up to the first token that ends it (eos, a stop token, or a stop
        string, cut off there), as one token at a time would have stopped: those tokens, and
        whether one ended it."""
        for i, token in enumerate(tokens):
            if params.ends(token, eos_token_ids) or self.add_text(token, params.stop):
                return list(tokens[:i + 1]), True
        return list(tokens), False

    def add_text(self, token: int, stops: list[str]) -> bool:
        """Append the token's text; True when a stop string now appears in it (cut off there).
        A stop string that appears now ends in the new text: look only where it could start."""
        new = self.detokenizer.add(token)
        self.text += new
        start = max(0, len(self.text) - len(new) - max(map(len, stops), default=1) + 1)
        found = [i for stop in stops if (i := self.text.find(stop, start)) >= 0]
        if found:
            self.text = self.text[:min(found)]
        return bool(found)

    def release(self, stops: list[str]) -> None:
        """Hand out the text so far, but for an end that could still become a stop string."""
        self.released = len(self.text) if self.finished else len(self.text) - held_back(self.text, stops)

    @property
    def released_text(self) -> str:
        """The text handed out so far (what follows may still turn out to be a stop string)."""
        return self.text[:self.released]

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

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
    num_cached_tokens: int = 0      # prompt tokens found in the prefix cache at first admission
    priority: int = 0               # vLLM's `priority=` (lower first), for a waiting order that reads it
    arrival: int = 0                # the scheduler's step count when it was added (waiting orders read it)
    done_beams: list[Sequence] = field(default_factory=list)  # finished beam hypotheses

    @property
    def live(self) -> list[Sequence]:
        return [s for s in self.seqs if not s.finished]

    @property
    def beam_search(self) -> bool:
        return self.params.beam_width > 1

    @property
    def width(self) -> int:
        """Sequences it may run at once: its live samples, or beam_width (beams fork later)."""
        return self.params.beam_width if self.beam_search else len(self.live)


def held_back(text: str, stops: list[str]) -> int:
    """How many characters at the end of `text` could be the start of a stop string."""
    return max((k for stop in stops for k in range(min(len(stop) - 1, len(text)), 0, -1)
                if text.endswith(stop[:k])), default=0)
