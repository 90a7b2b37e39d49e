"""A real ``kvbench sweep`` on the simulator judges its own client: a load point the client could not send on
time is INCONCLUSIVE (exit 3) with the figure, and a point it kept up with stays VALID with its figures stored.

The limited run offers 30 requests/s but lets one session be open at a time (``sweep.max_active_users: 1``), so
each arrival waits for the previous answer (well over 100 ms on the simulated H100): the requests leave
hundreds of ms after they were due, which is the client's doing, not the engine's. About 40 s on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.results.sweep_result import SweepResult
from harness.results.verdict import EXIT_INCONCLUSIVE
from tests.support import kvbench, write_scenario

pytestmark = pytest.mark.integration


def scenario(sweep: dict[str, object]) -> dict[str, object]:
    return {
        "name": "it-client-limited",
        "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
        "arms": [{"name": "ON", "offload": "cpu"}],
        "workload": {
            "kind": "multi_user_qa",
            "users": 8,
            "rounds": 3,
            "system_prompt_tokens": 200,
            "context_tokens": 2000,
            "question_tokens": 20,
            "answer_tokens": 16,
            "think_time_s": 0.1,
            "warmup_requests": 1,
        },
        "sweep": {"warmup": 1, "duration": 3, "stagger_rounds": False, **sweep},
        "seed": 2,
    }


def run(tmp_path: Path, sweep: dict[str, object]) -> tuple[int, str, SweepResult]:
    path = write_scenario(tmp_path / "sweep.yaml", scenario(sweep))
    done = kvbench("sweep", str(path), "-o", str(tmp_path / "runs"), cwd=tmp_path)
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    events = [json.loads(line) for line in (run_dir / "points.jsonl").read_text(encoding="utf-8").splitlines()]
    assert events and all(event["client"] is not None for event in events)  # stored with the point, not derived
    return done.returncode, done.stdout + done.stderr, SweepResult.read_file(run_dir / "sweep.json")


def test_a_client_that_keeps_up_leaves_the_sweep_valid(tmp_path: Path) -> None:
    code, output, result = run(tmp_path, {"mode": "concurrency", "values": [2], "ramp_up": 0.5})
    assert code == 0, output
    assert result.validity is not None and result.validity.verdict == "valid"
    (point,) = result.points
    lag = point.client
    assert lag is not None and lag.send_lag_n >= point.measured > 0 and lag.slot_waits == 0
    (runner,) = lag.processes
    assert runner.role == "runner" and runner.ticks > 100
    assert "Client @ ON 2 users: send lag p50" in output


def test_a_client_that_cannot_send_on_time_makes_the_point_inconclusive(tmp_path: Path) -> None:
    # no warm-up: arrivals due in a warm-up and sent in the window would leave the window nothing measured
    sweep = {"mode": "qps", "values": [30], "max_active_users": 1, "warmup": 0.1}
    code, output, result = run(tmp_path, sweep)
    assert code == EXIT_INCONCLUSIVE, output
    assert result.validity is not None and result.validity.verdict == "inconclusive"
    (finding,) = result.validity.findings
    assert finding.gate == "client_limited"
    assert finding.message.startswith("ON @ 30 req/s: client-limited: send lag p99 ")
    assert "arrivals waited for a free session" in finding.message
    (point,) = result.points
    assert point.client is not None and point.client.send_lag_p99_ms is not None
    assert point.client.send_lag_p99_ms > 50 and point.client.slot_waits > 10
    assert "INCONCLUSIVE (exit 3) -- the client fell behind its own schedule" in output
