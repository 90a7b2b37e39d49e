"""Where the stand-in HTTP servers serve from for a ``with`` block: a thread for a ``socketserver`` server, or this
event loop for an aiohttp application on a free loopback port; shut down and closed after the block."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TypeVar

from aiohttp import web

Server = TypeVar("Server", bound=socketserver.BaseServer)


@contextmanager
def serving(server: Server) -> Iterator[Server]:
    """``server`` serving from a daemon thread for the block; then shut down, its socket closed, its thread joined."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@asynccontextmanager
async def app_serving(app: web.Application) -> AsyncIterator[str]:
    """``app`` served by this event loop on a free port of 127.0.0.1 for the block (no access log); its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
