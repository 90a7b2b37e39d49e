"""``kvbench sim validate`` end to end: a run measured on a calibrated simulator, validated against it.

The "measured" run is a real probe run of the simulator (through the spine) under a chosen
calibration. Validating it with that calibration must be within 15 % per cell (exit 0); with a
calibration whose GEMM efficiency is halved, beyond (exit 1); a length the run does not have or a
calibration for another deployment cannot be compared (exit 2).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import common
from harness.runs.kinds import launch
from harness.scenario.spec import parse_scenario
from harness.sim.calibration import Calibration, FitParam
from kvbench.cli.sim import sim_app
from tests.scenarios import multi_round_qa, sim_scenario
from tests.unit.results.test_calibrate import chosen

pytestmark = pytest.mark.integration

runner = CliRunner()
LMC = {"name": "lmc", "tiers": [{"kind": "cpu", "capacity_gb": 8}], "backend": "lmcache"}


def sim_calibration(hardware: str = "h100-sxm") -> Calibration:
    """The chosen calibration (tests/unit/results/test_calibrate.py) made for this kvbench's simulator."""
    truth = chosen(hardware)
    engine = {"engine": "sim", "engine_version": common.__version__, "cuda_graphs": None}
    return truth.model_copy(update={"deployment": truth.deployment.model_copy(update=engine)})


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("validate")
    calibration = sim_calibration().save(root / "truth.yaml")
    data = sim_scenario(
        "measured-on-sim",
        multi_round_qa([4000, 8000], 1, turns=2, warmup_requests=1),
        engine={"calibration": str(calibration)},
        arms=[{"name": "OFF", "offload": "off"}, {"name": "LMC", "offload": LMC}],
        seed=3,
    )
    scenario = parse_scenario(data, "test")
    run_dir, _ = launch("probe", scenario, source=None, output_dir=root / "runs")
    return run_dir.path, calibration


def test_validate_exit_codes(measured: tuple[Path, Path], tmp_path: Path) -> None:
    run, calibration = measured
    ok = runner.invoke(
        sim_app,
        ["validate", str(run), "--calibration", str(calibration), "--holdout", "8000", "-o", str(tmp_path / "ok")],
    )
    assert ok.exit_code == 0, ok.output
    assert "Validated on lengths [8000]" in ok.output and "within" in ok.output
    for arm in ("OFF", "LMC"):
        assert any(line.split()[:3] == [arm, "8000", "2"] for line in ok.output.splitlines()), ok.output
    # each cell shows the measured requests' range and count (one conversation per length: one request)
    off_t2 = next(line for line in ok.output.splitlines() if line.split()[:3] == ["OFF", "8000", "2"])
    measured_ms = float(off_t2.split()[3].replace(",", ""))
    assert off_t2.endswith(f"; measured {measured_ms:,.1f}-{measured_ms:,.1f} (1)")
    # this machine's client time is measured first and taken out of the calibrated overhead: a few ms, not a
    # share of the 4k-8k prefill the model decides; what is left over the time model is smaller than it
    client = re.search(r"client time, measured first .*?: ([\d.]+) ms, taken out", ok.output)
    left = re.search(
        r"Left in the simulated values: median ([+-][\d.]+) ms per cell, ([+-][\d.]+) to ([+-][\d.]+);", ok.output
    )
    assert client is not None and left is not None, ok.output
    client_ms = float(client.group(1))
    median_ms, lowest_ms, highest_ms = (float(g) for g in left.groups())
    assert 0.0 < client_ms < 50.0
    assert -client_ms < lowest_ms <= median_ms <= highest_ms < 50.0

    slow = sim_calibration().model_copy(
        update={"linear_efficiency": FitParam(value=0.25, unit="", fitted=True, source="wrong on purpose")}
    )
    wrong = slow.save(tmp_path / "wrong.yaml")
    beyond = runner.invoke(
        sim_app,
        [
            "validate",
            str(run),
            "--calibration",
            str(wrong),
            "--holdout",
            "8000",
            "--count-client-time",
            "-o",
            str(tmp_path / "beyond"),
        ],
    )
    assert beyond.exit_code == 1, beyond.output
    assert "BEYOND" in beyond.output
    # --count-client-time: no client-time run first; the whole of this machine's time stays in, never negative
    assert not (tmp_path / "beyond" / "client-time").exists() and (tmp_path / "ok" / "client-time").is_dir()
    counted = re.search(
        r"own time in the simulated values .*?: median ([+-][\d.]+) ms per cell, ([+-][\d.]+) to", beyond.output
    )
    assert counted is not None, beyond.output
    assert float(counted.group(2)) > -0.5
    # a 4x slower GEMM lands outside the cell's one measured request: a model miss, not the run's spread
    assert "beyond: " in beyond.output and "inside the range" not in beyond.output

    absent = runner.invoke(
        sim_app,
        ["validate", str(run), "--calibration", str(calibration), "--holdout", "12345", "-o", str(tmp_path / "absent")],
    )
    assert absent.exit_code == 2 and "12345" in absent.output

    other = sim_calibration("h200-sxm").save(tmp_path / "h200.yaml")
    mismatch = runner.invoke(sim_app, ["validate", str(run), "--calibration", str(other), "-o", str(tmp_path / "x")])
    assert mismatch.exit_code == 2
    assert "h200-sxm" in mismatch.output and "h100-sxm" in mismatch.output


def test_validate_without_a_calibration_fits_on_the_other_lengths(measured: tuple[Path, Path], tmp_path: Path) -> None:
    run, _ = measured
    result = runner.invoke(sim_app, ["validate", str(run), "--holdout", "8000", "-o", str(tmp_path)])
    assert result.exit_code in (0, 1), result.output
    assert "fitted on lengths [4000]" in result.output
    assert "held out of the fit: [8000]" in result.output
    assert (tmp_path / "calibration.yaml").exists()
