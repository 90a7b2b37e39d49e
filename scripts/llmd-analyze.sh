#!/usr/bin/env bash
# kvbench's analysis step for llm-d-benchmark (docs/kubernetes.md#kvbench-as-an-llm-d-benchmark-harness).
#
# llm-d-benchmark's launcher runs /usr/local/bin/<harness>-analyze_results.sh after the harness; install this
# file there as kvbench-analyze_results.sh. It rebuilds the reports of the kvbench run directory in
# $LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR (scripts/llmd-harness.sh put it there) and copies them, with the
# result, into its analysis/ folder. Exit 0 once the reports are written, whatever the verdict (the harness's
# exit status and run_metadata.yaml carry that, so the launcher does not re-run a finished analysis);
# 2 when there is no run directory to read.
set -uo pipefail

fail() {
    echo "kvbench-analyze_results: $*" >&2
    exit 2
}

results="${LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR:-}"
[[ -n "$results" ]] || fail "LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR is not set: the folder the harness wrote"
kvbench_cmd=(${KVBENCH:-kvbench}) # a test or a venv may name another launcher, e.g. "python3 -m kvbench"

run_dirs=("$results"/*/manifest.json)
[[ -f "${run_dirs[0]}" ]] || fail "no kvbench run directory (*/manifest.json) in $results"
[[ ${#run_dirs[@]} -eq 1 ]] || fail "${#run_dirs[@]} kvbench run directories in $results: expected one"
run_dir=$(dirname "${run_dirs[0]}")

"${kvbench_cmd[@]}" report --rewrite "$run_dir" >/dev/null 2> >(tee -a "$results/stderr.log" >&2)
rc=$?
[[ $rc -eq 2 ]] && fail "kvbench report could not read $run_dir (see stderr.log)"
mkdir -p "$results/analysis" || fail "cannot create $results/analysis"
cp -f "$run_dir"/report/* "$results/analysis/" || fail "no reports in $run_dir/report"
[[ -f "$results/result.json" ]] && cp -f "$results/result.json" "$results/analysis/"
exit 0
