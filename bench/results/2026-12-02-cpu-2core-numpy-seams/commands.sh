# The lecture series' benchmarks, one line each (README.md next to this file).
# From the repo root, inside .venv: mkdir -p /tmp/series-after; OUT=/tmp/series-after bash <this file>
# OUT: folder of the JSON files (default: .); SUFFIX: appended to each name. Run them one at a time.
python -m minipaged.bench replacement --json --conversations 32 --turns 4 --block-size 16 --concurrency 4 --points 12 --seed 0 --anomaly-seeds 100 > "${OUT:-.}/replacement${SUFFIX}.json"
python -m minipaged.bench thrashing --json --device cpu --kv-tokens 128 256 512 --max-num-seqs 2 4 16 --requests 12 --window 16 --sim-kv-tokens 7500 15000 30000 --sim-max-num-seqs 8 16 32 64 128 256 --sim-requests 200 --engine yes > "${OUT:-.}/thrashing${SUFFIX}.json"
python -m minipaged.bench scheduling --json --device cpu --clock model --requests 32 --rate 5.0 --max-num-seqs 4 --policies fcfs sjf aging priority --aging-rate 4.0 --sim-requests 600 --sim-rate 6.0 --sim-aging-rate 1.0 --engine yes > "${OUT:-.}/scheduling${SUFFIX}.json"
python -m minipaged.bench drum --json --device cpu --conversations 4 --turns 4 --active 4 --pool-frames 28 --tier-frames 256 --file --max-tokens 2 --repeats 1 > "${OUT:-.}/drum${SUFFIX}.json"
python -m minipaged.bench speculative --json --device cpu --k 2 4 --draft-layers 24 --draft-k 2 --max-tokens 32 --batch 1 --repeats 1 --workloads rewrite chat > "${OUT:-.}/speculative${SUFFIX}.json"
python -m minipaged.bench fragmentation --json --requests 1000 --block-size 16 > "${OUT:-.}/fragmentation${SUFFIX}.json"
python -m minipaged.bench sharing --json --device cpu --requests 4 --seed 0 --width 4 > "${OUT:-.}/sharing${SUFFIX}.json"
python -m minipaged.bench throughput --json --device cpu --requests 8 --seed 0 --max-model-len 1024 --kv-tokens 4096 --max-num-seqs 32 > "${OUT:-.}/throughput${SUFFIX}.json"
python -m minipaged.simulate --json > "${OUT:-.}/simulate${SUFFIX}.json"
