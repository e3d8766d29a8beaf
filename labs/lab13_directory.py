"""Lab 13: the directory (meeting 17, locality-aware request distribution). Three replicas of
the engine serve one room behind a router; each replica publishes its prefix cache's events
(a block stored, a block removed, all cleared). You write the router's directory, which keeps
from those events which replica holds which block (as Censier and Feautrier's directory kept
which cache held which line), answers how many leading blocks of a prompt each replica holds,
and routes the prompt by LARD's rule: to the replica whose cache holds most of it, unless that
one is overloaded (docs/17_routing.md).

Grade it (then it routes three engines):  python -m minipaged.lab check 13 my_directory.py
Hints, one step at a time:                python -m minipaged.lab hint 13
"""

from __future__ import annotations


class Directory:
    """For each block a replica published, the replicas that hold it. A block is named by its
    hash, as the replica's events name it; its parent is the block before it in its prompt
    (None for a prompt's first block). The router never computes a hash: it follows the names
    the events gave, from (parent's name, the block's token ids) to the block's name."""

    def __init__(self, num_replicas: int, block_size: int, low: int = 2, high: int = 4):
        """An empty directory of `num_replicas` replicas whose blocks hold `block_size`
        tokens; LARD's load thresholds `low` and `high` (written for you)."""
        self.num_replicas = num_replicas
        self.block_size = block_size
        self.low = low
        self.high = high
        self.name_of: dict[tuple, int] = {}  # (parent's name or None, token ids tuple) -> name
        self.holders: dict[int, set[int]] = {}  # a block's name -> the replicas holding it

    def stored(self, replica: int, block_hashes, parent_block_hash, token_ids) -> None:
        """BlockStored from `replica`: the blocks named `block_hashes`, in order, now hold
        `token_ids` (`block_size` tokens each), the first chained to `parent_block_hash`
        (None: it starts a prompt), each next one to the one before. Name each block
        (`name_of`) and add `replica` to its holders."""
        raise NotImplementedError("lab 13: write Directory.stored (stuck? python -m minipaged.lab hint 13)")

    def removed(self, replica: int, block_hashes) -> None:
        """BlockRemoved from `replica`: it no longer holds these blocks (one it never held
        changes nothing; the other replicas keep theirs)."""
        raise NotImplementedError("lab 13: write Directory.removed (stuck? python -m minipaged.lab hint 13)")

    def cleared(self, replica: int) -> None:
        """AllBlocksCleared from `replica`: it holds no block any more."""
        raise NotImplementedError("lab 13: write Directory.cleared (stuck? python -m minipaged.lab hint 13)")

    def matches(self, token_ids) -> list[int]:
        """For each replica, how many leading full blocks of `token_ids` it holds: the run
        from the prompt's first block, stopping at the first block it does not hold (a
        partial last block never counts)."""
        raise NotImplementedError("lab 13: write Directory.matches (stuck? python -m minipaged.lab hint 13)")

    def route(self, token_ids, loads) -> int:
        """LARD: the replica holding the most leading blocks of `token_ids` (ties: the least
        loaded, then the first), or, when none holds any, the least loaded (ties: the first).
        `loads[r]` is replica r's unfinished requests. The target moves to the least loaded
        replica when it is over `high` while another is under `low`, or at twice `high` or
        more."""
        raise NotImplementedError("lab 13: write Directory.route (stuck? python -m minipaged.lab hint 13)")

    def feed(self, replica: int, events) -> None:
        """Apply `replica`'s KV events in order, each as vLLM's msgpack decodes it: a
        dict with its "type" (BlockStored, BlockRemoved, AllBlocksCleared) and vLLM's
        fields ("block_hashes", "parent_block_hash", "token_ids", "medium", ...). The
        directory keeps the pools: a block in a replica's tier (medium "CPU") is left
        out (written for you)."""
        for event in events:
            if event.get("medium", "GPU") != "GPU":
                continue  # a block in the replica's tier, not in its pool
            kind = event["type"]
            if kind == "BlockStored":
                hashes = event["block_hashes"]
                self.stored(replica, hashes, event["parent_block_hash"], event["token_ids"])
            elif kind == "BlockRemoved":
                self.removed(replica, event["block_hashes"])
            elif kind == "AllBlocksCleared":
                self.cleared(replica)
