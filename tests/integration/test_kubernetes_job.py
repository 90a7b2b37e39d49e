"""The Jobs of ``deploy/kubernetes`` run as written: their container's command line against simulators.

A cluster is not needed to know that a Job's arguments are a kvbench command line that measures:
the test takes the container's ``command`` + ``args`` (and its plain ``env`` values) from the
manifest and runs them as the pod would, with only what points into the cluster replaced --
Service URLs by ``kvbench sim serve`` endpoints on 127.0.0.1, the results volume's mount path by a
temporary folder, the ConfigMap's mount by the file it holds -- and smaller contexts so it is quick;
``$(VAR)`` in the arguments is the container's variable, as Kubernetes expands it. The API key variable
is set, as the Secret sets it. The offload-ON Service is a simulator with a CPU tier, declared by the
Job's offload profile. The container's command is a one-line ``sh -c`` that execs kvbench with the
manifest's args and sends its stdout (the ``--json`` result) to ``result.json`` on the results volume. It
must exit 0 (valid: turn 2 loaded from the declared tier), write the result there, leave nothing but logs on
the pod's output (progress, tables, the verdict line) and leave the run directory on the "volume".
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from tests.support import SimulatorLauncher, kvbench_argv, kvbench_env

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
SERVE = ("--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--host", "127.0.0.1")
RESULTS_MOUNT = "/results"


def container(path: Path) -> Mapping[str, object]:
    (job,) = yaml.safe_load_all(path.read_text(encoding="utf-8"))
    (only,) = job["spec"]["template"]["spec"]["containers"]
    assert isinstance(only, dict)
    return only


def pod_argv(spec: Mapping[str, object], replace: Mapping[str, str], env: Mapping[str, str] = {}) -> list[str]:
    """The container's command line; ``$(VAR)`` expanded from ``env``, as Kubernetes expands it."""
    command = spec["command"]
    args = spec["args"]
    assert isinstance(command, list) and isinstance(args, list)
    shell, flag, script, name = command
    assert (shell, flag, name) == ("sh", "-c", "kvbench") and script.startswith("exec kvbench "), command
    # the image's kvbench is this checkout's; the script's redirect lands on the test's "volume"
    local = script.replace("exec kvbench", f"exec {shlex.join(kvbench_argv())}", 1)
    local = local.replace(RESULTS_MOUNT, replace[RESULTS_MOUNT])
    expanded = (re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), str(arg)) for arg in args)
    return [shell, flag, local, name, *(replace.get(arg, arg) for arg in expanded)]


def run_directory(results: Path) -> Path:
    (run_dir,) = [path for path in results.iterdir() if path.is_dir()]
    return run_dir


def pod_env(spec: Mapping[str, object], replace: Mapping[str, str]) -> dict[str, str]:
    env = spec["env"]
    assert isinstance(env, list)
    values = {entry["name"]: replace.get(entry["value"], entry["value"]) for entry in env if "value" in entry}
    values.pop("HOME")  # the pod's writable /tmp; here the test's own HOME serves
    secrets = [entry["name"] for entry in env if "valueFrom" in entry]
    return kvbench_env(**values, **{name: "sk-test-not-a-real-key" for name in secrets})


def run_pod(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    return done.returncode, done.stdout, done.stderr


def test_flags_only_job_measures_the_service(tmp_path: Path, simulator: SimulatorLauncher) -> None:
    spec = container(DEPLOY / "job.yaml")
    args = [str(arg) for arg in spec["args"]]  # type: ignore[attr-defined]
    service = args[args.index("--base-url") + 1]
    contexts = args[args.index("--contexts") + 1]
    results = tmp_path / "results"
    results.mkdir()  # the volume exists before the pod starts
    environ = pod_env(spec, {})
    with simulator(*SERVE, "--offload", environ["KVBENCH_OFFLOAD"]) as base_url:
        replace = {service: f"{base_url}/v1", contexts: "1000", RESULTS_MOUNT: str(results)}
        code, stdout, stderr = run_pod(pod_argv(spec, replace, environ), environ, tmp_path)
    assert code == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    assert stdout == "" and "VALID: " in stderr  # the pod's log: progress, tables and the verdict, no JSON
    result = json.loads((results / "result.json").read_text(encoding="utf-8"))
    assert result["context_tokens"] == [1000]
    assert result["validity"]["verdict"] == "valid"
    assert any(entry["turn"] == 2 and entry["external_hits"] > 0 for entry in result["cache"])  # from the tier
    assert {cell["turn"] for cell in result["cells"]} == {1, 2}
    assert all(cell["ttft"]["n"] > 0 and cell["ttft"]["median_ms"] > 0 for cell in result["cells"])
    run_dir = run_directory(results)
    assert (run_dir / "summary.json").is_file() and (run_dir / "records.jsonl").is_file()
    assert result == json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert "sk-test-not-a-real-key" not in "".join(p.read_text() for p in run_dir.rglob("*") if p.is_file())


def test_scenario_job_runs_the_configmap_scenario(tmp_path: Path, simulator: SimulatorLauncher) -> None:
    configmap = yaml.safe_load((DEPLOY / "scenario" / "configmap.yaml").read_text(encoding="utf-8"))
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(configmap["data"]["scenario.yaml"], encoding="utf-8")
    spec = container(DEPLOY / "scenario" / "job.yaml")
    (mount,) = [m for m in spec["volumeMounts"] if m["name"] == "scenario"]  # type: ignore[attr-defined]
    env = {entry["name"]: entry.get("value") for entry in spec["env"]}  # type: ignore[attr-defined]
    results = tmp_path / "results"
    results.mkdir()
    on_tier = str(env["KVBENCH_ON_OFFLOAD"])  # the ON Service's tier, as the Job declares it
    with simulator(*SERVE, "--offload", "hbm") as off, simulator(*SERVE, "--offload", on_tier) as on:
        replace = {
            RESULTS_MOUNT: str(results),
            f"{mount['mountPath']}/scenario.yaml": str(scenario),
            str(env["KVBENCH_OFF_URL"]): off,
            str(env["KVBENCH_ON_URL"]): on,
            str(env["KVBENCH_MODEL"]): "llama-3.1-8b",
        }
        argv = [
            *pod_argv(spec, replace),
            "--set",
            "workload.context_tokens=[1000]",
            "--set",
            "workload.conversations=1",
        ]
        environ = pod_env(spec, replace)
        assert not any("svc.cluster.local" in value for value in environ.values())
        # the scenario's output.dir is the results volume's mount path: here a temporary folder
        code, stdout, stderr = run_pod([*argv, "--set", f"output.dir={results}"], environ, tmp_path)
    assert code == 0, stderr[-3000:]
    assert stdout == ""
    result = json.loads((results / "result.json").read_text(encoding="utf-8"))
    assert result["arms"] == ["off", "on"] and result["baseline_arm"] == "off"
    run_dir = run_directory(results)
    assert (run_dir / "summary.json").is_file()
    assert run_dir.name.startswith("cluster-offload-on-vs-off")
