"""Which KV memory an engine (or the simulator) runs on: paged frames, Orca's contiguous
chunks, or the static baseline's max_model_len regions. One function, so both choose
alike.
"""

from __future__ import annotations

from minipaged.paging.contiguous import RESERVATIONS, ContiguousBlockManager
from minipaged.paging.manager import BlockManager
from minipaged.paging.static import StaticBlockManager

ALLOCATORS = ("paged",) + tuple(f"contiguous-{r}" for r in RESERVATIONS)


def make_block_manager(
    allocator: str,
    scheduler: str,
    num_blocks: int,
    block_size: int,
    max_model_len: int,
    host_frames: int = 0,
    enable_prefix_caching: bool = False,
    prefix_cache_policy="lru",
    tier_frames: int = 0,
) -> BlockManager:
    """Paged memory (with `tier_frames`, a tier behind its prefix cache); or Orca's
    contiguous chunks (first fit); or for static batching on paged memory the baseline
    before both: one region of max_model_len slots per sequence."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {ALLOCATORS}, got {allocator!r}")
    if allocator != "paged":
        return ContiguousBlockManager(
            num_blocks, block_size, allocator.split("-")[1], max_model_len
        )
    if scheduler == "static":
        return StaticBlockManager(num_blocks * block_size, max_model_len)
    blocks = BlockManager(
        num_blocks, block_size, host_frames, enable_prefix_caching, prefix_cache_policy
    )
    if tier_frames:
        blocks.add_tier(tier_frames)  # the drum behind the prefix cache
    return blocks
