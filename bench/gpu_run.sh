#!/usr/bin/env bash
# Runs on the lent GPU machine (see README, "Benchmarks"): installs the carried wheels, then the
# given module (bench.run or bench.gpu_check) with its arguments; results go to $OUT.
#   bash bench/gpu_run.sh MODULE ARGS...                       one process
#   bash bench/gpu_run.sh --parts 'J2A,JF;J3,J1' MODULE ARGS... one process per part, part i on GPU i,
#                                                              each given --queries PART --tag partI
set -euo pipefail
parts=""
if [ "${1:-}" = "--parts" ]; then parts=$2; shift 2; fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
module=$1
shift
# -P: the source tree's quail/ folder must not shadow the installed package (its rooms map to quail.*)
if [ -z "$parts" ]; then
    exec python3 -P -m "$module" --out "${OUT:-.}" "$@"
fi
IFS=';' read -ra groups <<< "$parts"
for i in "${!groups[@]}"; do
    CUDA_VISIBLE_DEVICES=$i python3 -P -m "$module" --out "${OUT:-.}" "$@" --queries "${groups[$i]}" \
        --tag "part$i" > "${OUT:-.}/part$i.log" 2>&1 &
done
status=0
for job in $(jobs -p); do wait "$job" || status=$?; done
tail -n 30 "${OUT:-.}"/part*.log
exit $status
