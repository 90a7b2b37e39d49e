"""The validation's note on this machine's client time: what was taken out, and what was left per cell."""

from __future__ import annotations

from harness.calibrate.validate import client_time_line, lateness_lines

CELL = ("LMC", 2000, 2)


def test_the_client_time_taken_out_is_said_even_without_a_comparable_cell() -> None:
    # a validation whose simulated cells have no measured counterpart still says what it took out
    assert lateness_lines({}, {}, 0.0031) == [client_time_line(0.0031)]
    assert "3.1 ms, taken out of the calibrated overhead" in client_time_line(0.0031)
    assert lateness_lines({CELL: 2.0}, {CELL: 0.0}, 0.0031) == [client_time_line(0.0031)]
    # nothing measured, nothing taken out: nothing to say
    assert lateness_lines({}, {}, 0.0) == []


def test_what_is_left_per_cell_follows_the_amount_taken_out() -> None:
    (line,) = lateness_lines({CELL: 1.5, ("OFF", 2000, 1): -0.5}, {CELL: 60.0, ("OFF", 2000, 1): 130.0}, 0.0025)
    assert line.startswith(client_time_line(0.0025) + " Left in the simulated values: median +0.5 ms per cell")
    assert line.endswith("largest against the measured value in LMC 2000 2 (+2.5%).")
    (counted,) = lateness_lines({CELL: 3.0}, {CELL: 60.0})
    assert counted.startswith("This machine's own time in the simulated values") and "+5.0%" in counted
