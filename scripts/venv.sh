# Sourced by the install scripts, not run: a tool's own virtualenv at $VENV_DIR, made from $PYTHON (default
# python3), and the line that points kvbench at its python. The sourcing script sets VENV_DIR and TOOL (its own
# name, which starts its error lines); this sets BASE_PYTHON, PY (the venv's python) and start (for the timing).
BASE_PYTHON="${PYTHON:-python3}"
PY="$VENV_DIR/bin/python"
start=$(date +%s)

# make_venv: create the venv unless it already has a python; exit 1, saying why, when `python -m venv` fails
make_venv() {
  if [ ! -x "$PY" ] && ! "$BASE_PYTHON" -m venv "$VENV_DIR"; then
    echo "$TOOL: '$BASE_PYTHON -m venv' failed (Debian/Ubuntu: apt-get install python3-venv)" >&2
    exit 1
  fi
}

# print_export VAR: the shell line that sets VAR to the venv's python (absolute)
print_export() {
  echo "export $1=$(cd "$VENV_DIR" && pwd)/bin/python"
}
