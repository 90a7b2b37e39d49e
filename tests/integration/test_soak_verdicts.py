"""A soak's verdict is its exit code, a resumed window does not count its own fresh engine as a restart, and a
scenario without a window is refused before anything starts; every interval keeps its (simulated) energy.

``kvbench soak`` and ``kvbench report`` as a user runs them (subprocesses) against the built-in simulator,
which kvbench starts and stops.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.scenarios import exponential, multi_user_qa, sim_scenario, uniform
from tests.support import kvbench, kvbench_process, wait_for, write_scenario

pytestmark = pytest.mark.integration

WORKLOAD = multi_user_qa(
    8,
    uniform(2, 3),
    uniform(500, 1000),
    question_tokens=16,
    answer_tokens=8,
    think_time_s=exponential(0.2),
    warmup_requests=1,
)
SOAK_SCENARIO: dict[str, Any] = sim_scenario(
    "soak-verdicts",
    WORKLOAD,
    arms=[{"name": "AMG-ON", "offload": "cpu"}],
    sweep={"mode": "concurrency", "values": [2], "ramp_up": 0.5},
    slo={"ttft_ms": 5000, "tpot_ms": 1000},
    soak={"window": "12s", "interval": "3s", "criteria": {"max_restarts": 0}},
    seed=5,
)


def soak_file(tmp_path: Path, **changes: Any) -> Path:
    return write_scenario(tmp_path / "soak.yaml", json.loads(json.dumps(SOAK_SCENARIO)) | changes)


def criterion(soak_dir: Path, name: str) -> dict[str, Any]:
    result = json.loads((soak_dir / "soak.json").read_text())
    found: dict[str, Any] = next(c for c in result["verdict"]["criteria"] if c["name"] == name)
    return found


def test_a_resumed_window_does_not_count_its_own_engine_as_a_restart(tmp_path: Path) -> None:
    scenario = soak_file(tmp_path)
    runs = tmp_path / "runs"
    first = kvbench_process("soak", str(scenario), "-o", str(runs))

    def an_interval_is_stored() -> bool:
        return any(path.read_text().count("\n") >= 1 for path in runs.glob("*/intervals.jsonl"))

    wait_for(an_interval_is_stored, 120, first)
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=60)
    (soak_dir,) = runs.iterdir()
    assert f"kvbench soak --resume {soak_dir}" in out + err

    resumed = kvbench("soak", "--resume", str(soak_dir), cwd=tmp_path)
    result = json.loads((soak_dir / "soak.json").read_text())
    assert result["attempts"] == 2 and result["complete"], resumed.stdout + resumed.stderr
    restarts = criterion(soak_dir, "restarts")
    assert restarts["status"] == "pass", restarts
    expected = {"PASS": 0, "FAIL": 1, "INCOMPLETE": 3}[result["verdict"]["verdict"]]
    assert resumed.returncode == expected, resumed.stdout + resumed.stderr
    assert ("VALID: " in resumed.stderr) == (expected == 0), resumed.stderr  # a verdict line for PASS too


def test_a_failed_window_exits_1_when_it_ends_and_when_its_files_are_reported_again(tmp_path: Path) -> None:
    # a TTFT target no request can meet: the window fails its SLO criterion
    scenario = soak_file(tmp_path, slo={"ttft_ms": 0.001, "tpot_ms": 1000})
    runs = tmp_path / "runs"
    ended = kvbench("soak", str(scenario), "-o", str(runs), "--window", "6s", cwd=tmp_path)
    (soak_dir,) = runs.iterdir()
    assert json.loads((soak_dir / "soak.json").read_text())["verdict"]["verdict"] == "FAIL"
    assert ended.returncode == 1, ended.stdout + ended.stderr
    # each interval keeps the GPUs' energy, from the simulator's power model (idle 90 W to TDP 700 W on an H100)
    intervals = [json.loads(line) for line in (soak_dir / "intervals.jsonl").read_text().splitlines()]
    assert intervals and all(i["energy"]["source"] == "simulated" for i in intervals)
    assert all(90 < i["energy"]["joules"] / i["energy"]["seconds"] <= 700 for i in intervals)
    again = kvbench("report", str(soak_dir), cwd=tmp_path)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "FAILED" in again.stderr


def test_a_scenario_without_a_window_is_refused_before_anything_starts(tmp_path: Path) -> None:
    data = {key: value for key, value in SOAK_SCENARIO.items() if key != "soak"}
    scenario = write_scenario(tmp_path / "no-window.yaml", data)
    runs = tmp_path / "runs"
    refused = kvbench("soak", str(scenario), "-o", str(runs), cwd=tmp_path, timeout=60)
    assert refused.returncode == 2
    message = refused.stdout + refused.stderr
    assert "soak: missing" in message and "--window" in message
    assert len(message.strip().splitlines()) == 1, message
    assert not runs.exists()
