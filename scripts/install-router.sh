#!/usr/bin/env bash
# Creates a dedicated virtualenv with the vLLM Router (PyPI package vllm-router: the Rust router of
# github.com/vllm-project/router), apart from kvbench's own environment, for fleets whose scenario
# names `routing.router: {kind: vllm-router, ...}` and for the `router` test tier.
#
#   scripts/install-router.sh [VENV_DIR]      # default: .venv-router
#   export KVBENCH_ROUTER_PYTHON="$VENV_DIR/bin/python"
#
# Idempotent: when the venv already has the pinned version it only prints it. A prebuilt abi3 wheel
# (no Rust toolchain needed); about 15 s on the 2-core CPU machine. Override the pin with VLLM_ROUTER_VERSION.
set -euo pipefail

VENV_DIR="${1:-.venv-router}"
VLLM_ROUTER_VERSION="${VLLM_ROUTER_VERSION:-0.1.17}"
TOOL=install-router
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"

version() {
  "$PY" -c "import importlib.metadata as m, vllm_router; print(m.version('vllm-router'))"
}

if [ -x "$PY" ] && current="$(version 2>/dev/null | tail -n 1)" && [ "$current" = "$VLLM_ROUTER_VERSION" ]; then
  echo "$VENV_DIR already has vllm-router $current"
  print_export KVBENCH_ROUTER_PYTHON
  exit 0
fi

make_venv
if ! "$PY" -m pip install --quiet --disable-pip-version-check "vllm-router==$VLLM_ROUTER_VERSION"; then
  echo "install-router: pip could not install vllm-router==$VLLM_ROUTER_VERSION (see above)" >&2
  exit 1
fi

if ! current="$(version | tail -n 1)"; then
  echo "install-router: $VENV_DIR was installed but 'import vllm_router' fails (see above)" >&2
  exit 1
fi
echo "$VENV_DIR: vllm-router $current (installed in $(( $(date +%s) - start )) s)"
print_export KVBENCH_ROUTER_PYTHON
