"""The energy meter a runner wraps its measurement windows in: one call, whatever the engine kind.

``async with energy_meter(session) as meter: window = await run_load(...)``, then
``energy = await meter.window(window.window_start_ns, window.window_end_ns)`` gives the
:class:`~harness.client.power.EnergyWindow` to store with the window (a sweep's ``PointDone.energy``);
:func:`harness.results.energy.energy_sample` turns it into joules per token and agents per kW.

Which source meters is the engine kinds registry's decision (:func:`harness.engines.kinds.power_source`):
the simulator's power model for ``kind: sim``, NVML on the engine's GPUs for a kind kvbench starts on this
machine's GPUs, none otherwise. Energy never fails a run: a source that raises gives a window that says
why in ``not_sampled``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import aiohttp

from harness.client.power import EnergyWindow, NotSampled, PowerSource
from harness.engines.kinds import power_source

from .spine import ArmSession

log = logging.getLogger(__name__)


class EnergyMeter:
    """A started :class:`PowerSource` whose failures become ``not_sampled`` windows."""

    def __init__(self, source: PowerSource) -> None:
        self.source = source
        self.failed: str | None = None

    async def window(self, start_ns: int, end_ns: int) -> EnergyWindow:
        """The GPUs' energy from ``start_ns`` to ``end_ns`` (monotonic ns inside the metered span)."""
        if self.failed is not None:
            return await NotSampled(self.source.source, self.failed).window(start_ns, end_ns)
        try:
            return await self.source.window(start_ns, end_ns)
        except Exception as error:  # noqa: BLE001 - energy is a side measurement: it never fails a run
            log.warning("energy not sampled: %s: %s", type(error).__name__, error)
            reason = f"the power source failed: {type(error).__name__}: {error}"
            return await NotSampled(self.source.source, reason).window(start_ns, end_ns)

    async def close(self) -> None:
        """Stop sampling (the readings stay, so windows that ended before can still be integrated)."""
        if self.failed is not None:
            return
        try:
            await self.source.stop()
        except Exception as error:  # noqa: BLE001 - as in window
            log.warning("power source did not stop cleanly: %s: %s", type(error).__name__, error)


def session_power_source(session: ArmSession) -> PowerSource:
    """The power source of ``session``'s engine (its /metrics read straight from the client, so the
    session's own scrapes, which watch for engine restarts, see nothing extra)."""

    async def scrape() -> str | None:
        try:
            return await session.client.metrics_text()
        except (aiohttp.ClientError, TimeoutError):
            return None

    return power_source(session.runner.scenario.engine, scrape)


async def start_energy_meter(session: ArmSession, source: PowerSource | None = None) -> EnergyMeter:
    """A started meter of ``session``'s engine (``source``: the session's, by default); :meth:`EnergyMeter.close`
    ends it. For a runner whose window already sits in a ``try``/``finally``; others use :func:`energy_meter`."""
    meter = EnergyMeter(source if source is not None else session_power_source(session))
    try:
        await meter.source.start()
    except Exception as error:  # noqa: BLE001 - as in EnergyMeter.window
        log.warning("energy not sampled: %s: %s", type(error).__name__, error)
        meter.failed = f"the power source did not start: {type(error).__name__}: {error}"
    return meter


@contextlib.asynccontextmanager
async def energy_meter(session: ArmSession, source: PowerSource | None = None) -> AsyncIterator[EnergyMeter]:
    """Meter the GPUs' energy while the block runs (``source``: the session's, by default)."""
    meter = await start_energy_meter(session, source)
    try:
        yield meter
    finally:
        await meter.close()
