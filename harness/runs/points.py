"""A grid of load points per arm, each a measured window that ends in a ``PointDone``: what ``kvbench sweep``
(:mod:`.sweep`) and its agentic kind (:mod:`.agentic`) share.

A point is done once ``points.jsonl`` holds its :class:`~harness.store.events.PointDone`, so a resumed sweep
runs only the points still pending. The event carries the window as the load driver measured it and the
engine's cache counters over the window: ``/metrics`` scraped once the warm-up has passed and again after the
drain (:func:`cache_counter_deltas` of the two pages).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from abc import abstractmethod
from collections.abc import Awaitable, Callable

from harness.client.scrape import cache_counter_deltas
from harness.scenario.spec import Arm
from harness.store.events import PointDone
from harness.store.records import RequestRecord

from .energy import energy_meter
from .load import LoadWindow
from .shard import seconds_until
from .spine import ArmSession, ResultT, Runner

log = logging.getLogger(__name__)

SESSIONS_PER_POINT = 1_000_000
"""Point ``p`` numbers its sessions from ``p × SESSIONS_PER_POINT``: new conversations per point."""


class PointGridRunner(Runner[ResultT]):
    """A runner whose work is ``grid_size()`` load points per arm."""

    @abstractmethod
    def grid_size(self) -> int:
        """Load points per arm."""

    def pending(self) -> dict[str, list[int]]:
        """Per arm, the indexes of its points without a PointDone."""
        done = {event.key for event in self.run_dir.points()}
        return {
            arm.name: [i for i in range(self.grid_size()) if (arm.name, i) not in done] for arm in self.scenario.arms
        }

    def arms_with_work(self) -> list[Arm]:
        plan = self.pending()
        return [arm for arm in self.selected_arms() if plan[arm.name]]

    def work(self) -> tuple[int, int]:
        arms = self.selected_arms()
        plan = self.pending()
        total = len(arms) * self.grid_size()
        return total, total - sum(len(plan[arm.name]) for arm in arms)

    async def measure_point(
        self,
        session: ArmSession,
        index: int,
        load: float,
        *,
        label: str,
        warmup_s: float,
        window_s: float,
        noun: str,
        drive: Callable[[Callable[[RequestRecord], None], Callable[[int], None]], Awaitable[LoadWindow]],
        start_unix_s: float | None = None,
    ) -> LoadWindow:
        """One load point, from its progress step to its stored PointDone; ``drive(on_record, on_tick)`` sends the
        load and returns its window, its load from ``start_unix_s`` (None: at once; a shard's common start). ``noun``
        names what is sent in the progress texts ("requests", "calls")."""
        arm = session.arm
        total_s = warmup_s + window_s
        self.progress.describe(f"{arm.name}: point {index + 1}/{self.grid_size()}")
        self.progress.begin_step(label, total_s)
        count = 0
        started = time.monotonic_ns()

        def on_record(record: RequestRecord) -> None:
            nonlocal count
            session.append(record)
            count += 1

        def on_tick(now_ns: int) -> None:
            self.progress.tick(min((now_ns - started) / 1e9, total_s), f"{count} {noun}")

        async with energy_meter(session) as meter:
            before_task = asyncio.ensure_future(scrape_after(session, seconds_until(start_unix_s) + warmup_s))
            try:
                window = await drive(on_record, on_tick)
                before = await before_task
            finally:
                before_task.cancel()
            energy = await meter.window(window.window_start_ns, window.window_end_ns)
        after = await session.scrape()
        session.sync()
        done = point_done(arm.name, index, load, self.attempt, window, before, after)
        self.run_dir.append_point(done.model_copy(update={"energy": energy}))
        self.progress.end_step()
        return window


def point_done(
    arm: str, index: int, value: float, attempt: int, window: LoadWindow, before: str | None, after: str | None
) -> PointDone:
    """The point's event: its window and the cache counter deltas between two /metrics pages (None: unscraped)."""
    metrics = None
    if before is not None and after is not None:
        try:
            metrics = cache_counter_deltas(before, after)
        except ValueError as error:
            log.warning("unparseable /metrics page (%s); no cache statistics for this point", error)
    # the event stores the window as the driver reported it (PointDone's fields are LoadWindow's)
    return PointDone(arm=arm, point=index, load=value, attempt=attempt, metrics=metrics, **dataclasses.asdict(window))


async def scrape_after(session: ArmSession, delay_s: float) -> str | None:
    """The engine's /metrics page once ``delay_s`` (the warm-up) has passed."""
    await asyncio.sleep(delay_s)
    return await session.scrape()
