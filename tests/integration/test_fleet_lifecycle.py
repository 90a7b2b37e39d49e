"""A fleet starts its replicas together and stops every one of them when any fails (a real busy port)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import aiohttp
import pytest

from common.errors import EngineStartError
from harness.engines.base import LaunchContext
from harness.engines.fleet import Fleet
from harness.engines.process import free_port
from harness.sim.config import SimEngineConfig
from offload.profiles import resolve_profile

pytestmark = pytest.mark.integration


def _two_free_ports() -> int:
    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two adjacent free ports")


def _context(tmp_path: Path) -> LaunchContext:
    return LaunchContext(arm="A", profile=resolve_profile("cpu"), log_dir=tmp_path / "A", prefix_caching=True)


def test_one_replica_failing_stops_the_others(tmp_path: Path) -> None:
    port = _two_free_ports()
    config = SimEngineConfig(
        kind="sim", model="llama-3.1-8b", hardware="h100-sxm", replicas=2, port=port, startup_timeout_s=30
    )
    with socket.socket() as busy:  # replica 1 wants port + 1: taken
        busy.bind(("127.0.0.1", port + 1))
        busy.listen()

        async def start() -> None:
            async with Fleet(config, _context(tmp_path)):
                raise AssertionError("the fleet must not start with a replica down")

        with pytest.raises(EngineStartError, match="replica 1"):
            asyncio.run(start())
    assert "$ " in (tmp_path / "A" / "replica-0" / "engine.log").read_text()  # replica 0 was started...
    with socket.socket() as again:  # ...and stopped: its port is free again
        again.bind(("127.0.0.1", port))


def test_replicas_run_on_their_own_ports_and_stop_on_exit(tmp_path: Path) -> None:
    config = SimEngineConfig(kind="sim", model="llama-3.1-8b", hardware="h100-sxm", replicas=3)

    async def run() -> list[str]:
        async with Fleet(config, _context(tmp_path)) as fleet, aiohttp.ClientSession() as session:
            urls = [replica.endpoint.base_url for replica in fleet.replicas]
            for url in urls:
                async with session.get(url + "/health") as response:
                    assert response.status == 200
        return urls

    urls = asyncio.run(run())
    assert len(set(urls)) == 3
    assert all((tmp_path / "A" / f"replica-{i}" / "engine.log").exists() for i in range(3))
    for url in urls:  # every replica process is gone after the fleet exits
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", int(url.rsplit(":", 1)[1])))
