"""``scripts/llmd-harness.sh``: kvbench launched the way llm-d-benchmark launches a harness.

llm-d-benchmark's launcher runs ``/usr/local/bin/<harness>-llm-d-benchmark.sh`` with no arguments,
the experiment in ``LLMDBENCH_*`` variables, and collects ``$LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR``.
The test sets that environment against a ``kvbench sim serve`` endpoint and checks what lands in
the results folder: the result (``--json``), kvbench's run directory, the logs and
``run_metadata.yaml``, for a flags-only run (one of a stack with a CPU tier, ``KVBENCH_OFFLOAD=cpu``) and for a
workload profile (a scenario file whose
``${VAR}`` fields read the launcher's environment); a missing variable is one line and exit 2. The
analysis step (``scripts/llmd-analyze.sh``) puts kvbench's reports of that run in ``analysis/``.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import SimulatorLauncher, kvbench_env, run_captured

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "llmd-harness.sh"
ANALYZE = SCRIPT.with_name("llmd-analyze.sh")
SERVE = ("--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--host", "127.0.0.1")
KVBENCH = f"{shlex.quote(sys.executable)} -m kvbench"


def harness(env: dict[str, str], cwd: Path, script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
    return run_captured(["bash", str(script)], cwd=cwd, env=kvbench_env(KVBENCH=KVBENCH, **env), timeout=300)


def test_flags_only_experiment(tmp_path: Path, simulator: SimulatorLauncher) -> None:
    results = tmp_path / "results" / "kvbench_exp1_stack"
    with simulator(*SERVE) as base_url:
        done = harness(
            {
                "LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR": str(results),
                "LLMDBENCH_HARNESS_STACK_ENDPOINT_URL": base_url,  # no /v1: the script adds it
                "LLMDBENCH_DEPLOY_CURRENT_MODEL": "llama-3.1-8b",
                "LLMDBENCH_HARNESS_NAME": "kvbench",
                "LLMDBENCH_RUN_EXPERIMENT_ID": "exp1",
                "KVBENCH_CONTEXTS": "1000",
                "KVBENCH_CONVERSATIONS": "1",
                "KVBENCH_ANSWER_TOKENS": "4",
            },
            tmp_path,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((results / "result.json").read_text())
    assert result["context_tokens"] == [1000]
    assert all(cell["ttft"]["n"] == 1 and cell["ttft"]["median_ms"] > 0 for cell in result["cells"])
    (run_dir,) = [path for path in results.iterdir() if path.is_dir()]
    assert (run_dir / "records.jsonl").is_file()
    assert (results / "stderr.log").read_text().strip()
    metadata = yaml.safe_load((results / "run_metadata.yaml").read_text())
    assert metadata["harness_rc"] == "0"
    assert metadata["experiment_id"] == "exp1"
    assert metadata["endpoint_url"] == base_url
    assert metadata["harness_version"].startswith("kvbench ")
    assert f"--base-url {base_url}/v1 --contexts 1000 --model llama-3.1-8b" in metadata["harness_args"]
    # the analysis step: kvbench's reports of that run directory, and the result, in analysis/
    analysed = harness({"LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR": str(results)}, tmp_path, ANALYZE)
    assert analysed.returncode == 0, analysed.stderr[-3000:]
    table = (results / "analysis" / "ttft_table.md").read_text()
    assert "1000" in table
    assert json.loads((results / "analysis" / "result.json").read_text()) == result


def test_a_stack_with_a_cpu_tier_is_declared_with_kvbench_offload(tmp_path: Path, simulator: SimulatorLauncher) -> None:
    results = tmp_path / "results"
    env = {
        "LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR": str(results),
        "KVBENCH_CONTEXTS": "1000",
        "KVBENCH_CONVERSATIONS": "1",
        "KVBENCH_ANSWER_TOKENS": "4",
        "KVBENCH_OFFLOAD": "cpu",
    }
    with simulator(*SERVE, "--offload", "cpu") as base_url:
        done = harness(env | {"LLMDBENCH_HARNESS_STACK_ENDPOINT_URL": base_url}, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((results / "result.json").read_text())
    assert result["validity"]["verdict"] == "valid"
    assert any(entry["turn"] == 2 and entry["external_hits"] > 0 for entry in result["cache"])  # from the tier
    assert "--offload cpu" in yaml.safe_load((results / "run_metadata.yaml").read_text())["harness_args"]


def test_analysis_without_a_run_is_one_line(tmp_path: Path) -> None:
    done = harness({"LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR": str(tmp_path)}, tmp_path, ANALYZE)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "no kvbench run directory" in done.stderr


def test_workload_profile_is_a_scenario(tmp_path: Path, simulator: SimulatorLauncher) -> None:
    profiles = tmp_path / "workspace" / "profiles" / "kvbench"
    profiles.mkdir(parents=True)
    scenario = {
        "schema_version": 1,
        "name": "llmd-profile",
        "engine": {"kind": "openai", "model": "llama-3.1-8b", "base_url": "${LLMDBENCH_HARNESS_STACK_ENDPOINT_URL}"},
        "arms": [{"name": "stack", "offload": "hbm"}],
        "workload": {"kind": "multi_round_qa", "context_tokens": [1000], "conversations": 1, "answer_tokens": 4},
    }
    (profiles / "kv.yaml").write_text(yaml.safe_dump(scenario))
    results = tmp_path / "results"
    with simulator(*SERVE) as base_url:
        done = harness(
            {
                "LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR": str(results),
                "LLMDBENCH_HARNESS_STACK_ENDPOINT_URL": base_url,
                "LLMDBENCH_RUN_WORKSPACE_DIR": str(tmp_path / "workspace"),
                "LLMDBENCH_RUN_EXPERIMENT_HARNESS_WORKLOAD_NAME": "kv.yaml",
            },
            tmp_path,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (results / "kv.yaml").read_text() == (profiles / "kv.yaml").read_text()  # the profile kept beside
    result = json.loads((results / "result.json").read_text())
    assert result["scenario_name"] == "llmd-profile" and result["arms"] == ["stack"]
    assert yaml.safe_load((results / "run_metadata.yaml").read_text())["harness_workload"] == "kv.yaml"


@pytest.mark.parametrize("missing", ["LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR", "LLMDBENCH_HARNESS_STACK_ENDPOINT_URL"])
def test_missing_variable_is_one_line(tmp_path: Path, missing: str) -> None:
    env = {
        "LLMDBENCH_RUN_EXPERIMENT_RESULTS_DIR": str(tmp_path / "results"),
        "LLMDBENCH_HARNESS_STACK_ENDPOINT_URL": "http://127.0.0.1:9",
    }
    env.pop(missing)
    done = harness(env, tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and missing in done.stderr
