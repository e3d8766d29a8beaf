"""How batches form: Orca's continuous batching, or the static batches before it.

Orca (Yu et al., OSDI 2022) scheduled at each iteration instead of each request: a
finished sequence leaves at once, a waiting one joins at once. FasterTransformer's
static batches formed once, reserved the whole run, and kept finished rows as padding.
Each field is one such change.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Batching:
    name: str
    # may a request join while others run (else: only an empty batch)?
    joins_running_batch: bool
    # does admission take every frame the run could need, up front?
    reserves_whole_run: bool
    # do finished sequences stay in the batch as padding until it ends?
    keeps_finished_rows: bool


CONTINUOUS = Batching(
    "continuous",
    joins_running_batch=True,
    reserves_whole_run=False,
    keeps_finished_rows=False,
)
STATIC = Batching(
    "static",
    joins_running_batch=False,
    reserves_whole_run=True,
    keeps_finished_rows=True,
)
