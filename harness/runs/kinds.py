"""The run kinds, one row each: how the scenario is checked, which runner runs it, how its result is built.

The CLI's ``run``, ``sweep``, ``soak`` and ``replay`` commands and ``kvbench report`` all go through this table,
so "start or resume, then summarize" is written once (:func:`launch`, :func:`summarize`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common.errors import KvbenchError, RunDirError
from common.packed import stored_file
from common.schema import VersionedFile
from harness.results.agentic import agentic_result_of
from harness.results.aggregate import probe_result_of
from harness.results.fleet import fleet_result_of
from harness.results.pd_breakdown import pd_breakdown_of
from harness.results.replay import replay_result_of
from harness.results.run_results import RunResults
from harness.results.soak import soak_result_of
from harness.results.sweep import sweep_result_of
from harness.results.sweep_result import SweepResult
from harness.scenario.soak import SoakError, soak_arm, soak_scenario
from harness.scenario.spec import Scenario
from harness.store.lock import run_dir_lock
from harness.store.manifest import read_manifest
from harness.store.rundir import RunDir, RunKind

from .agentic import AgenticRunner
from .probe import ProbeRunner
from .progress import RunProgress
from .shard import WHOLE, Shard, parse_start_at
from .soak import SoakRunner
from .spine import Runner, run_sync
from .sweep import SweepRunner
from .trace import TraceRunner, load_replayed_trace

DEFAULT_LOAD_FRACTION = 0.7
"""``kvbench soak --load-from``: the share of the measured capacity a stability window runs at by default."""


@dataclass(frozen=True)
class LaunchOverrides:
    """Command-line choices beside the scenario: ``kvbench soak``'s window flags (a new window only) and
    its ``--arm``; ``kvbench run``/``sweep``'s ``--arm`` (repeatable: only these arms run now, the
    others stay pending for ``--resume``)."""

    window_s: float | None = None
    interval_s: float | None = None
    load: float | None = None
    arm: str | None = None
    arms: tuple[str, ...] = ()
    load_from: Path | None = None
    load_fraction: float = DEFAULT_LOAD_FRACTION
    scenario_set: tuple[str, ...] = ()
    """``--set`` given with ``--resume``: re-applied to the original scenario file when the stored one had its
    secrets removed (:meth:`RunDir.resume_scenario`); a new run's scenario has them applied already."""
    shard: Shard | None = None
    """``--shard I/N`` of a new run (a resumed shard keeps the one its manifest records)."""
    start_at: float | None = None
    """``--start-at`` of a new run, Unix seconds."""

    @property
    def changes_window(self) -> bool:
        return (
            self.window_s is not None
            or self.interval_s is not None
            or self.load is not None
            or self.load_from is not None
        )


def load_from_sweep(scenario: Scenario, arm: str, sweep_dir: Path, fraction: float) -> tuple[float, str]:
    """(load, where it came from): ``fraction`` of the load at which ``arm`` reached its best RPS/GPU within
    the SLO in the sweep stored in ``sweep_dir`` (its ``sweep.json``); whole users in concurrency mode."""
    if not 0 < fraction <= 1:
        raise SoakError(f"--load-fraction {fraction:g}: must be in (0, 1]")
    run_dir = RunDir.open(sweep_dir)
    if run_dir.kind != "sweep":
        raise SoakError(f"--load-from {sweep_dir}: a {run_dir.kind} run, not a sweep (kvbench sweep makes one)")
    result = SweepResult.read_file(run_dir.sweep_file) if stored_file(run_dir.sweep_file) else sweep_result_of(run_dir)
    capacity = result.capacity_of(arm)
    if capacity is None:
        raise SoakError(f"--load-from {sweep_dir}: the sweep has no arm {arm!r} (arms: {', '.join(result.arms)})")
    if capacity.at_load is None:
        raise SoakError(
            f"--load-from {sweep_dir}: arm {arm} met the SLO at no load point of the sweep, so it has no capacity "
            "to take a share of; give --load"
        )
    modes = {point.mode for point in result.points if point.arm == arm}
    assert scenario.sweep is not None  # soak_scenario requires it
    if modes != {scenario.sweep.mode}:
        raise SoakError(
            f"--load-from {sweep_dir}: the sweep's load is in {', '.join(sorted(modes))} but this scenario's sweep "
            f"mode is {scenario.sweep.mode}"
        )
    load = fraction * capacity.at_load
    if scenario.sweep.mode == "concurrency":
        load = float(max(1, round(load)))
    unit = "users" if scenario.sweep.mode == "concurrency" else "requests/s"
    source = (
        f"{fraction:.0%} of {arm}'s capacity within the SLO ({capacity.at_load:g} {unit}, "
        f"{capacity.max_rps_per_gpu_at_slo:.3g} RPS/GPU) in sweep {sweep_dir} (run {result.run_id})"
    )
    return load, source


def _check_arms(scenario: Scenario, source: str, overrides: LaunchOverrides) -> None:
    names = [arm.name for arm in scenario.arms]
    unknown = [name for name in overrides.arms if name not in names]
    if unknown:
        raise KvbenchError(f"{source}: --arm {', '.join(unknown)}: no such arm (arms: {', '.join(names)})")


def _probe_scenario(scenario: Scenario, source: str, overrides: LaunchOverrides) -> Scenario:
    _ = scenario.probe_workload  # a clear error before anything starts
    _check_arms(scenario, source, overrides)
    return scenario


def _sweep_scenario(scenario: Scenario, source: str, overrides: LaunchOverrides) -> Scenario:
    _ = scenario.load_workload
    _check_arms(scenario, source, overrides)
    return scenario


def _soak_scenario(scenario: Scenario, source: str, overrides: LaunchOverrides) -> Scenario:
    load, load_source = overrides.load, None
    if overrides.load_from is not None:
        if load is not None:
            raise SoakError("give --load or --load-from, not both")
        soak_scenario(scenario, window_s=overrides.window_s, source=source)  # the workload and sweep checks first
        arm = soak_arm(scenario, overrides.arm).name
        load, load_source = load_from_sweep(scenario, arm, overrides.load_from, overrides.load_fraction)
    effective = soak_scenario(
        scenario,
        window_s=overrides.window_s,
        interval_s=overrides.interval_s,
        load=load,
        load_source=load_source,
        source=source,
    )
    soak_arm(effective, overrides.arm)  # fail before creating a directory
    return effective


def _replay_scenario(scenario: Scenario, source: str, overrides: LaunchOverrides) -> Scenario:
    load_replayed_trace(scenario.trace_workload)  # a bad trace fails before a directory is created
    return scenario


def _agentic_scenario(scenario: Scenario, source: str, overrides: LaunchOverrides) -> Scenario:
    _ = scenario.agentic_workload
    _check_arms(scenario, source, overrides)
    return scenario


def _agentic_runner(
    scenario: Scenario, run_dir: RunDir, source: Path | None, progress: RunProgress | None, overrides: LaunchOverrides
) -> Runner[VersionedFile]:
    runner = AgenticRunner(scenario, run_dir, source=source, progress=progress, only_arms=overrides.arms)
    return runner  # type: ignore[return-value]


def _probe_runner(scenario: Scenario, run_dir: RunDir, source: Path | None, progress: RunProgress | None,
                  overrides: LaunchOverrides) -> Runner[VersionedFile]:  # fmt: skip
    return ProbeRunner(scenario, run_dir, source=source, progress=progress, only_arms=overrides.arms)  # type: ignore[return-value]


def _sweep_runner(scenario: Scenario, run_dir: RunDir, source: Path | None, progress: RunProgress | None,
                  overrides: LaunchOverrides) -> Runner[VersionedFile]:  # fmt: skip
    return SweepRunner(scenario, run_dir, source=source, progress=progress, only_arms=overrides.arms)  # type: ignore[return-value]


def _soak_runner(scenario: Scenario, run_dir: RunDir, source: Path | None, progress: RunProgress | None,
                 overrides: LaunchOverrides) -> Runner[VersionedFile]:  # fmt: skip
    return SoakRunner(scenario, run_dir, arm=overrides.arm, source=source, progress=progress)  # type: ignore[return-value]


def _replay_runner(scenario: Scenario, run_dir: RunDir, source: Path | None, progress: RunProgress | None,
                   overrides: LaunchOverrides) -> Runner[VersionedFile]:  # fmt: skip
    return TraceRunner(scenario, run_dir, source=source, progress=progress)  # type: ignore[return-value]


@dataclass(frozen=True)
class RunKindSpec:
    kind: RunKind
    check: Callable[[Scenario, str, LaunchOverrides], Scenario]
    runner: Callable[[Scenario, RunDir, Path | None, RunProgress | None, LaunchOverrides], Runner[VersionedFile]]
    result_of: Callable[[RunDir], VersionedFile]
    """The kind's result file content, aggregated from the stored files (writes nothing)."""


RUN_KINDS: dict[RunKind, RunKindSpec] = {
    "probe": RunKindSpec("probe", _probe_scenario, _probe_runner, probe_result_of),
    "sweep": RunKindSpec("sweep", _sweep_scenario, _sweep_runner, sweep_result_of),
    "soak": RunKindSpec("soak", _soak_scenario, _soak_runner, soak_result_of),
    "replay": RunKindSpec("replay", _replay_scenario, _replay_runner, replay_result_of),
    "agentic": RunKindSpec("agentic", _agentic_scenario, _agentic_runner, agentic_result_of),
}

SWEPT_BY_WORKLOAD: dict[str, RunKind] = {"agentic": "agentic"}
"""``kvbench sweep`` of these workload kinds runs this run kind instead (the load axis is theirs)."""


def _kind_for(kind: RunKind, scenario: Scenario | None, resume: Path | None) -> RunKind:
    """The run kind ``kind``'s command runs: a sweep of an agentic workload is an agentic sweep."""
    if kind != "sweep":
        return kind
    if scenario is not None:
        return SWEPT_BY_WORKLOAD.get(scenario.workload.kind, kind)
    if resume is not None and RunDir.open(resume).kind == "agentic":
        return "agentic"
    return kind


def launch(
    kind: RunKind,
    scenario: Scenario | None,
    *,
    source: Path | None,
    output_dir: Path | None = None,
    resume: Path | None = None,
    progress: RunProgress | None = None,
    overrides: LaunchOverrides | None = None,
) -> tuple[RunDir, VersionedFile]:
    """Start a new run of ``kind`` from ``scenario``, or resume the run directory ``resume``."""
    spec = RUN_KINDS[_kind_for(kind, scenario, resume)]
    overrides = overrides or LaunchOverrides()
    if resume is not None:
        if scenario is not None:
            raise KvbenchError("give either a scenario or --resume RUN_DIR, not both")
        if overrides.changes_window:
            raise SoakError("--resume continues the stored window: --window, --interval and --load cannot change it")
        run_dir = RunDir.open(resume)
        source = run_dir.scenario_file
        effective = spec.check(run_dir.resume_scenario(overrides.scenario_set), str(source), overrides)
    else:
        if scenario is None:
            raise KvbenchError("missing scenario (a YAML file or a bundled name such as 'quickstart')")
        effective = spec.check(scenario, str(source or "scenario"), overrides)
        run_dir = RunDir.create(output_dir or Path(effective.output.dir), effective)
    # the runner reads what is left to measure: only one process may do that and then measure it
    with run_dir_lock(run_dir.path):
        runner = spec.runner(effective, run_dir, source, progress, overrides)
        if resume is not None:
            runner.set_shard(*stored_shard(run_dir))
        else:
            runner.set_shard(overrides.shard or WHOLE, overrides.start_at)
        return run_dir, run_sync(runner)


def stored_shard(run_dir: RunDir) -> tuple[Shard, float | None]:
    """The shard and ``--start-at`` a run directory's manifest records (an unsharded run: the whole, None); a
    resumed shard whose common start has passed starts its remaining points at once."""
    block = read_manifest(run_dir.manifest_file).get("shard")
    if not isinstance(block, dict):
        return WHOLE, None
    try:
        shard = Shard(int(block["index"]), int(block["count"]))
    except (KeyError, TypeError, ValueError):
        where = f"{run_dir.manifest_file}: shard"
        raise RunDirError(f"{where}: must be {{index, count, start_at}} with 0 <= index < count") from None
    start = block.get("start_at")
    return shard, parse_start_at(start) if isinstance(start, str) else None


def results_of(run_dir: RunDir) -> RunResults:
    """Aggregate the run directory's result files from its stored files alone; writes nothing (``kvbench report``)."""
    return RunResults(RUN_KINDS[run_dir.kind].result_of(run_dir), fleet_result_of(run_dir), pd_breakdown_of(run_dir))


def summarize(run_dir: RunDir) -> RunResults:
    """:func:`results_of`, written into the run directory (its result file; fleets: fleet.json too; P/D arms:
    pd-breakdown.json)."""
    results = results_of(run_dir)
    results.result.write_file(run_dir.path / results.result.FILE_NAME)
    if results.fleet is not None:
        results.fleet.write_file(run_dir.fleet_file)
    if results.pd is not None:
        results.pd.write_file(run_dir.path / results.pd.FILE_NAME)
    return results
