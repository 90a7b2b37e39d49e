"""``kvbench sweep`` on a fleet of 2 simulator replicas: fleet capacity in RPS per GPU, per-replica load.

Expected values come from the stored records and point windows (an independent count), not constants.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.results.fleet import FleetResult
from harness.results.sweep_result import SweepResult
from harness.runs.spine import run_sync
from harness.runs.sweep import SweepRunner
from harness.scenario.spec import parse_scenario
from harness.store.rundir import RunDir
from tests.scenarios import exponential, fixed, multi_user_qa, sim_scenario

pytestmark = pytest.mark.integration

WORKLOAD = multi_user_qa(
    8, fixed(3), fixed(2000), question_tokens=20, answer_tokens=8, think_time_s=exponential(0.2), warmup_requests=1
)
SCENARIO = sim_scenario(
    "it-fleet-sweep",
    WORKLOAD,
    engine={"replicas": 2},
    routing={"policy": "least_loaded"},
    arms=[
        {"name": "LL-cpu", "offload": "cpu"},
        {"name": "SA-cpu", "offload": "cpu", "routing": {"policy": "session_affinity"}},
    ],
    sweep={"mode": "concurrency", "values": [4], "warmup": 1, "duration": 4, "ramp_up": 0.5},
    seed=5,
)


def test_fleet_sweep_capacity_per_gpu(tmp_path: Path) -> None:
    scenario = parse_scenario(SCENARIO, "inline")
    run_dir = RunDir.create(tmp_path, scenario)
    run_sync(SweepRunner(scenario, run_dir))
    fleet = FleetResult.read_file(run_dir.fleet_file)
    records = [r for r in run_dir.records() if r.phase == "measure"]
    for arm in fleet.arms:
        mine = [r for r in records if r.arm == arm.arm]
        assert {r.replica for r in mine} == {0, 1}
        assert sum(entry.requests for entry in arm.load) == len(mine)
        [point] = [p for p in run_dir.points() if p.arm == arm.arm]
        window_s = (point.window_end_ns - point.window_start_ns) / 1e9
        [capacity] = arm.capacity
        assert capacity.rps == pytest.approx(sum(1 for r in mine if r.ok) / window_s)
        assert capacity.rps_per_gpu == pytest.approx(capacity.rps / 2)
        assert arm.gpus == 2
        # a load run's same-vs-moved rows are per load level (its users have many context lengths)
        assert [(cell.context_tokens, cell.load) for cell in arm.moved] == [(None, 4.0)]
    # the sweep's own result counts every replica's GPUs too
    sweep = SweepResult.read_file(run_dir.path)
    assert sweep.gpus == 2
    for arm in fleet.arms:
        [measured] = [p for p in sweep.points if p.arm == arm.arm]
        assert measured.gpus == 2 and measured.rps_per_gpu == pytest.approx(arm.capacity[0].rps_per_gpu, rel=0.05)
    # session affinity never moves a conversation; per-replica counters were stored for both replicas
    assert not any(r.moved for r in records if r.arm == "SA-cpu")
    stored = [e for e in run_dir.replica_counters() if e.arm == "LL-cpu"]
    assert stored and all(c is not None for c in stored[-1].counters)
