"""``kvbench sim calibrate``: prints parameters with sources and residuals, writes the file; errors exit 2."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from harness.sim.calibration import Calibration
from kvbench.cli.sim import sim_app
from tests.unit.results.test_calibrate import chosen, write_run

runner = CliRunner()


def test_calibrate_prints_the_fit_and_writes_the_file(tmp_path: Path) -> None:
    run = write_run(tmp_path / "runs", chosen())
    out = tmp_path / "cal.yaml"
    result = runner.invoke(sim_app, ["calibrate", str(run), "--holdout", "4000", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "Calibration for llama-3.1-8b bf16 on 1x h100-sxm (vllm 9.9.9, CUDA graphs)" in result.output
    assert "held out [4000]" in result.output
    assert "lmcache 0.0.1: load_gbps" in result.output and "Residuals" in result.output
    assert any(
        line.split()[:3] == ["LMC", "4000", "2"] and line.endswith("held out") for line in result.output.splitlines()
    )
    assert Calibration.load(out).deployment == chosen().deployment


def test_calibrate_refuses_two_deployments_and_bad_holdouts(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", chosen())
    b = write_run(tmp_path / "b", chosen(), gpu="NVIDIA H200")
    mixed = runner.invoke(sim_app, ["calibrate", str(a), str(b), "-o", str(tmp_path / "x.yaml")])
    assert mixed.exit_code == 2 and "h200-sxm" in mixed.output and "h100-sxm" in mixed.output
    bad = runner.invoke(sim_app, ["calibrate", str(a), "--holdout", "2k", "-o", str(tmp_path / "y.yaml")])
    assert bad.exit_code == 2 and "--holdout" in bad.output
