"""Streaming requests spread over worker processes, for loads one event loop cannot time accurately.

One asyncio loop parses every SSE chunk of every stream in Python; past a few hundred concurrent
streams it falls behind and the TTFT it reports grows by its own backlog (``benchmarks/
client_capacity.py`` measures this against a fixed-latency server). :class:`ProcessClientPool`
keeps the session logic (who sends what, when) in the caller's loop and moves the requests into
``workers`` processes, each with its own event loop (uvloop when installed and asked for) and
its own pooled :class:`~harness.client.openai.OpenAIClient`. Timing is unchanged: ``started_ns``,
TTFT and ITLs are taken by the worker's client with ``time.monotonic_ns()``, the system-wide
monotonic clock, so they compare with the caller's own timestamps.

The pool has the ``chat``/``completion`` interface of the client (:class:`StreamingClient`), so
:func:`harness.runs.load.run_load` takes either. Requests go to the worker with the fewest in
flight. A worker that dies fails its requests with :class:`ClientPoolError`. Each worker runs a
:class:`~harness.client.fidelity.LoopMonitor`, so :meth:`ProcessClientPool.loop_lag` can say how far behind each
worker's loop fell over a window.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import multiprocessing
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from common.errors import KvbenchError

from .endpoint import Endpoint
from .fidelity import LoopLag, LoopMonitor
from .openai import ClosedOnExit, OpenAIClient, Request, RequestBody, RequestKind, RequestMethods, RequestOutcome

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


StreamingClient = RequestMethods
"""What the load runner needs from a client: streamed chat and text completions (one endpoint's client, this pool,
a fleet's)."""


class ClientPoolError(KvbenchError):
    """A client worker process failed to start or died."""


@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    pending: dict[int, asyncio.Future[RequestOutcome]] = field(default_factory=dict)
    lag_pending: dict[int, asyncio.Future[LoopLag]] = field(default_factory=dict)
    dead: bool = False


class ProcessClientPool(RequestMethods, ClosedOnExit):
    """``workers`` client processes behind the client interface; use as ``async with``."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        workers: int,
        timeout_s: float,
        max_connections: int,
        stall_timeout_s: float | None = None,
        use_uvloop: bool = True,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self._endpoint = endpoint
        self._workers_wanted = workers
        self._timeout_s = timeout_s
        self._stall_timeout_s = stall_timeout_s
        self._per_worker_connections = math.ceil(max_connections / workers) + 8
        self._use_uvloop = use_uvloop
        self._workers: list[_Worker] = []
        self._ids = itertools.count()

    @property
    def workers(self) -> int:
        return len(self._workers)

    async def __aenter__(self) -> ProcessClientPool:
        context = multiprocessing.get_context("spawn")
        loop = asyncio.get_running_loop()
        try:
            for _ in range(self._workers_wanted):
                parent, child = context.Pipe(duplex=True)
                process = context.Process(
                    target=_worker_main,
                    args=(
                        child,
                        self._endpoint,
                        self._timeout_s,
                        self._stall_timeout_s,
                        self._per_worker_connections,
                        self._use_uvloop,
                    ),
                    daemon=True,
                )
                process.start()
                child.close()
                self._workers.append(_Worker(process, parent))
            for worker in self._workers:
                ready = await loop.run_in_executor(None, worker.conn.poll, START_TIMEOUT_S)
                if not ready or worker.conn.recv() != ("ready", worker.process.pid):
                    raise ClientPoolError(f"client worker {worker.process.pid} did not start")
                _watch(loop, worker.conn, functools.partial(self._on_readable, worker))
        except BaseException:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        for worker in self._workers:
            with contextlib.suppress(OSError, ValueError):
                loop.remove_reader(worker.conn.fileno())
            if not worker.dead:
                with contextlib.suppress(OSError, ValueError):
                    worker.conn.send(("stop",))
            self._fail(worker, "the client pool closed")
        for worker in self._workers:
            await loop.run_in_executor(None, worker.process.join, STOP_TIMEOUT_S)
            if worker.process.is_alive():
                worker.process.kill()
                await loop.run_in_executor(None, worker.process.join, STOP_TIMEOUT_S)
            worker.conn.close()
        self._workers = []

    # -- requests ---------------------------------------------------------------------------
    async def request(self, request: Request) -> RequestOutcome:
        alive = [w for w in self._workers if not w.dead]
        if not alive:
            raise ClientPoolError("no client worker is running")
        worker = min(alive, key=lambda w: len(w.pending))
        request_id = next(self._ids)
        future: asyncio.Future[RequestOutcome] = asyncio.get_running_loop().create_future()
        worker.pending[request_id] = future
        extra = dict(request.extra_body) if request.extra_body else None
        try:
            worker.conn.send((request.kind, request_id, request.body, request.max_tokens, request.ignore_eos, extra))
        except (OSError, ValueError) as error:
            worker.pending.pop(request_id, None)
            self._fail(worker, f"cannot reach client worker: {error}")
            raise ClientPoolError(f"client worker {worker.process.pid} is gone") from error
        try:
            return await future
        except asyncio.CancelledError:
            if worker.pending.pop(request_id, None) is not None and not worker.dead:
                with contextlib.suppress(OSError, ValueError):
                    worker.conn.send(("cancel", request_id))
            raise

    async def loop_lag(self, start_ns: int, end_ns: int) -> list[LoopLag]:
        """Each running worker's event-loop delay and CPU use over [start_ns, end_ns] (monotonic ns)."""
        loop = asyncio.get_running_loop()
        asked: list[asyncio.Future[LoopLag]] = []
        for worker in self._workers:
            if worker.dead:
                continue
            request_id = next(self._ids)
            future: asyncio.Future[LoopLag] = loop.create_future()
            worker.lag_pending[request_id] = future
            try:
                worker.conn.send(("lag", request_id, start_ns, end_ns))
            except (OSError, ValueError) as error:
                self._fail(worker, f"cannot reach client worker: {error}")
                continue
            asked.append(future)
        return list(await asyncio.gather(*asked))

    def _on_readable(self, worker: _Worker) -> None:
        try:
            while worker.conn.poll():
                request_id, answer = worker.conn.recv()
                if isinstance(answer, LoopLag):
                    lag = worker.lag_pending.pop(request_id, None)
                    if lag is not None and not lag.done():
                        lag.set_result(answer)
                    continue
                future = worker.pending.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_result(answer)
        except (EOFError, OSError):
            with contextlib.suppress(OSError, ValueError):
                asyncio.get_running_loop().remove_reader(worker.conn.fileno())
            self._fail(worker, f"client worker {worker.process.pid} exited (code {worker.process.exitcode})")

    def _fail(self, worker: _Worker, reason: str) -> None:
        worker.dead = True
        for future in worker.pending.values():
            if not future.done():
                future.set_exception(ClientPoolError(reason))
        for lag in worker.lag_pending.values():
            if not lag.done():
                lag.set_exception(ClientPoolError(reason))
        worker.pending.clear()
        worker.lag_pending.clear()


def _watch(loop: asyncio.AbstractEventLoop, conn: Connection, callback: Callable[[], None]) -> None:
    """Call ``callback`` when ``conn`` has data, keeping its socket blocking: uvloop's ``add_reader`` makes it
    non-blocking, and then ``recv`` of a message larger than what has arrived (a 32k-token prompt is ~160 kB)
    fails half-read instead of waiting for the rest."""
    loop.add_reader(conn.fileno(), callback)
    os.set_blocking(conn.fileno(), True)


# ---------------------------------------------------------------------------------------------
# The worker process
# ---------------------------------------------------------------------------------------------


def _worker_main(
    conn: Connection,
    endpoint: Endpoint,
    timeout_s: float,
    stall_timeout_s: float | None,
    max_connections: int,
    use_uvloop: bool,
) -> None:
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            uvloop.install()
    asyncio.run(_serve(conn, endpoint, timeout_s, stall_timeout_s, max_connections))


async def _serve(
    conn: Connection, endpoint: Endpoint, timeout_s: float, stall_timeout_s: float | None, max_connections: int
) -> None:
    loop = asyncio.get_running_loop()
    tasks: dict[int, asyncio.Task[Any]] = {}
    stopped = asyncio.Event()

    async with (
        LoopMonitor("worker") as monitor,
        OpenAIClient(
            endpoint, timeout_s=timeout_s, read_timeout_s=stall_timeout_s, max_connections=max_connections
        ) as client,
    ):

        async def run(
            request_id: int, kind: RequestKind, body: RequestBody, max_tokens: int, ignore_eos: bool, extra: Any
        ) -> None:
            outcome = await client.request(Request(kind, body, max_tokens, ignore_eos, extra))
            tasks.pop(request_id, None)
            with contextlib.suppress(OSError, ValueError):
                conn.send((request_id, outcome))

        def on_readable() -> None:
            try:
                while conn.poll():
                    message = conn.recv()
                    if message[0] == "stop":
                        stopped.set()
                        return
                    if message[0] == "lag":
                        _, lag_id, start_ns, end_ns = message
                        conn.send((lag_id, monitor.over(start_ns, end_ns)))
                        continue
                    if message[0] == "cancel":
                        task = tasks.pop(message[1], None)
                        if task is not None:
                            task.cancel()
                        continue
                    kind, request_id, body, max_tokens, ignore_eos, extra = message
                    tasks[request_id] = loop.create_task(run(request_id, kind, body, max_tokens, ignore_eos, extra))
            except (EOFError, OSError):
                stopped.set()  # the parent went away

        _watch(loop, conn, on_readable)
        conn.send(("ready", os.getpid()))
        await stopped.wait()
        loop.remove_reader(conn.fileno())
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    conn.close()
