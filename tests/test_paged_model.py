"""The model over the paged KV cache gives the oracle's greedy tokens: paging changes
nothing.

A small driver plays the engine: allocate prompts (prefix-cache hits reused), prefill
them in one flattened step, then decode all sequences together, appending each new
token's slot (and applying copy-on-write copies) before the step that computes its K and
V.
"""

import numpy as np
import pytest

from minipaged.model import Model
from minipaged.model.oracle import greedy_generate
from minipaged.paging import BlockManager, KVCache, MemoryMoves
from minipaged.runner import ModelRunner, step_inputs


def inputs(manager, seq_ids, new_tokens):
    """The step's flat inputs: each sequence computes its last len(new_tokens[i])
    tokens."""
    return step_inputs(
        manager, list(seq_ids), [len(t) for t in new_tokens], token_ids=new_tokens
    )


def paged_greedy(
    model,
    prompts,
    max_tokens,
    block_size=4,
    num_blocks=256,
    forks=None,
    attention=None,
    prefix_caching=True,
):
    """Greedy tokens of every prompt (and of `forks`: {child: parent}), and paging
    statistics."""
    c = model.config
    manager = BlockManager(num_blocks, block_size, enable_prefix_caching=prefix_caching)
    kv = KVCache(
        c.num_layers,
        num_blocks,
        c.num_kv_heads,
        c.head_dim,
        block_size,
        dtype=model.dtype,
        device="cpu",
    )
    runner = ModelRunner(model, kv, manager, attention)
    hits = [manager.allocate(i, p) for i, p in enumerate(prompts)]
    new = [p[h:] for p, h in zip(prompts, hits)]
    logits = runner.run(inputs(manager, range(len(prompts)), new))
    outs = {i: [int(row.argmax())] for i, row in enumerate(logits)}
    # parallel "samples" share the prompt's frames
    for child, parent in (forks or {}).items():
        manager.fork(parent, child)
        outs[child] = list(outs[parent])
    ids, copies_seen = sorted(outs), 0
    for _ in range(max_tokens - 1):
        copies = [cow for i in ids if (cow := manager.append_slot(i, outs[i][-1])[1])]
        copies_seen += len(copies)
        runner.move(MemoryMoves(copies=copies))
        logits = runner.run(inputs(manager, ids, [[outs[i][-1]] for i in ids]))
        for i, row in zip(ids, logits):
            outs[i].append(int(row.argmax()))
    return outs, {"hits": hits, "copies": copies_seen}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from checkpoints import write_checkpoint

    return Model.from_folder(
        write_checkpoint(
            tmp_path_factory.mktemp("gqa3"),
            hidden=96,
            heads=6,
            kv_heads=2,
            max_positions=128,
        )
    )


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_greedy_equals_contiguous_oracle(model, block_size):
    rng = np.random.default_rng(block_size)
    lengths = [1, block_size - 1 or 1, block_size, block_size + 1, 37]
    prompts = [rng.integers(3, 60, n).tolist() for n in lengths]
    outs, _ = paged_greedy(model, prompts, max_tokens=12, block_size=block_size)
    for i, prompt in enumerate(prompts):
        assert outs[i] == greedy_generate(model, prompt, 12), (
            f"prompt {i} of {len(prompt)} tokens"
        )


def test_prefix_cache_hits_give_the_same_tokens(model):
    shared = list(range(3, 3 + 12))  # three full blocks of 4
    prompts = [shared + [40, 41], shared + [50], shared[:8] + [7, 7, 7]]
    outs, stats = paged_greedy(model, prompts, max_tokens=10, block_size=4)
    assert stats["hits"] == [0, 12, 8]  # later prompts reuse the first one's frames
    for i, prompt in enumerate(prompts):
        assert outs[i] == greedy_generate(model, prompt, 10)


def test_forked_sequences_copy_on_write_and_stay_correct(model):
    prompt = list(range(5, 23))  # 18 tokens: the last block of 4 is partial
    outs, stats = paged_greedy(
        model, [prompt], max_tokens=8, block_size=4, forks={1: 0, 2: 0}
    )
    assert stats["copies"] == 2  # two of the three writers copy the shared tail
    oracle = greedy_generate(model, prompt, 8)
    assert outs[0] == outs[1] == outs[2] == oracle


def test_real_model_paged_equals_transformers(smollm2):
    """SmolLM2-135M through the paged cache reproduces transformers' greedy tokens."""
    import json
    from pathlib import Path

    hf = json.loads((Path(__file__).parent / "data" / "hf_greedy.json").read_text())
    cases = hf["cases"][:3]
    outs, _ = paged_greedy(
        smollm2.model,
        [c["prompt_token_ids"] for c in cases],
        max_tokens=20,
        block_size=16,
        num_blocks=64,
    )
    for i, case in enumerate(cases):
        expected = case["output_token_ids"][:20]
        # (the oracle stops at eos; we don't)
        assert outs[i][: len(expected)] == expected


def test_the_cuda_kernels_code_drives_the_model_through_the_emulator(tmp_path):
    """The .cu kernels themselves (write_kv, decode, prefill), run by the CPU emulation,
    give the model the same greedy tokens as the contiguous oracle: the GPU path minus
    the GPU.
    """
    from checkpoints import write_checkpoint

    from minipaged.attention import emulated

    model = Model.from_folder(
        write_checkpoint(tmp_path, hidden=192, heads=3, kv_heads=1, layers=2)
    )
    prompts = [[1, 5, 9, 13, 17, 21, 25, 29, 33], [1, 40], [7]]  # head_dim 64, GQA 3
    outs, stats = paged_greedy(
        model, prompts, max_tokens=4, block_size=4, forks={3: 1}, attention=emulated
    )
    assert stats["copies"] == 1
    for i, prompt in enumerate(prompts):
        assert outs[i] == greedy_generate(model, prompt, 4), i
    assert outs[3] == outs[1]
