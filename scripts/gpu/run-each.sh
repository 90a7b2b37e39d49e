#!/usr/bin/env bash
# Runs `kvbench run SCENARIO -o $KVBENCH_RUNS/NAME` for each scenario in turn, one engine start per arm as always,
# going on past one that fails (its records stay, `kvbench run --resume` continues it), so one detached process
# can use a whole GPU session: `scripts/gpu/detach.sh --each A.yaml B.yaml` and then `scripts/gpu/wait.sh 540`.
# NAME is the scenario file's name without .yaml. Exit 0 when every run did, else the last failure's status.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
runs=${KVBENCH_RUNS:-/tmp/kvruns}
status=0
for scenario in "$@"; do
  name=$(basename "$scenario" .yaml)
  echo "=== $(date -u +%H:%M:%S) kvbench run $scenario -o $runs/$name"
  "$here/kvbench.sh" run "$scenario" -o "$runs/$name" || status=$?
done
exit "$status"
