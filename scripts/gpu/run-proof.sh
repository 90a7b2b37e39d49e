#!/usr/bin/env bash
# Runs the GPU proof scenario on a machine with one NVIDIA GPU and no network (see docs/gpu.md).
#   usage: scripts/gpu/run-proof.sh [SCENARIO] [--resume]      (SCENARIO "" = the default)
# Expects the vLLM + LMCache wheelhouse parts in /tmp/wb (../shared/gpu/pack.sh) and, optionally,
# kvbench's own dependency wheels in /tmp/kvdeps (scripts/gpu/pack-kvbench-deps.sh; the machine's
# image already had all of them in 2026-11). Installs once per machine, runs kvbench, and (when $OUT
# is set) leaves the run directory as $OUT/gpu-run.tar.gz. Run directories go to $KVBENCH_RUNS
# (default /tmp/kvruns): /tmp survives between calls to a warm machine, while a carried folder is
# replaced by each call's copy, so --resume must not look for the run inside the checkout.
set -euo pipefail
cd "$(dirname "$0")/../.."
scenario=${1:-scenarios/gpu-llama8b-lmcache.yaml}
[ -n "$scenario" ] || scenario=scenarios/gpu-llama8b-lmcache.yaml
mode=${2:-}

if [ ! -f /tmp/site/.kvbench-ok ]; then
  bash /tmp/wb/install.sh
  touch /tmp/site/.kvbench-ok
fi
runs=${KVBENCH_RUNS:-/tmp/kvruns}
if [ -d /tmp/kvdeps ] && [ ! -f /tmp/kvsite/.kvbench-ok ]; then
  python3 -m pip install -q --no-index --find-links /tmp/kvdeps --target /tmp/kvsite \
    typer rich aiohttp pandas pyyaml prometheus_client tokenizers
  # whatever the machine (or the vLLM wheelhouse) already has wins: drop our copy of it, so vLLM
  # keeps the numpy/tokenizers/pydantic it was built and tested with
  for dir in /tmp/kvsite/*/; do
    name=$(basename "$dir")
    case "$name" in *.dist-info|__pycache__|bin) continue ;; esac
    if PYTHONPATH=/tmp/site python3 -c "import $name" 2>/dev/null; then
      rm -rf "/tmp/kvsite/$name" /tmp/kvsite/"$name"-*.dist-info
    fi
  done
  touch /tmp/kvsite/.kvbench-ok
fi
export PYTHONPATH="$PWD:/tmp/site:/tmp/kvsite" PYTHONUNBUFFERED=1
python3 -m kvbench --version
python3 -c "import vllm, lmcache, tokenizers, transformers, torch; print('vllm', vllm.__version__, 'tokenizers', \
  tokenizers.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# KVBENCH_RUN_TIMEOUT (seconds) stops kvbench cleanly (SIGTERM: engines stopped, records kept) so a
# time-limited session can continue later with --resume
limit=(timeout -k 60 "${KVBENCH_RUN_TIMEOUT:-0}")
mkdir -p "$runs"
if [ "$mode" = "--resume" ]; then
  run_dir=$(ls -td "$runs"/*/ | head -1)
  "${limit[@]}" python3 -m kvbench run --resume "$run_dir" || status=$?
else
  "${limit[@]}" python3 -m kvbench run "$scenario" -o "$runs" || status=$?
fi
if [ -n "${OUT:-}" ]; then
  run_dir=$(ls -td "$runs"/*/ | head -1)
  tar czf "$OUT/gpu-run.tar.gz" -C "$(dirname "$run_dir")" "$(basename "$run_dir")"
fi
exit "${status:-0}"
