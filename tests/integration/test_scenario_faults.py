"""Faults declared in a scenario's sim engine reach the simulator process and show up as error records."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.results.run_result import RunResult
from harness.store.records import read_records
from tests.scenarios import multi_round_qa, sim_scenario
from tests.support import kvbench

pytestmark = pytest.mark.integration


def test_http_error_burst_from_scenario_becomes_error_records(tmp_path: Path) -> None:
    scenario = sim_scenario(
        "faults-in-scenario",
        multi_round_qa([1000], 3, turns=2, answer_tokens=4, warmup_requests=1),
        # requests 0-1 are the warm-up; the first two measured requests get HTTP 503
        engine={"faults": [{"kind": "http_error", "status": 503, "from_request": 1, "requests": 2}]},
        arms=[{"name": "AMG-ON", "offload": "cpu"}],
    )
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    done = kvbench("run", str(path), "-o", "runs", cwd=tmp_path)
    # 2 of 4 measured requests failed: above validity.max_error_rate (5 %), so the run is FAILED (exit 1)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED: 2 of 4 measured requests failed (50.0% > validity.max_error_rate 5.0%)" in done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    measured = [r for r in read_records(run_dir / "records.jsonl") if r.phase == "measure"]
    failed = [r for r in measured if not r.ok]
    assert [(r.http_status, r.error_kind) for r in failed] == [(503, "http_status")] * 2
    # a conversation whose turn 1 failed is not continued, so only one conversation reaches turn 2
    assert sum(1 for r in measured if r.turn == 2) == 1
    result = RunResult.read_file(run_dir / "summary.json")
    assert result.requests.errors_by_kind == {"http_status": 2}
