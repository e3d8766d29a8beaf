"""Contiguous allocators (Orca's max / pow2 / oracle): one chunk of consecutive frames
per sequence, first fit; refusals with enough memory free in total are external
fragmentation.
The same kernels read a chunk, so the real model gives the oracle's tokens on it."""

import numpy as np
import pytest

from minipaged import LLM, SamplingParams
from minipaged.model.oracle import greedy_generate
from minipaged.paging import ContiguousBlockManager, NoFreeFramesError


def test_first_fit_places_each_chunk_in_the_first_gap_and_merges_gaps_on_free():
    blocks = ContiguousBlockManager(
        num_blocks=10, block_size=1, reservation="oracle", max_model_len=10
    )
    blocks.allocate("a", [1, 2], final_len=3)  # frames 0-2
    blocks.allocate("b", [1], final_len=4)  # frames 3-6
    blocks.allocate("c", [1], final_len=2)  # frames 7-8
    assert [blocks.block_table(s) for s in "abc"] == [[0, 1], [3], [7]]
    blocks.free("a")
    blocks.free("c")  # gaps: 0-2 and 7-9
    assert blocks.device.gaps == [(0, 3), (7, 3)] and blocks.device.num_free == 6
    # 6 free in all, no 4 in a row
    assert not blocks.can_reserve(4) and blocks.refusals == 1
    assert blocks.can_reserve(3) and blocks.refusals == 1
    blocks.allocate("d", [5], final_len=3)  # first fit: the gap at 0
    assert blocks.block_table("d") == [0]
    blocks.free("b")  # 3-6 merges with 7-9
    assert blocks.device.gaps == [(3, 7)]
    with pytest.raises(NoFreeFramesError):
        blocks.allocate("e", [1], final_len=8)


def test_a_sequence_grows_inside_its_chunk_and_never_past_it():
    blocks = ContiguousBlockManager(
        num_blocks=8, block_size=2, reservation="oracle", max_model_len=16
    )
    blocks.allocate("a", [1, 2, 3], final_len=5)  # 3 frames: 0, 1, 2
    assert blocks.device.num_reserved == 1
    for token in (4, 5):
        assert blocks.can_append_slots("a")
        blocks.append_slot("a", token)
    assert blocks.block_table("a") == [0, 1, 2] and blocks.device.num_reserved == 0
    # 6 slots in 3 frames: 5 tokens, 1 slot of rounding (internal)
    usage = blocks.usage()
    assert (usage.token_slots, usage.reserved_unused, usage.internal_waste) == (5, 0, 1)
    # the rounding slot takes one more; then the chunk is full
    blocks.append_slot("a", 6)
    assert not blocks.can_append_slots("a")
    with pytest.raises(NoFreeFramesError):
        blocks.append_slot("a", 7)


@pytest.mark.parametrize(
    "reservation, final_len, frames",
    [("max", 5, 16), ("pow2", 5, 8), ("pow2", 9, 16), ("oracle", 5, 5)],
)
def test_reservation_sizes(reservation, final_len, frames):
    blocks = ContiguousBlockManager(
        num_blocks=64, block_size=1, reservation=reservation, max_model_len=16
    )
    assert blocks.frames_to_admit(2, final_len) == frames
    blocks.allocate("a", [1, 2], final_len=final_len)
    usage = blocks.usage()
    assert usage.allocated_slots == frames and usage.token_slots == 2
    assert (
        usage.reserved_unused == final_len - 2
        and usage.internal_waste == frames - final_len
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from checkpoints import write_checkpoint

    return write_checkpoint(
        tmp_path_factory.mktemp("tiny"),
        hidden=64,
        heads=4,
        kv_heads=2,
        max_positions=256,
    )


@pytest.mark.parametrize(
    "allocator", ["contiguous-max", "contiguous-pow2", "contiguous-oracle"]
)
def test_real_model_on_contiguous_chunks_gives_the_oracle_tokens(folder, allocator):
    llm = LLM(
        str(folder),
        device="cpu",
        num_blocks=40,
        block_size=4,
        max_model_len=64,
        allocator=allocator,
    )
    rng = np.random.default_rng(1)
    prompts = [
        rng.integers(5, 60, int(rng.integers(1, 40))).tolist() for _ in range(10)
    ]
    lengths = rng.integers(1, 20, 10).tolist()
    params = [
        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths
    ]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False
    )
    for prompt, n, out in zip(prompts, lengths, outs):
        assert out.outputs[0].token_ids == greedy_generate(llm.model, prompt, n)
    blocks = llm.engine.blocks
    assert blocks.device.num_free == blocks.num_frames and blocks.device.gaps == [
        (0, blocks.num_frames)
    ]


def test_contiguous_allocator_refuses_what_needs_shared_frames(folder):
    llm = LLM(
        str(folder),
        device="cpu",
        num_blocks=40,
        block_size=4,
        allocator="contiguous-oracle",
    )
    out = llm.generate(
        [{"prompt_token_ids": [5, 6]}],
        SamplingParams(n=2, max_tokens=3),
        use_tqdm=False,
    )[0]
    assert (
        out.outputs[0].finish_reason == "rejected"
        and "use allocator='paged'" in out.error
    )
    with pytest.raises(ValueError, match="allocator must be one of"):
        LLM(str(folder), device="cpu", num_blocks=8, allocator="buddy")
