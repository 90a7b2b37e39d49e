"""A sweep's result: a pure function of its stored records and point events -> ``sweep.json``.

Per (arm, load point) the attempt that finished the point is kept (a re-run after an interruption
supersedes the earlier one; its records are counted as discarded); the metric formulas
(:mod:`.sweep_metrics`) turn the window's records into RPS/GPU, TPS/user and latency quantiles, and
:mod:`.capacity` finds each arm's capacity within the SLO, the GPUs saved and the analytical model's
expectation beside the measurement.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from common.errors import KvbenchError
from harness.scenario.spec import Scenario
from harness.store.events import PointDone
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from workloads.config import MultiUserQA
from workloads.multi_user import plan_only

from .capacity import analytical_comparisons, arm_capacity, engine_shapes, savings
from .header import header_fields
from .sweep_metrics import point_data, point_result
from .sweep_result import PointResult, SloLimits, SweepCounts, SweepResult
from .validity import judge_errors, with_engines_down


def _chosen(points: Iterable[PointDone]) -> dict[tuple[str, int], PointDone]:
    chosen: dict[tuple[str, int], PointDone] = {}
    for event in points:
        current = chosen.get(event.key)
        if current is None or event.attempt >= current.attempt:
            chosen[event.key] = event
    return chosen


def _mean_question_tokens(config: MultiUserQA, seed: int, sessions: int = 400) -> float:
    workload = plan_only(config, seed=seed)
    lengths = [q for s in range(sessions) for q in workload.plan(s).question_tokens]
    return float(np.mean(lengths)) if lengths else 0.0


def aggregate_sweep(
    scenario: Scenario, run_id: str, records: Iterable[RequestRecord], points: Iterable[PointDone]
) -> SweepResult:
    """A pure function of the stored records and point events (so a run can be re-aggregated offline)."""
    spec = scenario.sweep
    if spec is None:
        raise KvbenchError(f"scenario {scenario.name!r} has no sweep section")
    config = scenario.load_workload
    engine = scenario.engine
    gpus = engine.fleet_gpus  # every replica's GPUs (engine.replicas × gpus_per_replica): RPS per GPU is per fleet GPU
    per_deployment = engine.replica_gpus
    slo = SloLimits(
        ttft_ms=scenario.slo.ttft_ms,
        tpot_ms=scenario.slo.tpot_ms,
        e2e_ms=scenario.slo.e2e_ms,
        percentile=scenario.slo.percentile,
    )
    chosen = _chosen(points)
    records = list(records)
    rows = [record.model_dump(exclude={"itl_ns"}) for record in records]
    df = pd.DataFrame(rows)
    itl_by_id = {r.request_id: r.itl_ns for r in records if r.phase == "measure" and r.ok and r.point is not None}

    results: list[PointResult] = []
    discarded = 0
    if not df.empty:
        loaded = df[df["point"].notna()]
        keys = zip(loaded["arm"], loaded["point"].astype("int64"), loaded["attempt"], strict=True)
        keep = [chosen.get((str(a), int(p))) is not None and chosen[(str(a), int(p))].attempt == t for a, p, t in keys]
        discarded = int(len(loaded) - sum(keep))
    for arm in scenario.arms:
        for index in range(len(spec.values)):
            event = chosen.get((arm.name, index))
            if event is None:
                continue
            if df.empty:
                subset = df
            else:
                subset = df[(df["arm"] == arm.name) & (df["point"] == index) & (df["attempt"] == event.attempt)]
            ids: list[str] = []
            if not subset.empty:
                good = subset[(subset["phase"] == "measure") & subset["ok"].astype(bool)]
                ids = [str(rid) for rid in good["request_id"]]
            gaps = [gap for rid in ids for gap in itl_by_id.get(rid, [])]
            data = point_data(subset, np.asarray(gaps, dtype="float64"), event, gpus, slo)
            results.append(point_result(data, mode=spec.mode))

    percentile = scenario.slo.percentile
    capacities = [arm_capacity(arm.name, results, scenario.cost, per_deployment, percentile) for arm in scenario.arms]
    baseline = scenario.baseline_arm
    report = analytical_comparisons(
        results,
        list(scenario.arms),
        baseline,
        engine_shapes(engine),
        capacities,
        question_tokens_mean=_mean_question_tokens(config, scenario.seed),
    )
    planned = {(arm.name, i) for arm in scenario.arms for i in range(len(spec.values))}
    measured = sum(p.measured for p in results)
    ok = sum(p.ok for p in results)
    return SweepResult(
        **header_fields(run_id, scenario.name),
        engine_kind=engine.kind,
        model=engine.model,
        hardware=engine.hardware,
        gpus=gpus,
        mode=spec.mode,
        loads=list(spec.values),
        arms=[arm.name for arm in scenario.arms],
        baseline_arm=baseline,
        slo=slo,
        complete=planned <= set(chosen),
        points=results,
        capacity=capacities,
        savings=savings(capacities, baseline, scenario.cost),
        analytical=report.comparisons,
        analytical_notes=report.notes,
        requests=SweepCounts(
            sent=len(df),
            measured=measured,
            ok=ok,
            errors=measured - ok,
            warmup=int((df["phase"] == "warmup").sum()) if not df.empty else 0,
            discarded=discarded,
        ),
        validity=judge_errors(measured, ok, _errors_by_kind(results), scenario.validity.max_error_rate),
    )


def _errors_by_kind(points: list[PointResult]) -> dict[str, int]:
    total: dict[str, int] = {}
    for point in points:
        for kind, count in point.errors_by_kind.items():
            total[kind] = total.get(kind, 0) + count
    return total


def summarize_sweep(run_dir: RunDir) -> SweepResult:
    """Aggregate a sweep run directory's stored files into sweep.json."""
    result = aggregate_sweep(run_dir.scenario(), run_dir.run_id, run_dir.records(), run_dir.points())
    if result.validity is not None:
        judged = with_engines_down(result.validity, run_dir.engines_down(), run_dir.attempts_started() - 1)
        result = result.model_copy(update={"validity": judged})
    result.write_file(run_dir.sweep_file)
    return result
