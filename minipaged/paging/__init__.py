"""Paged KV-cache memory, managed like virtual memory: frames, page tables, fork,
copy-on-write, a prefix (page) cache and swap; beside them, the contiguous allocators
paging replaced. The scheduler talks to BlockManager; the model sees only flat arrays
(block_tables, slot_mapping) and the KVCache arrays, never these objects.
"""

from minipaged.paging.allocator import (
    DEFAULT_BLOCK_SIZE,
    BlockAllocator,
    NoFreeFramesError,
    cdiv,
    check_size,
)
from minipaged.paging.block_table import BlockTable, CowPair
from minipaged.paging.choice import ALLOCATORS, make_block_manager
from minipaged.paging.contiguous import (
    RESERVATIONS,
    ChunkAllocator,
    ContiguousBlockManager,
)
from minipaged.paging.kv_cache import (
    CODEC_PARTS,
    KV_CACHE_DTYPES,
    SWAP_SPACE,
    KVCache,
    bytes_per_frame,
    check_codec,
    default_kv_memory,
    kv_storage_dtype,
    num_blocks_for_memory,
)
from minipaged.paging.manager import (
    BlockManager,
    FrameState,
    MemoryMoves,
    MemoryUsage,
    TableView,
)
from minipaged.paging.prefix_cache import PrefixCache, block_hash
from minipaged.paging.replacement import REPLACEMENT_POLICIES, make_policy
from minipaged.paging.static import StaticBlockManager
from minipaged.paging.tier import Drum, TierMove

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "BlockAllocator",
    "NoFreeFramesError",
    "cdiv",
    "check_size",
    "BlockTable",
    "CowPair",
    "KV_CACHE_DTYPES",
    "CODEC_PARTS",
    "check_codec",
    "kv_storage_dtype",
    "SWAP_SPACE",
    "default_kv_memory",
    "KVCache",
    "bytes_per_frame",
    "num_blocks_for_memory",
    "BlockManager",
    "MemoryMoves",
    "MemoryUsage",
    "FrameState",
    "TableView",
    "PrefixCache",
    "block_hash",
    "StaticBlockManager",
    "RESERVATIONS",
    "ChunkAllocator",
    "ContiguousBlockManager",
    "ALLOCATORS",
    "make_block_manager",
    "REPLACEMENT_POLICIES",
    "make_policy",
    "Drum",
    "TierMove",
]
