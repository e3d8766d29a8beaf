"""Small, fixed demo states shared by the notebooks, docs/figures and the benchmarks.

Each function builds one scene the walkthroughs show, with made-up token ids (paging
never looks at them), so a notebook and the lecture note's figure draw the very same
pool. Nothing here is used by the engine itself.
"""

from __future__ import annotations

from minipaged.paging import BlockManager


def two_sequences() -> BlockManager:
    """Notebook 2's pool, 12 frames of 4 slots: s1 (a 6-token prompt, then 8 generated
    tokens) and s2 (a 5-token prompt), then both generating 6 more tokens in turn, so
    that their frames interleave. Notebook 2 builds it step by step; notebook 3 runs the
    kernel over it.
    """
    manager = BlockManager(num_blocks=12, block_size=4, enable_prefix_caching=False)
    manager.allocate("s1", [101, 102, 103, 104, 105, 106])
    for token in range(200, 208):
        manager.append_slot("s1", token)
    manager.allocate("s2", [301, 302, 303, 304, 305])
    for step in range(6):
        manager.append_slot("s1", 400 + step)
        manager.append_slot("s2", 500 + step)
    return manager


def reused_frames() -> BlockManager:
    """two_sequences() at the end of notebook 2: s1 finished and freed its frames, then
    s3 (a 20-token prompt) took the free frames, s1's among them, wherever they lie."""
    manager = two_sequences()
    manager.free("s1")
    manager.allocate("s3", list(range(600, 620)))
    return manager
