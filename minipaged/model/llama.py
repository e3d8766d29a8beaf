"""The Llama-family transformer, written once against `xp` (NumPy or CuPy).

The middle of a request's path: flat token ids and positions in, logits out. The KV
cache is not the model's business: each layer hands its q, k, v to an `Attention`
callable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from minipaged.backend import array_module, get_xp
from minipaged.model import cpu
from minipaged.model.config import ModelConfig
from minipaged.model.weights import load_weights


class Attention(Protocol):
    """What each layer hands its q, k, v to: a contiguous cache in
    `minipaged.model.oracle`, the paged cache in the engine."""

    def __call__(self, layer: int, q, k, v):
        """q (T, heads, head_dim), k/v (T, kv_heads, head_dim) after RoPE -> (T, heads,
        head_dim).

        Stores k and v in the cache for later steps, then attends each query over its
        sequence's cached keys up to its own position."""


@dataclass(slots=True)
class Layer:
    input_norm: object  # (hidden,)
    wqkv: object  # (hidden, q_size + 2 * kv_size): q, k, v projections side by side
    bqkv: object | None  # (q_size + 2 * kv_size,) for Qwen2, else None
    wo: object  # (q_size, hidden)
    bo: object | None  # (hidden,) for Llama with attention_bias, else None
    post_norm: object  # (hidden,)
    # (hidden, 2 * intermediate): gate and up projections side by side
    w_gate_up: object
    w_down: object  # (intermediate, hidden)


class Model:
    """Weights on the device, and `forward`. Matmul weights are stored as (in, out)."""

    def __init__(
        self,
        config: ModelConfig,
        tensors: dict[str, np.ndarray],
        device: str = "cpu",
        dtype: str = "float32",
    ):
        self.config, self.device, self.dtype = config, device, np.dtype(dtype)
        self.xp = xp = get_xp(device)

        def get(name):
            if name not in tensors:
                raise KeyError(
                    f"checkpoint is missing tensor {name!r} (a {config.architecture}"
                    f" with {config.num_layers} layers needs it)"
                )
            return tensors[name]

        def put(array):  # host array -> device array of the model's dtype
            return xp.asarray(np.ascontiguousarray(array, dtype=self.dtype))

        # Hugging Face stores (out, in); concatenate outputs, then transpose
        def in_out(
            *names,
        ):
            return cpu.projection_weight(
                np.concatenate([get(n) for n in names], axis=0).T, xp, self.dtype
            )

        self.layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            qkv = [p + f"self_attn.{x}_proj" for x in "qkv"]
            self.layers.append(
                Layer(
                    input_norm=put(get(p + "input_layernorm.weight")),
                    wqkv=in_out(*(n + ".weight" for n in qkv)),
                    bqkv=(
                        put(np.concatenate([get(n + ".bias") for n in qkv]))
                        if config.qkv_bias
                        else None
                    ),
                    wo=in_out(p + "self_attn.o_proj.weight"),
                    bo=put(get(p + "self_attn.o_proj.bias")) if config.o_bias else None,
                    post_norm=put(get(p + "post_attention_layernorm.weight")),
                    w_gate_up=in_out(
                        p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"
                    ),
                    w_down=in_out(p + "mlp.down_proj.weight"),
                )
            )
        self.embed = put(get("model.embed_tokens.weight"))  # (vocab, hidden)
        self.norm = put(get("model.norm.weight"))
        lm_head = (
            "model.embed_tokens.weight"
            if config.tie_word_embeddings
            else "lm_head.weight"
        )
        # (hidden, vocab)
        self.lm_head = cpu.projection_weight(get(lm_head).T, xp, self.dtype)
        if isinstance(self.lm_head, cpu.PanelWeight):
            self.choose_gemm_rows()
        self.inv_freq = xp.asarray(rope_inv_freq(config))  # (head_dim / 2,) float32

    def projection_weights(self) -> list:
        """Every weight that multiplies activations, layer by layer, then the LM
        head."""
        weights = [
            w
            for layer in self.layers
            for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)
        ]
        return weights + [self.lm_head]

    def choose_gemm_rows(self) -> int:
        """On a CPU with weight panels: from how many rows the products take BLAS's
        GEMM instead, timed on this model's weights (model/cpu.py's choose_gemm_rows)
        and set on every weight."""
        weights = self.projection_weights()
        rows = cpu.choose_gemm_rows(weights)
        for w in weights:
            w.gemm_rows = rows
        return rows

    def use_cores(
        self, choice: str | int, kv=None, attention: str = ""
    ) -> tuple[int, str]:
        """For a long-running process on a CPU (the server, the benchmarks): how many
        cores the products use, `choice` as model/cpu.py's use_cores ("fit", "all" or
        a count), and helper processes that compute their share on the other cores
        (model/team.py) where they can run, sharing `kv` (an engine's KVCache) too when
        given, whose attention the helpers run with module `attention` (its name).
        Returns (cores in use now, what splits the products, in a few words).
        Nothing to do on a GPU."""
        if self.xp is not np:
            return 0, "a GPU"
        threads = cpu.use_cores(choice)
        if not isinstance(self.lm_head, cpu.PanelWeight):
            return threads, "BLAS threads (no weight panels here)"
        how = cpu.start_team(
            self.projection_weights(), cpu.cores_for(choice) - 1, kv, attention
        )
        self.choose_gemm_rows()  # the split changed: timed again (or kept)
        return threads, how

    @classmethod
    def from_folder(cls, folder, device: str = "cpu", dtype: str = "float32") -> Model:
        """Config and safetensors of a Hugging Face folder, on `device` in `dtype`."""
        return cls(ModelConfig.from_folder(folder), load_weights(folder), device, dtype)

    def forward(self, token_ids, positions, attention: Attention, logits_indices=None):
        """token_ids, positions: int (T,) -> float32 logits (len(logits_indices) or T,
        vocab). All sequences of a step are flattened into one (T, hidden) matrix, so
        every projection is one 2-D matmul whatever the batch."""
        xp, c = self.xp, self.config
        token_ids, positions = xp.asarray(token_ids), xp.asarray(positions)
        T = token_ids.shape[0]
        cos, sin = self.rope(positions)  # (T, 1, head_dim) each
        # (T, hidden) residual stream, fp32
        h = self.embed[token_ids].astype(xp.float32)
        for i, layer in enumerate(self.layers):
            x = rms_norm(h, layer.input_norm, c.rms_norm_eps, self.dtype)  # (T, hidden)
            qkv = x @ layer.wqkv  # (T, q_size + 2 kv_size)
            if layer.bqkv is not None:
                qkv += layer.bqkv
            heads = c.num_heads + c.num_kv_heads  # q and k sit side by side: one RoPE
            qk = apply_rope(
                qkv[:, : c.q_size + c.kv_size].reshape(T, heads, c.head_dim), cos, sin
            )
            q, k = qk[:, : c.num_heads], qk[:, c.num_heads :]
            v = qkv[:, c.q_size + c.kv_size :].reshape(T, c.num_kv_heads, c.head_dim)
            o = attention(i, q, k, v)  # (T, heads, head_dim)
            o = o.reshape(T, c.q_size) @ layer.wo  # (T, hidden)
            # h is float32: NumPy converts as it adds
            h += o if layer.bo is None else o + layer.bo
            x = rms_norm(h, layer.post_norm, c.rms_norm_eps, self.dtype)
            gate_up = x @ layer.w_gate_up  # (T, 2 intermediate)
            gate, up = (
                gate_up[:, : c.intermediate_size],
                gate_up[:, c.intermediate_size :],
            )
            h += (silu(gate) * up) @ layer.w_down
        if logits_indices is not None:
            h = h[xp.asarray(logits_indices)]  # only the rows we sample from
        x = rms_norm(h, self.norm, c.rms_norm_eps, self.dtype)
        return (x @ self.lm_head).astype(xp.float32)  # (rows, vocab)

    def follow_machine_load(self) -> None:
        """Before a step, on a CPU shared with other programs: BLAS and the weight
        panels use the cores the others leave free now (model/cpu.py: a clock check, and
        a look at /proc twice a second at most). Nothing to do on a GPU. The engine
        calls it; forward does not.
        """
        if self.xp is np:
            cpu.follow_machine_load()

    def rope(self, positions):
        """cos and sin of position * frequency, computed in float32 like
        transformers, each (T, 1, head_dim): the frequencies twice over, one for each
        half of a head (apply_rope)."""
        xp = self.xp
        angles = positions.astype(xp.float32)[:, None] * self.inv_freq[None, :]
        angles = xp.concatenate([angles, angles], axis=-1)[:, None, :]
        return xp.cos(angles), xp.sin(angles)


def rms_norm(x, weight, eps: float, dtype):
    """x / sqrt(mean(x^2) + eps) * weight, in float32, returned in the compute dtype."""
    xp = array_module(x)
    # dtypes compared here, not astype(copy=False) calls: each NumPy call costs some
    # microseconds with the cold caches of a decode step
    if x.dtype != xp.float32:
        x = x.astype(xp.float32)
    # the mean as a sum over the count: the same numbers as NumPy's own mean, whose
    # extra calls cost (39 against 27 us a call here)
    mean_square = (x * x).sum(axis=-1, keepdims=True) / x.shape[-1]  # (T, 1)
    scale = 1.0 / xp.sqrt(mean_square + eps)
    y = x * scale  # a new array
    if y.dtype != dtype:
        y = y.astype(dtype)
    y *= weight
    return y


def apply_rope(x, cos, sin):
    """Rotate each head's first half of dims against its second half (Hugging Face
    layout): x * cos + rotate_half(x) * sin, where rotate_half(x) is (-second half,
    first half). With halves x1, x2: (x1 cos - x2 sin, x2 cos + x1 sin).

    x: (T, heads, head_dim); cos, sin: (T, 1, head_dim), Model.rope's. Computed in
    float32; returned in x's dtype."""
    xp = array_module(x)
    half = x.shape[-1] // 2
    x32 = x if x.dtype == xp.float32 else x.astype(xp.float32)
    rotated = xp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    rotated *= sin
    out = x32 * cos
    out += rotated
    return out if out.dtype == x.dtype else out.astype(x.dtype)


def silu(x):
    """x * sigmoid(x); sigmoid written with tanh so large |x| cannot overflow exp:
    x * (0.5 + 0.5 tanh(x / 2)), computed in one new array (a prompt's (T,
    intermediate) temporaries are large: 2.2x faster at 4096 tokens on a CPU)."""
    y = x * 0.5
    array_module(x).tanh(y, out=y)
    y *= 0.5
    y += 0.5
    y *= x
    return y


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """RoPE frequencies theta^(-2i/d), adjusted for `rope_scaling` (linear or
    llama3)."""
    d = config.head_dim
    inv_freq = 1.0 / (
        config.rope_theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d)
    )
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        inv_freq = llama3_scaled_inv_freq(inv_freq, scaling)
    elif kind != "default":
        raise ValueError(
            f"rope_scaling type {kind!r} is not supported (default, linear, llama3 are)"
        )
    return inv_freq.astype(np.float32)


def llama3_scaled_inv_freq(inv_freq: np.ndarray, s: dict) -> np.ndarray:
    """Llama 3.1's long-context RoPE: slow down low frequencies, keep high ones, blend
    between.

    Wavelengths longer than original_max / low_freq_factor are divided by `factor`;
    shorter than original_max / high_freq_factor are kept; the band between is
    interpolated smoothly.
    """
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return np.where(medium, blended, scaled)
