"""The case study's "Predicted vs measured" for real-engine runs: shape from config.json, calibration beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.calibrate.predict import write_predictions
from harness.results.aggregate import summarize_run_dir
from harness.store.rundir import RunDir
from offload.analytical import kv_bytes_per_token
from reports.html import load_probe, predictions
from tests.unit.results.test_calibrate import chosen, write_run


@pytest.fixture
def vllm_run(tmp_path: Path) -> Path:
    """A vLLM run of ``synth:llama-3.1-8b`` (records from the simulator's core under a known calibration)."""
    run = write_run(tmp_path, chosen())
    summarize_run_dir(RunDir.open(run)).write_file(run)
    return run


def test_a_vllm_run_gets_the_analytical_prediction_from_config_json(vllm_run: Path) -> None:
    view = predictions(load_probe(vllm_run), 2)
    assert view.table is not None, view.note
    assert "32 layers, 8 KV heads × 128" in view.table.caption
    kv = kv_bytes_per_token(32, 8, 128, 2)  # Llama-3.1-8B's config.json, bf16
    assert f"{kv / 1024:.0f} KiB of KV per token" in view.table.caption
    assert "calibrated sim TTFT" not in view.table.columns
    assert [row[0] for row in view.table.rows] == ["1,000", "4,000", "16,000", "64,000"]


def test_a_calibration_in_the_run_adds_the_simulated_prediction(vllm_run: Path) -> None:
    write_predictions(vllm_run, chosen().save(vllm_run / "calibration.yaml"))
    view = predictions(load_probe(vllm_run), 2)
    assert view.table is not None
    # the fixture's manifest names no engine it ran: nothing calls its figures measured
    assert view.table.columns[-2:] == ["calibrated sim TTFT", "sim vs observed"]
    # the run was generated under this very calibration: the simulated TTFT is the measured one
    for row in view.table.rows:
        assert abs(int(row[-1].rstrip("%"))) <= 1, row


def test_a_calibration_for_another_deployment_is_named_not_used(vllm_run: Path) -> None:
    write_predictions(vllm_run, chosen("h200-sxm").save(vllm_run / "calibration.yaml"))
    view = predictions(load_probe(vllm_run), 2)
    assert view.table is not None
    assert "calibrated sim TTFT" not in view.table.columns
    assert "h200-sxm" in view.table.caption and "h100-sxm" in view.table.caption


def test_a_poc_on_the_simulator_is_never_called_measured() -> None:
    quickstart = Path(__file__).resolve().parents[3] / "docs" / "results" / "quickstart-sim"
    view = predictions(load_probe(quickstart), 2)
    assert view.observed == "simulated run"
    assert view.table is not None and not any("measured" in column for column in view.table.columns)
