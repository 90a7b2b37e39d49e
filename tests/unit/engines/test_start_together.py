"""Starting an engine and its sidecar at once (:func:`harness.engines.process.start_together`).

vLLM and its LMCache server start together to save the sidecar's start-up time; what must not change
is what a failure looks like. Against tests/fakes/fake_engine.py: both are spawned without waiting for
each other; a sidecar that fails is named, with its log, and the engine is stopped; an engine that
fails stops the sidecar; an engine failing after its sidecar died is blamed on the sidecar (first in
dependency order); a start
cancelled half-way stops both. A fleet's shared server, started by the fleet and waited for by every
replica, fails each replica with its own error and stops it; a replica counts as started only once the
shared server is healthy too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from pathlib import Path

import pytest

from common.errors import EngineStartError
from harness.engines.process import ManagedProcess, start_together
from tests.support import fake_engine_spec


def fake(tmp_path: Path, name: str, *args: str, timeout: float = 20.0) -> ManagedProcess:
    return ManagedProcess(
        fake_engine_spec(tmp_path / f"{name.replace(' ', '-')}.log", *args, name=name, startup_timeout_s=timeout)
    )


def stopped(process: ManagedProcess) -> bool:
    """Spawned, and no longer running (stop() reaps it)."""
    return process.pid is not None and process.returncode() is not None


async def test_both_become_healthy_and_keep_running(tmp_path: Path) -> None:
    sidecar = fake(tmp_path, "sidecar", "--startup-delay-s", "0.5")
    engine = fake(tmp_path, "engine", "--startup-delay-s", "0.5")
    try:
        await start_together([sidecar, engine])
        assert sidecar.returncode() is None and engine.returncode() is None
    finally:
        await engine.stop()
        await sidecar.stop()
    assert stopped(sidecar) and stopped(engine)


async def test_a_failing_sidecar_is_named_with_its_log_and_the_engine_stopped(tmp_path: Path) -> None:
    sidecar = fake(tmp_path, "LMCache server", "--mode", "crash-at-start")
    engine = fake(tmp_path, "vLLM", "--startup-delay-s", "30")  # would not be healthy within the test
    with pytest.raises(EngineStartError) as caught:
        await start_together([sidecar, engine])
    message = str(caught.value)
    assert message.startswith("LMCache server exited with code 3 before becoming healthy")
    assert str(tmp_path / "LMCache-server.log") in message and "CUDA out of memory" in message
    assert stopped(engine)  # it was started without waiting for the sidecar, and stopped with it


async def test_a_failing_engine_stops_its_sidecar(tmp_path: Path) -> None:
    sidecar = fake(tmp_path, "LMCache server")
    engine = fake(tmp_path, "vLLM", "--mode", "crash-at-start")
    with pytest.raises(EngineStartError) as caught:
        await start_together([sidecar, engine])
    assert str(caught.value).startswith("vLLM exited with code 3 before becoming healthy")
    assert str(tmp_path / "vLLM.log") in str(caught.value)
    assert stopped(sidecar)


async def test_an_engine_failing_after_its_sidecar_died_is_blamed_on_the_sidecar(tmp_path: Path) -> None:
    # the sidecar dies at once, but its health check hangs on a socket that never answers (as on a loaded
    # machine), so the engine's failure is seen first: the sidecar that had died must still be named first
    with socket.socket() as hang:
        hang.bind(("127.0.0.1", 0))
        hang.listen()
        sidecar = fake(tmp_path, "LMCache server", "--mode", "crash-at-start")
        own_port = int(sidecar.spec.health_port or 0)  # checked free before the start, as the hanging one is not
        hanging = f"http://127.0.0.1:{hang.getsockname()[1]}/"
        sidecar.spec = dataclasses.replace(sidecar.spec, health_url=hanging, ports=(own_port,))
        engine = fake(tmp_path, "vLLM", "--mode", "never-healthy", timeout=2.0)
        with pytest.raises(EngineStartError) as caught:
            await start_together([sidecar, engine])
    message = str(caught.value)
    assert message.startswith("LMCache server exited with code 3 before becoming healthy"), message
    assert str(tmp_path / "LMCache-server.log") in message
    assert "also failed: vLLM not healthy after 2 s" in message
    assert stopped(engine)


async def test_a_cancelled_start_stops_both(tmp_path: Path) -> None:
    sidecar = fake(tmp_path, "sidecar", "--startup-delay-s", "30")
    engine = fake(tmp_path, "engine", "--startup-delay-s", "30")
    task = asyncio.ensure_future(start_together([sidecar, engine]))
    while sidecar.pid is None or engine.pid is None:
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stopped(sidecar) and stopped(engine)


async def test_a_shared_server_that_fails_stops_the_processes_and_is_named_first(tmp_path: Path) -> None:
    shared = fake(tmp_path, "shared LMCache server", "--mode", "crash-at-start")
    ready = asyncio.ensure_future(shared.start())  # owned by the fleet, awaited by every replica
    replicas = [fake(tmp_path, f"vLLM replica {index}", "--startup-delay-s", "30") for index in (0, 1)]
    results = await asyncio.gather(*(start_together([r], after=[ready]) for r in replicas), return_exceptions=True)
    for result in results:
        assert isinstance(result, EngineStartError)
        assert str(result).startswith("shared LMCache server exited with code 3 before becoming healthy")
        assert str(tmp_path / "shared-LMCache-server.log") in str(result)
    assert all(stopped(replica) for replica in replicas)


async def test_the_processes_count_as_started_only_once_the_shared_server_is(tmp_path: Path) -> None:
    shared = fake(tmp_path, "shared LMCache server", "--startup-delay-s", "1.5")
    engine = fake(tmp_path, "vLLM")
    ready = asyncio.ensure_future(shared.start())
    try:
        await start_together([engine], after=[ready])
        assert ready.done() and ready.exception() is None
        assert engine.returncode() is None
    finally:
        await engine.stop()
        await shared.stop()
