"""Every response of a fleet's replica names the replica: the ``X-Kvbench-Replica`` header.

A router in front of kvbench's replicas (``routing.router``) forwards its workers' response headers
(vllm-router 0.1.17 does: verified 2026-11-26), so kvbench learns which replica served each request
from the header even when requests overlap -- where ``/metrics`` attribution, which needs one request
in flight at a time, attributes next to nothing. kvbench sets ``$KVBENCH_REPLICA`` (the replica's
index) for each replica process of a fleet; the simulator adds the header itself, and a vLLM replica
loads :class:`ReplicaHeader` with ``--middleware kvbench_replica_header.ReplicaHeader``.

This file is also copied as is into a vLLM replica's working directory and imported there, by the
engine's own Python (which has no kvbench): it must stay standard-library only, and import nothing
from kvbench.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, MutableMapping

REPLICA_HEADER = "X-Kvbench-Replica"
REPLICA_ENV = "KVBENCH_REPLICA"
MIDDLEWARE = "kvbench_replica_header.ReplicaHeader"
"""vLLM's ``--middleware`` value (module file name, then class)."""

# ASGI's own types: a scope and messages are dicts of values of any type (the ASGI spec)
Message = MutableMapping[str, object]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Message, Receive, Send], Awaitable[None]]


def replica_env(replica: int, fleet_size: int) -> dict[str, str]:
    """The environment that makes replica ``replica`` of a fleet name itself (nothing for a single engine)."""
    return {REPLICA_ENV: str(replica)} if fleet_size > 1 else {}


class ReplicaHeader:
    """A pure ASGI middleware: adds ``X-Kvbench-Replica: $KVBENCH_REPLICA`` to every HTTP response start.

    Pure ASGI (not Starlette's ``BaseHTTPMiddleware``) so that a streamed answer passes through
    untouched, chunk by chunk; without ``$KVBENCH_REPLICA`` it adds nothing.
    """

    def __init__(self, app: App) -> None:
        self.app = app
        value = os.environ.get(REPLICA_ENV)
        self.header = None if value is None else (REPLICA_HEADER.lower().encode(), value.encode())

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        header = self.header
        if header is None or scope.get("type") != "http":
            await self.app(scope, receive, send)
            return

        async def named(message: Message) -> None:
            if message.get("type") == "http.response.start":
                existing = message.get("headers")
                message["headers"] = [*(existing if isinstance(existing, list | tuple) else ()), header]
            await send(message)

        await self.app(scope, receive, named)
