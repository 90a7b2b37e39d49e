"""``python -m harness.calibrate.holdout --under-load`` on one kept GPU sweep, end to end.

The H100 sweep (docs/results/gpu-sweep-llama8b-h100) is a source of the shipped 8B H100 eager calibration, so the
tool refits that calibration without it and re-runs the sweep's scenario on the simulator at two of its loads,
windows cut to a quarter. The measured capacity must be the kept sweep's own (the best RPS/GPU among those loads that
met the SLO, from its sweep.json); every arm gets a predicted capacity and each treatment arm its ON/OFF ratio.
Bad input is a one-line error (exit 2). About 2 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.results.sweep_result import SweepResult

pytestmark = [pytest.mark.integration, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "docs" / "results" / "gpu-sweep-llama8b-h100"
LOADS = (8.0, 12.0)
"""Two load points busy enough to send the 10 requests a p90 needs in a quarter of the window."""


def holdout(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's code, whatever is installed
    return subprocess.run(
        [sys.executable, "-m", "harness.calibrate.holdout", "--under-load", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_one_kept_sweep_is_predicted_without_having_been_seen(tmp_path: Path) -> None:
    loads = [f"{load:g}" for load in LOADS]
    options = ["--runs", str(RUN), "--loads", *loads, "--window-scale", "0.25", "--out", str(tmp_path / "sim")]
    done = holdout(*options, "--json", str(tmp_path / "cells.json"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    [table] = json.loads((tmp_path / "cells.json").read_text())["runs"]
    assert table["calibration"] == "llama8b-h100-eager.yaml" and table["how"] == "left out"
    assert (tmp_path / "sim" / RUN.name / f"llama8b-h100-eager-without-{RUN.name}.yaml").is_file()
    kept = SweepResult.model_validate_json((RUN / "sweep.json").read_bytes())
    cells = {(c["arm"], c["quantity"]): c for c in table["cells"]}
    for arm in kept.arms:
        passing = [p.rps_per_gpu for p in kept.points if p.arm == arm and p.load in LOADS and p.meets_slo]
        cell = cells[(arm, "capacity RPS/GPU")]
        expected = max(passing) if passing else None
        assert cell["measured"] == (pytest.approx(expected) if expected is not None else None)
        assert cell["predicted"] is not None and cell["predicted"] > 0
        assert f"| {arm} | capacity RPS/GPU" in done.stdout
    ratios = [c for (_, quantity), c in cells.items() if quantity.startswith("ON/OFF")]
    assert len(ratios) == len(kept.arms) - 1


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    for args, words in (
        (["--runs", str(tmp_path)], "not a run directory"),
        (["--runs", str(RUN), "--loads", "5"], "--loads [5.0]: not load points"),
        (["--window-scale", "2"], "--window-scale 2.0"),
    ):
        done = holdout(*args, cwd=tmp_path)
        assert done.returncode == 2, done.stdout
        assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
