"""Meeting 17's router side (minipaged/tools/lab/directory_lab.py): the directory fed by
replicas' KV events answers what each replica's own prefix cache holds, through
evictions and a reset; LARD on it keeps each conversation on one replica and computes
fewer prompt tokens than round robin; the directory's picture says which replica holds
each block.
"""

import pytest

from minipaged.tools.lab import directory_lab
from minipaged.tools.lab.directory_lab import (
    Cluster,
    Directory,
    DirectoryMap,
    converse,
    lard,
    round_robin,
)
from minipaged.tools.lab.engine_run import RANDOM_MODEL, load_model


@pytest.fixture(scope="module")
def llm():
    return load_model(RANDOM_MODEL)[0]


class Counting(Directory):
    """The directory, counting the blocks its replicas said they removed."""

    removals = 0

    def removed(self, replica, block_hashes):
        self.removals += len(block_hashes)
        super().removed(replica, block_hashes)


@pytest.mark.parametrize("tier", [0, 16])
def test_the_directory_answers_as_each_replicas_prefix_cache(llm, tier):
    """A pool of 14 frames per replica: blocks are evicted (BlockRemoved), and replica 1
    is reset halfway (its parked blocks dropped); before every decision, the directory's
    matches are what each replica's prefix cache holds. With a tier behind each pool,
    its events (medium CPU) are left out: the directory keeps the pools."""
    cluster = Cluster(llm, num_blocks=14, max_num_seqs=2, kv_offload_frames=tier)
    directory = Counting(3, cluster.block_size)
    asked, reset = [], []

    def check(token_ids):
        if len(asked) == 12:
            reset.append(cluster.engines[1].blocks.reset_prefix_cache())
        cluster.take_events(directory)
        asked.append(token_ids)
        assert directory.matches(token_ids) == cluster.cached_blocks(token_ids)
        # a prompt's prefixes too, not only the prompts asked
        for end in range(0, len(token_ids), 5):
            prefix = token_ids[:end]
            assert directory.matches(prefix) == cluster.cached_blocks(prefix)

    converse(cluster, round_robin(), directory=directory, check=check)
    assert len(asked) == directory_lab.USERS * directory_lab.TURNS
    assert directory.removals, "the pool kept every block: no eviction seen"
    assert reset and reset[0] > 0, "the reset dropped no block"


def test_lard_keeps_each_conversation_on_one_replica_and_computes_less(llm):
    directory = Directory(3, directory_lab.ENGINE["block_size"])
    by_lard = converse(Cluster(llm), lard(directory), directory=directory)
    by_turn = converse(Cluster(llm), round_robin())
    for user in range(directory_lab.USERS):
        replicas = {r for (_, u), r in by_lard.sent.items() if u == user}
        assert len(replicas) == 1, (user, replicas)
    assert by_lard.prompt_tokens == by_turn.prompt_tokens
    assert by_lard.computed < by_turn.computed / 2
    assert sorted(by_lard.users_per_replica()) == [2, 3, 3]
    # the answers do not depend on the replica
    assert by_lard.texts == by_turn.texts


def test_the_directorys_picture_says_who_holds_each_block():
    directory = Directory(3, 2)
    directory.stored(0, [10, 11, 12], None, [1, 2, 3, 4, 5, 6])
    directory.stored(2, [10], None, [1, 2])
    directory.removed(0, [12])
    directory.stored(1, [20], None, [7, 8])
    rows = {"a": [1, 2, 3, 4, 5, 6, 9], "b": [7, 8, 9], "c": [5, 5]}
    picture = DirectoryMap(directory, rows, "t")
    # a's first block on 0 and 2, its second on 0, its third on none; b's on 1
    assert str(picture).splitlines() == ["t", "a  *0.", "b  1", "c  "]
    svg = picture.svg()
    assert svg.startswith("<svg") and "replica 2" in svg and "several" in svg
    assert directory.matches([1, 2, 3, 4, 5, 6]) == [2, 0, 1]
