"""``kvbench soak``: a stability window -- the workload at its target load for hours, judged per interval.

What differs from the other run kinds (the spine, :mod:`.spine`, does the rest): one arm (the
offload arm by default; ``kind: openai`` for a staging cluster kvbench does not run), and one
:func:`~harness.runs.load.run_load` without an end, stopped when the window is over.

Every request is appended to ``records.jsonl`` as it completes (raw data stays on disk); the
measured ones also go into the current interval's
:class:`~harness.results.soak_result.IntervalAccumulator`. At each interval boundary the engine's
``/metrics`` is scraped (hit rate over the interval, KV usage, counter resets = restarts), the
interval is aggregated, appended to ``intervals.jsonl`` and fsynced, and ``soak.json`` is rewritten
with the verdict so far. The last interval closes after the drain (at most ``sweep.drain_timeout``): the
requests in flight at the window's end count in it, so the slowest requests are never left out of the
verdict. Memory is the current interval only, so a 24 h window stays flat; a crash loses at most the
interval in flight, and ``kvbench soak --resume SOAK_DIR`` measures the intervals that are left.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from common.errors import EngineStartError
from harness.client.fleet import FleetClient
from harness.client.openai import OpenAIClient
from harness.client.scrape import MetricsSnapshot, counter_totals, delta, metric_value, parse_metrics, restarted
from harness.engines.base import FaultTarget, FaultUnsupported
from harness.engines.kinds import engine_kind
from harness.results.soak import build_result, soak_result_of
from harness.results.soak_result import IntervalAccumulator, MetricsReading, SoakResult, planned_intervals
from harness.scenario.soak import SoakError, describe_load, soak_arm, soak_scenario
from harness.scenario.spec import Arm, Scenario, SoakFault, SoakSpec, SweepSpec
from harness.store.events import FaultEvent, IntervalStats
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from offload.hits import counter_hit_rate
from workloads.config import MultiUserQA
from workloads.multi_user import MultiUserWorkload

from .energy import start_energy_meter
from .load import LoadPlan, RecordContext, run_load
from .progress import RunProgress
from .spine import ArmSession, Runner

NS = 1_000_000_000
SESSIONS_PER_ATTEMPT = 1_000_000_000
"""Attempt ``a`` numbers its sessions from ``a ×`` this, so a resumed window starts new conversations."""


def interval_hit_rate(before: MetricsSnapshot, after: MetricsSnapshot) -> float | None:
    """Prompt tokens served from a cache (GPU prefix cache + offload tier) / prompt tokens, over the interval."""
    diff = delta(before, after)
    prompt = metric_value(diff, "prompt_tokens") or metric_value(diff, "gpu_prefix_queries")
    return counter_hit_rate(prompt, metric_value(diff, "gpu_prefix_hits"), metric_value(diff, "external_prefix_hits"))


class MetricsTracker:
    """Scrapes /metrics at each interval boundary and turns two scrapes into a :class:`MetricsReading`."""

    def __init__(
        self, client: OpenAIClient | FleetClient, previous_counters: Mapping[str, float] | None = None
    ) -> None:
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


def _interval_detail(stats: IntervalStats) -> str:
    p99 = "—" if stats.ttft_p99_ms is None else f"{stats.ttft_p99_ms:.0f} ms"
    rate = "—" if stats.error_rate is None else f"{stats.error_rate:.1%}"
    return f"last: {stats.requests} req, TTFT p99 {p99}, errors {rate}"


class SoakRunner(Runner[SoakResult]):
    """Runs (or resumes) a stability window into a soak directory."""

    verb = "soak"
    unit = "intervals"

    def __init__(
        self,
        scenario: Scenario,
        run_dir: RunDir,
        *,
        arm: str | None = None,
        source: Path | None = None,
        progress: RunProgress | None = None,
    ) -> None:
        effective = soak_scenario(scenario, source=str(source or run_dir.scenario_file))
        super().__init__(effective, run_dir, source=source, progress=progress)
        assert effective.soak is not None and effective.sweep is not None
        self.spec: SoakSpec = effective.soak
        self.sweep: SweepSpec = effective.sweep
        self.arm = soak_arm(effective, arm)
        self.done = run_dir.intervals()
        self.planned = planned_intervals(self.spec.window, self.spec.interval)

    @property
    def config(self) -> MultiUserQA:
        return self.scenario.load_workload

    @property
    def remaining(self) -> list[int]:
        finished = {i.index for i in self.done}
        return [index for index in range(self.planned) if index not in finished]

    def arms_with_work(self) -> list[Arm]:
        return [self.arm] if self.remaining else []

    def work(self) -> tuple[int, int]:
        return self.planned, self.planned - len(self.remaining)

    def connections(self) -> int:
        load = self.spec.load or max(self.sweep.values)
        if self.sweep.mode == "concurrency":
            return int(load) + 8
        return self.sweep.max_active_users + 8

    def interrupted_message(self) -> str:
        kept = len(self.run_dir.intervals())
        return (
            f"interrupted: {kept} of {self.planned} intervals are stored in {self.run_dir.path}; "
            f"continue the window with `kvbench soak --resume {self.run_dir.path}`"
        )

    def result_of(self) -> SoakResult:
        return soak_result_of(self.run_dir)

    def _fault_target(self, session: ArmSession) -> FaultTarget | None:
        """The engine the soak's faults act on; SoakError when it cannot take them (before any load)."""
        if not self.spec.faults:
            return None
        engine = session.engine
        if not isinstance(engine, FaultTarget):
            raise SoakError(
                f"soak.faults: engine kind {self.scenario.engine.kind!r} is not started by kvbench, so kvbench "
                "cannot kill, pause or restart it; faults need an engine kvbench starts (e.g. sim, vllm)"
            )
        if any(fault.kind == "restart_tier" for fault in self.spec.faults) and not engine.has_tier_server():
            raise SoakError(
                f"soak.faults: restart_tier needs an offload-tier server beside the engine (vLLM with offload "
                f"backend lmcache-mp); arm {session.arm.name!r} has none"
            )
        return engine

    async def run_arm(self, session: ArmSession) -> None:
        config, arm = self.config, session.arm
        self._fault_target(session)  # refuse impossible drills before the warm-up
        self.progress.describe(f"{arm.name}: warming up")
        await session.warm_up(
            config.warmup_requests, api=config.api, ignore_eos=config.ignore_eos, tag=f"soak-warmup-{self.attempt}"
        )
        await session.reset_prefix_cache(required=False)
        workload = MultiUserWorkload(config, session.tokenizer, seed=self.scenario.seed, salt=self.prompt_salt)
        self.progress.describe(f"{arm.name}: building {config.users} user contexts")
        await workload.prepare()
        await self.wait_for_point(session)
        self.progress.describe(f"{arm.name}: {describe_load(self.sweep, self.spec.load or 0.0)}")
        await session.while_alive(self._window(session, self.remaining, workload))

    def _plan(self) -> LoadPlan:
        """The window's open-ended load (this shard's part of it, :mod:`.shard`)."""
        spec = self.spec
        return LoadPlan(
            mode=self.sweep.mode,
            value=spec.load or max(self.sweep.values),
            warmup_s=0.0,
            duration_s=None,
            arrival=self.sweep.arrival,
            ramp_up_s=min(self.sweep.ramp_up, spec.interval),
            stagger_rounds=self.sweep.stagger_rounds,
            drain_timeout_s=self.sweep.drain_timeout,
            max_active_users=self.sweep.max_active_users,
            first_session=self.attempt * SESSIONS_PER_ATTEMPT,
            seed=self.scenario.seed + self.attempt,
            shard=self.shard,
        )

    def shares(self) -> list[dict[str, float]]:
        plan = self._plan()
        return [{"point": 0, "load": plan.value, "share": plan.share()}]

    async def _window(self, session: ArmSession, remaining: list[int], workload: MultiUserWorkload) -> None:
        spec = self.spec
        plan = self._plan()
        accumulator = IntervalAccumulator(self.scenario.slo)
        collecting = True

        def on_record(record: RequestRecord) -> None:
            session.append(record)
            if collecting and record.phase == "measure":
                accumulator.add(record)

        # an engine kvbench started for this attempt is a new process: its counters start at zero, which is no
        # restart; an attached endpoint is the same service across attempts, so a drop in its counters is one
        carried = self.done and not engine_kind(self.scenario.engine.kind).starts_process
        previous = self.done[-1].counters if carried else None
        tracker = MetricsTracker(session.client, previous)
        await tracker.start()
        meter = await start_energy_meter(session)
        stop = asyncio.Event()
        interval_ns = int(spec.interval * NS)
        identity = RecordContext(arm=session.arm.name, attempt=self.attempt)
        load_task = asyncio.ensure_future(
            run_load(session.client, workload, plan, identity, on_record=on_record, stop=stop)
        )
        start_ns, wall_ns = time.monotonic_ns(), time.time_ns()
        target = self._fault_target(session)
        drills = (
            asyncio.ensure_future(self._drills(target, start_ns, remaining[0] * spec.interval))
            if target is not None and remaining
            else None
        )
        try:
            for position, index in enumerate(remaining):
                boundary = start_ns + (position + 1) * interval_ns
                wall_start = wall_ns + position * interval_ns
                if not await _sleep_until(boundary, load_task):
                    break  # the load failed: its exception is raised below
                if position == len(remaining) - 1:
                    # a request sent in the window counts in it however late it ends: the slowest requests are
                    # the ones still in flight at the boundary, and one the drain cancels is recorded as an error
                    stop.set()
                    await load_task
                    collecting = False
                reading = await tracker.reading()
                stats = accumulator.close(
                    index=index,
                    attempt=self.attempt,
                    start_unix_ns=wall_start,
                    duration_ns=interval_ns,
                    metrics=reading,
                )
                energy = await meter.window(boundary - interval_ns, boundary)
                stats = stats.model_copy(update={"energy": energy})
                session.sync()
                self.run_dir.append_interval(stats)
                self.done.append(stats)
                self._result().write_file(self.run_dir.soak_file)
                self.progress.advance(_interval_detail(stats))
            stop.set()
            await load_task
            if drills is not None and drills.done():
                drills.result()  # a drill that broke (not an engine that stayed down) is an error
        finally:
            stop.set()
            await meter.close()
            for task in (drills, load_task):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    async def _drills(self, target: FaultTarget, start_ns: int, offset_s: float) -> None:
        """Run each fault of ``soak.faults`` at its time (window time ``offset_s`` is ``start_ns``).

        Faults recorded by an earlier attempt, or due before this attempt's part of the window, are
        skipped; each one run is appended to ``faults.jsonl`` as it ends.
        """
        recorded = {event.index for event in self.run_dir.faults()}
        for index, fault in sorted(enumerate(self.spec.faults), key=lambda item: item[1].at):
            if index in recorded or fault.at < offset_s:
                continue
            delay_s = (start_ns + int((fault.at - offset_s) * NS) - time.monotonic_ns()) / NS
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            event = await self._drill(index, fault, target)
            self.run_dir.append_fault(event)

    async def _drill(self, index: int, fault: SoakFault, target: FaultTarget) -> FaultEvent:
        started_ns, wall_ns = time.monotonic_ns(), time.time_ns()
        recovery: float | None = None
        error: str | None = None
        try:
            recovery = await DRILLS[fault.kind](target, fault)
        except (EngineStartError, FaultUnsupported) as problem:
            # the engine stayed down: the load records the errors and the verdict says so
            error = str(problem).splitlines()[0]
        return FaultEvent(
            index=index,
            kind=fault.kind,
            attempt=self.attempt,
            at_s=fault.at,
            start_unix_ns=wall_ns,
            started_ns=started_ns,
            ended_ns=time.monotonic_ns(),
            recovery_s=recovery,
            error=error,
        )

    def _result(self) -> SoakResult:
        return build_result(
            self.run_dir,
            self.scenario,
            self.arm.name,
            self.done,
            attempts=self.attempt + 1,
            events=self.run_dir.faults(),
            deaths=self.run_dir.engines_down(),
        )


async def _kill(target: FaultTarget, fault: SoakFault) -> float | None:
    return await target.kill_engine()


async def _pause(target: FaultTarget, fault: SoakFault) -> float | None:
    await target.pause_engine(fault.duration or 0.0)
    return None


async def _restart_tier(target: FaultTarget, fault: SoakFault) -> float | None:
    return await target.restart_tier()


DRILLS: dict[str, Callable[[FaultTarget, SoakFault], Awaitable[float | None]]] = {
    "kill_engine": _kill,
    "pause_engine": _pause,
    "restart_tier": _restart_tier,
}
"""What each ``soak.faults`` kind does to the running engine; returns the recovery time, if any."""


async def _sleep_until(deadline_ns: int, load_task: asyncio.Future[Any]) -> bool:
    """Sleep until ``deadline_ns`` (monotonic); False if the load task ended first."""
    delay = (deadline_ns - time.monotonic_ns()) / NS
    if delay > 0:
        done, _ = await asyncio.wait({load_task}, timeout=delay)
        if done:
            return False
    return not load_task.done()
