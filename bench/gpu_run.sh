#!/usr/bin/env bash
# Runs on the lent GPU machine (see README, "Benchmarks"): installs the carried wheels, then the
# given module (bench.run or bench.gpu_check) with its arguments; results go to $OUT.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
module=$1
shift
# -P: the source tree's quail/ folder must not shadow the installed package (its rooms map to quail.*)
python3 -P -m "$module" --out "${OUT:-.}" "$@"
