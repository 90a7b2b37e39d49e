"""A capacity read between two grid points is interpolated and marked; a coarse grid warns (G3).

From the committed simulated Qwen3-14B sweep: each arm's best passing load point and the next, failing one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.results.capacity import COARSE_GRID, grid_crossing
from harness.results.sweep_result import SweepResult
from reports.curves import capacity_lines

SWEEP = Path(__file__).resolve().parents[3] / "docs" / "results" / "sweep-qwen3-14b-sim"


def test_the_slo_boundary_is_read_between_the_best_passing_point_and_the_next_failing_one() -> None:
    result = SweepResult.read_file(SWEEP)
    for capacity in result.capacity:
        points = result.arm_points(capacity.arm)
        best = max((p for p in points if p.meets_slo), key=lambda p: p.rps_per_gpu)
        crossing = grid_crossing(points, best, 0.9)  # the scenario's SLO percentile, 90
        assert crossing is not None and crossing.load_pass == best.load and crossing.load_fail > best.load
        low, high = sorted((crossing.rps_per_gpu_pass, crossing.rps_per_gpu_fail))
        assert low <= crossing.interpolated_rps_per_gpu <= high
    text = "\n".join(capacity_lines(result))
    assert "interpolated capacity" in text and "an estimate, not a measured point" in text


def test_two_loads_far_apart_make_the_grid_coarse_and_the_report_says_so() -> None:
    result = SweepResult.read_file(SWEEP)
    arm = result.capacity[0].arm
    points = result.arm_points(arm)
    best = max((p for p in points if p.meets_slo), key=lambda p: p.rps_per_gpu)
    stretched = [p.model_copy(update={"load": p.load * 10}) if p.load > best.load else p for p in points]
    crossing = grid_crossing(stretched, best, 0.9)
    assert crossing is not None and crossing.coarse and crossing.load_fail > COARSE_GRID * crossing.load_pass
    coarse = result.model_copy(
        update={"capacity": [result.capacity[0].model_copy(update={"between": crossing}), *result.capacity[1:]]}
    )
    assert any(line.startswith(f"warning: {arm}'s loads") for line in capacity_lines(coarse))


def test_no_failing_point_above_means_no_crossing() -> None:
    result = SweepResult.read_file(SWEEP)
    points = result.arm_points(result.capacity[0].arm)
    best = max((p for p in points if p.meets_slo), key=lambda p: p.rps_per_gpu)
    below = [p for p in points if p.load <= best.load]
    assert grid_crossing(below, best, 0.9) is None


@pytest.mark.parametrize("need", [0.0, 1.0])
def test_the_read_never_leaves_the_two_points(need: float) -> None:
    result = SweepResult.read_file(SWEEP)
    points = result.arm_points(result.capacity[-1].arm)
    best = max((p for p in points if p.meets_slo), key=lambda p: p.rps_per_gpu)
    crossing = grid_crossing(points, best, need)
    assert crossing is not None
    assert min(crossing.rps_per_gpu_pass, crossing.rps_per_gpu_fail) <= crossing.interpolated_rps_per_gpu
    assert crossing.interpolated_rps_per_gpu <= max(crossing.rps_per_gpu_pass, crossing.rps_per_gpu_fail)
