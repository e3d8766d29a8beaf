"""The baseline before paging: each request reserves `max_model_len` contiguous slots up
front.

A block manager the scheduler can use in place of the paged one; compare the two with
`python -m minipaged.bench memory`.
"""

from __future__ import annotations

from collections.abc import Sequence

from minipaged.paging.allocator import check_size
from minipaged.paging.manager import BlockManager, MemoryUsage, SeqId


class StaticBlockManager(BlockManager):
    """Regions of `max_model_len` slots (frame r = slots r*max_model_len ...), one per
    request. It is paging with one block of max_model_len slots per request, taken at
    the first token, so it shares BlockManager's machinery and accounting; the slots it
    holds for tokens that are not there yet are `reserved_unused`."""

    def __init__(self, num_slots: int, max_model_len: int = 2048):
        self.max_model_len = check_size("max_model_len", max_model_len)
        super().__init__(
            num_blocks=check_size("num_slots", num_slots, 0) // max_model_len,
            block_size=max_model_len,
            enable_prefix_caching=False,
        )

    def allocate(
        self,
        seq_id: SeqId,
        token_ids: Sequence[int],
        final_len: int = 0,
        read_cache: bool = True,
    ) -> int:
        self._check_fits(len(token_ids))
        return super().allocate(seq_id, token_ids)

    def append_slot(self, seq_id: SeqId, token_id: int):
        self._check_fits(self._table(seq_id).num_tokens + 1)
        return super().append_slot(seq_id, token_id)

    def usage(self) -> MemoryUsage:
        # its one block per request is all reservation, no tail waste
        usage = super().usage()
        usage.reserved_unused, usage.internal_waste = usage.internal_waste, 0
        return usage

    def _check_fits(self, num_tokens: int) -> None:
        if num_tokens > self.max_model_len:
            raise ValueError(
                f"a sequence of {num_tokens} tokens does not fit the "
                f"{self.max_model_len} slots reserved per request (max_model_len)"
            )
