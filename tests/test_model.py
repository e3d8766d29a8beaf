"""The forward pass and model loading, on tiny random checkpoints the tests write
themselves."""

import json
from pathlib import Path

import numpy as np
import pytest
from checkpoints import bf16_round, write_checkpoint

from minipaged.model.config import ModelConfig
from minipaged.model.llama import Model, rope_inv_freq
from minipaged.model.oracle import ContiguousKVCache, greedy_generate
from minipaged.model.weights import load_weights, read_safetensors, resolve_model

HF = json.loads((Path(__file__).parent / "data" / "hf_tiny_logits.json").read_text())


def full_logits(model: Model, tokens: list[int]) -> np.ndarray:
    """Logits at every position from one prefill pass over a contiguous cache."""
    cache = ContiguousKVCache(model.config, 1, len(tokens), np, model.dtype)
    positions = cache.begin_step([0], [len(tokens)])
    return model.forward(tokens, positions, cache)


@pytest.mark.parametrize("case", sorted(HF["cases"]))
def test_logits_equal_transformers(tmp_path, case):
    """GQA 1/3/8, Qwen2 and Llama biases, untied head, llama3 RoPE: same logits as
    transformers."""
    options = HF["cases"][case]["options"]
    model = Model.from_folder(write_checkpoint(tmp_path, **options))
    expected = np.array(HF["cases"][case]["logits"], dtype=np.float32)
    np.testing.assert_allclose(
        full_logits(model, HF["tokens"]), expected, atol=2e-4, rtol=1e-4
    )


@pytest.mark.parametrize(
    "options",
    [
        dict(heads=4, kv_heads=4),
        dict(hidden=96, heads=6, kv_heads=2),
        dict(hidden=128, heads=8, kv_heads=1, tied=False),
        dict(arch="Qwen2ForCausalLM"),
    ],
)
def test_decode_one_token_at_a_time_equals_prefill(tiny, options):
    """The KV cache is right: token-by-token logits equal one pass over the whole
    sequence."""
    model = Model.from_folder(tiny(**options))
    tokens = [1, 7, 12, 30, 5, 44, 9, 9, 21, 60]
    cache = ContiguousKVCache(model.config, 1, len(tokens), np, model.dtype)
    stepwise = [
        model.forward([t], cache.begin_step([0], [1]), cache)[0] for t in tokens
    ]
    np.testing.assert_allclose(
        np.stack(stepwise), full_logits(model, tokens), atol=1e-4
    )


def test_batched_sequences_do_not_leak_into_each_other(tiny):
    """Three sequences of different lengths in one flattened pass equal three separate
    passes."""
    model = Model.from_folder(tiny(hidden=96, heads=6, kv_heads=2))
    prompts = [[1, 5, 9], [1, 20, 21, 22, 23, 24, 25], [4]]
    cache = ContiguousKVCache(model.config, 3, 16, np, model.dtype)
    positions = cache.begin_step([0, 1, 2], [len(p) for p in prompts])
    batched = model.forward(sum(prompts, []), positions, cache)
    alone = np.concatenate([full_logits(model, p) for p in prompts])
    np.testing.assert_allclose(batched, alone, atol=1e-4)
    # and logits_indices keeps only the rows asked for
    last = model.forward(
        [3, 3, 3], cache.begin_step([0, 1, 2], [1, 1, 1]), cache, logits_indices=[2, 0]
    )
    assert last.shape == (2, model.config.vocab_size)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_checkpoints_load_exactly(tiny, dtype):
    """fp16 and bf16 files hold the fp32 weights rounded; loading must give exactly
    those."""
    fp32 = load_weights(tiny(dtype="float32"))
    half = load_weights(tiny(dtype=dtype))
    for name, weight in fp32.items():
        expected = (
            weight.astype(np.float16).astype(np.float32)
            if dtype == "float16"
            else bf16_round(weight)
        )
        assert np.array_equal(half[name].astype(np.float32), expected), name
    assert {a.dtype for a in half.values()} == {
        np.dtype(np.float16 if dtype == "float16" else np.float32)
    }


def test_bf16_widening_is_exact(tmp_path):
    from checkpoints import write_safetensors

    values = np.array(
        [1.0, -2.5, 3.140625, 1e-20, -65504.0, 2.0**100], dtype=np.float32
    )
    write_safetensors(tmp_path / "x.safetensors", {"x": values}, "bfloat16")
    assert np.array_equal(
        read_safetensors(tmp_path / "x.safetensors")["x"], bf16_round(values)
    )
    assert read_safetensors(tmp_path / "x.safetensors")["x"][0] == 1.0


def test_tied_and_untied_heads_agree_when_equal(tiny):
    """An untied lm_head equal to the embedding gives the same logits as a tied
    model."""
    tied_folder = tiny(tied=True)
    weights = load_weights(tied_folder)
    untied = dict(
        weights, **{"lm_head.weight": weights["model.embed_tokens.weight"].copy()}
    )
    config = ModelConfig.from_folder(tied_folder)
    config.tie_word_embeddings = False
    a, b = Model.from_folder(tied_folder), Model(config, untied)
    np.testing.assert_array_equal(full_logits(a, [1, 2, 3]), full_logits(b, [1, 2, 3]))


def test_biases_are_used(tiny):
    """Zeroing the q/k/v biases of a Qwen2 checkpoint changes its logits."""
    folder = tiny(arch="Qwen2ForCausalLM")
    weights = load_weights(folder)
    zeroed = {
        k: np.zeros_like(v) if k.endswith("bias") else v for k, v in weights.items()
    }
    config = ModelConfig.from_folder(folder)
    assert not np.allclose(
        full_logits(Model(config, weights), [1, 2, 3]),
        full_logits(Model(config, zeroed), [1, 2, 3]),
        atol=1e-3,
    )


def test_greedy_oracle_is_argmax_of_prefill(tiny):
    model = Model.from_folder(tiny())
    prompt = [1, 8, 9, 10]
    out = greedy_generate(model, prompt, max_tokens=5)
    for i, token in enumerate(out):
        assert token == int(full_logits(model, prompt + out[:i])[-1].argmax())


def test_llama3_rope_scaling_matches_formula():
    """Short wavelengths are kept, long ones divided by the factor, the band between
    blended."""
    config = ModelConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 8,
            "hidden_size": 128,
            "intermediate_size": 8,
            "num_hidden_layers": 1,
            "num_attention_heads": 1,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        }
    )
    plain = 1.0 / 500000.0 ** (np.arange(0, 128, 2) / 128)
    scaled = rope_inv_freq(config)
    wavelen = 2 * np.pi / plain
    np.testing.assert_allclose(
        scaled[wavelen < 8192 / 4], plain[wavelen < 8192 / 4], rtol=1e-6
    )
    np.testing.assert_allclose(
        scaled[wavelen > 8192], plain[wavelen > 8192] / 32, rtol=1e-6
    )
    band = (wavelen >= 2048) & (wavelen <= 8192)
    assert (
        band.any()
        and np.all(scaled[band] < plain[band])
        and np.all(scaled[band] > plain[band] / 32)
    )


# ---- errors that say what was wrong --------------------------------------------------


def test_unsupported_architecture(tiny):
    folder = tiny()
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["MambaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError,
        match="unsupported architecture 'MambaForCausalLM'.*LlamaForCausalLM",
    ):
        ModelConfig.from_folder(folder)


@pytest.mark.parametrize(
    "missing, said",
    [
        ("config.json", "config.json"),
        ("tokenizer.json", "tokenizer.json"),
        ("model.safetensors", r"\*.safetensors \(weights\)"),
    ],
)
def test_folder_missing_files(tiny, missing, said):
    folder = tiny()
    (folder / missing).unlink()
    with pytest.raises(FileNotFoundError, match="is missing " + said):
        resolve_model(folder)


def test_missing_tensor_is_named(tiny):
    folder = tiny(tied=False)
    weights = load_weights(folder)
    del weights["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match="model.layers.1.mlp.up_proj.weight"):
        Model(ModelConfig.from_folder(folder), weights)


def test_bad_gqa_and_rope_configs():
    base = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 8,
        "hidden_size": 64,
        "intermediate_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 6,
    }
    with pytest.raises(ValueError, match="not a multiple of num_key_value_heads=4"):
        ModelConfig.from_dict(dict(base, num_key_value_heads=4))
    with pytest.raises(ValueError, match="lacks hidden_size"):
        ModelConfig.from_dict({k: v for k, v in base.items() if k != "hidden_size"})
    config = ModelConfig.from_dict(
        dict(base, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    )
    with pytest.raises(ValueError, match="rope_scaling type 'yarn' is not supported"):
        rope_inv_freq(config)


def test_not_a_folder_nor_hub_id():
    with pytest.raises(FileNotFoundError, match="neither a folder nor a hub id"):
        resolve_model("./no/such/folder")


def test_hub_id_resolves_from_the_local_hub_cache(tiny, tmp_path, monkeypatch):
    """A hub id is looked up in the Hugging Face cache layout before any download."""
    import shutil

    import huggingface_hub.constants

    snapshot = tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / "0123abcd"
    shutil.copytree(tiny(), snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(
        huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub")
    )
    # never the network
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert resolve_model("acme/tiny-llama") == snapshot
    with pytest.raises(
        FileNotFoundError,
        match=(
            "model 'acme/not-here' is not a local folder, and the "
            "Hugging Face hub cannot be reached"
        ),
    ) as caught:
        resolve_model("acme/not-here")
    # one message, no chain
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
