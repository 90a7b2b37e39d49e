"""Control POSTs (prefix-cache reset, tokenize) survive a keep-alive connection the server closed.

A real asyncio TCP server speaks just enough HTTP/1.1: it answers the first request on a connection
with ``Connection: keep-alive`` and then, for the next request on that same connection, reads it and
closes the socket without answering -- what aiohttp meets when uvicorn closed an idle pooled
connection (vLLM behind vllm-router on 2 GPUs, 2026-11-26). The control POST must go through on a
new connection; a server that drops every request is still an error naming the URL.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from harness.engines.common import EngineRequestError, post_text

BODY = b'{"success": true}'


class DroppingServer:
    """Answers ``answers_per_connection`` requests per connection, then drops the next one unanswered."""

    def __init__(self, answers_per_connection: int) -> None:
        self.answers_per_connection = answers_per_connection
        self.connections = 0
        self.answered = 0
        self.dropped = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered_here = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                await reader.readexactly(length)
                if answered_here >= self.answers_per_connection:
                    self.dropped += 1
                    return
                answered_here += 1
                self.answered += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                    + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
                    + BODY
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


async def serve(server: DroppingServer) -> AsyncIterator[str]:
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/reset_prefix_cache"
    finally:
        listener.close()
        await listener.wait_closed()


async def test_a_post_dropped_on_a_kept_alive_connection_goes_through_on_a_new_one() -> None:
    server = DroppingServer(answers_per_connection=1)
    async for url in serve(server):
        async with aiohttp.ClientSession() as session:
            first = await post_text(session, url)
            second = await post_text(session, url)
    assert first == second == (200, BODY.decode())
    assert (server.answered, server.dropped, server.connections) == (2, 1, 2)


async def test_a_server_that_drops_every_post_is_an_error_naming_the_url() -> None:
    server = DroppingServer(answers_per_connection=0)
    async for url in serve(server):
        async with aiohttp.ClientSession() as session:
            with pytest.raises(EngineRequestError, match="reset_prefix_cache failed: ServerDisconnectedError"):
                await post_text(session, url)
    assert server.dropped == 2
