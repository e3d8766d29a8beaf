"""The seams of the scheduler, as protocols: what each policy is asked, and nothing
more.

A policy is any object with these methods (no base class needed). The plain defaults are
in `defaults.py`; each idea of the series is a file of its own beside it.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Protocol

from minipaged.paging import BlockManager
from minipaged.sequence import Request


class WaitingOrder(Protocol):
    """Which waiting request admission tries next (if it does not fit, nobody else is
    tried). With `max_decode_rows`, the same `pick` also ranks the running requests
    whose rows a step cannot all hold: asked again without each one it picked."""

    # does it read `request.priority` (vLLM's `priority=`)? Others refuse one
    uses_priority: bool

    def pick(self, waiting: Seq[Request], now: int) -> Request:
        """One of `waiting` (queue order: requests preempted by recompute at the front,
        then arrivals oldest first; running requests in the order they were admitted);
        `now` is the scheduler's step count, `request.arrival` its step.
        """

    # optional (checks.served): an order that counts service, as fair queuing does,
    # has it
    def served(self, request: Request, num_tokens: int, kind: str) -> None:
        """After each step, for each row it ran: `num_tokens` of `request` were computed
        (a decode row's accepted extra tokens too), `kind` "prefill" or "decode";
        `request.client`
        names who asked (the server's API key, else address; "" from LLM.generate)."""


class Admission(Protocol):
    """May a request join now: the frames admission counts beyond each request's frames
    now."""

    def growth(self, request: Request, blocks: BlockManager, final_len: int) -> int:
        """Frames to promise the request's sequences for their growth (0: only what fits
        now)."""


class Victim(Protocol):
    """Whom to preempt when a running request cannot grow."""

    def choose(self, candidates: Seq[Request]) -> Request:
        """One of `candidates`: the request that must grow first, then the others not
        yet scheduled this step, in the order they were admitted (oldest first)."""


class Lookahead(Protocol):
    """Extra tokens a row runs after its next one, checked by the same forward
    (speculation)."""

    def reserve(self, batch, budget: int, max_model_len: int) -> None:
        """At the end of `schedule()`: give decode rows slots for extra tokens
        (`extra_slots`) within `budget` tokens; `batch` is then final."""

    def propose(self, batch) -> dict:
        """After the step's memory moves, before its forward: sequence -> its extra
        tokens (at most its slots)."""

    def emit(self, row, extra: list[int], logits) -> list[int]:
        """After the forward: the tokens the row emits, from its logits (1 + len(extra),
        vocab): the extra tokens kept, then one of the model's."""

    def settle(self, row, kept: list[int]) -> None:
        """The row's extra slots hold `kept` (its kept extra tokens); roll back the
        rest."""


class Constraint(Protocol):
    """The tokens one sequence may take next: structured output's automaton at its
    state. The backend (EngineConfig.structured_outputs_backend) compiles one per
    request with `compile(StructuredOutputsParams) -> Constraint`; each sequence holds
    its own fork.
    """

    def allowed(self):
        """A bool array (vocab,): True for each token the sequence may take now."""

    def advance(self, token: int) -> None:
        """The sequence took `token` (each kept token, in order)."""

    def fork(self) -> Constraint:
        """An independent copy at the same state (another sample; a walk over
        guesses)."""
