"""What the engine hands back: a request's outputs, and a report of each step.

`RequestOutput` and `CompletionOutput` are vLLM's shapes, so code moves over unchanged;
`StepReport` is minipaged's own: what one `step()` scheduled, paged, copied and
finished, as a line of text or, collected over a run, a timeline picture
(minipaged.tools.viz).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class Logprob:
    """vLLM's: one token's log probability under the model's own distribution, its rank
    there (1: the likeliest) and its text alone."""

    logprob: float
    rank: int
    decoded_token: str | None = None


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    # "stop" (eos, stop token/string), "length", "abort", "rejected"
    finish_reason: str | None
    # beam search, or asked for logprobs: the sum of its tokens'
    cumulative_logprob: float | None = None
    # asked for logprobs: per token, its own and the top ones
    logprobs: list[dict[int, Logprob]] | None = None
    stop_reason: int | str | None = (
        # vLLM's: the stop string or stop token id that ended it (None: eos, length)
        None
    )


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None  # why the request was rejected; the others still ran
    # asked for: per prompt token (the first: None)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


@dataclass(slots=True)
class ExtraRow:
    """A row that ran extra tokens in a step (speculation's guesses): how many, emitted,
    kept."""

    request_id: str
    index: int
    extra: int  # extra tokens computed after its next one
    # tokens emitted: the extra tokens the model agreed with, and one of its own
    emitted: int
    kept: int  # extra tokens kept, after a stop cut the run short


@dataclass(slots=True)
class StepReport:
    """What one step did: print it for a line, collect them for a timeline picture."""

    step: int
    # (request_id, seq index, "prefill"/"decode", tokens)
    ran: list[tuple[str, int, str, int]]
    frames_taken: int
    frames_freed: int
    free_frames: int
    copies: int  # copy-on-write frame copies
    swapped_out: int  # frames moved to host memory
    swapped_in: int
    cached_tokens: int  # prompt tokens found in the prefix cache
    preempted: list[tuple[str, str]]  # (request_id, "recompute" / "swap")
    finished: list[RequestOutput]
    seconds: float
    # static batching: finished rows still computed
    padded: list[tuple[str, int]] = field(default_factory=list)
    guessed: int = 0  # speculative decoding: guessed tokens checked this step
    accepted: int = 0  # of those, the ones the model agreed with
    # per row: (request_id,
    guesses: list[tuple[str, int, int, int]] = field(default_factory=list)
    #   seq index, guessed, kept); the guessed - kept slots were rolled back

    @classmethod
    def of(
        cls,
        step: int,
        batch,
        extra: dict,
        rows: list[ExtraRow],
        finished: list[RequestOutput],
        blocks,
        before: tuple[int, int],
        start: float,
    ) -> StepReport:
        """The report of a step that ran `batch` (its rows' `extra` tokens; `rows`, the
        ones that ran some) over `blocks`, whose frames_taken and frames_released were
        `before` at `start`.
        """
        return cls(
            step,
            ran=[
                (
                    s.request.request_id,
                    s.seq.index,
                    s.kind,
                    s.num_new_tokens + len(extra.get(s.seq, ())),
                )
                for s in batch.scheduled
            ],
            frames_taken=blocks.frames_taken - before[0],
            frames_freed=blocks.frames_released - before[1],
            free_frames=blocks.num_free_frames,
            copies=len(batch.moves.copies),
            swapped_out=len(batch.moves.swap_out),
            swapped_in=len(batch.moves.swap_in),
            cached_tokens=batch.cached_tokens,
            preempted=batch.preempted,
            finished=finished,
            seconds=time.perf_counter() - start,
            padded=[(request.request_id, seq.index) for request, seq in batch.padding],
            guessed=sum(map(len, extra.values())),
            accepted=sum(r.emitted - 1 for r in rows),
            guesses=[(r.request_id, r.index, r.extra, r.kept) for r in rows],
        )

    @property
    def padding(self) -> int:
        return len(self.padded)

    @property
    def num_tokens(self) -> int:
        return sum(n for *_, n in self.ran)

    def __str__(self) -> str:
        kinds = {"prefill": 0, "decode": 0}
        for _, _, kind, _ in self.ran:
            kinds[kind] += 1
        parts = [
            (
                f"step {self.step}: {kinds['prefill']} prefill + {kinds['decode']}"
                f" decode ({self.num_tokens} tokens, {1000 * self.seconds:.0f} ms)"
            ),
            (
                f"frames +{self.frames_taken} -{self.frames_freed} ({self.free_frames}"
                " free)"
            ),
        ]
        extras = [
            (self.copies, "copy-on-write"),
            (self.cached_tokens, "cached tokens"),
            (self.swapped_out, "frames swapped out"),
            (self.swapped_in, "frames swapped in"),
        ]
        parts += [f"{n} {what}" for n, what in extras if n]
        parts += [f"preempted {rid} ({mode})" for rid, mode in self.preempted]
        parts += [f"finished {o.request_id}" for o in self.finished]
        return ", ".join(parts)


def rejected(request_id: str, prompt, error: ValueError) -> RequestOutput:
    """The output of a request that add_request refused: no tokens, and why."""
    ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else None
    ids = list(ids) if isinstance(ids, (list, tuple)) else []
    return RequestOutput(
        request_id,
        prompt if isinstance(prompt, str) else None,
        ids,
        [CompletionOutput(0, "", [], "rejected")],
        error=str(error),
    )
