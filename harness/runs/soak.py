"""``kvbench soak``: a stability window -- the workload at its target load for hours, judged per interval.

One direction, like the other runners: scenario (a ``multi_user_qa`` workload, its ``sweep`` section
for the load shape, its ``soak`` section for window, interval, target load and criteria) -> one
arm's engine (``kind: openai`` for a staging cluster kvbench does not run) -> warm-up -> user
contexts -> :func:`~harness.runs.load.run_load` without an end, stopped when the window is over.

Every request is appended to ``records.jsonl`` as it completes (raw data stays on disk); the
measured ones also go into the current interval's :class:`~harness.results.soak_result.IntervalAccumulator`.
At each interval boundary the engine's ``/metrics`` is scraped (hit rate over the interval, KV
usage, counter resets = restarts), the interval is aggregated, appended to ``intervals.jsonl`` and
fsynced, and ``soak.json`` is rewritten with the verdict so far. Memory is the current interval
only, so a 24 h window stays flat; a crash loses at most the interval in flight, and
``kvbench soak --resume SOAK_DIR`` measures the intervals that are left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from harness.client.openai import OpenAIClient
from harness.client.scrape import METRICS, MetricsSnapshot, delta, metric_value, parse_metrics
from harness.engines.base import LaunchContext, PrefixCacheResetUnsupported, RunningEngine
from harness.engines.kinds import create_engine
from harness.results.soak_result import (
    IntervalAccumulator,
    IntervalStats,
    MetricsReading,
    SoakResult,
    append_interval,
    evaluate,
    planned_intervals,
    read_intervals,
    totals,
)
from harness.scenario.spec import Arm, Scenario, SoakSpec, SweepSpec
from harness.store.manifest import Manifest, read_manifest
from harness.store.records import RecordWriter, RequestRecord
from harness.store.rundir import RunDir
from kvbench import __version__
from kvbench.errors import KvbenchError, ScenarioError
from workloads.config import MultiUserQA
from workloads.multi_user import MultiUserWorkload

from .interrupt import Interrupted, run_interruptible
from .load import LoadPlan, RecordContext, run_load
from .warmup import send_warmup_requests

log = logging.getLogger(__name__)

INTERVALS_FILE = "intervals.jsonl"
SOAK_FILE = "soak.json"
NS = 1_000_000_000
SESSIONS_PER_ATTEMPT = 1_000_000_000
"""Attempt ``a`` numbers its sessions from ``a ×`` this, so a resumed window starts new conversations."""
RESTART_TOLERANCE = 1e-6
START_TIME_METRIC = "process_start_time_seconds"


class SoakError(KvbenchError):
    """A soak cannot start or continue (wrong workload kind, missing section, unknown arm)."""


def intervals_file(run_dir: RunDir) -> Path:
    return run_dir.path / INTERVALS_FILE


def soak_file(run_dir: RunDir) -> Path:
    return run_dir.path / SOAK_FILE


# --------------------------------------------------------------------------------------------
# Scenario checks
# --------------------------------------------------------------------------------------------


def soak_scenario(
    scenario: Scenario,
    *,
    window_s: float | None = None,
    interval_s: float | None = None,
    load: float | None = None,
    source: str = "scenario",
) -> Scenario:
    """The scenario with its effective soak section (flags override the file), validated for a soak."""
    if not isinstance(scenario.workload, MultiUserQA):
        raise ScenarioError(
            f"{source}: workload kind {scenario.workload.kind!r} cannot run a stability window; "
            "kvbench soak needs workload kind 'multi_user_qa' (users under load)"
        )
    if scenario.sweep is None:
        raise ScenarioError(f"{source}: sweep: required by kvbench soak (mode and load shape)")
    base = scenario.soak or SoakSpec()
    updates: dict[str, object] = {}
    if window_s is not None:
        updates["window"] = window_s
    if interval_s is not None:
        updates["interval"] = interval_s
    if load is not None:
        updates["load"] = load
    try:
        spec = SoakSpec.model_validate(base.model_dump() | updates)
    except ValueError as error:
        raise ScenarioError(f"{source}: soak: {error}") from None
    if spec.load is None:
        spec = spec.model_copy(update={"load": max(scenario.sweep.values)})
    if scenario.sweep.mode == "concurrency" and spec.load is not None and spec.load != int(spec.load):
        raise ScenarioError(f"{source}: soak.load: concurrency needs a whole number of users, got {spec.load:g}")
    return scenario.model_copy(update={"soak": spec})


def soak_arm(scenario: Scenario, wanted: str | None) -> Arm:
    """The arm a soak runs: ``wanted``, the only arm, or the first arm that is not the baseline."""
    names = [arm.name for arm in scenario.arms]
    if wanted is not None:
        for arm in scenario.arms:
            if arm.name == wanted:
                return arm
        raise SoakError(f"--arm {wanted!r} is not an arm of {scenario.name!r}; arms: {', '.join(names)}")
    if len(scenario.arms) == 1:
        return scenario.arms[0]
    return next(arm for arm in scenario.arms if arm.name != scenario.baseline_arm)


def describe_load(sweep: SweepSpec, load: float) -> str:
    if sweep.mode == "concurrency":
        return f"{load:g} concurrent users (closed loop)"
    return f"{load:g} requests/s ({sweep.arrival} arrivals)"


# --------------------------------------------------------------------------------------------
# /metrics per interval
# --------------------------------------------------------------------------------------------


def counter_totals(snapshot: MetricsSnapshot) -> dict[str, float]:
    """Running totals of the counters kvbench reads (and the process start time, when exposed)."""
    out: dict[str, float] = {}
    for spec in METRICS:
        if spec.kind == "counter":
            value = metric_value(snapshot, spec.tag)
            if value is not None:
                out[spec.tag] = value
    start = [v for (name, _), v in snapshot.items() if name == START_TIME_METRIC]
    if start:
        out[START_TIME_METRIC] = max(start)
    return out


def restarted(previous: Mapping[str, float], current: Mapping[str, float]) -> bool:
    """Whether the engine restarted between two scrapes: a counter went down, or the start time moved."""
    for name, value in current.items():
        before = previous.get(name)
        if before is None:
            continue
        if name == START_TIME_METRIC:
            if abs(value - before) > RESTART_TOLERANCE:
                return True
        elif value < before - RESTART_TOLERANCE:
            return True
    return False


def interval_hit_rate(before: MetricsSnapshot, after: MetricsSnapshot) -> float | None:
    """Prompt tokens served from a cache (GPU prefix cache + offload tier) / prompt tokens, over the interval."""
    diff = delta(before, after)
    prompt = metric_value(diff, "prompt_tokens") or metric_value(diff, "gpu_prefix_queries")
    if not prompt:
        return None
    hits = (metric_value(diff, "gpu_prefix_hits") or 0.0) + (metric_value(diff, "external_prefix_hits") or 0.0)
    return min(hits / prompt, 1.0)


class MetricsTracker:
    """Scrapes /metrics at each interval boundary and turns two scrapes into a :class:`MetricsReading`."""

    def __init__(self, client: OpenAIClient, previous_counters: Mapping[str, float] | None = None) -> None:
        self.client = client
        self.last: MetricsSnapshot | None = None
        self.last_counters: dict[str, float] = dict(previous_counters or {})

    async def scrape(self) -> tuple[MetricsSnapshot | None, str | None]:
        try:
            text = await self.client.metrics_text()
        except (aiohttp.ClientError, TimeoutError) as error:
            return None, f"{type(error).__name__}: {error}"
        try:
            return parse_metrics(text), None
        except ValueError as error:
            return None, f"unparseable /metrics: {error}"

    async def start(self) -> None:
        snapshot, _ = await self.scrape()
        if snapshot is not None:
            self.last = snapshot

    async def reading(self) -> MetricsReading:
        snapshot, error = await self.scrape()
        if snapshot is None:
            return MetricsReading(error=error)
        counters = counter_totals(snapshot)
        restarts = 1 if self.last_counters and restarted(self.last_counters, counters) else 0
        hit = interval_hit_rate(self.last, snapshot) if self.last is not None and not restarts else None
        self.last = snapshot
        self.last_counters = counters
        return MetricsReading(
            hit_rate=hit, kv_usage=metric_value(snapshot, "kv_usage"), restarts=restarts, counters=counters
        )


# --------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------


class SoakProgress(Protocol):
    def start(self, total: int, done: int) -> None: ...

    def describe(self, text: str) -> None: ...

    def interval(self, stats: IntervalStats) -> None: ...


class _NoProgress:
    def start(self, total: int, done: int) -> None:
        return None

    def describe(self, text: str) -> None:
        return None

    def interval(self, stats: IntervalStats) -> None:
        return None


class RichSoakProgress:
    """A rich bar over the window's intervals, showing the last interval's numbers."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description:<28}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("intervals  {task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self._task: TaskID | None = None

    def __enter__(self) -> RichSoakProgress:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    def start(self, total: int, done: int) -> None:
        self._task = self._progress.add_task("soak", total=total, completed=done, detail="")

    def describe(self, text: str) -> None:
        if self._task is not None:
            self._progress.update(self._task, description=text)

    def interval(self, stats: IntervalStats) -> None:
        if self._task is None:
            return
        p99 = "—" if stats.ttft_p99_ms is None else f"{stats.ttft_p99_ms:.0f} ms"
        rate = "—" if stats.error_rate is None else f"{stats.error_rate:.1%}"
        detail = f"last: {stats.requests} req, TTFT p99 {p99}, errors {rate}"
        self._progress.update(self._task, advance=1, detail=detail, description=f"interval {stats.index + 1}")


# --------------------------------------------------------------------------------------------
# The runner
# --------------------------------------------------------------------------------------------


class SoakRunner:
    """Runs (or resumes) a stability window into a soak directory."""

    def __init__(
        self,
        scenario: Scenario,
        run_dir: RunDir,
        *,
        arm: str | None = None,
        source: Path | None = None,
        progress: SoakProgress | None = None,
    ) -> None:
        self.scenario = soak_scenario(scenario, source=str(source or run_dir.scenario_file))
        assert self.scenario.soak is not None and self.scenario.sweep is not None
        self.spec: SoakSpec = self.scenario.soak
        self.sweep: SweepSpec = self.scenario.sweep
        self.workload_config: MultiUserQA = self.scenario.load_workload
        self.arm = soak_arm(self.scenario, arm)
        self.run_dir = run_dir
        self.source = source
        self.progress: SoakProgress = progress or _NoProgress()
        self.done = read_intervals(intervals_file(run_dir))
        started = len(read_manifest(run_dir.manifest_file).get("attempts", []))
        self.attempt = max([started - 1, *(i.attempt for i in self.done)], default=-1) + 1
        self.planned = planned_intervals(self.spec.window, self.spec.interval)

    @property
    def remaining(self) -> list[int]:
        finished = {i.index for i in self.done}
        return [index for index in range(self.planned) if index not in finished]

    async def run(self) -> SoakResult:
        remaining = self.remaining
        self.progress.start(self.planned, self.planned - len(remaining))
        manifest = Manifest.start(self.run_dir.manifest_file, self.scenario, self.source, self.attempt)
        status = "interrupted"
        try:
            if remaining:
                with RecordWriter(self.run_dir.records_file) as writer:
                    await self._run_arm(remaining, writer, manifest)
            status = "completed"
        except KvbenchError:
            status = "failed"
            raise
        finally:
            manifest.finish(status)
        return summarize_soak(self.run_dir)

    def _connections(self) -> int:
        load = self.spec.load or max(self.sweep.values)
        if self.sweep.mode == "concurrency":
            return int(load) + 8
        return self.sweep.max_active_users + 8

    async def _run_arm(self, remaining: list[int], writer: RecordWriter, manifest: Manifest) -> None:
        arm = self.arm
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
                await self._warm_up(engine, client, writer)
                workload = MultiUserWorkload(self.workload_config, engine.tokenizer(), seed=self.scenario.seed)
                self.progress.describe(f"{arm.name}: building {self.workload_config.users} user contexts")
                await workload.prepare()
                self.progress.describe(f"{arm.name}: {describe_load(self.sweep, self.spec.load or 0.0)}")
                await self._window(remaining, client, workload, writer)

    async def _warm_up(self, engine: RunningEngine, client: OpenAIClient, writer: RecordWriter) -> None:
        config = self.workload_config
        self.progress.describe(f"{self.arm.name}: warming up")
        await send_warmup_requests(
            engine, client, writer, arm=self.arm.name, attempt=self.attempt, count=config.warmup_requests,
            api=config.api, ignore_eos=config.ignore_eos, seed=self.scenario.seed,
            tag=f"soak-warmup-{self.attempt}", error=SoakError,
        )  # fmt: skip
        with contextlib.suppress(PrefixCacheResetUnsupported):
            await engine.reset_prefix_cache()

    async def _window(
        self, remaining: list[int], client: OpenAIClient, workload: MultiUserWorkload, writer: RecordWriter
    ) -> None:
        spec = self.spec
        load = spec.load or max(self.sweep.values)
        plan = LoadPlan(
            mode=self.sweep.mode,
            value=load,
            warmup_s=0.0,
            duration_s=None,
            arrival=self.sweep.arrival,
            ramp_up_s=min(self.sweep.ramp_up, spec.interval),
            stagger_rounds=self.sweep.stagger_rounds,
            drain_timeout_s=self.sweep.drain_timeout,
            max_active_users=self.sweep.max_active_users,
            first_session=self.attempt * SESSIONS_PER_ATTEMPT,
            seed=self.scenario.seed + self.attempt,
        )
        accumulator = IntervalAccumulator(self.scenario.slo)
        collecting = True

        def on_record(record: RequestRecord) -> None:
            writer.append(record)
            if collecting and record.phase == "measure":
                accumulator.add(record)

        previous = self.done[-1].counters if self.done else None
        tracker = MetricsTracker(client, previous)
        await tracker.start()
        stop = asyncio.Event()
        interval_ns = int(spec.interval * NS)
        identity = RecordContext(arm=self.arm.name, attempt=self.attempt)
        load_task = asyncio.ensure_future(run_load(client, workload, plan, identity, on_record=on_record, stop=stop))
        try:
            start_ns = time.monotonic_ns()
            wall_ns = time.time_ns()
            for position, index in enumerate(remaining):
                boundary = start_ns + (position + 1) * interval_ns
                wall_start = wall_ns + position * interval_ns
                if not await _sleep_until(boundary, load_task):
                    break  # the load failed: its exception is raised below
                if position == len(remaining) - 1:
                    collecting = False
                    stop.set()
                reading = await tracker.reading()
                stats = accumulator.close(
                    index=index, attempt=self.attempt, start_unix_ns=wall_start, duration_ns=interval_ns,
                    metrics=reading,
                )  # fmt: skip
                writer.sync()
                append_interval(intervals_file(self.run_dir), stats)
                self.done.append(stats)
                self._result().write_file(soak_file(self.run_dir))
                self.progress.interval(stats)
            stop.set()
            await load_task
        finally:
            stop.set()
            if not load_task.done():
                load_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await load_task

    def _result(self) -> SoakResult:
        return build_result(self.run_dir, self.scenario, self.arm.name, self.done, attempts=self.attempt + 1)


async def _sleep_until(deadline_ns: int, load_task: asyncio.Future[Any]) -> bool:
    """Sleep until ``deadline_ns`` (monotonic); False if the load task ended first."""
    delay = (deadline_ns - time.monotonic_ns()) / NS
    if delay > 0:
        done, _ = await asyncio.wait({load_task}, timeout=delay)
        if done:
            return False
    return not load_task.done()


# --------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------


def build_result(
    run_dir: RunDir, scenario: Scenario, arm: str, intervals: list[IntervalStats], *, attempts: int
) -> SoakResult:
    spec = scenario.soak or SoakSpec()
    sweep = scenario.sweep
    planned = planned_intervals(spec.window, spec.interval)
    load = spec.load if spec.load is not None else (max(sweep.values) if sweep else math.nan)
    return SoakResult(
        kvbench_version=__version__,
        run_id=run_dir.run_id,
        scenario_name=scenario.name,
        arm=arm,
        engine_kind=scenario.engine.kind,
        load=describe_load(sweep, load) if sweep else "unknown",
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
        verdict=evaluate(intervals, spec, scenario.slo, planned=planned),
    )


def summarize_soak(run_dir: RunDir, arm: str | None = None) -> SoakResult:
    """Re-judge a soak directory from its stored intervals and rewrite soak.json (``kvbench report``)."""
    scenario = soak_scenario(run_dir.scenario(), source=str(run_dir.scenario_file))
    intervals = read_intervals(intervals_file(run_dir))
    manifest = read_manifest(run_dir.manifest_file)
    attempts = max(len(manifest.get("attempts", [])), max((i.attempt + 1 for i in intervals), default=0))
    arm_name = arm or next(iter(manifest.get("engines", {})), None) or soak_arm(scenario, None).name
    result = build_result(run_dir, scenario, arm_name, intervals, attempts=attempts)
    result.write_file(soak_file(run_dir))
    return result


def run_soak(
    scenario: Scenario,
    *,
    source: Path | None,
    output_dir: Path | None = None,
    resume: Path | None = None,
    window_s: float | None = None,
    interval_s: float | None = None,
    load: float | None = None,
    arm: str | None = None,
    progress: SoakProgress | None = None,
) -> tuple[RunDir, SoakResult]:
    """Run a new stability window, or resume one; returns the soak directory and its result."""
    if resume is not None:
        run_dir = RunDir.open(resume)
        effective = soak_scenario(run_dir.scenario(), source=str(run_dir.scenario_file))
        if window_s is not None or interval_s is not None or load is not None:
            raise SoakError("--resume continues the stored window: --window, --interval and --load cannot change it")
    else:
        effective = soak_scenario(
            scenario, window_s=window_s, interval_s=interval_s, load=load, source=str(source or "scenario")
        )
        soak_arm(effective, arm)  # fail before creating a directory
        run_dir = RunDir.create(output_dir or Path(effective.output.dir), effective)
    runner = SoakRunner(effective, run_dir, arm=arm, source=source, progress=progress)
    try:
        result = run_interruptible(runner.run)
    except Interrupted:
        kept = len(read_intervals(intervals_file(run_dir)))
        raise SoakError(
            f"interrupted: {kept} of {runner.planned} intervals are stored in {run_dir.path}; "
            f"continue the window with `kvbench soak --resume {run_dir.path}`"
        ) from None
    return run_dir, result
