#!/usr/bin/env bash
# Starts `scripts/gpu/kvbench.sh ARGS...` detached from the device call, so one run can outlive the 10-minute
# limit of a call: a >= 20-minute soak window or a whole sweep in ONE engine process, with no restart between
# calls. A warm machine keeps the process (verified: a detached process went on writing between two
# calls); it is given back 30 s after a call ends, so follow at once with back-to-back
# `scripts/gpu/wait.sh 540` calls until it reports the run finished.
#   usage: scripts/gpu/detach.sh soak scenarios/gpu-sweep-llama8b.yaml --arm AMG-ON-LMCache --window 20m --load 12
#          scripts/gpu/detach.sh --each scenarios/A.yaml scenarios/B.yaml   (run-each.sh: one run after the other)
#          scripts/gpu/detach.sh --script attach-proof.sh 8000,32000   (another script of scripts/gpu with its arguments)
# Output goes to /tmp/kvbench-detached.log, the pid to /tmp/kvbench-detached.pid, the exit status (when it ends)
# to /tmp/kvbench-detached.rc; relative paths (a scenario, a run directory) are read in the copy of the checkout
# it runs from. KVBENCH_RUN_TIMEOUT is not applied here: the run is meant to outlive a call.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ -f /tmp/kvbench-detached.pid ] && kill -0 "$(cat /tmp/kvbench-detached.pid)" 2>/dev/null; then
  echo "a detached kvbench is still running (pid $(cat /tmp/kvbench-detached.pid)): wait for it first" >&2
  exit 2
fi
rm -f /tmp/kvbench-detached.rc
entry=kvbench.sh
if [ "${1:-}" = "--each" ]; then
  entry=run-each.sh
  shift
elif [ "${1:-}" = "--script" ]; then
  entry="$2"
  shift 2
fi
# The run reads its code from a private copy of the checkout: every device call re-sends the checkout into the
# same folder, and a run importing a module while the next call replaces it can die (seen: a run started
# here stopped at import with "No module named 'kvbench.cli.console'" as the next call's copy landed; the file was
# there a minute later). The carried wheel parts stay behind.
repo="$(cd "$here/../.." && pwd)"
src=/tmp/kvbench-src
rm -rf "$src" && mkdir -p "$src"
tar cf - -C "$repo" --exclude=./.gpucarry --exclude=./.gpuwheels . | tar xf - -C "$src"
# setsid: its own session and process group, so the end of this call does not signal it; OUT is unset so the
# archive is made by wait.sh in the call that has an $OUT
setsid nohup env -u OUT bash -c '"$0" "$@"; echo $? > /tmp/kvbench-detached.rc' "$src/scripts/gpu/$entry" "$@" \
  > /tmp/kvbench-detached.log 2>&1 < /dev/null &
echo $! > /tmp/kvbench-detached.pid
sleep 5
echo "detached kvbench pid $(cat /tmp/kvbench-detached.pid); log /tmp/kvbench-detached.log"
tail -n 5 /tmp/kvbench-detached.log
