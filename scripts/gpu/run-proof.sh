#!/usr/bin/env bash
# Runs the 1-GPU proof scenario on a machine with one NVIDIA GPU and no network (see docs/gpu.md).
#   usage: scripts/gpu/run-proof.sh [SCENARIO] [--resume]      (SCENARIO "" = the default)
# Installs once and runs through scripts/gpu/kvbench.sh; --resume continues the newest run directory
# under $KVBENCH_RUNS (default /tmp/kvruns).
set -euo pipefail
here="$(dirname "$0")"
scenario=${1:-scenarios/gpu-llama8b-lmcache.yaml}
[ -n "$scenario" ] || scenario=scenarios/gpu-llama8b-lmcache.yaml
runs=${KVBENCH_RUNS:-/tmp/kvruns}
if [ "${2:-}" = "--resume" ]; then
  exec "$here/kvbench.sh" run --resume "$(ls -td "$runs"/*/ | head -1)"
fi
exec "$here/kvbench.sh" run "$scenario" -o "$runs"
