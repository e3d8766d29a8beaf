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
