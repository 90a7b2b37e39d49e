"""The LMCache multi-process server that kvbench runs beside vLLM (offload backend ``lmcache-mp``).

Started as ``<venv python> -m lmcache.cli.main server ...`` (the same entry point as the
``lmcache`` console script, which is missing where the venv's ``bin/`` is not on hand, e.g. a
``--target`` install), in its own process group through :class:`ManagedProcess`, healthy when its
HTTP API answers ``GET /healthcheck`` with 200 and the listening socket is its own; its three
ports (ZMQ, HTTP, Prometheus) must be free before it starts (:mod:`.process`). Its log goes to
``lmcache-server.log`` beside the engine log.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from .process import ManagedProcess, ProcessSpec
from .vllm_offload import LmcacheServerSpec

LMCACHE_SERVER_MODULE = "lmcache.cli.main"
DEFAULT_ENV: Mapping[str, str] = {
    "LMCACHE_DISABLE_BANNER": "1",
    "PYTHONUNBUFFERED": "1",
}
CLEANUP_GLOBS: tuple[str, ...] = ()
"""lmcache 0.5.6 in engine_driven mode without --shm-name leaves nothing behind (checked on CPU)."""


def lmcache_server_argv(python: str, spec: LmcacheServerSpec) -> tuple[str, ...]:
    return (python, "-m", LMCACHE_SERVER_MODULE, "server", *spec.args())


class LmcacheServer:
    """Async context manager: start the server, wait for /healthcheck, stop it on exit."""

    def __init__(
        self,
        spec: LmcacheServerSpec,
        *,
        python: str,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 300.0,
        stop_grace_s: float = 10.0,
    ) -> None:
        self.spec = spec
        self._process = ManagedProcess(
            ProcessSpec(
                name=f"LMCache server (port {spec.port})",
                argv=lmcache_server_argv(python, spec),
                env={**DEFAULT_ENV, **(env or {})},
                log_path=log_path,
                health_url=spec.health_url,
                startup_timeout_s=startup_timeout_s,
                stop_grace_s=stop_grace_s,
                cleanup_globs=CLEANUP_GLOBS,
                ports=(spec.port, spec.http_port, spec.prometheus_port),
            )
        )

    @property
    def process(self) -> ManagedProcess:
        return self._process

    @property
    def redacted_argv(self) -> list[str]:
        return self._process.redacted_argv

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def log_tail(self, lines: int = 50) -> list[str]:
        return self._process.log_tail(lines)

    def returncode(self) -> int | None:
        return self._process.returncode()

    async def __aenter__(self) -> LmcacheServer:
        await self._process.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._process.stop()
