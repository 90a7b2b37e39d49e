#!/usr/bin/env bash
# Waits for the run scripts/gpu/detach.sh started: up to SECONDS (default 540), or until it ends. Prints the
# log's tail and, when $OUT is set, returns every run directory under $KVBENCH_RUNS (default /tmp/kvruns) as
# $OUT/kvruns.tar.gz (records so far, even mid-run). Exit 0 when the run has ended with status 0, 10 while it
# still runs (call again at once), and the run's own status when it failed.
set -euo pipefail
limit=${1:-540}
runs=${KVBENCH_RUNS:-/tmp/kvruns}
pid=$(cat /tmp/kvbench-detached.pid 2>/dev/null || true)
[ -n "$pid" ] || { echo "no detached run (scripts/gpu/detach.sh starts one)" >&2; exit 2; }
waited=0
while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$limit" ]; do
  sleep 5
  waited=$((waited + 5))
done
grep -v '━━' /tmp/kvbench-detached.log | tail -n 30 || true
if [ -n "${OUT:-}" ] && [ -d "$runs" ]; then
  tar czf "$OUT/kvruns.tar.gz" -C "$runs" . || [ $? -eq 1 ]  # 1: a file grew while read (a live run)
fi
if kill -0 "$pid" 2>/dev/null; then
  echo "still running after ${waited}s (pid $pid): call scripts/gpu/wait.sh again"
  exit 10
fi
rc=$(cat /tmp/kvbench-detached.rc 2>/dev/null || echo 1)
echo "finished with status $rc"
exit "$rc"
