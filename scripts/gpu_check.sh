#!/usr/bin/env bash
# Every GPU check in one command, for a machine with a CUDA GPU and CuPy (under 10 minutes):
# the GPU tests (tests/test_*gpu*.py: kernels vs the NumPy reference, the model on CuPy vs NumPy),
# then the kernel benchmark, with a description of the device. Results go to $OUT, by default
# bench/results/<date>-<gpu>/, to be committed:
#     device.txt       nvidia-smi, CuPy and CUDA versions
#     gpu-tests.txt    pytest -m gpu
#     kernel.json      python -m minipaged.bench kernel --json (one row per shape and version)
#     kernel.txt       the same as a table
#     kv_dtype_kernel.json  python -m minipaged.bench kv-dtype --kernel (decode v7 over int8 beside v5 over fp16)
#     throughput.json  python -m minipaged.bench throughput on CuPy (continuous vs static)
#     serve.json       python -m minipaged.bench serve on CuPy (the server under load, continuous vs static)
# Run from anywhere:  PYTHONPATH=. bash scripts/gpu_check.sh   (PYTHON=... picks the interpreter)
# Exit status: non-zero if a test or the benchmark failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
gpu=$(echo "$gpu" | tr -c 'A-Za-z0-9\n' '-')
OUT=${OUT:-bench/results/$(date +%Y-%m-%d)-${gpu:-no-gpu}}
mkdir -p "$OUT"

{ nvidia-smi; "$PYTHON" -c "import cupy, numpy; print('cupy', cupy.__version__, '| numpy',
numpy.__version__, '| CUDA runtime', cupy.cuda.runtime.runtimeGetVersion(), '| driver',
cupy.cuda.runtime.driverGetVersion())"; } > "$OUT/device.txt" 2>&1

echo "== GPU tests (the files tests/test_*gpu*.py)"
timeout 170 "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider tests/test_*gpu*.py 2>&1 |
    tee "$OUT/gpu-tests.txt"
tests=${PIPESTATUS[0]}

echo "== kernel benchmark"
timeout 120 "$PYTHON" -m minipaged.bench kernel --json > "$OUT/kernel.json"
bench=$?
[ "$bench" -eq 0 ] &&
    "$PYTHON" -m minipaged.bench.kernel "$OUT/kernel.json" | tee "$OUT/kernel.txt"

echo "== decode v7 (int8 KV cache) beside v5 (fp16): GB/s and % of peak, checked against the NumPy 8-bit reference"
timeout 90 "$PYTHON" -m minipaged.bench kv-dtype --kernel --json > "$OUT/kv_dtype_kernel.json" ||
    echo "kv-dtype --kernel failed (exit $?)"

echo "== throughput: continuous vs static batching on CuPy (random weights, SmolLM2-135M's shapes)"
"$PYTHON" scripts/write_random_model.py "${TMPDIR:-/tmp}/smol-random" --dtype float16 > /dev/null &&
    timeout 150 "$PYTHON" -m minipaged.bench throughput --model "${TMPDIR:-/tmp}/smol-random" \
        --device cuda --requests 64 --json > "$OUT/throughput.json"
throughput=$?

echo "== serve: the OpenAI server under Poisson load on CuPy, continuous vs static, and the engine in-process"
timeout 240 "$PYTHON" -m minipaged.bench serve --model "${TMPDIR:-/tmp}/smol-random" --device cuda \
    --requests 64 --request-rate 32 --json > "$OUT/serve.json"
serve=$?

echo "results in $OUT (tests exit $tests, kernel benchmark exit $bench, throughput exit $throughput, serve exit $serve)"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ] && [ "$throughput" -eq 0 ] && [ "$serve" -eq 0 ]
