"""The simulator's real-time loops (one core, or a P/D cluster) when their task fails: every request in flight
ends with an error naming the failure, and the loop refuses new work instead of accepting requests no one serves."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from harness.sim.disagg import Cluster, ClusterLoop, Disaggregation
from harness.sim.scheduler import EngineCore, EngineLoop, ErrorEvent, Event, RealTimeLoop, SimRequest
from harness.sim.settings import SimSettings

SETTINGS = SimSettings(model="llama-3.1-8b", hardware="h100-sxm")


def core_loop() -> tuple[RealTimeLoop, object]:
    core = EngineCore(SETTINGS)
    return EngineLoop(core), core


def cluster_loop() -> tuple[RealTimeLoop, object]:
    cluster = Cluster(SETTINGS, Disaggregation())
    return ClusterLoop(cluster), cluster


@pytest.mark.parametrize(("make", "method"), [(core_loop, "plan"), (cluster_loop, "next_event_time")])
async def test_a_failed_loop_ends_every_request_in_flight_and_refuses_new_ones(
    make: Callable[[], tuple[RealTimeLoop, object]], method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop, engine = make()
    events: list[Event] = []
    request = SimRequest("r", list(range(1000)), 64, events.append)
    loop.start()
    try:
        loop.submit(request)

        def broken(*args: object) -> None:
            raise ValueError("a modelled step broke")

        monkeypatch.setattr(engine, method, broken)
        loop._wake.set()
        for _ in range(200):
            if loop.failure is not None:
                break
            await asyncio.sleep(0.01)
        assert isinstance(loop.failure, ValueError)
        errors = [event for event in events if isinstance(event, ErrorEvent)]
        assert len(errors) == 1 and "a modelled step broke" in str(errors[0]), events
        with pytest.raises(RuntimeError, match="the simulated engine has failed"):
            loop.submit(SimRequest("late", [1, 2, 3], 4, events.append))
    finally:
        await loop.stop()
