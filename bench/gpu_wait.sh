#!/usr/bin/env bash
# Waits (at most SECONDS) for a run started by `gpu_run.sh --detach`, then copies what it wrote so far
# to $OUT and prints its logs' ends. Exit 0 once the run is done, 3 while it still runs.
set -uo pipefail
limit=${1:-540}
run=/tmp/quail-run
for ((waited = 0; waited < limit; waited += 5)); do
    [ -e "$run/exit_status" ] && break
    sleep 5
done
cp -r "$run"/. "${OUT:-.}"/ 2>/dev/null
for log in "$run"/*.log; do echo "== $log"; tail -n 15 "$log"; done
if [ -e "$run/exit_status" ]; then echo "run done, exit status $(cat "$run/exit_status")"; exit 0; fi
echo "still running"
exit 3
