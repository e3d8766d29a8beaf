#!/usr/bin/env bash
# Every GPU check in one command, for a machine with a CUDA GPU and CuPy (about 8 minutes at most:
# each step has a time limit, and a step that would run past BUDGET seconds gets what is left):
# the GPU tests (tests/test_*gpu*.py: kernels vs the NumPy reference, the int8 kernels included;
# the model on CuPy vs NumPy), then the benchmarks on CuPy, with a description of the device.
# Results go to $OUT, by default bench/results/<date>-<gpu>/, to be committed:
#     device.txt       nvidia-smi, CuPy and CUDA versions
#     gpu-tests.txt    pytest -m gpu
#     kernel.json      python -m minipaged.bench kernel --json (one row per shape and version)
#     kernel.txt       the same as a table
#     kv_dtype_kernel.json  python -m minipaged.bench kv-dtype --kernel (decode v7 over int8 beside v5 over fp16)
#     kv_dtype.json    kv-dtype on CuPy, random weights: int8 vs auto, greedy agreement and decode tok/s
#                      (write_kv_int8, paged_prefill_int8 and v7 driving the engine)
#     speculative.json speculative decoding on CuPy (n-gram, draft layers) vs plain, random weights
#     drum.json        the drum (the KV tier behind the prefix cache, in memory and in a file) on CuPy
#     throughput.json  python -m minipaged.bench throughput on CuPy (continuous vs static)
#     serve.json       python -m minipaged.bench serve on CuPy (the server under load, continuous vs static)
#     NAME.log         each benchmark's stderr; status.txt: each step's exit status, one a line
# Run from anywhere:  PYTHONPATH=. bash scripts/gpu_check.sh   (PYTHON=... picks the interpreter)
# The last line printed lists every step's exit status; the script's own is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUDGET=${BUDGET:-480}           # seconds for the whole script
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
gpu=$(echo "$gpu" | tr -c 'A-Za-z0-9\n' '-')
OUT=${OUT:-bench/results/$(date +%Y-%m-%d)-${gpu:-no-gpu}}
MODEL=${TMPDIR:-/tmp}/smol-random     # random weights of SmolLM2-135M's shapes: nothing to download
mkdir -p "$OUT"
: > "$OUT/status.txt"
statuses=()

# limit SECONDS: SECONDS, or what is left of BUDGET if less (0 when too little is left to start)
limit() {
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt 15 ]; then echo 0; elif [ "$1" -lt "$left" ]; then echo "$1"; else echo "$left"; fi
}

# record NAME STATUS: one step's exit status, in status.txt and for the last line
record() {
    statuses+=("$1=$2")
    echo "$1 $2" >> "$OUT/status.txt"
}

# bench NAME SECONDS ARGS...: python -m minipaged.bench ARGS --json within SECONDS, its JSON in
# $OUT/NAME.json and its stderr in $OUT/NAME.log
bench() {
    local name=$1 seconds; seconds=$(limit "$2"); shift 2
    if [ "$seconds" -eq 0 ]; then record "$name" skipped; return; fi
    echo "== $name (at most ${seconds} s): minipaged.bench $*"
    timeout "$seconds" "$PYTHON" -m minipaged.bench "$@" --json > "$OUT/$name.json" 2> "$OUT/$name.log"
    record "$name" $?
}

{ nvidia-smi; "$PYTHON" -c "import cupy, numpy; print('cupy', cupy.__version__, '| numpy',
numpy.__version__, '| CUDA runtime', cupy.cuda.runtime.runtimeGetVersion(), '| driver',
cupy.cuda.runtime.driverGetVersion())"; } > "$OUT/device.txt" 2>&1

echo "== GPU tests (the files tests/test_*gpu*.py)"
timeout 200 "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider tests/test_*gpu*.py 2>&1 |
    tee "$OUT/gpu-tests.txt"
record gpu-tests "${PIPESTATUS[0]}"

# the kernels: every decode version's GB/s and % of peak; v7 over int8 beside v5 over fp16
bench kernel 90 kernel
[ "${statuses[-1]}" = kernel=0 ] && "$PYTHON" -m minipaged.tools.bench.kernel "$OUT/kernel.json" | tee "$OUT/kernel.txt"
bench kv_dtype_kernel 60 kv-dtype --kernel

"$PYTHON" scripts/write_random_model.py "$MODEL" --dtype float16 > /dev/null
record random-model $?

# the engine on CuPy, sized to run in well under a minute each once the kernels are compiled
bench kv_dtype 120 kv-dtype --model "$MODEL" --device cuda --dtypes int8 --prompts 10 --max-tokens 32 \
    --batch 16 --decode-tokens 64
bench speculative 120 speculative --model "$MODEL" --device cuda --workloads chat rewrite --k 2 4 \
    --draft-layers 24 --draft-k 2 --max-tokens 32 --batch 4 --repeats 1
bench drum 90 drum --model "$MODEL" --device cuda --conversations 4 --turns 3 --active 4 --repeats 1 --file
bench throughput 150 throughput --model "$MODEL" --device cuda --requests 64
bench serve 240 serve --model "$MODEL" --device cuda --requests 64 --request-rate 32

echo "results in $OUT after ${SECONDS} s; exit status per step: ${statuses[*]}"
for status in "${statuses[@]}"; do [ "${status#*=}" = 0 ] || exit 1; done
