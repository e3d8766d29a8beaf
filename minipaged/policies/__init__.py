"""The seams: each decision an idea of the series changes is asked of a policy, named
here.

The core (engine, scheduler, runner) is mechanism and asks these; each policy is one
file that opens with its classic source. A user's own policy plugs in wherever a name is
taken: as an object, or as a dotted path "package.module:Class" (built with the settings
it accepts).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path

from minipaged.paging import REPLACEMENT_POLICIES
from minipaged.policies.batching import CONTINUOUS, STATIC, Batching
from minipaged.policies.checks import (
    CheckedConstraint,
    PolicyError,
    check_protocol,
    describe,
)
from minipaged.policies.defaults import FCFS, Greedy, Newest
from minipaged.policies.fair import Fair, MostServed
from minipaged.policies.priority import LeastUrgent, Priority
from minipaged.policies.protocols import (
    Admission,
    Constraint,
    Lookahead,
    Victim,
    WaitingOrder,
)
from minipaged.policies.sjf import SJF, Aging
from minipaged.policies.working_set import WorkingSet

# option -> {name: policy class}: the seam table of docs/architecture.md ("the seams").
# The prefix cache's replacement seam is paging's own (paging/replacement.py); the
# tier's is kv_offload_frames, speculation's is speculative_config
# (minipaged.speculative).
SEAMS = {
    # the waiting order
    "scheduling_policy": {p.name: p for p in (FCFS, SJF, Aging, Priority, Fair)},
    "admission": {p.name: p for p in (Greedy, WorkingSet)},
    # (most-served: fair's own)
    "preemption_victim": {p.name: p for p in (Newest, LeastUrgent)},
    "prefix_cache_policy": REPLACEMENT_POLICIES,
    # batching: built-in, no plug-in
    "scheduler": {b.name: b for b in (CONTINUOUS, STATIC)},
    # imported when an engine is built
    "structured_outputs_backend": {"automata": "minipaged.structured:Automata"},
}
WAITING_ORDERS = tuple(SEAMS["scheduling_policy"])
ADMISSIONS = tuple(SEAMS["admission"])


def make(option: str, spec, **settings):
    """The policy `spec` names for `option`: a name from SEAMS[option], a "module:Class"
    path, or an object (returned as it is). A class is built with those of `settings` it
    accepts.
    """
    cls = resolve(option, spec)
    if not inspect.isclass(cls):
        policy = cls
    else:
        policy = build(option, cls, settings)
    check_protocol(option, policy)
    return policy


def build(option: str, cls, settings: dict):
    """An instance of a policy class, given those of `settings` it accepts; whatever
    its constructor raises becomes a ValueError naming the option and the class."""
    try:
        accepted = inspect.signature(cls).parameters
        return cls(**{k: v for k, v in settings.items() if k in accepted})
    except Exception as error:
        raise ValueError(
            f"{option}={describe(cls)}: building it failed:"
            f" {type(error).__name__}: {error}"
        ) from None


def resolve(option: str, spec):
    """The class (or object) `spec` names for `option`, not yet built: a ValueError
    naming the option's policies when it names none."""
    if not isinstance(spec, str):
        return spec
    if ":" in spec:
        return load(option, spec)
    if spec not in SEAMS[option]:
        raise ValueError(
            f"{option} must be one of {tuple(SEAMS[option])} or a 'module:Class' path,"
            f" got {spec!r}"
        )
    found = SEAMS[option][spec]
    return load(option, found) if isinstance(found, str) else found


def load(option: str, path: str):
    """The object at "package.module:Name", or a ValueError naming the option and the
    path."""
    module, _, name = path.rpartition(":")
    try:
        return getattr(import_module(module), name)
    except Exception as error:
        raise ValueError(
            f"{option}={path!r}: cannot load {name!r} from module {module!r} ({error})"
        ) from None


def import_module(module: str):
    """A module by its dotted name, or by a file's path (`./my_policies.py`)."""
    if not module.endswith(".py"):
        return importlib.import_module(module)
    path = Path(module).resolve()
    if not path.is_file():
        raise ImportError(f"no file {path}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def name_of(policy) -> str:
    """A policy's name for messages and metrics: its `name`, else its class name."""
    return getattr(policy, "name", type(policy).__name__)


def scheduler_policies(config) -> tuple:
    """The scheduler's (waiting order, admission, victim) for a SchedulerConfig's
    options, each a name, a path or an object; the settings are checked whichever policy
    reads them. The victim, when not given, is the one the waiting order brings
    (priority's least urgent), else the newest."""
    aging_rate = config.aging_rate
    admission_window = config.admission_window
    # a bad setting is refused by name, whichever policy reads it
    Aging(aging_rate)
    WorkingSet(admission_window)
    order = make("scheduling_policy", config.scheduling_policy, aging_rate=aging_rate)
    admit = make("admission", config.admission, admission_window=admission_window)
    if config.preemption_victim is not None:
        victim = make("preemption_victim", config.preemption_victim)
    else:
        victim = order.victim() if hasattr(order, "victim") else Newest()
    return order, admit, victim


def check_options(
    batching: str = "continuous",
    allocator: str = "paged",
    chunked_prefill: bool = False,
    lookahead: bool = False,
    prefix_caching: bool = True,
    offload_frames: int = 0,
    offload_path=None,
    max_num_batched_tokens: int = 0,
    max_model_len: int = 0,
    max_decode_rows: int = 0,
) -> None:
    """Which options combine, in one place: each refusal names both options and why."""
    static, paged = batching == "static", allocator == "paged"
    for refused, message in [
        (
            max_num_batched_tokens < max_model_len and not chunked_prefill,
            (
                f"max_num_batched_tokens={max_num_batched_tokens} is below"
                f" max_model_len={max_model_len}: a long prompt could never be"
                " prefilled (unless enable_chunked_prefill=True)"
            ),
        ),
        (
            max_decode_rows and static,
            (
                "max_decode_rows needs scheduler='continuous': a static batch runs"
                " every row of its batch each step until the last one finishes"
            ),
        ),
        (
            chunked_prefill and static,
            (
                "enable_chunked_prefill needs scheduler='continuous': a static batch "
                "is formed once, so there are no running decodes to share steps with"
            ),
        ),
        (
            lookahead and static,
            (
                "speculative decoding (speculative_config) needs"
                " scheduler='continuous': a static batch keeps finished rows as padding"
                " and never rolls a row back"
            ),
        ),
        (
            lookahead and not paged,
            (
                "speculative decoding (speculative_config) rolls page tables back: it "
                f"needs allocator='paged', not {allocator!r}"
            ),
        ),
        (
            offload_path is not None and not offload_frames,
            (
                "kv_offload_path needs kv_offload_frames > 0: the file holds the tier's"
                " frames"
            ),
        ),
        (
            offload_frames and not prefix_caching,
            (
                "kv_offload_frames keeps the prefix cache's evicted blocks: "
                "it needs enable_prefix_caching=True"
            ),
        ),
        (
            offload_frames and (not paged or static),
            (
                "kv_offload_frames needs allocator='paged' and "
                "scheduler='continuous' (their prefix cache), not "
                f"{allocator!r} and {batching!r}"
            ),
        ),
    ]:
        if refused:
            raise ValueError(message)


def check_request(order, lookahead, priority, beam_width: int) -> None:
    """A request's options against the engine's policies (ValueError naming both)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(
            f"priority must be a whole number (lower runs first), got {priority!r}"
        )
    if priority and not getattr(order, "uses_priority", False):
        raise ValueError(
            f"priority={priority} needs scheduling_policy='priority' (it is"
            f" {name_of(order)!r})"
        )
    if beam_width > 1 and lookahead is not None:
        raise ValueError(
            f"beam search (beam_width={beam_width}) cannot run with speculative_config:"
            " beams fork at every token, guesses need one sequence; use n instead"
        )


__all__ = [
    "SEAMS",
    "WAITING_ORDERS",
    "ADMISSIONS",
    "make",
    "resolve",
    "load",
    "name_of",
    "PolicyError",
    "CheckedConstraint",
    "check_protocol",
    "describe",
    "scheduler_policies",
    "check_options",
    "check_request",
    "Batching",
    "CONTINUOUS",
    "STATIC",
    "FCFS",
    "SJF",
    "Aging",
    "Priority",
    "Greedy",
    "WorkingSet",
    "Newest",
    "LeastUrgent",
    "Fair",
    "MostServed",
    "WaitingOrder",
    "Admission",
    "Victim",
    "Lookahead",
    "Constraint",
]
