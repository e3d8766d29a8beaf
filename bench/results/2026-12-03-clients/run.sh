#!/bin/bash
# Seven client libraries' typical calls against `python -m minipaged.serve` with its
# default options (SmolLM2-135M-Instruct, 127.0.0.1:8000), as a user would run them:
# each library in its own venv under $VENVS (default /tmp/clients), newest release
# from PyPI, never in minipaged's own environment.
#   bash bench/results/2026-12-03-clients/run.sh          # install if need be, run all
#   bash bench/results/2026-12-03-clients/run.sh openai   # one library's calls
# One JSON line per call goes to results/<library>.jsonl beside this script; tally.py
# reads them all.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
venvs=${VENVS:-/tmp/clients}
python=${PYTHON:-$repo/.venv/bin/python}
declare -A package=(
  [openai]=openai [instructor]=instructor [langchain]=langchain-openai
  [litellm]=litellm [llm]=llm [lm_eval]="lm-eval[api] transformers" [guidellm]=guidellm
)
libs=${*:-openai instructor langchain litellm llm lm_eval guidellm}
for lib in $libs; do
  if [ ! -x "$venvs/$lib/bin/python" ]; then
    python3 -m venv "$venvs/$lib"
    "$venvs/$lib/bin/pip" install -q ${package[$lib]} > "$venvs/$lib.install.log" 2>&1
  fi
done
if curl -sf http://127.0.0.1:8000/health > /dev/null; then
  echo "something already answers on 127.0.0.1:8000: stop it first" >&2
  exit 1
fi
# the server, with its default options
"$python" -m minipaged.serve > "$venvs/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 300); do
  curl -sf http://127.0.0.1:8000/health > /dev/null && break
  sleep 1
done
cd "$here/calls"
mkdir -p "$here/results"
for lib in $libs; do
  versions=$("$venvs/$lib/bin/pip" list 2>/dev/null | awk -v IGNORECASE=1 \
    '$1 ~ /^(openai|instructor|langchain-openai|litellm|llm|lm.eval|guidellm)$/ {printf "%s %s; ", $1, $2}')
  echo "== $lib: $versions" >&2
  timeout 3600 "$venvs/$lib/bin/python" "${lib}_client.py" 2> "$venvs/$lib.stderr" \
    | tee "$here/results/$lib.jsonl"
done
"$python" "$here/tally.py" "$here"/results/*.jsonl
