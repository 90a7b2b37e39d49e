"""A cell beyond the threshold says whether the simulated value lies inside its measured requests' range."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.calibrate.validate import Cell, NeighbourLine, Validation, neighbour_line


def _cell(arm: str, measured: float, simulated: float, low: float, high: float) -> Cell:
    return Cell((arm, "2000", "2"), measured, simulated, 0.15, "held out", True, (low, high))


def test_a_cell_beyond_is_inside_its_measured_range_only_between_its_fastest_and_slowest_request() -> None:
    noisy = _cell("LMC", 58.9, 74.8, 48.5, 107.6)  # +27 %, inside 48.5-107.6
    missed = _cell("OFF", 58.7, 71.6, 57.5, 65.1)  # +22 %, above every measured request
    assert noisy.beyond and noisy.inside_measured_range
    assert missed.beyond and not missed.inside_measured_range
    assert not Cell(("x",), 10.0, 20.0, 0.15).inside_measured_range  # one figure (a sweep metric): no range
    assert _cell("edge", 50.0, 40.0, 40.0, 60.0).inside_measured_range


def test_the_summary_names_the_cells_beyond_and_separately_those_inside_their_range() -> None:
    cells = [
        _cell("LMC", 58.9, 74.8, 48.5, 107.6),
        _cell("OFF", 58.7, 71.6, 57.5, 65.1),
        _cell("NAT", 53.6, 55.0, 51.8, 93.0),
    ]
    result = Validation(Path("run"), "probe", Path("sim"), None, ("arm", "tokens", "turn"), cells)
    lines = result.beyond_lines()
    assert lines[0] == "beyond: LMC 2000 2; OFF 2000 2"
    assert lines[1].startswith("1 of the 2 cells beyond have the simulated value inside") and lines[1].endswith(
        ": LMC 2000 2"
    )
    assert lines[2] == (
        "with the cells beyond that lie inside their own requests' range or bend set aside, 1 would be left "
        "(not the verdict): OFF 2000 2"
    )
    assert len(lines) == 3
    assert not result.passed  # the range is shown, never used in the verdict
    only_noise = Validation(Path("run"), "probe", Path("sim"), None, ("arm", "tokens", "turn"), cells[:1])
    assert only_noise.beyond_lines()[-1].endswith("none is left (not the verdict: every cell beyond still counts)")
    assert not only_noise.passed
    within = Validation(Path("run"), "probe", Path("sim"), None, ("arm", "tokens", "turn"), cells[2:])
    assert within.beyond_lines() == [] and within.passed


def test_the_summary_names_the_cells_beyond_whose_measured_median_the_last_pass_still_moved() -> None:
    unsettled = Cell(("LMC", "96000", "2"), 529.8, 428.0, 0.15, "held out", True, (452.5, 547.7), -0.159)
    settled = Cell(("OFF", "2000", "2"), 58.7, 71.6, 0.15, "held out", True, (57.5, 65.1), 0.021)
    one_pass = Cell(("NAT", "2000", "1"), 60.0, 80.0, 0.15, "held out", True, (59.0, 61.0))
    cells = [unsettled, settled, one_pass]
    result = Validation(Path("run"), "probe", Path("sim"), None, ("arm", "tokens", "turn"), cells)
    lines = result.beyond_lines()
    assert lines[-1].startswith("1 of the 3 cells beyond had a measured median that the run's last pass still moved")
    assert lines[-1].endswith(": LMC 96000 2 (-15.9%)")
    assert not result.passed  # shown, never used in the verdict


def test_the_line_through_the_neighbouring_lengths_is_linear_in_tokens_and_needs_both_sides() -> None:
    medians = {("LMC", 64000, 2): 332.2, ("LMC", 128000, 2): 571.8, ("LMC", 1000, 2): 30.5, ("OFF", 96000, 2): 1.0}
    line = neighbour_line(medians, ("LMC", 96000, 2), [1000, 64000, 128000])
    assert line is not None and (line.below, line.above) == (64000, 128000)
    assert line.at_cell_ms == pytest.approx((332.2 + 571.8) / 2)
    nearer = neighbour_line(medians, ("LMC", 32000, 2), [1000, 64000, 128000])
    assert nearer is not None and (nearer.below, nearer.above) == (1000, 64000)  # the nearest on each side
    assert neighbour_line(medians, ("LMC", 160000, 2), [1000, 64000, 128000]) is None  # nothing above
    assert neighbour_line(medians, ("OFF", 96000, 2), [64000, 128000]) is None  # another arm's medians do not count
    assert neighbour_line(medians, ("LMC", 96000, 2), [128000]) is None  # not a reference length below


def test_a_cell_beyond_is_a_bend_only_when_the_measurement_leaves_the_line_and_the_simulation_does_not() -> None:
    line = NeighbourLine(64000, 128000, 452.0)
    bent = Cell(("LMC", "96000", "2"), 529.8, 430.5, 0.15, "held out", True, (452.5, 547.7), None, line)
    model_miss = Cell(("NAT", "96000", "2"), 455.0, 560.0, 0.15, "held out", True, (440.0, 470.0), None, line)
    no_line = Cell(("OFF", "2000", "1"), 58.7, 71.6, 0.15, "held out", True, (57.5, 65.1))
    assert bent.bend() == "LMC 96000 2 (+17.2% off the line through 64,000 and 128,000; simulated -4.8%)"
    assert model_miss.beyond and model_miss.bend() is None  # the measurement is on the line: the model missed
    assert no_line.bend() is None
    result = Validation(Path("run"), "probe", Path("sim"), None, ("arm", "tokens", "turn"), [bent, model_miss, no_line])
    lines = result.beyond_lines()
    assert any(
        x.startswith("1 of the 3 cells beyond have a measured median further than the threshold")
        and x.endswith(": LMC 96000 2 (+17.2% off the line through 64,000 and 128,000; simulated -4.8%)")
        for x in lines
    )
    assert not result.passed  # shown, never used in the verdict
