#!/usr/bin/env bash
# Runs `kvbench ARGS...` on an offline GPU machine (see docs/gpu.md), installing vLLM + LMCache once.
#   usage: scripts/gpu/kvbench.sh run scenarios/gpu-seed-llama70b-tp4-fp16.yaml -o /tmp/kvruns/fp16 --arm AMG-OFF
# Expects the vLLM + LMCache wheelhouse parts in /tmp/wb (../shared/gpu/pack.sh; install.sh joins and
# checks them) and, optionally, kvbench's own dependency wheels in /tmp/kvdeps
# (scripts/gpu/pack-kvbench-deps.sh; the machines' image had all of them).
# The checkout's tracked files stay under 20 MB (kept runs' JSON Lines and logs are packed as .xz), so a device
# call carries any branch's checkout with the wheelhouse parts within its 64 MiB: no lean branch to switch to.
# KVBENCH_RUN_TIMEOUT (seconds) stops kvbench cleanly (SIGTERM: engines stopped, records kept), so a
# time-limited call can be continued with `kvbench run --resume RUN_DIR` in the next one. When $OUT is
# set, every run directory under $KVBENCH_RUNS (default /tmp/kvruns; /tmp survives between calls to a
# warm machine, a carried folder does not) comes back as $OUT/kvruns.tar.gz.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${KVBENCH_RUNS:-/tmp/kvruns}

# KVBENCH_SKIP_INSTALL=1: vLLM is already importable (or the run needs no engine venv, e.g. the simulator)
if [ -z "${KVBENCH_SKIP_INSTALL:-}" ] && [ ! -f /tmp/site/.kvbench-ok ]; then
  bash /tmp/wb/install.sh
  touch /tmp/site/.kvbench-ok
fi
if [ -d /tmp/kvdeps ] && [ ! -f /tmp/kvsite/.kvbench-ok ]; then
  python3 -m pip install -q --no-index --find-links /tmp/kvdeps --target /tmp/kvsite \
    pydantic typer rich aiohttp pandas pyyaml prometheus_client tokenizers nvidia-ml-py
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
  tokenizers.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)" || true
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader || true
env | grep -E '^(NCCL_|TORCH_SYMM|NVSHMEM_|CUDA_VISIBLE)' || true
mkdir -p "$runs"
status=0
timeout -k 60 "${KVBENCH_RUN_TIMEOUT:-0}" python3 -m kvbench "$@" || status=$?
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/kvruns.tar.gz" -C "$runs" . || [ $? -eq 1 ]  # 1: a file grew while read (a live run)
fi
exit "$status"
