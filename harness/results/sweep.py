"""A sweep's result: a pure function of its stored records and point events -> ``sweep.json``.

Per (arm, load point) the attempt that finished the point is kept (:mod:`.points`: a re-run after an
interruption supersedes the earlier one; its records are counted as discarded); the metric formulas
(:mod:`.sweep_metrics`) turn the window's records into RPS/GPU, TPS/user and latency quantiles, and
:mod:`.capacity` finds each arm's capacity within the SLO, the GPUs saved and the analytical model's
expectation beside the measurement.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from common.errors import KvbenchError
from harness.scenario.spec import Scenario
from harness.store.events import PointDone
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from workloads.config import MultiUserQA
from workloads.multi_user import plan_only

from .capacity import analytical_comparisons, arm_capacity, engine_shapes, savings
from .header import header_fields, with_provenance
from .points import errors_by_kind, stored_grid
from .sweep_metrics import point_result
from .sweep_result import SloLimits, SweepResult
from .validity import judge_errors, with_client_limited, with_engines_down


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
    slo = SloLimits.of(scenario.slo)
    arm_names = [arm.name for arm in scenario.arms]
    grid = stored_grid(arm_names, len(spec.values), records, points, gpus, slo)
    results = [point_result(point.data, mode=spec.mode) for point in grid.points]

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
    counts = grid.counts(results)
    errors = judge_errors(counts.measured, counts.ok, errors_by_kind(results), scenario.validity.max_error_rate)
    return SweepResult(
        **header_fields(run_id, scenario.name),
        engine_kind=engine.kind,
        model=engine.model,
        hardware=engine.hardware,
        gpus=gpus,
        mode=spec.mode,
        loads=list(spec.values),
        arms=arm_names,
        baseline_arm=baseline,
        slo=slo,
        complete=grid.complete,
        points=results,
        capacity=capacities,
        savings=savings(capacities, baseline, scenario.cost),
        analytical=report.comparisons,
        analytical_notes=report.notes,
        requests=counts,
        validity=with_client_limited(errors, results, scenario.validity),
    )


def sweep_result_of(run_dir: RunDir) -> SweepResult:
    """Aggregate a sweep run directory's stored files into its sweep.json content; writes nothing."""
    result = aggregate_sweep(run_dir.scenario(), run_dir.run_id, run_dir.records(), run_dir.points())
    if result.validity is not None:
        judged = with_engines_down(result.validity, run_dir.engines_down(), run_dir.attempts_started() - 1)
        result = result.model_copy(update={"validity": judged})
    result = with_provenance(result, run_dir)
    return result
