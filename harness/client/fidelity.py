"""Client fidelity: how far behind its own schedule the process sending the load fell.

A client that cannot keep up reports its own backlog as the engine's latency. Each process that sends
requests (the load runner's, and every :class:`~harness.client.pool.ProcessClientPool` worker) runs one
:class:`LoopMonitor`: a task that sleeps ``tick_s`` (10 ms) at a time and records, per tick,

* the **event-loop delay**: ``woke_ns − due_ns``, how late the sleep returned (ns). A loop busy parsing
  chunks or building prompts wakes late; an idle one wakes within a fraction of a millisecond;
* the process's CPU time (``time.process_time_ns()``), so that over a window
  ``cpu_fraction = Δ CPU time / Δ wall time``: the share of one core the process used (a single event loop
  cannot use more than about 1.0 of it).

:meth:`LoopMonitor.over` summarises the ticks inside a window (monotonic ns) as a :class:`LoopLag`. The
ticks are kept in a bounded buffer (:data:`MAX_TICKS`, about 67 minutes at 10 ms), so a soak's monitor stays
small; a window older than that reads only the ticks still kept.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

TICK_S = 0.01
"""How often the monitor wakes (s): event-loop delay is resolved to about this much CPU time."""
MAX_TICKS = 400_000
"""Ticks kept (about 67 minutes at 10 ms)."""

Role = Literal["runner", "worker"]
"""``runner``: the process whose loop runs the sessions (and, without a pool, the requests); ``worker``: a
client pool's process that only sends requests."""


def percentile_ns(values: Sequence[int], q: float) -> int:
    """The ``q``-th percentile (0-100) of ``values`` by the nearest-rank method: the smallest value with at least
    ``q`` % of the values at or below it (an observed value, never an interpolation)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class LoopLag:
    """One process's event-loop delay and CPU use over a window (ns)."""

    pid: int
    role: Role
    ticks: int
    delay_p99_ns: int | None
    delay_max_ns: int | None
    cpu_ns: int
    wall_ns: int

    @property
    def cpu_fraction(self) -> float | None:
        """CPU time / wall time: the share of one core the process used."""
        return self.cpu_ns / self.wall_ns if self.wall_ns > 0 else None


class LoopMonitor:
    """Samples the running event loop's delay and the process's CPU time every ``tick_s``; ``async with``."""

    def __init__(self, role: Role, tick_s: float = TICK_S) -> None:
        if tick_s <= 0:
            raise ValueError("tick_s must be positive")
        self.role = role
        self._tick_ns = int(tick_s * 1e9)
        # (woke_ns, delay_ns, cpu_ns) per tick
        self._ticks: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=MAX_TICKS)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopMonitor:
        self._ticks.append((time.monotonic_ns(), 0, time.process_time_ns()))
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        due = time.monotonic_ns() + self._tick_ns
        while True:
            await asyncio.sleep(max(0, due - time.monotonic_ns()) / 1e9)
            woke = time.monotonic_ns()
            self._ticks.append((woke, max(0, woke - due), time.process_time_ns()))
            # the next tick is due a tick after this wake-up: one late wake-up is counted once, not again by
            # every tick it pushed back
            due = woke + self._tick_ns

    def over(self, start_ns: int, end_ns: int) -> LoopLag:
        """The ticks that woke inside [start_ns, end_ns], and the CPU time between the first and last of them."""
        inside = [tick for tick in self._ticks if start_ns <= tick[0] <= end_ns]
        if not inside:  # a window shorter than a tick (or a loop too busy to tick): the closest tick after it
            inside = [tick for tick in self._ticks if tick[0] >= start_ns][:1]
        delays = [delay for _, delay, _ in inside]
        first, last = (inside[0], inside[-1]) if inside else ((start_ns, 0, 0), (start_ns, 0, 0))
        return LoopLag(
            pid=os.getpid(),
            role=self.role,
            ticks=len(inside),
            delay_p99_ns=percentile_ns(delays, 99) if delays else None,
            delay_max_ns=max(delays) if delays else None,
            cpu_ns=last[2] - first[2],
            wall_ns=last[0] - first[0],
        )


@runtime_checkable
class LagReporting(Protocol):
    """A client whose requests run in other processes, which can say how far behind each of them fell."""

    async def loop_lag(self, start_ns: int, end_ns: int) -> list[LoopLag]:
        """Each worker process's :class:`LoopLag` over the window."""
        ...
