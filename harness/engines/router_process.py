"""Starting and stopping the router process of a fleet (``routing.router``, :mod:`harness.engines.routers`).

``async with start_router(spec, worker_urls, log_dir) as router:`` runs the router kind's argv
(never a shell) in its own process group through :class:`~harness.engines.process.ManagedProcess`:
both of its ports (HTTP, Prometheus) picked free on 127.0.0.1 and checked free, healthy when
``GET <health_path>`` answers 200 from a socket its own process holds, log in
``<log_dir>/router.log``. :func:`check_router` runs first, before any replica starts (a missing
router should not cost an engine start-up): it finds the router's python and reads the router's
version from it (``importlib.metadata``), so the manifest names the router that ran, not the one
kvbench was built against. The fleet starts the router after every replica is healthy and stops
it before the replicas.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.errors import EngineStartError

from .common import probe_python
from .process import ManagedProcess, ProcessSpec, free_port
from .routers import ROUTER_PYTHON_ENV, RouterSpec

LOG_NAME = "router.log"
VERSION_MARKER = "KVBENCH_ROUTER_VERSION="


@dataclass(frozen=True)
class RunningRouter:
    """A started router: where to send requests, and what the manifest says about it."""

    base_url: str
    metrics_url: str
    command: tuple[str, ...]
    version: str
    label: str
    policy: str


def router_python(spec: RouterSpec) -> str:
    """``spec.python``, else ``$KVBENCH_ROUTER_PYTHON``; EngineStartError when neither is set."""
    python = spec.python or os.environ.get(ROUTER_PYTHON_ENV)
    if not python:
        raise EngineStartError(
            f"routing.router: no python for {spec.kind}: set routing.router.python or ${ROUTER_PYTHON_ENV} "
            f"to the python of a virtualenv with pip package {spec.row.distribution!r}"
        )
    return python


async def router_version(spec: RouterSpec, python: str) -> str:
    script = f"import importlib.metadata as m; print({VERSION_MARKER!r} + m.version({spec.row.distribution!r}))"

    def hint(exe: str, problem: str) -> str:
        return f"routing.router: {exe} cannot run {spec.kind} (pip install {spec.row.distribution} there): {problem}"

    return await probe_python(python, script, VERSION_MARKER, what="a version look-up", timeout_s=60.0, hint=hint)


@dataclass(frozen=True)
class RouterInstall:
    """A router kind's python and the version it runs, checked before any replica starts."""

    spec: RouterSpec
    python: str
    version: str


async def check_router(spec: RouterSpec) -> RouterInstall:
    """EngineStartError now, rather than after the replicas' start-up, when the router cannot run."""
    python = router_python(spec)
    return RouterInstall(spec, python, await router_version(spec, python))


@contextlib.asynccontextmanager
async def start_router(
    install: RouterInstall, worker_urls: Sequence[str], log_dir: Path
) -> AsyncIterator[RunningRouter]:
    spec, python = install.spec, install.python
    port, metrics_port = free_port(), free_port()
    while metrics_port == port:
        metrics_port = free_port()
    row = spec.row
    base_url = f"http://127.0.0.1:{port}"
    process = ManagedProcess(
        ProcessSpec(
            name=f"{spec.kind} router (port {port})",
            argv=row.argv(spec.launch(python, port, metrics_port, worker_urls)),
            env={"PYTHONUNBUFFERED": "1"},
            log_path=log_dir / LOG_NAME,
            health_url=base_url + row.health_path,
            startup_timeout_s=spec.startup_timeout_s,
            stop_grace_s=10.0,
            ports=(port, metrics_port),
        )
    )
    async with process:
        yield RunningRouter(
            base_url=base_url,
            metrics_url=f"http://127.0.0.1:{metrics_port}{row.metrics_path}",
            command=tuple(process.redacted_argv),
            version=install.version,
            label=row.label,
            policy=spec.policy,
        )
