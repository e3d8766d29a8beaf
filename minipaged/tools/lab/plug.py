"""Plugging a participant's piece into the engine, the least magical way we found: while
a `with plugged(...)` block runs, the names the engine looks up when it builds its parts
(the block manager's BlockTable, the engine's Scheduler, ...) are bound to the
participant's objects instead (unittest.mock.patch.object), and put back after, even on
an error.
"""

from __future__ import annotations

import importlib
from contextlib import ExitStack, contextmanager
from unittest import mock

# (module, global name looked up there) -> the participant's name that replaces it, per
# lab
PLUG_POINTS: dict[int, list[tuple[str, str, str]]] = {
    # the manager builds its pools and tables by these names; BlockTable.fork builds a
    # child by the name in block_table.py, so a forked child is the participant's class
    # too
    1: [
        ("minipaged.paging.manager", "BlockAllocator", "BlockAllocator"),
        ("minipaged.paging.manager", "BlockTable", "BlockTable"),
        ("minipaged.paging.block_table", "BlockTable", "BlockTable"),
    ],
    2: [
        ("minipaged.paging.manager", "BlockAllocator", "BlockAllocator"),
        ("minipaged.paging.manager", "BlockTable", "BlockTable"),
        ("minipaged.paging.block_table", "BlockTable", "BlockTable"),
    ],
    # the allocator builds its cache by this name; block_hash is called from three
    # modules
    3: [
        ("minipaged.paging.allocator", "PrefixCache", "PrefixCache"),
        ("minipaged.paging.prefix_cache", "block_hash", "block_hash"),
        ("minipaged.paging.block_table", "block_hash", "block_hash"),
        ("minipaged.paging.manager", "block_hash", "block_hash"),
    ],
    4: [("minipaged.engine", "Scheduler", "Scheduler")],
    # the engine builds its ModelRunner by this name; lab 5 passes one bound to its
    # attention
    5: [("minipaged.engine", "ModelRunner", "ModelRunner")],
}


@contextmanager
def plugged(lab: int, pieces):
    """Inside the block, the engine builds (and runs) lab `lab`'s part from `pieces`."""
    with ExitStack() as stack:
        for module, name, theirs in PLUG_POINTS[lab]:
            stack.enter_context(
                mock.patch.object(
                    importlib.import_module(module), name, getattr(pieces, theirs)
                )
            )
        yield
