"""Lab 13's cases: a file as a participant writes it from the hints, and the catalogue
of plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = """
class Directory:
    def __init__(self, num_replicas, block_size, low=2, high=4):
        self.num_replicas = num_replicas
        self.block_size = block_size
        self.low = low
        self.high = high
        self.name_of = {}
        self.holders = {}

    def stored(self, replica, block_hashes, parent_block_hash, token_ids):
        parent = parent_block_hash
        size = self.block_size
        for i, name in enumerate(block_hashes):
            block = tuple(token_ids[i * size : (i + 1) * size])
            self.name_of[(parent, block)] = name
            self.holders.setdefault(name, set()).add(replica)
            parent = name

    def removed(self, replica, block_hashes):
        for name in block_hashes:
            if name in self.holders:
                self.holders[name].discard(replica)

    def cleared(self, replica):
        for replicas in self.holders.values():
            replicas.discard(replica)

    def matches(self, token_ids):
        counts = [0] * self.num_replicas
        still = set(range(self.num_replicas))
        parent = None
        size = self.block_size
        for start in range(0, len(token_ids) - size + 1, size):
            name = self.name_of.get((parent, tuple(token_ids[start : start + size])))
            if name is None:
                break
            still = still & self.holders.get(name, set())
            for replica in still:
                counts[replica] += 1
            parent = name
        return counts

    def route(self, token_ids, loads):
        counts = self.matches(token_ids)
        least = 0
        for r in range(self.num_replicas):
            if loads[r] < loads[least]:
                least = r
        target = 0
        for r in range(self.num_replicas):
            if (-counts[r], loads[r]) < (-counts[target], loads[target]):
                target = r
        if loads[target] > self.high and loads[least] < self.low:
            return least
        if loads[target] >= 2 * self.high:
            return least
        return target

    def feed(self, replica, events):
        for event in events:
            if event.get("medium", "GPU") != "GPU":
                continue  # a block in the replica's tier, not in its pool
            kind = event["type"]
            if kind == "BlockStored":
                parent = event["parent_block_hash"]
                hashes = event["block_hashes"]
                self.stored(replica, hashes, parent, event["token_ids"])
            elif kind == "BlockRemoved":
                self.removed(replica, event["block_hashes"])
            elif kind == "AllBlocksCleared":
                self.cleared(replica)
"""

MATCHES = (
    "matches finds a stored block again by its tokens, on the replica that stored it,"
    " its chain continued by later events"
)
RUN = (
    "a replica's match is its run of full blocks from the prompt's first, stopping at"
    " its first missing block"
)
REMOVED = "BlockRemoved takes one replica off a block, and nothing else"
CLEARED = "AllBlocksCleared empties one replica, and the others keep their blocks"
TARGET = (
    "route sends a prompt to the replica holding most of it (ties: the least loaded,"
    " then the first); none: the least loaded"
)
THRESHOLDS = (
    "LARD's thresholds: the target moves to the least loaded only when over high while"
    " another is under low, or at twice high"
)
RANDOM = "random scripts of three replicas' events leave the directory's answers"

# where a statement that breaks the participant's method goes
BREAK_AT = (
    "    def stored(self, replica, block_hashes, parent_block_hash, token_ids):\n"
)

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that
# must catch it)
MISTAKES = [
    (
        "every block chained to the event's parent, not to the block before it",
        "            parent = name\n\n    def removed",
        "\n\n    def removed",
        MATCHES,
    ),
    (
        "the block's tokens kept as a list: never found again",
        "block = tuple(token_ids[i * size : (i + 1) * size])",
        "block = token_ids[i * size : (i + 1) * size]",
        MATCHES,
    ),
    (
        "a block named by its tokens alone, whatever came before it",
        "self.name_of[(parent, block)] = name",
        "self.name_of[(None, block)] = name",
        RUN,
    ),
    (
        "a replica counted on after its first missing block",
        "still = still & self.holders.get(name, set())",
        "still = set(self.holders.get(name, set()))",
        RUN,
    ),
    (
        "the last full block missed when the prompt ends with it",
        "range(0, len(token_ids) - size + 1, size)",
        "range(0, len(token_ids) - size, size)",
        RUN,
    ),
    (
        "BlockRemoved forgets the block on every replica",
        "                self.holders[name].discard(replica)\n",
        "                self.holders[name].clear()\n",
        REMOVED,
    ),
    (
        "BlockRemoved of a block never held raises",
        "            if name in self.holders:\n                self.holders[name]",
        "            if True:\n                self.holders[name]",
        RANDOM,
    ),
    (
        "AllBlocksCleared forgets every replica's blocks",
        "        for replicas in self.holders.values():\n"
        "            replicas.discard(replica)\n",
        "        self.holders = {}\n",
        CLEARED,
    ),
    (
        "ties of equal matches go to the first, not the least loaded",
        "if (-counts[r], loads[r]) < (-counts[target], loads[target]):",
        "if -counts[r] < -counts[target]:",
        TARGET,
    ),
    (
        "the most loaded replica taken as the least loaded",
        "if loads[r] < loads[least]:",
        "if loads[r] > loads[least]:",
        THRESHOLDS,
    ),
    (
        "moved at high, not over it",
        "loads[target] > self.high and",
        "loads[target] >= self.high and",
        THRESHOLDS,
    ),
    (
        "moved over high whatever the others' loads",
        "loads[target] > self.high and loads[least] < self.low",
        "loads[target] > self.high",
        THRESHOLDS,
    ),
    (
        "never moved at twice high",
        "        if loads[target] >= 2 * self.high:\n            return least\n",
        "",
        THRESHOLDS,
    ),
    (
        "thresholds fixed at 2 and 4, not the directory's own",
        "loads[target] > self.high and loads[least] < self.low",
        "loads[target] > 4 and loads[least] < 2",
        THRESHOLDS,
    ),
]
