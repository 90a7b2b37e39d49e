"""An engine restart mid-arm is visible in /metrics: the real simulator, SIGKILLed and restarted by kvbench.

This is the evidence the ``engine_restarted`` validity gate and the soak's restart criterion read:
the process start time (``process_start_time_seconds``) moves even when no counter has grown yet.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from harness.client.scrape import counter_totals, parse_metrics, restarted
from harness.engines.base import FaultTarget, LaunchContext
from harness.sim.config import SimEngineConfig
from harness.sim.engine import SimEngine
from offload.profiles import BUILTIN_PROFILES

pytestmark = pytest.mark.integration


async def _totals(base_url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(base_url + "/metrics") as response:
        return counter_totals(parse_metrics(await response.text()))


async def test_a_killed_and_restarted_simulator_shows_as_restarted(tmp_path: Path) -> None:
    config = SimEngineConfig(kind="sim", model="llama-3.1-8b", hardware="h100-sxm")
    context = LaunchContext(arm="ON", profile=BUILTIN_PROFILES["cpu"], log_dir=tmp_path, prefix_caching=True)
    async with SimEngine(config, context) as running:
        assert isinstance(running, FaultTarget)
        before = await _totals(running.endpoint.base_url)
        same = await _totals(running.endpoint.base_url)
        assert "process_start_time_seconds" in before and not restarted(before, same)
        first_pid = running.pid
        recovery_s = await running.kill_engine()
        assert recovery_s > 0 and running.pid != first_pid
        after = await _totals(running.endpoint.base_url)
        assert restarted(before, after)
