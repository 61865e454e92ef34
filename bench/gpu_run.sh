#!/usr/bin/env bash
# Runs on a GPU host (see bench/README.md, "A GPU host without a package index"): installs the wheels
# of `make offline-wheels`, then the given module (bench.run or bench.gpu_check) with its arguments; results
# go to $OUT.
#   bash bench/gpu_run.sh MODULE ARGS...                       one process
#   bash bench/gpu_run.sh --parts 'J2A,JF;J3,J1' MODULE ARGS... one process per part, part i on GPU i,
#                                                              each given --queries PART --tag partI
#   bash bench/gpu_run.sh --detach ...                         the same in its own process session,
#       writing to /tmp/quail-run, for runs longer than a session's command may last; collect with
#       `bash bench/gpu_wait.sh SECONDS` until it says the run is done
set -euo pipefail
if [ "${1:-}" = "--detach" ]; then
    shift
    rm -rf /tmp/quail-run && mkdir -p /tmp/quail-run
    OUT=/tmp/quail-run setsid nohup bash "$0" "$@" > /tmp/quail-run/run.log 2>&1 < /dev/null &
    echo "detached (pid $!): collect with bash bench/gpu_wait.sh SECONDS"
    exit 0
fi
out=${OUT:-.}
trap 'echo $? > "$out/exit_status"' EXIT
parts=""
if [ "${1:-}" = "--parts" ]; then parts=$2; shift 2; fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .offline/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# results name the commit the wheel was built from, not the tree's (which may be older, or no checkout)
if [ -f .offline/wheels/COMMIT ]; then export QUAIL_GIT_COMMIT=$(cat .offline/wheels/COMMIT); fi
module=$1
shift
status=0
# -P: the source tree's quail/ folder must not shadow the installed package (its rooms map to quail.*)
if [ -z "$parts" ]; then
    python3 -P -m "$module" --out "$out" "$@" || status=$?
else
    IFS=';' read -ra groups <<< "$parts"
    for i in "${!groups[@]}"; do
        CUDA_VISIBLE_DEVICES=$i python3 -P -m "$module" --out "$out" "$@" --queries "${groups[$i]}" \
            --tag "part$i" > "$out/part$i.log" 2>&1 &
    done
    for job in $(jobs -p); do wait "$job" || status=$?; done
    tail -n 30 "$out"/part*.log
fi
exit $status
