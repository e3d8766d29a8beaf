"""Tiny random Hugging Face checkpoints that tests write themselves (no network, no big
files).

`write_checkpoint(folder, **options)` writes config.json, model.safetensors (fp32, fp16
or bf16), tokenizer.json (a word-level vocabulary), tokenizer_config.json with a chat
template and generation_config.json. Weights come from a seeded NumPy generator, so the
same options always give the same checkpoint (scripts/hf_tiny_reference.py relies on
that).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

WORDS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"] + [
    w
    for w in (
        "the a an of to in is it and or paged frame block table token cache kv memory"
        " attention model query key value head layer step batch request sequence fork"
        " copy write read free swap share prefix hash host device page gpu cpu hello"
        " world yes no one two three four five six seven eight nine ten red blue green"
        " fast slow"
    ).split()
]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|> ' + m['content'] + ' ' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|> ' }}{% endif %}"
)


def write_checkpoint(
    folder,
    *,
    arch="LlamaForCausalLM",
    hidden=64,
    layers=2,
    heads=4,
    kv_heads=2,
    intermediate=96,
    tied=True,
    bias=False,
    dtype="float32",
    rope_scaling=None,
    max_positions=256,
    seed=0,
    vocab_size=None,
) -> Path:
    """vocab_size pads the word list with w0, w1, ... (for real-sized output layers)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    words = WORDS + [f"w{i}" for i in range((vocab_size or 0) - len(WORDS))]
    vocab = len(words)
    head_dim = hidden // heads
    config = {
        "architectures": [arch],
        "model_type": "qwen2" if arch.startswith("Qwen2") else "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": tied,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": dtype,
        "hidden_act": "silu",
    }
    if rope_scaling:
        config["rope_scaling"] = rope_scaling
    if bias and arch == "LlamaForCausalLM":
        config["attention_bias"] = True
    rng = np.random.default_rng(seed)

    def w(*shape, scale=None):
        return (rng.standard_normal(shape) * (scale or shape[-1] ** -0.5)).astype(
            np.float32
        )

    # embeddings small enough that the tied head gives logits of order 1 (a flat-ish
    # distribution)
    tensors = {
        "model.embed_tokens.weight": w(vocab, hidden, scale=0.15),
        "model.norm.weight": 1 + 0.1 * w(hidden, scale=1.0),
    }
    if not tied:
        tensors["lm_head.weight"] = w(vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": 1 + 0.1 * w(hidden, scale=1.0),
            p + "post_attention_layernorm.weight": 1 + 0.1 * w(hidden, scale=1.0),
            p + "self_attn.q_proj.weight": w(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": w(intermediate, hidden),
            p + "mlp.up_proj.weight": w(intermediate, hidden),
            p + "mlp.down_proj.weight": w(hidden, intermediate),
        }
        if bias or arch.startswith("Qwen2"):
            for name, size in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
                tensors[p + f"self_attn.{name}_proj.bias"] = 0.5 * w(
                    size * head_dim, scale=1.0
                )
        # Llama's attention_bias covers o_proj too
        if bias and arch == "LlamaForCausalLM":
            tensors[p + "self_attn.o_proj.bias"] = 0.5 * w(hidden, scale=1.0)
    write_safetensors(folder / "model.safetensors", tensors, dtype)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2]}))
    write_tokenizer(folder, words)
    return folder


def write_safetensors(path, tensors: dict[str, np.ndarray], dtype: str) -> None:
    """Write by hand (the documented format) so bf16 can be written without torch."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        if dtype == "bfloat16":  # round to nearest even, keep the top 16 bits
            bits = array.astype(np.float32).view(np.uint32)
            data = (
                ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
            )
            code = "BF16"
        else:
            data = array.astype(dtype).tobytes()
            code = {"float32": "F32", "float16": "F16"}[dtype]
        header[name] = {
            "dtype": code,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def bf16_round(array: np.ndarray) -> np.ndarray:
    """What a bf16 checkpoint holds for a float32 array (same rounding as
    write_safetensors)."""
    bits = array.astype(np.float32).view(np.uint32)
    return (
        (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16)
        .astype(np.uint32)
        .view(np.float32)
    )


def write_tokenizer(folder: Path, words: list[str] = WORDS) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(
        models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    )
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer.add_special_tokens([AddedToken(w, special=True) for w in WORDS[:5]])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": {"content": "<s>"},
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "chat_template": CHAT_TEMPLATE,
            }
        )
    )
