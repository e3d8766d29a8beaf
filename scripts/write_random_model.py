"""Write a random-weight checkpoint of SmolLM2-135M's shapes (for GPU checks: nothing to
download).

    python scripts/write_random_model.py /tmp/smol-random [--dtype float16]

30 layers, hidden 576, 9 query / 3 KV heads of 64, MLP 1536, vocabulary 49,152, tied
embeddings: the same work per token as the real model, with a word-level tokenizer.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from checkpoints import write_checkpoint  # noqa: E402

SMOLLM2_135M = dict(
    hidden=576,
    layers=30,
    heads=9,
    kv_heads=3,
    intermediate=1536,
    max_positions=8192,
    vocab_size=49152,
)

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "float16", "bfloat16"]
    )
    args = parser.parse_args()
    print(write_checkpoint(args.folder, dtype=args.dtype, **SMOLLM2_135M))
