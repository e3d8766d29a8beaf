#!/bin/bash
# Before (commit 10729df, the tree before issue 29) and after (this commit), interleaved, on a
# quiet 2-core machine. BEFORE is a checkout of 10729df; run from the repository root:
#   git worktree add /tmp/before 10729df && BEFORE=/tmp/before bash bench/results/2026-12-02-cpu-2core-numpy-decode/commands.sh
set -u
OUT=${OUT:-bench/results/2026-12-02-cpu-2core-numpy-decode}
PY=${PY:-$PWD/.venv/bin/python}
AFTER=$PWD
mkdir -p "$OUT"
uptime > "$OUT/uptime-start.txt"
chat() {  # three questions piped to the chat: each answer's first-token time and tok/s
  printf 'What is the capital of France?\nWrite a haiku about memory pages.\nExplain what a page table does in two sentences.\n' |
    "$PY" -m minipaged.chat --max-tokens 64 2>&1 >/dev/null | grep -o '\[[0-9]* tokens, first in [^]]*\]'
}
for i in 1 2; do
  for side in before after; do
    dir=$AFTER; [ $side = before ] && dir=$BEFORE
    (cd "$dir" && "$PY" -m minipaged.bench decode --batch 1 2 4 8 16 --json > "$AFTER/$OUT/decode-$side-$i.json" 2>/dev/null)
  done
done
for side in before after; do
  dir=$AFTER; [ $side = before ] && dir=$BEFORE
  (cd "$dir" && chat > "$AFTER/$OUT/chat-$side.txt")
  (cd "$dir" && "$PY" -m minipaged.bench serve --json > "$AFTER/$OUT/serve-$side.json" 2>/dev/null)
  (cd "$dir" && "$PY" -m minipaged.bench serve --workload room --json > "$AFTER/$OUT/room-$side.json" 2>/dev/null)
done
for side in before after; do  # the third pair, after the server runs
  dir=$AFTER; [ $side = before ] && dir=$BEFORE
  (cd "$dir" && "$PY" -m minipaged.bench decode --batch 1 2 4 8 16 --json > "$AFTER/$OUT/decode-$side-3.json" 2>/dev/null)
done
"$PY" -m minipaged.bench projections --json > "$OUT/projections.json" 2>/dev/null
"$PY" -m minipaged.bench projections > "$OUT/projections.txt" 2>/dev/null
uptime > "$OUT/uptime-end.txt"
for side in after before; do  # static batching again, after the fix of the contiguous frames' copy
  dir=$AFTER; [ $side = before ] && dir=$BEFORE
  (cd "$dir" && "$PY" -m minipaged.bench serve --scheduler static --requests 16 --json > "$AFTER/$OUT/static16-$side.json" 2>/dev/null)
done
