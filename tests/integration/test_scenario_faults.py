"""Faults declared in a scenario's sim engine reach the simulator process and show up as error records."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.results.run_result import RunResult
from harness.store.records import read_records
from tests.support import kvbench

pytestmark = pytest.mark.integration


def test_http_error_burst_from_scenario_becomes_error_records(tmp_path: Path) -> None:
    scenario = {
        "name": "faults-in-scenario",
        "engine": {
            "kind": "sim",
            "model": "llama-3.1-8b",
            "hardware": "h100-sxm",
            # requests 0-1 are the warm-up; the first two measured requests get HTTP 503
            "faults": [{"kind": "http_error", "status": 503, "from_request": 1, "requests": 2}],
        },
        "arms": [{"name": "AMG-ON", "offload": "cpu"}],
        "workload": {
            "kind": "multi_round_qa",
            "context_tokens": [1000],
            "conversations": 3,
            "turns": 2,
            "answer_tokens": 4,
            "warmup_requests": 1,
        },
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    done = kvbench("run", str(path), "-o", "runs", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    measured = [r for r in read_records(run_dir / "records.jsonl") if r.phase == "measure"]
    failed = [r for r in measured if not r.ok]
    assert [(r.http_status, r.error_kind) for r in failed] == [(503, "http_status")] * 2
    # a conversation whose turn 1 failed is not continued, so only one conversation reaches turn 2
    assert sum(1 for r in measured if r.turn == 2) == 1
    result = RunResult.read_file(run_dir / "summary.json")
    assert result.requests.errors_by_kind == {"http_status": 2}
