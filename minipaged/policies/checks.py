"""Checks at the seams: a policy is a participant's code, so what it is and what it
answers are checked before the core acts on it. A policy without its seam's methods is
refused when it is built; a wrong answer (or an exception) is replaced, for that one
decision, by the default's, and the step then raises a PolicyError naming the seam,
the policy and what was wrong, with the step's report: nothing is lost or doubled.
"""

from __future__ import annotations

import inspect

import numpy as np

# option -> the methods a policy of that seam must have (policies/protocols.py)
PROTOCOLS = {
    "scheduling_policy": ("pick",),
    "admission": ("growth",),
    "preemption_victim": ("choose",),
    "prefix_cache_policy": ("entered", "parked", "left", "victim"),
    "structured_outputs_backend": ("compile",),
    "constraint": ("allowed", "advance", "fork"),
}


class PolicyError(RuntimeError):
    """A policy failed at its seam. `option` names the seam, `policy` the policy;
    `request_ids` are the requests it cut short (none when the default stood in);
    `report` is the StepReport of the step that raised it (the step itself ran)."""

    def __init__(self, option: str, policy, what: str, request_ids=()):
        self.option = option
        self.policy = describe(policy)
        self.what = what
        self.request_ids = list(request_ids)
        self.report = None
        self.reported = False  # a constraint's failure: already raised by a step
        super().__init__(f"{option} {self.policy}: {what}")


def describe(policy) -> str:
    """A policy as a message names it: its name and class, or a string given."""
    if isinstance(policy, str):
        return policy
    cls = policy if inspect.isclass(policy) else type(policy)
    name = getattr(policy, "name", None)
    where = f"{cls.__module__}:{cls.__qualname__}"
    if isinstance(name, str) and name:
        return f"{name!r} ({where})"
    return where


def check_protocol(option: str, policy) -> None:
    """A ValueError naming the option, the policy and the first method it lacks."""
    needed = PROTOCOLS.get(option, ())
    missing = [m for m in needed if not callable(getattr(policy, m, None))]
    if missing:
        methods = ", ".join(f"{m}()" for m in needed)
        raise ValueError(
            f"{option}={describe(policy)} has no {missing[0]}() method: a"
            f" {option} policy needs {methods} (see minipaged/policies/protocols.py)"
        )


def ask(option: str, policy, method: str, *args):
    """policy.method(*args); an exception it raises becomes a PolicyError."""
    try:
        return getattr(policy, method)(*args)
    except Exception as error:
        what = f"{method}() raised {type(error).__name__}: {error}"
        raise PolicyError(option, policy, what) from error


def one_of(option: str, policy, method: str, answer, choices, what: str):
    """`answer` if it is one of `choices` (the very object), else a PolicyError."""
    if any(answer is choice for choice in choices):
        return answer
    shown = repr(answer)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    raise PolicyError(option, policy, f"{method}() returned {shown}, not {what}")


def frame_count(option: str, policy, method: str, answer) -> int:
    """`answer` if it is a whole number of frames >= 0, else a PolicyError."""
    is_int = isinstance(answer, (int, np.integer)) and not isinstance(answer, bool)
    if is_int and answer >= 0:
        return int(answer)
    what = f"{method}() returned {answer!r}, not a whole number of frames >= 0"
    raise PolicyError(option, policy, what)


# ---- the scheduler's seams: each answer checked, the default's taken when it fails --
def pick(order, waiting, now: int, errors: list):
    """The waiting order's choice among a copy of the queue (it cannot lose or double
    one); when it fails (appended to `errors`), the default's: the first waiting."""
    waiting = tuple(waiting)
    try:
        answer = ask("scheduling_policy", order, "pick", waiting, now)
        what = "one of the waiting requests it was given"
        return one_of("scheduling_policy", order, "pick", answer, waiting, what)
    except PolicyError as error:
        errors.append(error)
        return waiting[0]


def rank(order, requests, now: int, errors: list) -> list:
    """`requests` in the waiting order's choice: pick, then pick again among the rest
    (each answer checked as `pick`'s; a failure ranks the rest as given)."""
    left, ranked = list(requests), []
    while left:
        before = len(errors)
        request = pick(order, left, now, errors)
        if len(errors) > before:
            return ranked + left
        left.remove(request)
        ranked.append(request)
    return ranked


def victim(policy, candidates: list, errors: list):
    """The victim policy's choice among a copy of `candidates` (the request that must
    grow, then the others not yet scheduled); when it fails, the default's: the
    newest."""
    candidates = tuple(candidates)
    try:
        answer = ask("preemption_victim", policy, "choose", candidates)
        what = "one of the candidates it was given"
        return one_of("preemption_victim", policy, "choose", answer, candidates, what)
    except PolicyError as error:
        errors.append(error)
        return candidates[-1]


def growth(admission, request, blocks, final_len: int, errors: list) -> int:
    """The frames admission promises to a request's growth; when it fails, the
    default's: none beyond what fits now."""
    try:
        answer = ask("admission", admission, "growth", request, blocks, final_len)
        return frame_count("admission", admission, "growth", answer)
    except PolicyError as error:
        errors.append(error)
        return 0


def served(order, row, num_tokens: int, errors: list) -> None:
    """Tell an order that counts service (it has served()) what a row was served."""
    if not callable(getattr(order, "served", None)):
        return
    try:
        ask("scheduling_policy", order, "served", row.request, num_tokens, row.kind)
    except PolicyError as error:
        errors.append(error)


class CheckedConstraint:
    """A structured-output constraint whose answers are checked: `allowed()` must be a
    bool mask over the vocabulary, and neither call may raise. After a failure the
    sequence may take an end-of-sequence token only (it ends), and `failure` says why.
    """

    def __init__(self, inner, backend, vocab_size: int, eos_token_ids):
        check_protocol("constraint", inner)
        self.inner = inner
        self.backend = backend
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.failure: PolicyError | None = None

    def allowed(self):
        if self.failure is None:
            try:
                return self._checked(self._call("allowed"))
            except PolicyError as error:
                self.failure = error
        mask = np.zeros(self.vocab_size, dtype=bool)  # (vocab,)
        mask[self.eos_token_ids] = True
        return mask

    def _call(self, method: str, *args):
        """The constraint's own method; what it raises names the backend."""
        try:
            return getattr(self.inner, method)(*args)
        except Exception as error:
            what = f"its constraint's {method}() raised {type(error).__name__}: {error}"
            raise PolicyError(
                "structured_outputs_backend", self.backend, what
            ) from error

    def _checked(self, mask):
        mask = np.asarray(mask)
        if mask.dtype != bool or mask.shape != (self.vocab_size,):
            what = (
                f"its constraint's allowed() returned an array of {mask.dtype}"
                f" {mask.shape}, not a bool mask of shape ({self.vocab_size},)"
            )
            raise PolicyError("structured_outputs_backend", self.backend, what)
        return mask

    def advance(self, token: int) -> None:
        if self.failure is not None:
            return
        try:
            self._call("advance", token)
        except PolicyError as error:
            self.failure = error

    def fork(self) -> CheckedConstraint:
        """An independent copy; a fork that fails leaves the copy failed too."""
        forked = CheckedConstraint.__new__(CheckedConstraint)
        forked.backend = self.backend
        forked.vocab_size = self.vocab_size
        forked.eos_token_ids = self.eos_token_ids
        forked.failure = self.failure
        forked.inner = self.inner
        if self.failure is None:
            try:
                forked.inner = self._call("fork")
                check_protocol("constraint", forked.inner)
            except (PolicyError, ValueError) as error:
                forked.failure = PolicyError(
                    "structured_outputs_backend", self.backend, str(error)
                )
        return forked
