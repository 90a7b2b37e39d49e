"""kvbench measures only a server it started: a real busy port held by a decoy HTTP server.

The decoy is a real ``http.server`` in a thread that answers ``GET /health`` (and ``/healthcheck``)
with 200, as another engine left running would. Each test checks one of the three guards of
:mod:`harness.engines.process`: the busy-port refusal before the start (simulator, LMCache
sidecar), the listening-socket owner check after ``/health`` answered (the race where another
server takes the port between the pick and the bind), and the simulator's per-launch token.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from common.errors import EngineStartError
from harness.engines.base import LaunchContext
from harness.engines.lmcache_server import LmcacheServer
from harness.engines.process import EPHEMERAL_RANGE_FILE, PICK_LOW, ManagedProcess, ProcessSpec, free_port, port_busy
from harness.engines.vllm_offload import LmcacheServerSpec
from harness.sim.config import SimEngineConfig
from harness.sim.engine import SimEngine
from offload.profiles import BUILTIN_PROFILES
from tests.fakes.serving import serving


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def decoy() -> Iterator[int]:
    """A real HTTP server on a real port that answers every GET with 200; yields its port."""
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)) as server:
        yield int(server.server_address[1])


def _context(tmp_path: Path) -> LaunchContext:
    return LaunchContext(arm="ON", profile=BUILTIN_PROFILES["cpu"], log_dir=tmp_path, prefix_caching=True)


def test_port_busy_sees_the_decoy_and_not_a_free_port(decoy: int) -> None:
    assert port_busy(decoy)
    assert not port_busy(free_port())


async def test_simulator_refuses_a_configured_port_held_by_another_server(decoy: int, tmp_path: Path) -> None:
    config = SimEngineConfig(kind="sim", model="llama-3.1-8b", hardware="h100-sxm", port=decoy)
    with pytest.raises(EngineStartError, match=f"port {decoy} is already in use"):
        async with SimEngine(config, _context(tmp_path)):
            pytest.fail("the simulator must not be taken as healthy on a decoy's port")
    assert not (tmp_path / "engine.log").exists(), "nothing may be started on a busy port"


async def test_lmcache_sidecar_refuses_a_busy_port(decoy: int, tmp_path: Path) -> None:
    spec = LmcacheServerSpec(
        host="127.0.0.1",
        port=free_port(),
        http_port=decoy,
        prometheus_port=free_port(),
        l1_size_gb=1.0,
        chunk_size=256,
    )
    with pytest.raises(EngineStartError, match=f"port {decoy} is already in use"):
        async with LmcacheServer(spec, python=sys.executable, log_path=tmp_path / "lmcache.log"):
            pytest.fail("the sidecar must not be taken as healthy on a decoy's port")


def _silent_process(tmp_path: Path, health_port: int, *, launch_token: bool) -> ManagedProcess:
    """A real process that listens nowhere, whose health URL is the decoy's port (the port-race case)."""
    return ManagedProcess(
        ProcessSpec(
            name="engine under test",
            argv=(sys.executable, "-c", "import time; time.sleep(60)"),
            env={},
            log_path=tmp_path / "engine.log",
            health_url=f"http://127.0.0.1:{health_port}/health",
            startup_timeout_s=10.0,
            stop_grace_s=1.0,
            ports=(free_port(),),  # the pick was free: another server took the health port afterwards
            launch_token=launch_token,
        )
    )


async def test_a_health_answer_from_a_socket_the_engine_does_not_hold_is_refused(decoy: int, tmp_path: Path) -> None:
    process = _silent_process(tmp_path, decoy, launch_token=False)
    with pytest.raises(EngineStartError, match=rf"port {decoy} is held by pid \d+ .*not by the process kvbench"):
        async with process:
            pytest.fail("a decoy's /health must not count")
    assert process.returncode() is not None, "the started process is stopped after the refusal"


async def test_a_health_answer_without_this_launch_token_is_refused(decoy: int, tmp_path: Path) -> None:
    with pytest.raises(EngineStartError, match="no launch token"):
        async with _silent_process(tmp_path, decoy, launch_token=True):
            pytest.fail("a decoy's /health must not count")


async def test_the_simulator_kvbench_starts_is_recognised_as_its_own(tmp_path: Path) -> None:
    config = SimEngineConfig(kind="sim", model="llama-3.1-8b", hardware="h100-sxm")
    async with SimEngine(config, _context(tmp_path)) as running:
        assert running.endpoint.base_url.startswith("http://127.0.0.1:")


def test_kvbench_picks_its_ports_below_the_kernels_ephemeral_range(tmp_path: Path) -> None:
    """Every process binding port 0 (vLLM's ZMQ and torch.distributed sockets) gets a port of the ephemeral
    range, so a port picked there for a sidecar could be taken before the sidecar started (seen once in CI); picks
    below the range are not handed to anyone else, and one kvbench process never hands out a port twice."""
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n", encoding="ascii")
    picked = [free_port(range_file=ranges) for _ in range(50)]
    assert all(PICK_LOW <= port < 32768 for port in picked)
    assert len(set(picked)) == len(picked)
    assert not any(port_busy(port) for port in picked)


def test_without_room_below_the_ephemeral_range_the_kernel_picks(tmp_path: Path) -> None:
    cramped = tmp_path / "cramped"
    cramped.write_text(f"{PICK_LOW + 10} 60999\n", encoding="ascii")
    unreadable = tmp_path / "absent"
    kernel_low = int(EPHEMERAL_RANGE_FILE.read_text().split()[0]) if EPHEMERAL_RANGE_FILE.exists() else 1024
    for range_file in (cramped, unreadable):
        port = free_port(range_file=range_file)
        assert port >= kernel_low  # bound to port 0: the kernel's pick
        assert not port_busy(port)
