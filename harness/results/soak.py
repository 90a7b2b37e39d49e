"""A soak's result: the verdict over its stored intervals -> ``soak.json`` (rebuilt by ``kvbench report``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from harness.scenario.soak import describe_load, soak_arm, soak_scenario
from harness.scenario.spec import Scenario, SoakSpec, SweepSpec
from harness.store.events import EngineDown, FaultEvent, IntervalStats
from harness.store.manifest import read_manifest
from harness.store.records import read_records
from harness.store.rundir import RunDir

from .header import header_fields, with_provenance
from .soak_result import FaultOutcome, SoakResult, evaluate, fault_outcomes, planned_intervals, totals


def build_result(
    run_dir: RunDir,
    scenario: Scenario,
    arm: str,
    intervals: list[IntervalStats],
    *,
    attempts: int,
    events: list[FaultEvent] | None = None,
    faults: list[FaultOutcome] | None = None,
    deaths: Sequence[EngineDown] = (),
) -> SoakResult:
    """The verdict over ``intervals``. The restarts that ``events`` (kill_engine drills) caused are
    not held against the engine; ``faults`` (the final summary computes them from the records, the
    per-interval rewrite during the window leaves them out) are named in the result."""
    faults = faults or []
    drilled = sum(1 for event in events or [] if event.kind == "kill_engine" and event.error is None)
    spec = scenario.soak or SoakSpec()
    sweep = scenario.sweep
    planned = planned_intervals(spec.window, spec.interval)
    load = spec.load if spec.load is not None else (max(sweep.values) if sweep else math.nan)
    result = SoakResult(
        **header_fields(run_dir.run_id, scenario.name),
        arm=arm,
        engine_kind=scenario.engine.kind,
        load=_load_words(sweep, load, spec.load_source),
        window_s=spec.window,
        interval_s=spec.interval,
        planned_intervals=planned,
        completed_intervals=len(intervals),
        complete=len(intervals) >= planned,
        attempts=attempts,
        slo=scenario.slo,
        criteria_spec=spec.criteria,
        warmup_intervals=spec.warmup_intervals,
        totals=totals(intervals),
        verdict=evaluate(
            intervals,
            spec,
            scenario.slo,
            planned=planned,
            drilled_restarts=drilled,
            deaths=[f"{down.reason} (attempt {down.attempt + 1})" for down in deaths if down.arm == arm],
        ),
        faults=faults,
    )
    return with_provenance(result, run_dir)


def soak_result_of(run_dir: RunDir, arm: str | None = None) -> SoakResult:
    """Re-judge a soak directory from its stored intervals into its soak.json content; writes nothing."""
    scenario = soak_scenario(run_dir.scenario(), source=str(run_dir.scenario_file))
    intervals = run_dir.intervals()
    manifest = read_manifest(run_dir.manifest_file)
    attempts = max(len(manifest.get("attempts", [])), max((i.attempt + 1 for i in intervals), default=0))
    arm_name = arm or next(iter(manifest.get("engines", {})), None) or soak_arm(scenario, None).name
    events = run_dir.faults()
    records_file = run_dir.records_file
    faults = fault_outcomes(events, lambda: read_records(records_file), scenario.slo) if events else []
    result = build_result(
        run_dir,
        scenario,
        arm_name,
        intervals,
        attempts=attempts,
        events=events,
        faults=faults,
        deaths=run_dir.engines_down(),
    )
    return result


def summarize_soak(run_dir: RunDir, arm: str | None = None) -> SoakResult:
    """soak_result_of, written to soak.json (a run's end, --resume, ``kvbench report --rewrite``)."""
    result = soak_result_of(run_dir, arm)
    result.write_file(run_dir.soak_file)
    return result


def _load_words(sweep: SweepSpec | None, load: float, source: str | None) -> str:
    if sweep is None:
        return "unknown"
    return describe_load(sweep, load) + (f"; {source}" if source else "")
