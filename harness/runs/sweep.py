"""``kvbench sweep``: the multi-user workload over a grid of loads, per arm, into capacity curves.

What differs from the other run kinds (the spine, :mod:`.spine`, does the rest): per arm, after
the warm-up, the engine's prefix cache is reset; then, for each pending load point, the users' contexts
of that point are built (fresh per point in a salted run, so a point's users never find a previous
point's context KV: :meth:`~workloads.multi_user.MultiUserWorkload.at_point`), a shard waits for the point's
common start (:meth:`~.spine.Runner.wait_for_point`), and the point runs one
:func:`~harness.runs.load.run_load` window (warm-up seconds, then the measured window) with
``/metrics`` scraped at the window's edges and the GPUs' energy metered
(:mod:`.energy`), and appends a
:class:`~harness.store.events.PointDone` to ``points.jsonl``. The result (``sweep.json``) is
:func:`harness.results.sweep.sweep_result_of` of the stored files; the curves are drawn by reports.

A killed sweep keeps its records and finished points; ``kvbench sweep --resume RUN_DIR`` re-runs only
the points without a PointDone (the engine of an arm with work left starts again).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

from common.errors import KvbenchError
from harness.client.pool import ProcessClientPool, StreamingClient
from harness.engines.base import stall_limit
from harness.results.sweep import sweep_result_of
from harness.results.sweep_result import SweepResult
from harness.scenario.spec import SweepSpec
from workloads.config import MultiUserQA
from workloads.multi_user import MultiUserWorkload

from .load import LoadPlan, RecordContext, run_load
from .points import SESSIONS_PER_POINT, PointGridRunner
from .shard import SETUP_ALLOWANCE_S, START_LEAD_S
from .spine import ArmSession

log = logging.getLogger(__name__)


class SweepRunner(PointGridRunner[SweepResult]):
    """Runs a multi-user scenario's sweep into a run directory."""

    verb = "sweep"
    unit = "points"
    _workload: MultiUserWorkload | None = None

    @property
    def config(self) -> MultiUserQA:
        return self.scenario.load_workload

    @property
    def spec(self) -> SweepSpec:
        if self.scenario.sweep is None:  # the scenario validator already requires it
            raise KvbenchError(f"scenario {self.scenario.name!r} has no sweep section")
        return self.scenario.sweep

    def grid_size(self) -> int:
        return len(self.spec.values)

    def connections(self) -> int:
        if self.spec.mode == "concurrency":
            return int(max(self.spec.values)) + 8
        return self.spec.max_active_users + 8

    def point_period_s(self) -> float:
        spec = self.spec
        return spec.warmup + spec.duration + spec.drain_timeout + SETUP_ALLOWANCE_S

    def shares(self) -> list[dict[str, float]]:
        values = enumerate(self.spec.values)
        return [{"point": index, "load": value, "share": self._plan(index).share()} for index, value in values]

    def _plan(self, index: int) -> LoadPlan:
        return LoadPlan.from_sweep(
            self.spec,
            self.spec.values[index],
            first_session=index * SESSIONS_PER_POINT,
            seed=self.scenario.seed,
            shard=self.shard,
        )

    def result_of(self) -> SweepResult:
        return sweep_result_of(self.run_dir)

    def _workload_for(self, session: ArmSession) -> MultiUserWorkload:
        """One workload (and text cache) for the whole sweep; each arm's engine tokenizes for it."""
        if self._workload is None:
            self._workload = MultiUserWorkload(
                self.config, session.tokenizer, seed=self.scenario.seed, salt=self.prompt_salt
            )
        else:
            self._workload.tokenizer = session.tokenizer
        return self._workload

    async def run_arm(self, session: ArmSession) -> None:
        arm, config, spec = session.arm, self.config, self.spec
        self.progress.describe(f"{arm.name}: warming up")
        await session.warm_up(config.warmup_requests, api=config.api, ignore_eos=config.ignore_eos, tag="sweep-warmup")
        workload = self._workload_for(session)
        await session.reset_prefix_cache(required=False)
        async with contextlib.AsyncExitStack() as stack:
            sender: StreamingClient = session.client
            if spec.client_workers > 1:
                sender = await stack.enter_async_context(
                    ProcessClientPool(
                        session.engine.endpoint,
                        workers=spec.client_workers,
                        timeout_s=config.request_timeout_s,
                        stall_timeout_s=stall_limit(config.stall_timeout_s, session.engine),
                        max_connections=self.connections(),
                    )
                )
            for index in self.pending()[arm.name]:
                workload.at_point(index)
                self.progress.describe(f"{arm.name}: building {config.users} user contexts")
                await workload.prepare()
                if spec.reset_between_points:
                    await session.reset_prefix_cache(required=False)
                start = await self.wait_for_point(session, index, START_LEAD_S)
                await session.while_alive(self._run_point(session, index, sender, workload, start))

    async def _run_point(
        self,
        session: ArmSession,
        index: int,
        sender: StreamingClient,
        workload: MultiUserWorkload,
        start_unix_s: float | None,
    ) -> None:
        """One load point, its load from ``start_unix_s`` (None: at once): ``sender`` carries the load, the session's
        client scrapes /metrics."""
        spec, arm = self.spec, session.arm
        value = spec.values[index]
        plan = dataclasses.replace(self._plan(index), start_unix_s=start_unix_s)
        unit = "users" if spec.mode == "concurrency" else "req/s"
        window = await self.measure_point(
            session,
            index,
            value,
            label=f"{arm.name} @ {value:g} {unit}",
            warmup_s=spec.warmup,
            window_s=spec.duration,
            noun="requests",
            start_unix_s=start_unix_s,
            drive=lambda on_record, on_tick: run_load(
                sender,
                workload,
                plan,
                RecordContext(arm=arm.name, attempt=self.attempt, point=index),
                on_record=on_record,
                on_tick=on_tick,
                tick_s=0.5,
            ),
        )
        self.progress.advance(f"{arm.name} @ {value:g} {unit}: {window.measured} measured")
        if window.measured == 0:
            log.warning("arm %s, load %g: no request was sent inside the window", arm.name, value)
