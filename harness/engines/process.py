"""Starting, health-checking and stopping engine processes (argv lists only, never a shell).

A :class:`ManagedProcess` runs in its own process group with stdout/stderr in a log file. Stopping
sends SIGTERM to the whole group, waits a grace period, then SIGKILLs the group, and removes the
leftover paths the engine is known to create.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import aiohttp

from kvbench.errors import EngineStartError
from kvbench.private import open_private
from kvbench.redact import redact_argv, redact_text, remember_secret, secret_values


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if kvbench dies, even by SIGKILL (Linux only)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the engine binds it shortly after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def tail_lines(path: Path, lines: int = 50) -> list[str]:
    """The last ``lines`` lines of a log, redacted."""
    if not path.exists():
        return []
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 256 * 1024))
        data = handle.read().decode("utf-8", errors="replace")
    return [redact_text(line) for line in data.splitlines()[-lines:]]


@dataclass(frozen=True)
class ProcessSpec:
    """Everything needed to start one process."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_path: Path
    health_url: str
    startup_timeout_s: float
    stop_grace_s: float = 20.0
    cleanup_globs: tuple[str, ...] = ()
    cwd: Path | None = None


class ManagedProcess:
    """Async context manager around one engine process."""

    def __init__(self, spec: ProcessSpec) -> None:
        self.spec = spec
        for secret in secret_values(spec.argv, spec.env):
            remember_secret(secret)  # whatever the engine echoes them with, its log tails never show them
        self._process: subprocess.Popen[bytes] | None = None
        self._preexisting: set[str] = set()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def redacted_argv(self) -> list[str]:
        return redact_argv(self.spec.argv)

    def log_tail(self, lines: int = 50) -> list[str]:
        return tail_lines(self.spec.log_path, lines)

    def returncode(self) -> int | None:
        return self._process.poll() if self._process else None

    async def __aenter__(self) -> ManagedProcess:
        self._preexisting = {p for pattern in self.spec.cleanup_globs for p in glob.glob(pattern)}
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.spec.env}
        # 0600: engines may print their own arguments (tokens included) into their log
        with os.fdopen(open_private(self.spec.log_path, os.O_WRONLY | os.O_APPEND), "ab") as log:
            log.write(f"$ {' '.join(self.redacted_argv)}\n".encode())
            try:
                self._process = subprocess.Popen(  # noqa: ASYNC220 - argv list, never a shell; spawning is instant
                    list(self.spec.argv),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=self.spec.cwd,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            except OSError as error:
                raise EngineStartError(
                    f"{self.spec.name}: cannot start {self.spec.argv[0]!r}: {error}"
                ) from None
        try:
            await self._wait_healthy()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.spec.startup_timeout_s
        timeout = aiohttp.ClientTimeout(total=5)
        last_problem = "no answer yet"
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                code = self.returncode()
                if code is not None:
                    raise EngineStartError(self._failure(f"exited with code {code} before becoming healthy"))
                try:
                    async with session.get(self.spec.health_url) as response:
                        if response.status == 200:
                            return
                        last_problem = f"HTTP {response.status}"
                except (aiohttp.ClientError, TimeoutError) as error:
                    last_problem = type(error).__name__
                if time.monotonic() > deadline:
                    raise EngineStartError(
                        self._failure(
                            f"not healthy after {self.spec.startup_timeout_s:.0f} s "
                            f"({self.spec.health_url}: {last_problem})"
                        )
                    )
                await asyncio.sleep(0.25)

    def _failure(self, what: str) -> str:
        tail = "\n".join(f"    {line}" for line in self.log_tail(50))
        return f"{self.spec.name} {what}.\n  log: {self.spec.log_path}\n  last lines:\n{tail}"

    async def stop(self) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            self._signal_group(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + self.spec.stop_grace_s
            while process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        # children can outlive the leader (engine workers): always sweep the group
        self._signal_group(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        self._cleanup()

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def _cleanup(self) -> None:
        for pattern in self.spec.cleanup_globs:
            for path in glob.glob(pattern):
                if path in self._preexisting:
                    continue
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)


def python_module_argv(python: str, module: str, args: Sequence[str]) -> tuple[str, ...]:
    return (python, "-m", module, *args)
