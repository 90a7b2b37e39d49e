"""A soak flag the window cannot take is one line naming the soak field, not pydantic's multi-line dump (R13)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from kvbench.cli import app


def test_an_interval_longer_than_the_window_is_one_line(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["soak", "soak-sim", "--window", "1m", "--interval", "10m", "-o", str(tmp_path)])
    assert done.exit_code == 2
    lines = [line for line in done.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, done.output
    assert "soak:" in lines[0] and "interval (600 s) is longer than the window (60 s)" in lines[0]
    assert "pydantic" not in done.output and "validation error" not in done.output
    assert not any(tmp_path.iterdir())  # refused before a run directory exists
