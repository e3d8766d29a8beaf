#!/bin/bash
# usage: run_all.sh before|after|fixed|TREE [files...]   (results in results/<label>/ beside this script;
# VENV_PY: the python with the test tools, TIMEOUT: seconds per test, 90 by default)
label=$1; shift
case $label in before) tree=/tmp/before;; after) tree=/tmp/after;;
  fixed) tree=$(cd "$(dirname "$0")/../../../.." && pwd);; *) tree=$label; label=$(basename $tree);; esac
cd "$(dirname "$0")"
files=${@:-$(find tests/entrypoints/openai -name 'test_*.py' | sort)}
mkdir -p results/$label logs/$label
for f in $files; do
  name=$(echo $f | sed 's#tests/entrypoints/openai/##; s#/#__#g; s#\.py$##')
  MINIPAGED_TREE=$tree MINIPAGED_LOG_DIR=logs/$label timeout 1200 ${VENV_PY:-/tmp/vllm_venv/bin/python} -m pytest -q \
    --timeout ${TIMEOUT:-90} --junitxml=results/$label/$name.xml $f > results/$label/$name.txt 2>&1
  echo "$f rc=$? $(tail -1 results/$label/$name.txt)"
done
