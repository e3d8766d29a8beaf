"""The second half of a check: the participant's piece, plugged in, serves the model.
The same requests run on an engine built with it and on one built with the engine's own
code, and their tokens must be equal; a frame map shows the participant's frames (the
fullest step, among those with cached blocks where there are any), labelled by request
as the lines above are.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from minipaged.llm import LLM
from minipaged.sampling import SamplingParams
from minipaged.tools.lab.grading import in_one_line, time_limit
from minipaged.tools.lab.plug import plugged
from minipaged.tools.viz import FrameMap
from minipaged.tools.viz.pages import plural

SYSTEM = "You are a kind teacher of operating systems . Answer in one short sentence ."
QUESTIONS = [
    "What is a page table ?",
    "Why do frames have a fixed size ?",
    "What does fork copy ?",
]
MAX_STEPS = 400  # a scheduler that never finishes is stopped here
RANDOM_MODEL = "random"


@dataclass(slots=True)
class Run:
    """What one engine did with the lab's requests."""

    # request id -> each sample's tokens
    tokens: dict[str, list[list[int]]] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)  # request id -> its first text
    copies: int = 0
    preempted: int = 0
    cached_tokens: int = 0
    fullest: tuple = (
        (False, -1),
        "",
        "",
    )  # ((cached and used frames?, frames used or cached), text, svg)


def requests(samples: bool, max_tokens: int) -> list[tuple[str, SamplingParams]]:
    """Three prompts sharing a system prompt: greedy, and (where the lab has forks) two
    samples. The last stops at half the tokens, so its blocks are cached while the
    others still run.
    """
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    sampled = SamplingParams(
        n=2, temperature=0.8, seed=0, max_tokens=max_tokens, ignore_eos=True
    )
    short = SamplingParams(
        temperature=0, max_tokens=max(1, max_tokens // 2), ignore_eos=True
    )
    return [
        (f"{SYSTEM} {q}", [greedy, sampled if samples else greedy, short][i])
        for i, q in enumerate(QUESTIONS)
    ]


def run(engine, work: list[tuple[str, SamplingParams]]) -> Run:
    """Every request to its end (at most MAX_STEPS steps), noting the fullest step's
    frame map."""
    result = Run()
    for i, (prompt, params) in enumerate(work):
        engine.add_request(f"r{i}", prompt, params)
    for _ in range(MAX_STEPS):
        if not engine.has_unfinished_requests():
            return result
        report = engine.step()
        result.copies += report.copies
        result.preempted += len(report.preempted)
        result.cached_tokens += report.cached_tokens
        used = engine.blocks.num_frames - engine.blocks.num_free_frames
        cached = sum(state.cached for state in engine.blocks.frame_states())
        score = (cached > 0 and used > 0, used + cached)
        if score > result.fullest[0]:
            frames = FrameMap(engine.blocks, names=names(engine))
            result.fullest = (score, str(frames), frames.svg())
        for output in report.finished:
            result.tokens[output.request_id] = [
                list(c.token_ids) for c in output.outputs
            ]
            result.texts[output.request_id] = output.outputs[0].text
    raise RuntimeError(f"the engine had not finished after {MAX_STEPS} steps")


def names(engine) -> dict:
    """seq id -> the name the lines say: the request's id, with the sample's index when
    n > 1."""
    return {
        seq.seq_id: (
            request.request_id
            if len(request.seqs) == 1
            else f"{request.request_id}.{seq.index}"
        )
        for request in engine.requests.values()
        for seq in request.seqs
    }


def load_model(model: str | None) -> tuple[LLM, str]:
    """An LLM on the CPU sized for the lab (its own engine is not used), and a line
    naming it. Without the real model, a small random one, with a note saying so."""
    options = dict(device="cpu", num_blocks=8, block_size=4)
    if model == RANDOM_MODEL:
        return (
            LLM(str(random_model()), **options),
            "a small random model (--model random)",
        )
    try:
        return LLM(model, **options), f"{model or 'SmolLM2-135M-Instruct'}"
    except FileNotFoundError as error:
        if model is not None:
            raise
        note = (
            f"note: the real model is missing ({str(error).splitlines()[0]}); a small"
            " random model serves instead, so the texts are gibberish, but they must"
            " still be equal"
        )
        return LLM(str(random_model()), **options), note


def serve(
    lab: int,
    pieces,
    llm: LLM,
    options: dict,
    samples: bool,
    max_tokens: int,
    picture: Path,
) -> list[str]:
    """Run the lab's requests plugged and built-in; the lines to print. RuntimeError
    when the participant's engine fails or its tokens differ."""
    work = requests(samples, max_tokens)
    try:
        with plugged(lab, pieces), time_limit(300):
            theirs = run(llm.new_engine(**options), work)
    except Exception as error:
        raise RuntimeError(
            f"the engine with your code failed: {in_one_line(error)}"
        ) from None
    built_in = run(llm.new_engine(**options), work)
    lines = []
    for i, (_prompt, params) in enumerate(work):
        request_id, tokens = f"r{i}", built_in.tokens[f"r{i}"]
        kind = f"n={params.n} sampled" if params.n > 1 else "greedy"
        if theirs.tokens.get(request_id) != tokens:
            raise RuntimeError(
                f"request {request_id} ({kind}): your engine gave tokens "
                f"{theirs.tokens.get(request_id)}, the built-in one {tokens}"
            )
        lines.append(
            f"  {request_id} {kind:<11} same {sum(map(len, tokens))} tokens as the"
            f" built-in engine: {json.dumps(theirs.texts[request_id][:48])}"
        )
    lines.append(
        f"  on the way: {plural(theirs.preempted, 'preemption')},"
        f" {plural(theirs.copies, 'copy-on-write')},"
        f" {plural(theirs.cached_tokens, 'prompt token')} found in the prefix cache"
    )
    (both, _), text, svg = theirs.fullest
    picture.parent.mkdir(parents=True, exist_ok=True)
    picture.write_text(svg)
    when = (
        "the fullest step with cached blocks beside running ones"
        if both
        else "the fullest step"
    )
    return lines + ["", f"your frames at {when}:", text, f"picture: {picture}"]


# ---- a small random model, for machines without the real one -------------------------


def random_model() -> Path:
    """A 2-layer Llama with random weights whose vocabulary holds the lab's words,
    written once under the model cache (head_dim 64, as the kernels are built for)."""
    from minipaged.model.offline import cache_dir

    folder = cache_dir() / "lab-random-model-v1"
    if (folder / "model.safetensors").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    words = ["<unk>", "<s>", "</s>"] + sorted(
        {w for text in [SYSTEM, *QUESTIONS] for w in text.split()}
    )
    words += [f"w{i}" for i in range(64 - len(words))]
    hidden, layers, inter = 128, 2, 256
    rng = np.random.default_rng(0)

    def w(*shape, scale=None):
        return (rng.standard_normal(shape) * (scale or shape[-1] ** -0.5)).astype(
            np.float32
        )

    tensors = {
        "model.embed_tokens.weight": w(len(words), hidden, scale=0.15),
        "model.norm.weight": 1 + w(hidden, scale=0.1),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": 1 + w(hidden, scale=0.1),
            p + "post_attention_layernorm.weight": 1 + w(hidden, scale=0.1),
            p + "self_attn.q_proj.weight": w(128, hidden),
            p + "self_attn.k_proj.weight": w(64, hidden),
            p + "self_attn.v_proj.weight": w(64, hidden),
            p + "self_attn.o_proj.weight": w(hidden, 128),
            p + "mlp.gate_proj.weight": w(inter, hidden),
            p + "mlp.up_proj.weight": w(inter, hidden),
            p + "mlp.down_proj.weight": w(hidden, inter),
        }
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(words),
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
        "hidden_act": "silu",
    }
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(
        models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>")
    )
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.partial"))
    # last, at once: the folder is whole
    os.replace(folder / "model.partial", folder / "model.safetensors")
    return folder
