#!/usr/bin/env bash
# kvbench as an llm-d-benchmark harness (docs/kubernetes.md#kvbench-as-an-llm-d-benchmark-harness).
#
# llm-d-benchmark's launcher runs /usr/local/bin/<harness>-llm-d-benchmark.sh with no arguments and
# the experiment in its environment; install this file there as kvbench-llm-d-benchmark.sh. It reads:
#   LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR   required: where the results go (the launcher copies them off the PVC)
#   LLMDBENCH_HARNESS_STACK_ENDPOINT_URL   required: the stack's endpoint (http://HOST:PORT, with or without /v1)
#   LLMDBENCH_DEPLOY_CURRENT_MODEL         the served model (default: what GET /v1/models lists)
#   LLMDBENCH_RUN_WORKSPACE_DIR + LLMDBENCH_RUN_EXPERIMENT_HARNESS_WORKLOAD_NAME
#       the workload profile: profiles/kvbench/<name>, a kvbench scenario file (its ${VAR} fields see this
#       environment); without one, a flags-only run of the endpoint with KVBENCH_CONTEXTS (default
#       8000,32000), KVBENCH_CONVERSATIONS, KVBENCH_TURNS, KVBENCH_ANSWER_TOKENS, and KVBENCH_OFFLOAD: what
#       the stack offloads (off, hbm, cpu, disk, shared; default hbm: a GPU prefix cache, no tier)
#   KVBENCH_API_KEY_ENV                    the name of the variable that holds the endpoint's API key
#   LLMDBENCH_HARNESS_NAME, LLMDBENCH_RUN_EXPERIMENT_ID   copied into run_metadata.yaml
# and writes into the results directory: result.json (kvbench's summary, `kvbench schema summary`), the
# kvbench run directory (records, manifest, reports), stdout.log, stderr.log and run_metadata.yaml.
# Exit status: kvbench's (0 valid, 1 FAILED, 2 cannot run, 3 INCONCLUSIVE; docs/scripting.md).
set -uo pipefail

fail() {
    echo "kvbench-llm-d-benchmark: $*" >&2
    exit 2
}

results="${LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR:-}"
endpoint="${LLMDBENCH_HARNESS_STACK_ENDPOINT_URL:-}"
[[ -n "$results" ]] || fail "LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR is not set: the folder the results go to"
[[ -n "$endpoint" ]] || fail "LLMDBENCH_HARNESS_STACK_ENDPOINT_URL is not set: the endpoint to measure"
kvbench_cmd=(${KVBENCH:-kvbench}) # a test or a venv may name another launcher, e.g. "python3 -m kvbench"
mkdir -p "$results" || fail "cannot create $results"

args=(run)
profile=""
if [[ -n "${LLMDBENCH_RUN_EXPERIMENT_HARNESS_WORKLOAD_NAME:-}" && -n "${LLMDBENCH_RUN_WORKSPACE_DIR:-}" ]]; then
    profile="$LLMDBENCH_RUN_WORKSPACE_DIR/profiles/kvbench/$LLMDBENCH_RUN_EXPERIMENT_HARNESS_WORKLOAD_NAME"
    [[ -f "$profile" ]] || fail "workload profile $profile does not exist"
    cp -f "$profile" "$results/" || fail "cannot copy $profile to $results"
    args+=("$profile")
else
    base="${endpoint%/}"
    [[ "$base" == */v1 ]] || base="$base/v1"
    args+=(--base-url "$base" --contexts "${KVBENCH_CONTEXTS:-8000,32000}")
    [[ -n "${LLMDBENCH_DEPLOY_CURRENT_MODEL:-}" ]] && args+=(--model "$LLMDBENCH_DEPLOY_CURRENT_MODEL")
    [[ -n "${KVBENCH_CONVERSATIONS:-}" ]] && args+=(--conversations "$KVBENCH_CONVERSATIONS")
    [[ -n "${KVBENCH_TURNS:-}" ]] && args+=(--turns "$KVBENCH_TURNS")
    [[ -n "${KVBENCH_ANSWER_TOKENS:-}" ]] && args+=(--answer-tokens "$KVBENCH_ANSWER_TOKENS")
    [[ -n "${KVBENCH_OFFLOAD:-}" ]] && args+=(--offload "$KVBENCH_OFFLOAD")
    [[ -n "${KVBENCH_API_KEY_ENV:-}" ]] && args+=(--api-key-env "$KVBENCH_API_KEY_ENV")
fi
args+=(--output-dir "$results" --json)

start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# stdout (the result) to result.json; stderr (progress, tables) both to the pod log and to stderr.log
{ "${kvbench_cmd[@]}" "${args[@]}" 2>&1 1>&3 3>&- | tee -a "$results/stderr.log" >&2; } 3>"$results/result.json"
rc=${PIPESTATUS[0]}
stop=$(date -u +%Y-%m-%dT%H:%M:%SZ)
cp -f "$results/result.json" "$results/stdout.log"
version=$("${kvbench_cmd[@]}" --version 2>/dev/null | tr -d '\n' || true)

# run_metadata.yaml: what llm-d-benchmark's analysis reads about the harness run. Every value is written
# through yaml_quote so an endpoint or model name cannot break the file.
yaml_quote() {
    local text="${1//\\/\\\\}"
    text="${text//\"/\\\"}"
    printf '"%s"' "${text//$'\n'/\\n}"
}
{
    echo "harness_name: $(yaml_quote "${LLMDBENCH_HARNESS_NAME:-kvbench}")"
    echo "harness_version: $(yaml_quote "$version")"
    echo "harness_start: $(yaml_quote "$start")"
    echo "harness_stop: $(yaml_quote "$stop")"
    echo "harness_args: $(yaml_quote "${args[*]}")"
    echo "harness_workload: $(yaml_quote "${LLMDBENCH_RUN_EXPERIMENT_HARNESS_WORKLOAD_NAME:-}")"
    echo "harness_rc: $(yaml_quote "$rc")"
    echo "experiment_id: $(yaml_quote "${LLMDBENCH_RUN_EXPERIMENT_ID:-}")"
    echo "model: $(yaml_quote "${LLMDBENCH_DEPLOY_CURRENT_MODEL:-}")"
    echo "endpoint_url: $(yaml_quote "$endpoint")"
} >"$results/run_metadata.yaml"
exit "$rc"
