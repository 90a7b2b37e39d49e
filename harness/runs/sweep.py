"""``kvbench sweep``: the multi-user workload over a grid of loads, per arm, into capacity curves.

One direction, like the probe runner: scenario -> per arm, engine lifecycle (started once per arm,
so caches never leak between arms) -> warm-up -> user contexts built -> for each load point, one
:func:`~harness.runs.load.run_load` window with ``/metrics`` scraped at the window's edges ->
records appended as they complete -> ``points.jsonl`` event per finished point -> aggregation
(:func:`summarize_sweep`) -> ``sweep.json`` -> curves and tables (:mod:`reports.curves`).

Run directory (beside the probe's files)::

  records.jsonl   every request (warm-up and measured), with point, load, user and turn (= round)
  points.jsonl    one PointDone per finished (arm, point): window edges, counters, /metrics deltas
  sweep.json      the versioned SweepResult every report reads
  report/         capacity.png/.svg, ttft_p99.png/.svg, sweep.csv, capacity.md

A killed sweep keeps its records and finished points; ``kvbench sweep --resume RUN_DIR`` re-runs only
the points without a PointDone (the engine of an arm with work left starts again).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Protocol

import aiohttp
import numpy as np
import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from harness.client.openai import OpenAIClient
from harness.client.pool import ProcessClientPool, StreamingClient
from harness.client.scrape import cache_counter_deltas
from harness.engines.base import LaunchContext, PrefixCacheResetUnsupported, RunningEngine
from harness.engines.kinds import create_engine
from harness.results.capacity import analytical_comparisons, arm_capacity, engine_shapes, savings
from harness.results.sweep_metrics import PointDone, point_data, point_result
from harness.results.sweep_result import (
    PointResult,
    SloLimits,
    SweepCounts,
    SweepResult,
)
from harness.scenario.spec import Arm, Scenario, SweepSpec
from harness.store.manifest import Manifest
from harness.store.records import RecordWriter, RequestRecord, append_jsonl
from harness.store.rundir import RunDir
from kvbench import __version__
from kvbench.errors import KvbenchError, RunInterrupted
from workloads.config import MultiUserQA
from workloads.multi_user import MultiUserWorkload

from .interrupt import Interrupted, run_interruptible
from .load import LoadPlan, LoadWindow, RecordContext, run_load
from .warmup import send_warmup_requests

log = logging.getLogger(__name__)

POINTS_FILE = "points.jsonl"
SWEEP_FILE = "sweep.json"
SESSIONS_PER_POINT = 1_000_000
"""Point ``p`` numbers its sessions from ``p × SESSIONS_PER_POINT``: new conversations per point."""


def points_file(run_dir: RunDir) -> Path:
    return run_dir.path / POINTS_FILE


def sweep_file(run_dir: RunDir) -> Path:
    return run_dir.path / SWEEP_FILE


def read_points(run_dir: RunDir) -> list[PointDone]:
    path = points_file(run_dir)
    if not path.exists():
        return []
    out = []
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append(PointDone.model_validate(json.loads(line)))
        except ValueError:
            if number == len(lines) and not line.endswith("\n"):
                break  # torn final line of a killed writer
            raise KvbenchError(f"{path}:{number}: not a valid point event") from None
    return out


class SweepProgress(Protocol):
    """Where the sweep reports progress (the CLI draws rich bars from it)."""

    def start(self, points: int) -> None: ...

    def describe(self, text: str) -> None: ...

    def begin_point(self, label: str, seconds: float) -> None: ...

    def tick(self, elapsed_s: float, requests: int) -> None: ...

    def end_point(self) -> None: ...


class _NoProgress:
    def start(self, points: int) -> None:
        return None

    def describe(self, text: str) -> None:
        return None

    def begin_point(self, label: str, seconds: float) -> None:
        return None

    def tick(self, elapsed_s: float, requests: int) -> None:
        return None

    def end_point(self) -> None:
        return None


class RichSweepProgress:
    """Two rich bars: points done, and the time through the current point's warm-up and window."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description:<44}"),
            BarColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self._points: TaskID | None = None
        self._point: TaskID | None = None
        self._done = 0
        self._total = 0

    def __enter__(self) -> RichSweepProgress:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    def start(self, points: int) -> None:
        self._total = points
        self._points = self._progress.add_task("sweep", total=max(points, 1), detail=f"0/{points} points")

    def describe(self, text: str) -> None:
        if self._points is not None:
            self._progress.update(self._points, description=text)

    def begin_point(self, label: str, seconds: float) -> None:
        if self._point is not None:
            self._progress.remove_task(self._point)
        self._point = self._progress.add_task(label, total=seconds, detail="0 requests")

    def tick(self, elapsed_s: float, requests: int) -> None:
        if self._point is not None:
            self._progress.update(self._point, completed=elapsed_s, detail=f"{requests} requests")

    def end_point(self) -> None:
        self._done += 1
        if self._points is not None:
            self._progress.update(self._points, completed=self._done, detail=f"{self._done}/{self._total} points")
        if self._point is not None:
            self._progress.remove_task(self._point)
            self._point = None


class SweepRunner:
    """Runs a multi-user scenario's sweep into a run directory."""

    def __init__(
        self,
        scenario: Scenario,
        run_dir: RunDir,
        *,
        source: Path | None = None,
        progress: SweepProgress | None = None,
    ) -> None:
        self.scenario = scenario
        self.workload_config: MultiUserQA = scenario.load_workload
        if scenario.sweep is None:  # the scenario validator already requires it
            raise KvbenchError(f"scenario {scenario.name!r} has no sweep section")
        self.spec: SweepSpec = scenario.sweep
        self.run_dir = run_dir
        self.source = source
        self.progress: SweepProgress = progress or _NoProgress()
        records_attempts = [r.attempt for r in run_dir.records()]
        points_attempts = [p.attempt for p in read_points(run_dir)]
        self.attempt = max([*records_attempts, *points_attempts], default=-1) + 1
        self._workload: MultiUserWorkload | None = None

    def pending(self) -> dict[str, list[int]]:
        done = {event.key for event in read_points(self.run_dir)}
        return {
            arm.name: [i for i in range(len(self.spec.values)) if (arm.name, i) not in done]
            for arm in self.scenario.arms
        }

    async def run(self) -> SweepResult:
        plan = self.pending()
        self.progress.start(sum(len(points) for points in plan.values()))
        manifest = Manifest.start(self.run_dir.manifest_file, self.scenario, self.source, self.attempt)
        status = "interrupted"
        try:
            with RecordWriter(self.run_dir.records_file) as writer:
                for arm in self.scenario.arms:
                    if plan[arm.name]:
                        await self._run_arm(arm, plan[arm.name], writer, manifest)
            status = "completed"
        except KvbenchError:
            status = "failed"
            raise
        finally:
            manifest.finish(status)
        return summarize_sweep(self.run_dir)

    def _connections(self) -> int:
        if self.spec.mode == "concurrency":
            return int(max(self.spec.values)) + 8
        return self.spec.max_active_users + 8

    async def _run_arm(self, arm: Arm, points: list[int], writer: RecordWriter, manifest: Manifest) -> None:
        context = LaunchContext(
            arm=arm.name,
            profile=arm.profile,
            log_dir=self.run_dir.log_dir(arm.name),
            prefix_caching=arm.profile.prefix_caching,
        )
        self.progress.describe(f"{arm.name}: starting {self.scenario.engine.kind} engine")
        async with create_engine(self.scenario.engine, context) as engine:
            manifest.record_engine(arm.name, engine.facts)
            async with OpenAIClient(
                engine.endpoint, timeout_s=self.workload_config.request_timeout_s, max_connections=self._connections()
            ) as client:
                await self._warm_up(arm, engine, client, writer)
                workload = self._workload_for(engine)
                users = self.workload_config.users
                self.progress.describe(f"{arm.name}: building {users} user contexts")
                await workload.prepare()
                await _reset(engine, arm.name)
                async with contextlib.AsyncExitStack() as stack:
                    sender: StreamingClient = client
                    if self.spec.client_workers > 1:
                        sender = await stack.enter_async_context(
                            ProcessClientPool(
                                engine.endpoint,
                                workers=self.spec.client_workers,
                                timeout_s=self.workload_config.request_timeout_s,
                                max_connections=self._connections(),
                            )
                        )
                    for index in points:
                        if self.spec.reset_between_points:
                            await _reset(engine, arm.name)
                        await self._run_point(arm, index, engine, client, sender, workload, writer)

    def _workload_for(self, engine: RunningEngine) -> MultiUserWorkload:
        """One workload (and text cache) for the whole sweep; each arm's engine tokenizes for it."""
        if self._workload is None:
            self._workload = MultiUserWorkload(self.workload_config, engine.tokenizer(), seed=self.scenario.seed)
        else:
            self._workload.tokenizer = engine.tokenizer()
        return self._workload

    async def _warm_up(self, arm: Arm, engine: RunningEngine, client: OpenAIClient, writer: RecordWriter) -> None:
        """Unmeasured requests after start-up (kernels, allocators, connections)."""
        config = self.workload_config
        self.progress.describe(f"{arm.name}: warming up")
        await send_warmup_requests(
            engine, client, writer, arm=arm.name, attempt=self.attempt, count=config.warmup_requests,
            api=config.api, ignore_eos=config.ignore_eos, seed=self.scenario.seed, tag="sweep-warmup",
        )  # fmt: skip

    async def _run_point(
        self,
        arm: Arm,
        index: int,
        engine: RunningEngine,
        client: OpenAIClient,
        sender: StreamingClient,
        workload: MultiUserWorkload,
        writer: RecordWriter,
    ) -> None:
        """One load point: ``sender`` carries the load, ``client`` scrapes /metrics."""
        spec = self.spec
        value = spec.values[index]
        plan = LoadPlan.from_sweep(spec, value, first_session=index * SESSIONS_PER_POINT, seed=self.scenario.seed)
        unit = "users" if spec.mode == "concurrency" else "req/s"
        self.progress.describe(f"{arm.name}: point {index + 1}/{len(spec.values)}")
        self.progress.begin_point(f"{arm.name} @ {value:g} {unit}", spec.warmup + spec.duration)
        count = 0
        started = time.monotonic_ns()

        def on_record(record: RequestRecord) -> None:
            nonlocal count
            writer.append(record)
            count += 1

        def on_tick(now_ns: int) -> None:
            self.progress.tick(min((now_ns - started) / 1e9, spec.warmup + spec.duration), count)

        before_task = asyncio.ensure_future(_scrape_after(client, spec.warmup, arm.name))
        try:
            window = await run_load(
                sender,
                workload,
                plan,
                RecordContext(arm=arm.name, attempt=self.attempt, point=index),
                on_record=on_record,
                on_tick=on_tick,
                tick_s=0.5,
            )
            before = await before_task
        finally:
            before_task.cancel()
        after = await _scrape(client, arm.name)
        writer.sync()
        event = _point_done(arm.name, index, value, self.attempt, window, before, after)
        append_jsonl(points_file(self.run_dir), event)
        self.progress.end_point()
        if window.measured == 0:
            log.warning("arm %s, load %g: no request was sent inside the window", arm.name, value)


def _point_done(
    arm: str, index: int, value: float, attempt: int, window: LoadWindow, before: str | None, after: str | None
) -> dict[str, object]:
    metrics = None
    if before is not None and after is not None:
        try:
            metrics = cache_counter_deltas(before, after)
        except ValueError as error:
            log.warning("unparseable /metrics page (%s); no cache statistics for this point", error)
    event = PointDone(
        arm=arm, point=index, load=value, attempt=attempt, start_ns=window.start_ns,
        window_start_ns=window.window_start_ns, window_end_ns=window.window_end_ns, end_ns=window.end_ns,
        sent=window.sent, measured=window.measured, errors=window.errors, sessions=window.sessions,
        max_in_flight=window.max_in_flight, late_arrivals=window.late_arrivals, cancelled=window.cancelled,
        metrics=metrics,
    )  # fmt: skip
    return event.model_dump()


async def _scrape(client: OpenAIClient, arm: str) -> str | None:
    """The engine's /metrics page, or None when it has none (the sweep goes on without cache stats)."""
    try:
        return await client.metrics_text()
    except (aiohttp.ClientError, TimeoutError) as error:
        log.warning("arm %s: /metrics unavailable (%s); no cache statistics", arm, error)
        return None


async def _scrape_after(client: OpenAIClient, delay_s: float, arm: str) -> str | None:
    await asyncio.sleep(delay_s)
    return await _scrape(client, arm)


async def _reset(engine: RunningEngine, arm: str) -> None:
    try:
        await engine.reset_prefix_cache()
    except PrefixCacheResetUnsupported:
        log.info("arm %s: the engine cannot reset its prefix cache; it starts warm", arm)


# ---------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------


def _chosen(points: Iterable[PointDone]) -> dict[tuple[str, int], PointDone]:
    chosen: dict[tuple[str, int], PointDone] = {}
    for event in points:
        current = chosen.get(event.key)
        if current is None or event.attempt >= current.attempt:
            chosen[event.key] = event
    return chosen


def _mean_question_tokens(config: MultiUserQA, seed: int, sessions: int = 400) -> float:
    workload = MultiUserWorkload(config, _PlanOnly(), seed=seed)
    lengths = [q for s in range(sessions) for q in workload.plan(s).question_tokens]
    return float(np.mean(lengths)) if lengths else 0.0


class _PlanOnly:
    async def encode(self, text: str) -> list[int]:
        raise RuntimeError("aggregation builds no text")

    async def decode(self, token_ids: object) -> str:
        raise RuntimeError("aggregation builds no text")


def aggregate_sweep(
    scenario: Scenario, run_id: str, records: Iterable[RequestRecord], points: Iterable[PointDone]
) -> SweepResult:
    """A pure function of the stored records and point events (so a run can be re-aggregated offline)."""
    spec = scenario.sweep
    if spec is None:
        raise KvbenchError(f"scenario {scenario.name!r} has no sweep section")
    config = scenario.load_workload
    engine = scenario.engine
    gpus = engine.parallelism.gpus
    per_deployment = engine.parallelism.tp * engine.parallelism.pp * engine.parallelism.dp
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

    capacities = [arm_capacity(arm.name, results, scenario.cost, per_deployment) for arm in scenario.arms]
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
        kvbench_version=__version__,
        run_id=run_id,
        scenario_name=scenario.name,
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
    )


def summarize_sweep(run_dir: RunDir) -> SweepResult:
    """Aggregate a sweep run directory's stored files into sweep.json."""
    result = aggregate_sweep(run_dir.scenario(), run_dir.run_id, run_dir.records(), read_points(run_dir))
    result.write_file(sweep_file(run_dir))
    return result


# ---------------------------------------------------------------------------------------------
# What the CLI calls
# ---------------------------------------------------------------------------------------------


def run_sweep(
    scenario: Scenario,
    *,
    source: Path | None,
    output_dir: Path | None = None,
    resume: Path | None = None,
    progress: SweepProgress | None = None,
) -> RunDir:
    """Run (or resume) a sweep; returns the run directory with sweep.json written."""
    _ = scenario.load_workload  # a clear error before anything starts
    run_dir = RunDir.open(resume) if resume else RunDir.create(output_dir or Path(scenario.output.dir), scenario)
    runner = SweepRunner(scenario, run_dir, source=source, progress=progress)
    try:
        run_interruptible(runner.run)
    except Interrupted:
        raise RunInterrupted(
            f"sweep interrupted; engines were stopped and the records kept. Continue with: "
            f"kvbench sweep --resume {run_dir.path}"
        ) from None
    return run_dir


def rebuild_sweep_reports(run_dir: RunDir, console: Console | None = None) -> list[Path]:
    """Re-aggregate stored records into sweep.json, then draw every sweep report from that file alone."""
    from reports.curves import print_sweep, write_sweep_reports

    summarize_sweep(run_dir)
    result = SweepResult.read_file(sweep_file(run_dir))
    paths = write_sweep_reports(result, run_dir.report_dir)
    if console is not None:
        print_sweep(result, console)
    return paths
