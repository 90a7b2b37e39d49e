"""Sweep aggregation from records to the versioned result, capacity at the SLO, GPUs saved, $/year,
the analytical model beside the measurement, and the scenario rules of load workloads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from common.errors import RunDirError, ScenarioError
from harness.results.capacity import (
    Reuse,
    arm_capacity,
    engine_shapes,
    gpus_needed,
    grid_crossing,
    measured_reuse,
    predicted_ttft,
    savings,
)
from harness.results.sweep import aggregate_sweep
from harness.results.sweep_metrics import LATENCY_METRICS, SCALAR_METRICS, requests_to_judge
from harness.results.sweep_result import PointResult, SweepResult
from harness.scenario.spec import CostSpec, Scenario, parse_scenario
from harness.store.events import PointDone
from harness.store.records import RequestRecord
from kvbench.cli import app
from offload import analytical
from offload.profiles import BUILTIN_PROFILES
from tests.resultfiles import request_record

MS = 1_000_000
S = 1_000_000_000

SCENARIO: dict[str, Any] = {
    "name": "agg-sweep",
    "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
    "arms": [{"name": "AMG-OFF", "offload": "hbm"}, {"name": "AMG-ON", "offload": "cpu"}],
    "compare": {"baseline": "AMG-OFF"},
    "workload": {
        "kind": "multi_user_qa",
        "users": 10,
        "rounds": 3,
        "context_tokens": 1000,
        "question_tokens": 50,
        "answer_tokens": 11,
    },
    "sweep": {"mode": "concurrency", "values": [4]},
    "slo": {"ttft_ms": 250, "tpot_ms": 30, "percentile": 50},
    "cost": {"target_rps": 100, "usd_per_gpu_hour": 2.0},
}


def scenario(**overrides: Any) -> Scenario:
    return parse_scenario({**SCENARIO, **overrides}, "test.yaml")


def rec(
    arm: str,
    ttft_ms: float,
    *,
    turn: int = 2,
    phase: str = "measure",
    ok: bool = True,
    start_s: float = 11.0,
    attempt: int = 0,
    point: int = 0,
    cached: int | None = 800,
) -> RequestRecord:
    ttft = int(ttft_ms * MS)
    return request_record(
        arm,
        1000,
        1,
        turn,
        attempt=attempt,
        phase=phase,
        request_id=f"{arm}-{ttft_ms}-{turn}-{phase}-{ok}-{attempt}-{start_s}",
        started_ns=int(start_s * S),
        ttft_ns=ttft if ok else None,
        e2e_ns=ttft + 200 * MS if ok else 5 * MS,
        itl_ns=[20 * MS] * 10 if ok else [],
        output_chunks=11 if ok else 0,
        prompt_tokens=1000 if ok else None,
        completion_tokens=11 if ok else None,
        cached_tokens=cached if ok else None,
        ok=ok,
        error_kind=None if ok else "http_status",
        point=point,
        load=4,
        user=1,
    )


def done(arm: str, *, attempt: int = 0, metrics: dict[str, float] | None = None) -> PointDone:
    return PointDone(
        arm=arm,
        point=0,
        load=4,
        attempt=attempt,
        start_ns=5 * S,
        window_start_ns=10 * S,
        window_end_ns=20 * S,
        end_ns=21 * S,
        sent=6,
        measured=5,
        errors=1,
        sessions=3,
        max_in_flight=4,
        late_arrivals=0,
        cancelled=0,
        metrics=metrics,
    )


def arm_records(arm: str, ttfts: tuple[float, ...] = (100, 200, 300, 400), attempt: int = 0) -> list[RequestRecord]:
    out = [rec(arm, t, turn=1 if t == ttfts[0] else 2, attempt=attempt) for t in ttfts]
    out.append(rec(arm, 0, ok=False, attempt=attempt))
    out.append(rec(arm, 50, phase="warmup", start_s=9.9, attempt=attempt))  # ends at 10.15 s: inside
    out.append(rec(arm, 50, phase="warmup", start_s=1.0, attempt=attempt))  # completes before it
    return out


METRICS = {
    "gpu_prefix_queries": 1000.0,
    "gpu_prefix_hits": 600.0,
    "external_prefix_hits": 200.0,
    "external_prefix_queries": 400.0,
}


def test_point_metrics_by_hand() -> None:
    result = aggregate_sweep(
        scenario(), "run", arm_records("AMG-OFF") + arm_records("AMG-ON"), [done("AMG-OFF", metrics=METRICS)]
    )
    assert not result.complete and [p.arm for p in result.points] == ["AMG-OFF"]
    p = result.points[0]
    assert (p.measured, p.ok, p.errors, p.errors_by_kind) == (5, 4, 1, {"http_status": 1})
    assert p.window_s == 10.0
    assert p.rps == pytest.approx(0.5)  # 4 measured + 1 warm-up completed inside the 10 s window
    assert p.rps_per_gpu == pytest.approx(0.5)
    assert p.output_tps == pytest.approx(5 * 11 / 10)
    assert p.tps_user_mean == pytest.approx(10 / 0.2)  # 10 decode steps in 200 ms
    assert p.ttft is not None and p.ttft.p50_ms == pytest.approx(250) and p.ttft.n == 4
    assert p.ttft_round1 is not None and p.ttft_round1.p50_ms == pytest.approx(100)
    assert p.ttft_later is not None and p.ttft_later.p50_ms == pytest.approx(300)
    assert p.tpot is not None and p.tpot.p50_ms == pytest.approx(20)
    assert p.itl is not None and p.itl.n == 40 and p.itl.p99_ms == pytest.approx(20)
    assert p.e2e is not None and p.e2e.p50_ms == pytest.approx(450)
    # SLO (TTFT ≤ 250, TPOT ≤ 30) met by 2 of the 5 measured requests (the failed one never is)
    assert p.slo_attainment == pytest.approx(0.4)
    assert p.goodput_rps == pytest.approx(0.2)
    assert p.meets_slo is False  # p50 needs ≥ 50 % within each limit; TTFT has 40 %
    assert p.gpu_hit_rate == pytest.approx(0.6) and p.external_hit_rate == pytest.approx(0.5)
    assert p.hit_rate == pytest.approx(0.8)
    assert p.cached_share == pytest.approx(0.8) and p.cached_share_later == pytest.approx(0.8)
    assert p.output_tokens_mean == pytest.approx(11)


def test_meets_slo_at_a_lower_percentile_and_none_without_limits() -> None:
    loose = scenario(slo={"ttft_ms": 250, "tpot_ms": 30, "percentile": 40})
    p = aggregate_sweep(loose, "run", arm_records("AMG-OFF"), [done("AMG-OFF")]).points[0]
    assert p.meets_slo is True
    p = aggregate_sweep(scenario(slo={}), "run", arm_records("AMG-OFF"), [done("AMG-OFF")]).points[0]
    assert p.meets_slo is None and p.goodput_rps is None and p.slo_attainment is None


def test_a_point_with_fewer_requests_than_its_percentile_needs_is_unjudged() -> None:
    assert [requests_to_judge(q) for q in (50, 90, 95, 99, 99.9, 100)] == [2, 10, 20, 100, 1000, 1]
    # 5 measured requests, 2 within the limits: a fail at p50, unjudged at p90 (its p90 is the slowest request)
    strict = scenario(slo={"ttft_ms": 250, "tpot_ms": 30, "percentile": 90})
    p = aggregate_sweep(strict, "run", arm_records("AMG-OFF"), [done("AMG-OFF")]).points[0]
    assert p.slo_attainment == pytest.approx(0.4) and p.meets_slo is None
    assert arm_capacity("AMG-OFF", [p], None, 1, 90.0).max_rps_per_gpu_at_slo is None
    # a pass below an unjudged point: the crossing is not placed across it
    passing = p.model_copy(update={"meets_slo": True, "slo_attainment": 1.0, "load": 2, "point": 0})
    above = p.model_copy(update={"load": 4, "point": 1})
    failing = p.model_copy(update={"meets_slo": False, "load": 8, "point": 2})
    assert grid_crossing([passing, above, failing], passing, 0.9) is None


def test_the_completing_attempt_wins_and_older_records_are_discarded() -> None:
    records = arm_records("AMG-OFF", (900, 900, 900, 900), attempt=0) + arm_records("AMG-OFF", attempt=1)
    result = aggregate_sweep(scenario(), "run", records, [done("AMG-OFF", attempt=1)])
    p = result.points[0]
    assert p.ttft is not None and p.ttft.p50_ms == pytest.approx(250)
    assert result.requests.discarded == 7


def test_every_declared_metric_has_a_formula_and_a_field() -> None:
    fields = set(PointResult.model_fields)
    for spec in (*SCALAR_METRICS.values(), *LATENCY_METRICS.values()):
        assert spec.tag in fields and spec.unit and len(spec.formula) > 20


def test_gpus_needed_rounds_up_to_whole_deployments() -> None:
    assert gpus_needed(100, 0.5, 1) == (200, 200)
    assert gpus_needed(10, 1.5, 2) == (4, 8)  # 3 RPS per 2-GPU deployment: 3.33 -> 4 deployments
    assert gpus_needed(9, 1.5, 2) == (3, 6)
    with pytest.raises(ValueError):
        gpus_needed(1, 0, 1)


def test_capacity_and_savings_take_the_best_point_within_the_slo() -> None:
    cost = CostSpec(target_rps=100, usd_per_gpu_hour=2.0)
    points = aggregate_sweep(
        scenario(slo={"ttft_ms": 250, "tpot_ms": 30, "percentile": 40}, sweep={"mode": "concurrency", "values": [4]}),
        "run",
        arm_records("AMG-OFF") + arm_records("AMG-ON"),
        [done("AMG-OFF"), done("AMG-ON")],
    ).points
    fast = points[1].model_copy(update={"rps_per_gpu": 2.0, "point": 1, "load": 8})
    failing = points[1].model_copy(update={"rps_per_gpu": 9.0, "point": 2, "load": 16, "meets_slo": False})
    off = arm_capacity("AMG-OFF", points, cost, 1, 90.0)
    on = arm_capacity("AMG-ON", [*points, fast, failing], cost, 1, 90.0)
    assert off.max_rps_per_gpu_at_slo == pytest.approx(0.5) and off.gpus_needed == 200
    assert on.max_rps_per_gpu_at_slo == 2.0 and on.at_load == 8 and on.max_rps_per_gpu == 9.0
    assert on.gpus_needed == 50 and on.usd_per_year == pytest.approx(50 * 2.0 * 8760)
    (saved,) = savings([off, on], "AMG-OFF", cost)
    assert (saved.gpus_baseline, saved.gpus_arm, saved.gpus_saved) == (200, 50, 150)
    assert saved.usd_per_year_saved == pytest.approx(150 * 2.0 * 8760) and saved.capacity_ratio == pytest.approx(4)
    assert savings([off, on], "AMG-OFF", None) == []


def test_predicted_ttft_applies_the_deck_model_beyond_gpu_memory() -> None:
    n, t, r, w = 10_000, 50e-6, 5e-6, 8e-6
    reuse = Reuse(a=0.9, a_gpu=0.5, a_tier=0.4, source="test")
    # N' = 5000, a' = 0.8: max(0.4·N·R, 0.1·N·W, 0.1·N·T) = max(0.02, 0.008, 0.05)
    assert predicted_ttft(n, reuse, t, r, w) == pytest.approx(0.05)
    assert predicted_ttft(n, reuse, t, r, w) == pytest.approx(analytical.ttft_kv(5000, 0.8, t, r, w))
    tier_bound = Reuse(a=0.99, a_gpu=0.0, a_tier=0.99, source="test")
    assert predicted_ttft(n, tier_bound, t, r, w) == pytest.approx(0.99 * n * r)  # IO-bound
    assert predicted_ttft(n, Reuse(0.3, 0.3, 0.0, "test"), t, None, None) == pytest.approx(0.7 * n * t)
    assert predicted_ttft(n, Reuse(1.0, 1.0, 0.0, "test"), t, r, w) == 0.0


def test_measured_reuse_splits_hits_between_gpu_and_tier_from_metrics() -> None:
    point = aggregate_sweep(scenario(), "run", arm_records("AMG-ON"), [done("AMG-ON", metrics=METRICS)]).points[0]
    reuse = measured_reuse(BUILTIN_PROFILES["cpu"], point, 50)
    # a = 0.8 (cached_tokens); hits are 600 GPU + 200 tier -> a quarter of a from the tier
    assert reuse.a == pytest.approx(0.8) and reuse.a_tier == pytest.approx(0.2) and reuse.a_gpu == pytest.approx(0.6)
    no_tier = measured_reuse(BUILTIN_PROFILES["hbm"], point, 50)
    assert no_tier.a_tier == 0 and no_tier.a_gpu == pytest.approx(0.8)
    bare = point.model_copy(update={"cached_share_later": None, "hit_rate": None, "prompt_tokens_later_mean": 1000.0})
    structural = measured_reuse(BUILTIN_PROFILES["cpu"], bare, 50)
    assert structural.a == pytest.approx(0.95) and structural.a_tier == pytest.approx(0.95)
    assert "structure" in structural.source


def test_analytical_comparison_is_stored_beside_each_common_load() -> None:
    records = arm_records("AMG-OFF") + arm_records("AMG-ON", (100, 20, 25, 30))
    events = [done("AMG-OFF", metrics=METRICS), done("AMG-ON", metrics=METRICS)]
    result = aggregate_sweep(scenario(), "run", records, events)
    (c,) = result.analytical
    assert (c.arm, c.baseline, c.load) == ("AMG-ON", "AMG-OFF", 4)
    assert c.measured_speedup == pytest.approx(300 / 25)
    shapes = engine_shapes(scenario().engine)
    assert shapes.model is not None and shapes.hardware is not None and shapes.hardware.hbm_gbps == pytest.approx(3350)
    kv = analytical.model_kv_bytes_per_token(shapes.model, 1)
    assert kv == 2 * 32 * 8 * 128 * 2 and c.inputs.r_s == pytest.approx(kv / 25e9)
    assert c.prediction.a_star == pytest.approx(c.prediction.e / (1 + c.prediction.e))
    assert c.regime == c.prediction.regime and c.e2e_gain_bound is not None and c.e2e_gain_bound > 1


def test_result_round_trips_and_unknown_versions_are_refused(tmp_path: Path) -> None:
    result = aggregate_sweep(scenario(), "run", arm_records("AMG-OFF"), [done("AMG-OFF")])
    path = tmp_path / "sweep.json"
    result.write_file(path)
    assert SweepResult.read_file(path) == result
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(RunDirError, match="schema_version 99"):
        SweepResult.read_file(path)


def test_load_scenario_rules_name_the_file_and_field() -> None:
    with pytest.raises(ScenarioError, match="needs a 'sweep' section"):
        parse_scenario({k: v for k, v in SCENARIO.items() if k != "sweep"}, "x.yaml")
    probe = {**SCENARIO, "workload": {"kind": "multi_round_qa", "context_tokens": [100]}}
    with pytest.raises(ScenarioError, match="'sweep' applies to workload kind 'multi_user_qa'"):
        parse_scenario(probe, "x.yaml")
    with pytest.raises(ScenarioError) as info:
        parse_scenario({**SCENARIO, "sweep": {"mode": "concurrency", "values": [1.5]}}, "x.yaml")
    assert "x.yaml" in str(info.value) and "whole numbers" in str(info.value)
    with pytest.raises(ScenarioError) as info:
        parse_scenario({**SCENARIO, "sweep": {"mode": "rps", "values": [1]}}, "x.yaml")
    assert "sweep.mode" in str(info.value) and "'concurrency'" in str(info.value) and "'qps'" in str(info.value)
    with pytest.raises(ScenarioError, match="run it with `kvbench sweep`"):
        _ = scenario().probe_workload
    probe_scenario = parse_scenario({**probe, "sweep": None}, "p.yaml")
    with pytest.raises(ScenarioError, match="run it with `kvbench run`"):
        _ = probe_scenario.load_workload


def test_sweep_command_needs_exactly_one_source(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["sweep"]).exit_code == 2
    out = runner.invoke(app, ["sweep", "x.yaml", "--report", str(tmp_path)])
    assert out.exit_code == 2 and "exactly one" in out.output
    probe = tmp_path / "probe.yaml"
    probe.write_text(
        json.dumps({**SCENARIO, "workload": {"kind": "multi_round_qa", "context_tokens": [100]}, "sweep": None})
    )
    out = runner.invoke(app, ["sweep", str(probe)])
    assert out.exit_code == 2 and "run it with `kvbench run`" in out.output


def test_resume_plans_only_unfinished_points_in_a_new_attempt(tmp_path: Path) -> None:
    from harness.runs.sweep import SweepRunner
    from harness.store.jsonl import append_jsonl
    from harness.store.records import RecordWriter
    from harness.store.rundir import RunDir

    two_points = scenario(sweep={"mode": "concurrency", "values": [2, 4]})
    run_dir = RunDir.create(tmp_path, two_points)
    with RecordWriter(run_dir.records_file) as writer:
        for record in arm_records("AMG-OFF"):
            writer.append(record)
    append_jsonl(run_dir.points_file, done("AMG-OFF"))
    with run_dir.points_file.open("a") as handle:
        handle.write('{"arm": "AMG-OFF", "point": 1')  # torn line of a killed writer
    runner = SweepRunner(run_dir.scenario(), run_dir)
    assert runner.attempt == 1
    assert runner.pending() == {"AMG-OFF": [1], "AMG-ON": [0, 1]}
    assert [p.key for p in run_dir.points()] == [("AMG-OFF", 0)]
