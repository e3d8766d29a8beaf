"""Model configuration, read from a Hugging Face `config.json`: the first stop of
loading a model.

Which architecture, how many layers and heads, how RoPE is scaled, which token ends an
answer. Only the Llama family is served (Llama, SmolLM2, TinyLlama, Llama 3.x,
Qwen2/2.5).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# architecture name in config.json -> whether q/k/v projections always carry a bias
# (Llama has them, and one on o_proj, only when config.json sets attention_bias)
SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM": False, "Qwen2ForCausalLM": True}


@dataclass(slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    rope_scaling: dict | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str = "float32"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dict(cls, cfg: dict) -> ModelConfig:
        archs = cfg.get("architectures") or [cfg.get("model_type", "?")]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {arch!r}; minipaged runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)} (the Llama family)"
            )
        missing = [
            k
            for k in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
            )
            if k not in cfg
        ]
        if missing:
            raise ValueError(f"config.json lacks {', '.join(missing)}")
        if cfg.get("mlp_bias"):
            raise ValueError(
                "config.json sets mlp_bias, which minipaged does not support"
            )
        num_heads = cfg["num_attention_heads"]
        num_kv_heads = cfg.get("num_key_value_heads") or num_heads
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads={num_heads} is not a multiple of "
                f"num_key_value_heads={num_kv_heads}"
            )
        # transformers 5 moves rope settings into `rope_parameters`; older configs keep
        # them flat
        rope = cfg.get("rope_parameters") or {}
        rope_scaling = cfg.get("rope_scaling") or (
            rope if rope.get("rope_type", "default") != "default" else None
        )
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 10000.0)),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            qkv_bias=SUPPORTED_ARCHITECTURES[arch] or cfg.get("attention_bias", False),
            o_bias=arch == "LlamaForCausalLM" and cfg.get("attention_bias", False),
            rope_scaling=rope_scaling,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=_as_list(cfg.get("eos_token_id")),
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype") or "float32",
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelConfig:
        """config.json, with eos ids from generation_config.json when it has them."""
        folder = Path(folder)
        path = folder / "config.json"
        if not path.exists():
            raise FileNotFoundError(
                f"{folder} has no config.json; a Hugging Face model folder "
                "needs config.json, *.safetensors and tokenizer.json"
            )
        config = cls.from_dict(json.loads(path.read_text()))
        gen_path = folder / "generation_config.json"
        if gen_path.exists():
            gen_eos = _as_list(json.loads(gen_path.read_text()).get("eos_token_id"))
            config.eos_token_ids = list(dict.fromkeys(gen_eos + config.eos_token_ids))
        return config


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
