"""Starting, health-checking and stopping engine processes (argv lists only, never a shell).

A :class:`ManagedProcess` runs in its own process group with stdout/stderr in a log file. Stopping
sends SIGTERM to the whole group, waits a grace period, then SIGKILLs the group, and removes the
leftover paths the engine is known to create.

kvbench measures only a server it started (issue 11: a decoy answering ``/health`` on the port
must never be measured), so starting one checks, for every kind and sidecar alike:

1. before the start, every port the process will listen on (:attr:`ProcessSpec.ports`, default
   the health URL's port) is free: binding it on the wildcard address fails with EADDRINUSE when
   any other socket listens on it, and kvbench refuses with a one-line error;
2. once ``/health`` answers 200, the socket listening on the health URL's port belongs to the
   started process's session (Linux: ``/proc/net/tcp{,6}`` LISTEN inode -> ``/proc/PID/fd`` of
   the processes whose session id is the leader's pid); elsewhere this check is skipped;
3. with :attr:`ProcessSpec.launch_token` (servers kvbench owns: the simulator), a fresh random
   token goes to the process in ``$KVBENCH_LAUNCH_TOKEN`` and the health answer must echo it in
   the ``X-Kvbench-Launch-Token`` header.

Processes that only need each other once they serve (vLLM and its LMCache sidecar) start at once
(:func:`start_together`): on the 2-core CPU machine that overlaps the sidecar's ~15 s start with
vLLM's minute of imports, and a failure of any stops them all, the error naming the first one (in
dependency order) that failed, with its log.

For soak fault drills the process can be SIGKILLed and restarted on the same argv and ports
(:meth:`ManagedProcess.kill_and_restart`, returning the seconds until healthy again) and paused
(:meth:`ManagedProcess.pause` / :meth:`ManagedProcess.resume`: SIGSTOP/SIGCONT to the group).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import glob
import os
import secrets
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
from urllib.parse import urlsplit

import aiohttp

from common.errors import EngineStartError
from common.private import open_private
from common.redact import redact_argv, redact_text, remember_secret, scrub_file, secret_values


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if kvbench dies, even by SIGKILL (Linux only)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG = 1
LAUNCH_TOKEN_ENV = "KVBENCH_LAUNCH_TOKEN"
LAUNCH_TOKEN_HEADER = "X-Kvbench-Launch-Token"
PORT_RELEASE_S = 10.0
"""How long a restart waits for the killed process's ports to be released before refusing."""
_TCP_LISTEN = "0A"


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PICK_LOW = 20_000
"""kvbench picks its servers' ports from here up to the kernel's ephemeral range (Linux default 32768-60999)."""
_PICK_MIN_SPAN = 1_000
_handed_out: set[int] = set()


def _ephemeral_low(range_file: Path = EPHEMERAL_RANGE_FILE) -> int | None:
    """The lowest port the kernel gives to a socket bound to port 0; None where it cannot be read."""
    try:
        low, _high = (int(field) for field in range_file.read_text(encoding="ascii").split())
    except (OSError, ValueError):
        return None
    return low


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return not port_busy(port)


def free_port(host: str = "127.0.0.1", range_file: Path = EPHEMERAL_RANGE_FILE) -> int:
    """A TCP port that is free now, for a server kvbench starts (it binds the port a few seconds later).

    Picked at random below the kernel's ephemeral range: in that range the kernel hands ports to every process
    that binds port 0, and vLLM's own sockets (ZMQ, torch.distributed), started at the same time as an LMCache
    sidecar, once took a port picked for the sidecar between the pick and its start. Never the same port twice in
    one kvbench process. Where the range cannot be read or leaves too little room below it: the kernel's pick.
    """
    low = _ephemeral_low(range_file)
    if low is not None and low - PICK_LOW >= _PICK_MIN_SPAN:
        picker = secrets.SystemRandom()
        for _ in range(100):
            port = picker.randrange(PICK_LOW, low)
            if port not in _handed_out and _bindable(host, port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        picked: int = sock.getsockname()[1]
    _handed_out.add(picked)
    return picked


def port_busy(port: int, host: str = "0.0.0.0") -> bool:
    """Whether another socket listens on ``port`` (bound on the wildcard address, as servers do).

    SO_REUSEADDR is set so that connections of a stopped server in TIME_WAIT do not count; a
    listening socket on any address of the family still makes the bind fail with EADDRINUSE.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    wildcard = "::" if family == socket.AF_INET6 else "0.0.0.0"
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((wildcard, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def listening_inodes(port: int) -> set[str] | None:
    """Socket inodes listening on TCP ``port`` (IPv4 and IPv6); None where /proc/net cannot be read."""
    found: set[str] = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if len(fields) > 9 and fields[3] == _TCP_LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found if readable else None


def _session_id(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[3]) if len(fields) > 3 else None


def socket_holders(inodes: set[str]) -> dict[int, int | None]:
    """pid -> session id of every readable process holding one of the socket ``inodes``."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    holders: dict[int, int | None] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # another user's process, or gone meanwhile
            continue
        links = set()
        for fd in fds:
            with contextlib.suppress(OSError):  # closed meanwhile (the listing's own descriptor, for one)
                links.add(os.readlink(fd))
        if links & wanted:
            pid = int(entry.name)
            holders[pid] = _session_id(pid)
    return holders


def _command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return redact_text(" ".join(part.decode("utf-8", errors="replace") for part in raw.split(b"\0") if part))[:200]


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
    ports: tuple[int, ...] = ()
    """TCP ports the process listens on, all checked free before it starts (default: the health URL's)."""
    launch_token: bool = False
    """The process echoes ``$KVBENCH_LAUNCH_TOKEN`` in the ``X-Kvbench-Launch-Token`` header of /health."""

    @property
    def health_port(self) -> int | None:
        return urlsplit(self.health_url).port

    @property
    def bind_host(self) -> str:
        return urlsplit(self.health_url).hostname or "127.0.0.1"

    @property
    def listen_ports(self) -> tuple[int, ...]:
        if self.ports:
            return self.ports
        return (self.health_port,) if self.health_port is not None else ()


class ManagedProcess:
    """Async context manager around one engine process."""

    def __init__(self, spec: ProcessSpec) -> None:
        self.spec = spec
        for secret in secret_values(spec.argv, spec.env):
            remember_secret(secret)  # whatever the engine echoes them with, its log tails never show them
        self._process: subprocess.Popen[bytes] | None = None
        self._preexisting: set[str] = set()
        self._token: str | None = None
        self.restarts = 0
        self._restarting = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def redacted_argv(self) -> list[str]:
        return redact_argv(self.spec.argv)

    def log_tail(self, lines: int = 50) -> list[str]:
        return tail_lines(self.spec.log_path, lines)

    def returncode(self) -> int | None:
        """The exit code once the process has exited; None while it runs or while kvbench itself restarts it
        (a drill's kill is not a death)."""
        if self._restarting or self._process is None:
            return None
        return self._process.poll()

    async def __aenter__(self) -> ManagedProcess:
        await self.start()
        return self

    async def start(self) -> None:
        """Check the ports, spawn the process and wait until it (and no other server) is healthy."""
        self._preexisting = {p for pattern in self.spec.cleanup_globs for p in glob.glob(pattern)}
        await self._refuse_busy_ports(wait_s=0.0)
        await self._spawn_healthy()

    async def _spawn_healthy(self) -> None:
        self._spawn()
        try:
            await self._wait_healthy()
        except BaseException:
            await self.stop()
            raise

    def _spawn(self) -> None:
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        # a kvbench killed before it stopped this process's previous run left that log unscrubbed; this run appends
        scrub_file(self.spec.log_path, secret_values(self.spec.argv, self.spec.env))
        self._token = secrets.token_hex(16) if self.spec.launch_token else None
        env = {**os.environ, **self.spec.env}
        if self._token is not None:
            env[LAUNCH_TOKEN_ENV] = self._token
        # 0600: engines may print their own arguments (tokens included) into their log
        with os.fdopen(open_private(self.spec.log_path, os.O_WRONLY | os.O_APPEND), "ab") as log:
            log.write(f"$ {' '.join(self.redacted_argv)}\n".encode())
            try:
                # argv list, never a shell; spawning is instant
                self._process = subprocess.Popen(
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
                raise EngineStartError(f"{self.spec.name}: cannot start {self.spec.argv[0]!r}: {error}") from None

    async def _refuse_busy_ports(self, *, wait_s: float) -> None:
        """EngineStartError if a port the process will listen on is taken (after waiting up to ``wait_s``)."""
        deadline = time.monotonic() + wait_s
        for port in self.spec.listen_ports:
            while port_busy(port, self.spec.bind_host):
                if time.monotonic() >= deadline:
                    raise EngineStartError(
                        f"{self.spec.name}: port {port} is already in use by another process; kvbench measures "
                        "only a server it starts itself: free the port, or leave the port unset so kvbench "
                        "picks a free one"
                    )
                await asyncio.sleep(0.1)  # only after a SIGKILL: the kernel releases the dead server's socket

    def _check_owner(self) -> None:
        """EngineStartError if the socket answering on the health port is not held by this process's session."""
        port, process = self.spec.health_port, self._process
        if port is None or process is None:
            return
        inodes = listening_inodes(port)
        if inodes is None:
            return  # no /proc/net (not Linux): the port check before the start is all there is
        holders = socket_holders(inodes) if inodes else {}
        if any(session == process.pid for session in holders.values()):
            return
        others = ", ".join(f"pid {pid} ({_command_line(pid)})" for pid in sorted(holders))
        others = others or "a process kvbench cannot see"
        raise EngineStartError(
            f"{self.spec.name}: {self.spec.health_url} answered, but port {port} is held by {others}, not by the "
            f"process kvbench started (pid {process.pid}); refusing to measure another server"
        )

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
                            self._check_identity(response.headers.get(LAUNCH_TOKEN_HEADER))
                            self._check_owner()
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

    def _check_identity(self, echoed: str | None) -> None:
        if self._token is None or (echoed is not None and secrets.compare_digest(echoed, self._token)):
            return
        said = "no launch token" if echoed is None else "another launch token"
        raise EngineStartError(
            f"{self.spec.name}: {self.spec.health_url} answered with {said} ({LAUNCH_TOKEN_HEADER}): another server "
            "holds the port; refusing to measure it"
        )

    # -- fault drills (kvbench soak) ----------------------------------------------------------------

    async def kill_and_restart(self) -> float:
        """SIGKILL the whole group, start the same argv again, wait until healthy: seconds from kill to healthy."""
        process = self._process
        if process is None:
            raise RuntimeError(f"{self.spec.name} is not running")
        killed = time.monotonic()
        self._restarting = True
        try:
            self._signal_group(process.pid, signal.SIGKILL)
            await asyncio.to_thread(process.wait)
            await self._refuse_busy_ports(wait_s=PORT_RELEASE_S)
            await self._spawn_healthy()
        finally:
            self._restarting = False
        self.restarts += 1
        return time.monotonic() - killed

    def pause(self) -> None:
        """SIGSTOP the group (the engine stops answering but keeps its sockets and memory)."""
        if self._process is not None:
            self._signal_group(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the group."""
        if self._process is not None:
            self._signal_group(self._process.pid, signal.SIGCONT)

    def _failure(self, what: str) -> str:
        tail = "\n".join(f"    {line}" for line in self.log_tail(50))
        return f"{self.spec.name} {what}.\n  log: {self.spec.log_path}\n  last lines:\n{tail}"

    async def stop(self) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            self._signal_group(process.pid, signal.SIGCONT)  # a paused group would hold SIGTERM pending
            self._signal_group(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + self.spec.stop_grace_s
            while process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        # children can outlive the leader (engine workers): always sweep the group
        self._signal_group(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        # the engine wrote its log itself, its own echo of its arguments included: scrub it now it is gone
        scrub_file(self.spec.log_path, secret_values(self.spec.argv, self.spec.env))
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


async def start_together(processes: Sequence[ManagedProcess], *, after: Sequence[asyncio.Future[None]] = ()) -> None:
    """Start ``processes`` at once and wait until all are healthy; if one fails, stop them all.

    ``processes`` go in dependency order (a sidecar before the engine that connects to it): when
    several fail, or one fails because another died (an engine that lost its sidecar), the error
    raised is that of the first in this order, with a line naming the others'. On success the caller
    stops them on its way out as usual (:meth:`ManagedProcess.stop` of a stopped process does nothing).

    ``after``: starts of servers the processes depend on that someone else owns (a fleet's shared
    LMCache server), waited for but never cancelled; one that fails stops the processes, and its
    error comes before theirs.
    """
    tasks = [asyncio.ensure_future(process.start()) for process in processes]
    exited: list[int | None] = []
    try:
        await asyncio.wait([*after, *tasks], return_when=asyncio.FIRST_EXCEPTION)
        # before the others are cancelled (and so stopped): which ones had died on their own
        exited = [process.returncode() for process in processes]
    finally:
        for task in tasks:
            task.cancel()  # stops a process still starting (its start() stops it on the way out)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        failed = any(dependency.done() and (dependency.cancelled() or dependency.exception()) for dependency in after)
        if failed or not exited or any(isinstance(result, BaseException) for result in results):
            await asyncio.gather(*(process.stop() for process in processes))  # those that were healthy already
    errors: list[BaseException] = []
    for dependency in after:
        if not dependency.done():
            continue
        if dependency.cancelled():
            errors.append(EngineStartError("a server they depend on was stopped before it was healthy"))
        elif (error := dependency.exception()) is not None:
            # a copy: the same start is awaited by every process that depends on it (a fleet's replicas)
            errors.append(EngineStartError(str(error)) if isinstance(error, EngineStartError) else error)
    for process, result, code in zip(processes, results, exited, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            errors.append(result)
        elif code is not None:
            when = "after" if result is None else "before"
            errors.append(EngineStartError(process._failure(f"exited with code {code} {when} becoming healthy")))
    if not errors:
        return
    first, others = errors[0], errors[1:]
    if others and isinstance(first, EngineStartError):
        also = "; ".join(str(error).splitlines()[0] for error in others)
        raise EngineStartError(f"{first}\n  also failed: {also}") from None
    raise first


def python_module_argv(python: str, module: str, args: Sequence[str]) -> tuple[str, ...]:
    return (python, "-m", module, *args)
