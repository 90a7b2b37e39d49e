"""``--set`` and ``--json`` end to end on the simulator: ``kvbench run quickstart --set ... --json`` prints its
summary.json and nothing else on stdout, stores the effective scenario, and ``report``/``compare`` print theirs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support import kvbench

pytestmark = pytest.mark.integration

SETS = ("--set", "workload.conversations=1", "--set", "workload.context_tokens=[1000]", "--set", "arms.1.name=ON")


def test_run_set_json_then_report_and_compare(tmp_path: Path) -> None:
    done = kvbench("run", "quickstart", *SETS, "--json", "-o", str(tmp_path / "runs"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)  # the whole of stdout is one JSON document
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert printed == json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert printed["arms"] == ["AMG-OFF", "ON"] and printed["context_tokens"] == [1000]
    assert "Run directory:" in done.stderr and "AMG-OFF" in done.stderr  # the table and notes: stderr
    assert f"VALID: every validity gate passed (run directory: {run_dir})" in done.stderr  # a verdict line, valid too
    stored = yaml.safe_load((run_dir / "scenario.yaml").read_text(encoding="utf-8"))
    assert stored["workload"]["conversations"] == 1 and stored["arms"][1]["name"] == "ON"

    report = kvbench("report", str(run_dir), "--json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout) == printed
    assert "VALID: every validity gate passed" in report.stderr
    both = kvbench("report", str(run_dir), str(run_dir), "--json", cwd=tmp_path)
    assert json.loads(both.stdout) == [printed, printed]

    # one request per cell cannot show a regression: INCONCLUSIVE (exit 3), and still the verdict on stdout
    gate = kvbench("compare", str(run_dir), str(run_dir), "--json", "-", cwd=tmp_path)
    assert gate.returncode == 3, gate.stderr
    verdict = json.loads(gate.stdout)
    assert verdict["verdict"] == "inconclusive" and verdict["scenario_name"] == printed["scenario_name"]
    assert not (tmp_path / "-").exists()


def test_a_bad_set_prints_nothing_on_stdout(tmp_path: Path) -> None:
    done = kvbench("run", "quickstart", "--set", "workload.turn=3", "--json", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "--set workload.turn: no field 'turn' in workload; allowed:" in line and "turns" in line
    checked = kvbench("validate", "quickstart", "--set", "workload.conversations=0", cwd=tmp_path)
    assert checked.returncode == 2 and "with --set workload.conversations=0" in checked.stderr
