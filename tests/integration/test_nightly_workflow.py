"""``ci/nightly.yml`` runs as written: its engine is in dev mode where its scenario resets caches, and its kvbench
steps run (in ``engine: sim`` mode, on the simulator) with the exit codes and files the later steps rely on.

The test reads the workflow with PyYAML and runs each ``run:`` step's script with bash the way a GitHub runner
does (``bash -e``, ``$GITHUB_OUTPUT``, ``$GITHUB_STEP_SUMMARY``, ``${{ ... }}`` substituted, ``if:`` evaluated),
with ``kvbench`` on PATH as this checkout. The install step (pip from git) and ``uses:`` actions are not run;
an expression or condition the test does not know fails it, so a change to the workflow is a change to this test.
Two nights in sim mode: the first finds no baseline and promotes its run, the second is gated against it.
A small scenario stands in for nightly-sim (``NIGHTLY_SIM_SCENARIO``, the workflow's own knob) to keep it short.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest
import yaml

from harness.scenario.spec import Scenario, load_scenario
from tests.scenarios import multi_round_qa, sim_scenario
from tests.support import REPO, kvbench_env, write_scenario
from workloads.config import MultiRoundQAProbe

pytestmark = pytest.mark.integration

WORKFLOW = REPO / "ci" / "nightly.yml"
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
KVBENCH_STEP = re.compile(r"(^|[\s;&|(])kvbench (validate|run|compare|report)\b", re.MULTILINE)
GPU_NAME = "NVIDIA H100 80GB HBM3"

Step = dict[str, object]


def _job() -> dict[str, object]:
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    return cast(dict[str, object], workflow["jobs"]["gate"])


def _steps() -> list[Step]:
    return cast(list[Step], _job()["steps"])


def _step(name: str) -> Step:
    (step,) = [step for step in _steps() if step.get("name") == name]
    return step


class Night:
    """One run of the job: its inputs, its environment, the step outputs so far, and whether a step failed."""

    def __init__(self, workdir: Path, bin_dir: Path, *, engine: str, promote: bool, env: dict[str, str]) -> None:
        self.workdir, self.engine, self.promote = workdir, engine, promote
        self.outputs: dict[str, dict[str, str]] = {}
        self.failed = False
        self.codes: dict[str, int] = {}
        job_env = {
            key: self.substitute(str(value))
            for key, value in cast(dict[str, object], _job()["env"]).items()
            if key not in env
        }
        self.env = {**kvbench_env(), **job_env, **env, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    def expression(self, text: str) -> str:
        if text == "inputs.engine || 'vllm'":
            return self.engine
        if match := re.fullmatch(r"inputs\.engine == '(\w+)' && '([^']*)' \|\| '([^']*)'", text):
            return match[2] if self.engine == match[1] else match[3]
        if text == "github.run_id":
            return "1"
        if match := re.fullmatch(r"steps\.(\w+)\.outputs\.(\w+)", text):
            return self.outputs.get(match[1], {}).get(match[2], "")
        raise AssertionError(f"ci/nightly.yml: this test does not know the expression ${{{{ {text} }}}}")

    def substitute(self, text: str) -> str:
        return EXPRESSION.sub(lambda match: self.expression(match[1]), text)

    def condition(self, text: str | None) -> bool:
        """A step's ``if:`` (terms joined by ``&&``); without ``always()`` a step runs only while none failed."""
        if text is None:
            return not self.failed
        always, holds = False, True
        inner = EXPRESSION.fullmatch(text.strip())
        for term in (inner[1] if inner else text).split("&&"):
            term = term.strip()
            if term == "always()":
                always = True
            elif match := re.fullmatch(r"hashFiles\('([^']+)'\) != ''", term):
                holds &= (self.workdir / match[1]).exists()
            elif match := re.fullmatch(r"env\.(\w+) == '([^']*)'", term):
                holds &= self.env.get(match[1]) == match[2]
            elif term in ("inputs.promote", "!inputs.promote"):
                holds &= self.promote != term.startswith("!")
            else:
                raise AssertionError(f"ci/nightly.yml: this test does not know the condition {term!r}")
        return holds and (always or not self.failed)

    def run_step(self, step: Step) -> int | None:
        """The step's script under ``bash -e`` when its ``if:`` holds; its exit status (None: not run)."""
        if "run" not in step or not self.condition(cast("str | None", step.get("if"))):
            return None
        script = self.workdir / "step.sh"
        script.write_text(self.substitute(str(step["run"])), encoding="utf-8")
        output, summary = self.workdir / "github_output", self.workdir / "summary.md"
        output.write_text("")
        step_env = {
            key: self.substitute(str(value)) for key, value in cast(dict[str, object], step.get("env", {})).items()
        }
        done = subprocess.run(
            ["bash", "-e", str(script)],
            cwd=self.workdir,
            env={**self.env, **step_env, "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary)},
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if "id" in step:
            pairs = (line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)
            self.outputs[str(step["id"])] = dict(pairs)
        self.codes[str(step.get("name"))] = done.returncode
        if done.returncode != 0:
            self.failed = True
        (self.workdir / f"step-{len(self.codes)}.log").write_text(done.stdout + done.stderr)
        return done.returncode

    def run(self, skip: tuple[str, ...] = ()) -> None:
        for step in _steps():
            if step.get("name") == "Install kvbench" or step.get("name") in skip:
                continue  # the test's PATH has this checkout's kvbench
            self.run_step(step)


def _between_turns(scenario: Scenario) -> str:
    assert isinstance(scenario.workload, MultiRoundQAProbe), scenario.workload
    return scenario.workload.between_turns.mode


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """``kvbench`` (this checkout) and a stand-in ``nvidia-smi`` that names one GPU."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, body in (
        ("kvbench", f'exec {sys.executable} -m kvbench "$@"\n'),
        ("nvidia-smi", f'echo "{GPU_NAME}"\n'),
    ):
        path = folder / name
        path.write_text(f"#!/bin/sh\n{body}", encoding="utf-8")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


def test_the_engine_runs_in_dev_mode_where_the_nightly_scenario_resets_the_prefix_cache(
    tmp_path: Path, bin_dir: Path
) -> None:
    night = Night(tmp_path, bin_dir, engine="vllm", promote=False, env={})
    assert night.run_step(_step("Write the nightly scenario")) == 0, (tmp_path / "step-1.log").read_text()
    scenario, _ = load_scenario(str(tmp_path / "nightly.yaml"))  # the file the run step is given
    assert night.outputs["scenario"]["name"] == "nightly.yaml"
    assert scenario.engine.kind == "openai" and scenario.engine.hardware == GPU_NAME
    start = _step("Start the engine")
    assert night.condition(cast(str, start["if"])) and "vllm serve" in str(start["run"])
    dev_mode = {**night.env, **cast(dict[str, str], start.get("env", {}))}.get("VLLM_SERVER_DEV_MODE")
    resets = _between_turns(scenario) == "reset_prefix_cache"
    assert resets and dev_mode == "1", "a scenario that resets the prefix cache needs VLLM_SERVER_DEV_MODE=1"
    # its sim counterpart measures the same returning user, on the simulator
    sim = Night(tmp_path / "sim", bin_dir, engine="sim", promote=False, env={})
    assert not sim.condition(cast(str, start["if"]))
    counterpart, _ = load_scenario(sim.env["NIGHTLY_SIM_SCENARIO"])
    assert counterpart.engine.kind == "sim"
    assert _between_turns(counterpart) == _between_turns(scenario)
    assert sim.env["KVBENCH_BASELINE_DIR"] != night.env["KVBENCH_BASELINE_DIR"]  # a sim promote keeps the engine's


def test_two_sim_nights_promote_a_baseline_then_gate_against_it(tmp_path: Path, bin_dir: Path) -> None:
    reset = {"mode": "reset_prefix_cache"}
    workload = multi_round_qa([1000, 4000], 3, turns=2, answer_tokens=4, warmup_requests=1, between_turns=reset)
    data = sim_scenario("nightly-small-sim", workload, arms=[{"name": "AMG-ON", "offload": "cpu"}], seed=5)
    scenario = write_scenario(tmp_path / "nightly-small-sim.yaml", data)
    env = {"NIGHTLY_SIM_SCENARIO": str(scenario), "KVBENCH_BASELINE_DIR": str(tmp_path / "baselines" / "nightly")}

    first = tmp_path / "night1"
    first.mkdir()
    night = Night(first, bin_dir, engine="sim", promote=True, env=env)
    night.run()
    logs = "\n".join(path.read_text() for path in sorted(first.glob("step-*.log")))
    assert set(night.codes.values()) == {0}, logs
    assert "Start the engine" not in night.codes and "Fail on a regression or an incomparable run" not in night.codes
    current = Path(night.outputs["gate"]["current"])
    assert (first / current / "records.jsonl").is_file()
    assert night.outputs["gate"]["code"] == "0"  # no baseline yet
    assert "No baseline yet" in (first / "summary.md").read_text()
    assert (first / "report" / "nightly.html").stat().st_size > 0
    assert (tmp_path / "baselines" / "nightly" / "records.jsonl").is_file()  # promoted

    second = tmp_path / "night2"
    second.mkdir()
    night = Night(second, bin_dir, engine="sim", promote=False, env=env)
    night.run(skip=("Render the HTML report",))  # rendered on the first night: 7 s of CPU saved
    logs = "\n".join(path.read_text() for path in sorted(second.glob("step-*.log")))
    code = int(night.outputs["gate"]["code"])
    assert code in (0, 1, 3), logs  # 2 (cannot compare) would mean the two nights differ in scenario or hardware
    for name in ("gate.md", "gate.xml", "gate.json"):
        assert (second / name).stat().st_size > 0, name
    assert "Promote this run to baseline" not in night.codes
    # the last step turns the gate's answer into the job's: green only for "no regression"
    assert night.codes["Fail on a regression or an incomparable run"] == (0 if code == 0 else 1), logs
