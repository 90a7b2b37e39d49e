"""The under-load held-out table's logic and the error band that simulated reports state."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from harness.calibrate.underload import (
    RATIO,
    Cell,
    RunTable,
    Value,
    agentic_values,
    bands,
    capacity_cells,
    kept_load_runs,
    markdown,
    sweep_values,
    tpot_cells,
)
from harness.results.agentic_result import AgenticResult
from harness.results.provenance import provenance
from harness.results.sweep_result import SweepResult
from harness.sim.calibration import SHIPPED_DIR
from harness.sim.heldout import (
    AGENTS,
    CAPACITY,
    NO_BAND,
    Band,
    HeldOut,
    band_words,
    read_bands,
    shipped_name,
    write_bands,
)

RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"


def by_quantity(cells: list[Cell]) -> dict[tuple[str, str], Cell]:
    return {(c.arm, c.quantity): c for c in cells}


def test_a_wrong_prediction_gives_a_large_error_and_a_wrong_ratio() -> None:
    measured = {"OFF": Value(3.0), "ON": Value(6.0)}
    predicted = {"OFF": Value(3.3), "ON": Value(9.0)}  # the ON arm over-predicted by half
    cells = by_quantity(capacity_cells(measured, predicted, "OFF", CAPACITY))
    assert cells[("OFF", CAPACITY)].error == pytest.approx(0.10)
    assert cells[("ON", CAPACITY)].error == pytest.approx(0.50)
    ratio = cells[("ON", f"{RATIO} {CAPACITY}")]
    assert ratio.measured == pytest.approx(2.0) and ratio.predicted == pytest.approx(9.0 / 3.3)
    assert ratio.error == pytest.approx((9.0 / 3.3) / 2.0 - 1)
    assert ("OFF", f"{RATIO} {CAPACITY}") not in cells  # the baseline has no ratio to itself
    exact = capacity_cells(measured, measured, "OFF", CAPACITY)
    assert all(c.error == pytest.approx(0.0) for c in exact)


def test_a_bound_or_a_missing_side_is_shown_but_not_banded() -> None:
    measured = {"OFF": Value(2.4), "ON": Value(12.0, False, ">= 12 (every point met it)")}
    predicted = {"OFF": Value(None, False, "no load point met the SLO"), "ON": Value(12.0, False, ">= 12")}
    cells = by_quantity(capacity_cells(measured, predicted, "OFF", AGENTS))
    assert cells[("OFF", AGENTS)].error is None and not cells[("OFF", AGENTS)].exact
    assert not cells[("ON", AGENTS)].exact and "measured >= 12" in cells[("ON", AGENTS)].note
    assert cells[("ON", f"{RATIO} {AGENTS}")].predicted is None
    table = RunTable("docs/results/x", "agentic", "cal.yaml", "never seen", list(cells.values()))
    assert bands([table]) == {}
    text = markdown([table, RunTable("docs/results/soak", "soak", "", "", skipped="one load")])
    assert "(bound)" in text and "no exact cells" in text and "`soak`: one load" in text


def test_bands_span_the_exact_per_arm_cells_of_each_calibration() -> None:
    def table(run: str, off: float, on: float, calibration: str = "a.yaml") -> RunTable:
        cells = capacity_cells(
            {"OFF": Value(1.0), "ON": Value(2.0)}, {"OFF": Value(off), "ON": Value(on)}, "OFF", CAPACITY
        )
        return RunTable(run, "sweep", calibration, "left out", cells)

    found = bands([table("r1", 1.11, 3.04), table("r2", 1.16, 2.98), table("r3", 0.5, 1.0, "b.yaml")])
    band = found["a.yaml"][CAPACITY]
    assert band.low == pytest.approx(0.11) and band.high == pytest.approx(0.52) and band.runs == 2
    assert found["b.yaml"][CAPACITY].low == pytest.approx(-0.5) and found["b.yaml"][CAPACITY].runs == 1
    assert AGENTS not in found["a.yaml"]


def test_agentic_values_follow_each_tier_status() -> None:
    result = AgenticResult.model_validate_json((RESULTS / "gpu-agentic-llama8b-h200" / "agentic.json").read_bytes())
    for tier in ("interactive", "standard", "batch"):
        values = agentic_values(result, tier)
        for arm in result.arms:
            capacity = result.capacity_of(arm, tier)
            assert capacity is not None
            assert values[arm].exact == (capacity.status == "met")
            assert values[arm].value == capacity.agents_at_slo


def test_band_words_name_the_calibration_or_say_there_is_none(tmp_path: Path) -> None:
    file = write_bands(
        {"cal.yaml": HeldOut(capacity=Band(low=0.11, high=0.52, runs=2), ttft_unloaded_median=0.013, ttft_cells=9)},
        tmp_path / "heldout.json",
    )
    words = "capacity held-out error +11..+52 % (2 runs), TTFT unloaded median 1.3 % (9 cells)"
    # a band not written for a shipped file names no digest: any recorded one is taken as its version
    assert band_words("auto: cal.yaml", "ab" * 32, path=file) == f"calibration cal.yaml: {words}"
    assert band_words("auto: cal.yaml", path=file) == (
        f"calibration cal.yaml (its version not recorded; the file as shipped now): {words}"
    )
    assert band_words(None, path=file) == f"uncalibrated: {NO_BAND}"
    assert band_words("/home/me/my-cal.yaml", path=file) == f"calibration my-cal.yaml: {NO_BAND}"
    assert band_words("auto: other.yaml", path=file) == f"calibration other.yaml: {NO_BAND}"
    assert shipped_name(str(SHIPPED_DIR / "llama8b-h100-eager.yaml")) == "llama8b-h100-eager.yaml"
    assert shipped_name("/elsewhere/llama8b-h100-eager.yaml") is None


def test_a_run_made_with_another_version_of_a_shipped_calibration_has_no_band(tmp_path: Path) -> None:
    shipped = SHIPPED_DIR / "llama8b-h200-eager.yaml"
    file = write_bands({shipped.name: HeldOut(capacity=Band(low=0.04, high=0.26, runs=1))}, tmp_path / "heldout.json")
    held = read_bands(file)[shipped.name]
    assert held.calibration_sha256 == hashlib.sha256(shipped.read_bytes()).hexdigest()
    name = f"auto: {shipped.name}"
    assert band_words(name, held.calibration_sha256, path=file) == (
        f"calibration {shipped.name}: capacity held-out error +4..+26 % (1 run)"
    )
    assert band_words(name, "0" * 64, path=file) == (
        f"calibration {shipped.name} (a version since changed): {NO_BAND} for it"
    )
    # the provenance line reads the digest the simulator recorded in the run's engine facts
    data: dict[str, Any] = json.loads((RESULTS / "sweep-qwen3-14b-sim" / "manifest.json").read_text())
    for facts in data["engines"].values():
        facts["details"].update(calibration=name, calibration_sha256="0" * 64)
    assert f"(a version since changed): {NO_BAND} for it" in provenance(data).label


def test_a_simulated_run_s_provenance_states_its_band() -> None:
    data: dict[str, Any] = json.loads((RESULTS / "sweep-qwen3-14b-sim" / "manifest.json").read_text())
    label = provenance(data).label
    assert f"uncalibrated: {NO_BAND}" in label and label.endswith("not a measurement")
    data["scenario"]["engine"]["calibration"] = "/home/me/my-cal.yaml"
    assert f"calibration my-cal.yaml: {NO_BAND}" in provenance(data).label


LAB_TABLE = RESULTS.parents[1] / "lab" / "validations" / "heldout-under-load"


def kept_tables() -> list[RunTable]:
    data = json.loads(LAB_TABLE.with_suffix(".json").read_text())
    return [
        RunTable(**{**t, "cells": [Cell(**c) for c in t["cells"]], "tpot": [Cell(**c) for c in t["tpot"]]})
        for t in data["runs"]
    ]


def test_the_shipped_bands_and_the_doc_s_table_are_the_kept_evidence_s() -> None:
    tables = kept_tables()
    shipped = read_bands()
    for name, by_kind in bands(tables).items():
        assert shipped[name].capacity == by_kind.get(CAPACITY) and shipped[name].agents == by_kind.get(AGENTS)
    doc = (RESULTS.parent / "simulator.md").read_text()
    assert markdown(tables) in doc and markdown(tables) == LAB_TABLE.with_suffix(".md").read_text().rstrip("\n")


def test_a_sweep_s_capacity_over_some_of_its_loads_is_its_best_passing_point_there() -> None:
    result = SweepResult.model_validate_json((RESULTS / "gpu-sweep-llama8b-h100" / "sweep.json").read_bytes())
    whole = sweep_values(result, result.loads)
    for arm in result.arms:
        capacity = result.capacity_of(arm)
        assert capacity is not None and whole[arm].value == capacity.max_rps_per_gpu_at_slo
    some = sweep_values(result, [8.0, 12.0])
    for arm in result.arms:
        passing = [p for p in result.points if p.arm == arm and p.load in (8.0, 12.0) and p.meets_slo]
        best = max(passing, key=lambda p: p.rps_per_gpu)
        assert some[arm].value == best.rps_per_gpu and some[arm].at_load == best.load


def test_the_kept_load_runs_are_the_real_engines_sweeps_agentic_runs_and_soaks() -> None:
    found = {path.name for path in kept_load_runs()}
    assert {"gpu-sweep-llama8b-h100", "gpu-agentic-llama8b-h200", "gpu-soak-llama8b-lmcache-h100"} <= found
    simulated_or_probe = {
        "sweep-qwen3-14b-sim",
        "gpu-decode-tax-llama8b-h200-prediction",
        "gpu-fleet-llama8b-2x-h200-7arms",
    }
    assert not found & simulated_or_probe


def test_a_sweep_s_tpot_cells_pair_its_points_that_both_sides_ran() -> None:
    result = SweepResult.model_validate_json((RESULTS / "gpu-sweep-llama8b-h100" / "sweep.json").read_bytes())
    fewer = result.model_copy(update={"points": [p for p in result.points if p.load != 8.0]})
    cells = tpot_cells(result, fewer, result.loads)
    timed = [p for p in result.points if p.tpot is not None and p.load != 8.0]
    assert len(cells) == len(timed) > 0
    for cell, point in zip(cells, timed, strict=True):
        assert point.tpot is not None and cell.measured == cell.predicted == point.tpot.p50_ms and cell.error == 0.0
        assert cell.arm == point.arm and cell.quantity == f"TPOT p50 ms at load {point.load:g}"
