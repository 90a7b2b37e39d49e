"""Capacity curves and sweep tables: Pareto frontier, SLO shading, PNG/SVG/CSV/Markdown from sweep.json alone."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.patches import Rectangle
from rich.console import Console

from harness.results.capacity import arm_capacity, savings
from harness.results.energy import EnergySample, energy_sample
from harness.results.header import UNKNOWN_PROVENANCE
from harness.results.sweep_result import (
    PointResult,
    Quantiles,
    SloLimits,
    SweepCounts,
    SweepResult,
)
from harness.scenario.spec import CostSpec
from reports.curves import (
    capacity_figure,
    capacity_lines,
    energy_lines,
    frontier_flags,
    pareto_frontier,
    points_rows,
    print_sweep,
    ttft_figure,
    write_sweep_reports,
)


def q(p50: float, p99: float) -> Quantiles:
    return Quantiles(n=100, p50_ms=p50, p90_ms=(p50 + p99) / 2, p99_ms=p99, mean_ms=p50, max_ms=p99)


def point(
    arm: str, index: int, load: float, rps_per_gpu: float, tps_user: float, meets: bool, ttft_p99: float
) -> PointResult:
    values: dict[str, Any] = {
        "arm": arm,
        "point": index,
        "load": load,
        "mode": "concurrency",
        "gpus": 2,
        "window_s": 30.0,
        "sent": 300,
        "measured": 290,
        "ok": 290,
        "errors": 0,
        "rps": rps_per_gpu * 2,
        "rps_per_gpu": rps_per_gpu,
        "output_tps": 1000.0,
        "output_tps_per_gpu": 500.0,
        "tps_user_mean": tps_user,
        "tps_user_p50": tps_user,
        "ttft": q(ttft_p99 / 3, ttft_p99),
        "ttft_round1": q(ttft_p99 / 2, ttft_p99),
        "ttft_later": q(50, ttft_p99 / 2),
        "tpot": q(1000 / tps_user, 1200 / tps_user),
        "itl": q(20, 40),
        "e2e": q(2000, 4000),
        "goodput_rps": rps_per_gpu,
        "goodput_rps_per_gpu": rps_per_gpu / 2,
        "slo_attainment": 0.95 if meets else 0.5,
        "meets_slo": meets,
        "prompt_tokens_mean": 9000.0,
        "prompt_tokens_round1_mean": 8000.0,
        "prompt_tokens_later_mean": 9200.0,
        "output_tokens_mean": 100.0,
        "cached_share": 0.8,
        "cached_share_later": 0.9,
        "gpu_hit_rate": 0.5,
        "external_hit_rate": 0.9,
        "hit_rate": 0.85,
        "lag_p99_ms": None,
    }
    return PointResult.model_validate(values)


def result(tpot_ms: float | None = 40.0) -> SweepResult:
    points = [
        # OFF: capacity collapses past 16 users
        point("AMG-OFF", 0, 8, 1.0, 60, True, 500),
        point("AMG-OFF", 1, 16, 2.0, 45, True, 900),
        point("AMG-OFF", 2, 32, 1.5, 15, False, 9000),  # dominated by point 1: less of both
        # ON: keeps scaling
        point("AMG-ON", 0, 8, 1.0, 61, True, 400),
        point("AMG-ON", 1, 16, 2.1, 50, True, 600),
        point("AMG-ON", 2, 32, 4.0, 30, True, 900),
    ]
    cost = CostSpec(target_rps=100, usd_per_gpu_hour=2.5)
    capacities = [arm_capacity(arm, points, cost, 2, 90.0) for arm in ("AMG-OFF", "AMG-ON")]
    return SweepResult(
        kvbench_version="test",
        run_id="run-1",
        scenario_name="curves",
        provenance=UNKNOWN_PROVENANCE,
        engine_kind="sim",
        model="qwen3-14b",
        hardware="h100-sxm",
        gpus=2,
        mode="concurrency",
        loads=[8, 16, 32],
        arms=["AMG-OFF", "AMG-ON"],
        baseline_arm="AMG-OFF",
        slo=SloLimits(ttft_ms=1000, tpot_ms=tpot_ms, e2e_ms=None, percentile=90),
        complete=True,
        points=points,
        capacity=capacities,
        savings=savings(capacities, "AMG-OFF", cost),
        analytical=[],
        analytical_notes=["a note"],
        requests=SweepCounts(sent=1800, measured=1740, ok=1740, errors=0, warmup=60, discarded=0),
    )


def test_pareto_frontier_keeps_the_undominated_points() -> None:
    pts = [(60, 1.0), (45, 2.0), (15, 1.5), (45, 1.0), (80, 0.5)]
    assert pareto_frontier(pts) == [1, 0, 4]  # by x: (45, 2.0), (60, 1.0), (80, 0.5)
    assert pareto_frontier([(1, 1), (1, 1)]) == [0, 1]  # equal points do not dominate each other
    assert pareto_frontier([]) == []
    flags = frontier_flags(result())
    assert flags == {
        ("AMG-OFF", 0): True,
        ("AMG-OFF", 1): True,
        ("AMG-OFF", 2): False,
        ("AMG-ON", 0): True,
        ("AMG-ON", 1): True,
        ("AMG-ON", 2): True,
    }


def _shaded(figure_axes: Any) -> list[Rectangle]:
    return [p for p in figure_axes.patches if isinstance(p, Rectangle) and p.get_alpha() == pytest.approx(0.08)]


def test_capacity_figure_shades_the_tpot_region_only_when_there_is_a_limit() -> None:
    ax = capacity_figure(result()).axes[0]
    (region,) = _shaded(ax)
    assert region.get_x() == pytest.approx(1000 / 40)  # TPS/user ≥ 25 is within TPOT ≤ 40 ms
    legend = ax.get_legend()
    assert legend is not None
    labels = [t.get_text() for t in legend.get_texts()]
    assert "AMG-ON Pareto frontier" in labels and "AMG-OFF" in labels
    assert not _shaded(capacity_figure(result(tpot_ms=None)).axes[0])
    ttft_ax = ttft_figure(result()).axes[0]
    assert ttft_ax.get_yscale() == "log" and len(_shaded(ttft_ax)) == 1


def test_reports_are_written_from_the_stored_result_alone(tmp_path: Path) -> None:
    path = tmp_path / "sweep.json"
    result().write_file(path)
    paths = write_sweep_reports(SweepResult.read_file(path), tmp_path / "report")
    names = sorted(p.name for p in paths)
    assert names == ["capacity.md", "capacity.svg", "sweep.csv", "ttft_p99.svg"]  # one format per figure
    assert "<svg" in (tmp_path / "report" / "capacity.svg").read_text()
    with (tmp_path / "report" / "sweep.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 6
    off32 = next(r for r in rows if r["arm"] == "AMG-OFF" and r["load"] == "32.0")
    assert off32["pareto"] == "False" and off32["meets_slo"] == "False" and off32["ttft_p99_ms"] == "9000.0"
    markdown = (tmp_path / "report" / "capacity.md").read_text()
    # OFF: 2.0 RPS/GPU at SLO -> 100 req/s needs 25 deployments of 2 GPUs = 50; ON: 4.0 -> 13 × 2 = 26
    assert "GPUs saved by AMG-ON vs AMG-OFF at 100 req/s: 50 − 26 = 24 GPUs, $525,600/year" in markdown
    # redrawing gives byte-identical vector output
    first = (tmp_path / "report" / "capacity.svg").read_bytes()
    write_sweep_reports(SweepResult.read_file(path), tmp_path / "report")
    assert (tmp_path / "report" / "capacity.svg").read_bytes() == first


def test_console_summary_names_capacity_and_savings() -> None:
    console = Console(record=True, width=200)
    print_sweep(result(), console)
    text = console.export_text()
    assert "AMG-ON: max 4 RPS/GPU within the SLO (at load 32" in text
    assert "24 GPUs" in text and "note: a note" in text


def test_a_hardware_text_that_counts_its_gpus_is_not_counted_again() -> None:
    from reports.curves import GPU_COUNT_PREFIX

    assert GPU_COUNT_PREFIX.match("1x NVIDIA H100 (see manifest)") and GPU_COUNT_PREFIX.match("4× H200 ")
    assert not GPU_COUNT_PREFIX.match("h100-sxm") and not GPU_COUNT_PREFIX.match("H100 x2")


def test_energy_columns_are_labelled_and_a_point_without_energy_says_why() -> None:
    base = result()
    measured = energy_sample(
        EnergySample(source="nvml", method="energy_counter", gpus=2, seconds=30.0, joules=24000.0),
        prompt_tokens=90000,
        generated_tokens=6000,
        agents=8,
    )
    missing = EnergySample(source="nvml", gpus=2, seconds=30.0, not_sampled="NVML library not importable")
    points = [p.model_copy(update={"energy": measured if i == 0 else missing}) for i, p in enumerate(base.points)]
    header, body = points_rows(base.model_copy(update={"points": points}))
    assert header[-4:] == ["GPU W (NVML)", "J/gen tok (NVML)", "J/tok (NVML)", "users/kW (NVML)"]
    assert body[0][-4:] == ["800", "4", "0.25", "10"]  # 24 kJ / 30 s; / 6000; / 96000; 8 users / 0.8 kW
    assert body[1][-4:] == ["—"] * 4
    lines = energy_lines(base.model_copy(update={"points": points}))
    assert lines[0].startswith("Energy (NVML): measured through NVML")
    assert "AMG-OFF @ 16: energy not sampled (nvml): NVML library not importable" in lines
    # a sweep that metered nothing has no energy columns at all
    assert points_rows(base)[0][-1] == "errors" and energy_lines(base) == []


def test_each_slo_band_says_its_percentile_and_the_ttft_lines_are_drawn_at_it() -> None:
    sweep = result()
    tag = f"p{sweep.slo.percentile:g}"
    capacity_labels = [t.get_text() for t in capacity_figure(sweep).axes[0].get_legend().get_texts()]  # type: ignore[union-attr]
    assert any(label.startswith(f"TPOT {tag} ≤ {sweep.slo.tpot_ms:g} ms") for label in capacity_labels)
    ttft_ax = ttft_figure(sweep).axes[0]
    labels = [t.get_text() for t in ttft_ax.get_legend().get_texts()]  # type: ignore[union-attr]
    assert f"TTFT {tag} ≤ {sweep.slo.ttft_ms:g} ms" in labels and f"AMG-OFF TTFT {tag}" in labels
    assert ttft_ax.get_ylabel().startswith(f"TTFT {tag}")
    # the line reads the stored quantile at the SLO's percentile, not p99
    field = {"p50": "p50_ms", "p90": "p90_ms", "p99": "p99_ms"}[tag]
    drawn = next(line for line in ttft_ax.get_lines() if line.get_label() == f"AMG-OFF TTFT {tag}")
    points = [p for p in sweep.arm_points("AMG-OFF") if p.ttft is not None]
    assert np.asarray(drawn.get_ydata()).tolist() == [getattr(p.ttft, field) for p in points]
    # the legend sits outside the data: to the right of the axes
    legend = ttft_ax.get_legend()
    assert legend is not None and legend.get_bbox_to_anchor().x0 >= ttft_ax.get_window_extent().x1 - 1


def test_an_unjudged_point_says_too_few_and_the_summary_names_its_load() -> None:
    base = result()
    unjudged = base.points[2].model_copy(update={"measured": 6, "meets_slo": None})
    changed = base.model_copy(update={"points": [*base.points[:2], unjudged, *base.points[3:]]})
    header, rows = points_rows(changed)
    meets = header.index(next(name for name in header if name.startswith("meets")))
    assert [row[meets] for row in rows][:3] == ["yes", "yes", "too few"]
    lines = capacity_lines(changed)
    assert any(line.startswith("AMG-OFF: the SLO is not judged at load 32: fewer than 10") for line in lines)
    assert not any(line.startswith("AMG-ON: the SLO is not judged") for line in lines)
