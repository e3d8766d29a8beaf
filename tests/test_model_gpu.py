"""On a GPU: the CuPy forward pass equals the NumPy one (run by scripts/gpu_check.sh).

Random weights of SmolLM2-135M's real shapes (30 layers, 9/3 heads, head_dim 64), so
nothing large has to travel to the GPU machine.
"""

import numpy as np
import pytest
from checkpoints import write_checkpoint

from minipaged.backend import to_numpy
from minipaged.model import Model
from minipaged.model.oracle import ContiguousKVCache, greedy_generate

pytestmark = pytest.mark.gpu

SMOLLM2_SHAPES = dict(
    hidden=576,
    layers=30,
    heads=9,
    kv_heads=3,
    intermediate=1536,
    max_positions=2048,
    vocab_size=49152,
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("smol_shapes"), **SMOLLM2_SHAPES)


def logits(model, tokens):
    cache = ContiguousKVCache(model.config, 1, len(tokens), model.xp, model.dtype)
    return to_numpy(model.forward(tokens, cache.begin_step([0], [len(tokens)]), cache))


@pytest.mark.parametrize("dtype, atol", [("float32", 2e-3), ("float16", 5e-2)])
def test_cupy_forward_equals_numpy(folder, dtype, atol):
    tokens = np.random.default_rng(0).integers(0, 49152, 100).tolist()
    cpu = logits(Model.from_folder(folder, "cpu", "float32"), tokens)
    gpu = logits(Model.from_folder(folder, "cuda", dtype), tokens)
    assert np.abs(gpu - cpu).max() < atol * max(1.0, np.abs(cpu).max())
    assert (gpu.argmax(-1) == cpu.argmax(-1)).mean() > 0.95


def test_cupy_greedy_fp32_equals_numpy(folder):
    prompt = [1, 5, 9, 17, 33]
    cpu = greedy_generate(Model.from_folder(folder, "cpu", "float32"), prompt, 16)
    gpu = greedy_generate(Model.from_folder(folder, "cuda", "float32"), prompt, 16)
    assert cpu == gpu


def test_engine_on_cupy_equals_numpy(folder):
    """The whole engine on the GPU (paged CUDA kernels, continuous batching) in fp32
    gives the CPU's greedy tokens, for prompts of different lengths decoded together."""
    from minipaged import LLM, SamplingParams

    rng = np.random.default_rng(1)
    prompts = [
        {"prompt_token_ids": rng.integers(5, 49152, n).tolist()}
        for n in (1, 15, 16, 17, 200)
    ]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    cpu = LLM(str(folder), device="cpu").generate(prompts, params, use_tqdm=False)
    gpu = LLM(
        str(folder), device="cuda", dtype="float32", kv_cache_memory=2**30
    ).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in gpu] == [
        o.outputs[0].token_ids for o in cpu
    ]
