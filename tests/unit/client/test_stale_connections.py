"""Pooled connections the server closed: idempotent requests are resent once, measured ones never.

A real HTTP/1.1 server written here (asyncio TCP, in its own thread with its own event loop)
answers with ``Connection: keep-alive`` and then, depending on the test, closes the socket a moment
later without saying so (FIN, or RST via SO_LINGER 0), drops a request unanswered, or keeps the
connection open. It counts connections and requests, so the tests see what went over the wire.

To meet a closed connection the way the failing run did, the client's event loop is blocked
(``time.sleep``) while the server closes: the FIN then sits unread, aiohttp still thinks the
connection is alive and hands it out, and the next request fails on it (``Broken pipe`` for a
large body, as the 3 MB ``/tokenize`` here and on vLLM 0.26.0; ``Connection reset`` or
``ServerDisconnectedError`` for a small one). A loop that is not blocked would read the FIN first
and never reuse the connection, and the resend would go untested.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from harness.client.connections import KEEPALIVE_TIMEOUT_S
from harness.client.endpoint import Endpoint
from harness.client.openai import OpenAIClient
from harness.engines.common import EngineRequestError, ServerTokenizer, open_session

TOKENS = [3, 1, 4, 1, 5]
CLOSE_AFTER_S = 0.1
"""How long the server waits after its answer before closing the connection unannounced."""
BLOCKED_S = 0.5
"""How long the client's loop is kept busy: long enough for the close to arrive unread."""
LARGE_TEXT = "x" * 3_000_000
"""A body larger than the socket buffers, so that its writing meets the peer's RST (EPIPE)."""


@dataclass
class Behaviour:
    close_after_s: float | None = None
    """Close each connection this long after its first answer (None: keep it open)."""
    reset: bool = False
    """Close with an RST (SO_LINGER 0) instead of a FIN."""
    drop_requests: bool = False
    """Read each request and close the connection without answering."""


class ThreadedServer:
    """A minimal HTTP/1.1 JSON server on 127.0.0.1 running in its own thread and event loop."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.connections = 0
        self.requests: list[str] = []
        """Request lines in arrival order (e.g. 'POST /tokenize HTTP/1.1')."""
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._open: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        assert self._ready.wait(10), "the test server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        stop = self._stop
        assert stop is not None
        self._loop.call_soon_threadsafe(stop.set)
        self._thread.join(10)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        listener = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = listener.sockets[0].getsockname()[1]
        self._ready.set()
        async with listener:
            await self._stop.wait()
        for writer in self._open.values():  # Python 3.11's server leaves open connections to their handlers
            writer.close()
        await asyncio.gather(*self._open, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._open[task] = writer
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                length = 0
                for line in head.split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                await reader.readexactly(length)
                self.requests.append(head.split("\r\n", 1)[0])
                if self.behaviour.drop_requests:
                    return
                body = json.dumps({"tokens": TOKENS, "count": len(TOKENS)}).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                if self.behaviour.close_after_s is not None:
                    await asyncio.sleep(self.behaviour.close_after_s)
                    if self.behaviour.reset:
                        sock = writer.get_extra_info("socket")
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()
            self._open.pop(task, None)


@contextlib.contextmanager
def serving(behaviour: Behaviour) -> Iterator[ThreadedServer]:
    with ThreadedServer(behaviour) as server:
        yield server


def block_the_loop() -> None:
    """Keep the client's event loop busy while the server closes: the FIN arrives unread."""
    time.sleep(BLOCKED_S)  # blocking is the point: a loop busy elsewhere is how a client meets the close


# -- idempotent requests: resent once on a new connection -----------------------------------------


@pytest.mark.parametrize(
    ("reset", "text", "first_error"),
    [
        (False, "a b", "ServerDisconnectedError"),
        (True, "a b", "Connection reset by peer"),
        (False, LARGE_TEXT, "Broken pipe"),
    ],
    ids=["fin", "rst", "fin-large-body"],
)
async def test_tokenize_on_a_connection_the_server_closed_is_resent_on_a_new_one(
    reset: bool, text: str, first_error: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="harness.client.connections")
    with serving(Behaviour(close_after_s=CLOSE_AFTER_S, reset=reset)) as server:
        async with contextlib.AsyncExitStack() as stack:  # the engines' helper session, as vllm.py opens it
            tokenizer = ServerTokenizer(open_session(stack), server.base_url, "m")
            first = await tokenizer.encode("a b")
            block_the_loop()
            second = await tokenizer.encode(text)
    assert first == second == TOKENS
    assert server.connections == 2
    assert server.requests == ["POST /tokenize HTTP/1.1"] * 2  # the dead connection carried nothing
    resends = [r.getMessage() for r in caplog.records if "sending it once more" in r.getMessage()]
    assert len(resends) == 1 and first_error in resends[0], resends


async def test_metrics_and_tokenize_through_the_client_survive_a_closed_connection() -> None:
    with serving(Behaviour(close_after_s=CLOSE_AFTER_S)) as server:
        endpoint = Endpoint(base_url=server.base_url + "/v1", model="m")
        async with OpenAIClient(endpoint, timeout_s=10.0) as client:
            await client.metrics_text()
            block_the_loop()
            await client.metrics_text()
            block_the_loop()
            status, body = await client.post_json("/tokenize", {"prompt": "a b"})
    assert (status, body) == (200, {"tokens": TOKENS, "count": len(TOKENS)})
    assert server.connections == 3
    assert server.requests == ["GET /metrics HTTP/1.1"] * 2 + ["POST /tokenize HTTP/1.1"]


async def test_a_connection_refused_is_not_resent(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="harness.client.connections")
    with socket.socket() as holder:  # a port nothing listens on: bound, never listening
        holder.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{holder.getsockname()[1]}"
        async with contextlib.AsyncExitStack() as stack:
            with pytest.raises(EngineRequestError, match="tokenize failed: ClientConnectorError"):
                await ServerTokenizer(open_session(stack), url, "m").encode("a b")
    assert "sending it once more" not in caplog.text


# -- measured requests: never resent ----------------------------------------------------------


async def test_a_measured_request_the_server_drops_fails_once_without_a_resend() -> None:
    with serving(Behaviour(drop_requests=True)) as server:
        endpoint = Endpoint(base_url=server.base_url + "/v1", model="m")
        async with OpenAIClient(endpoint, timeout_s=10.0) as client:
            outcome = await client.chat([{"role": "user", "content": "hi"}], max_tokens=4)
    assert outcome.error_kind == "connection"
    assert outcome.error is not None and "ServerDisconnectedError" in outcome.error
    assert server.connections == 1
    assert server.requests == ["POST /v1/chat/completions HTTP/1.1"]


async def test_a_measured_request_on_a_closed_connection_is_a_failure_not_a_resend() -> None:
    # The server closes after 0.1 s, sooner than any client keep-alive could guard against: the
    # chat request meets the dead connection and must come back failed, with nothing sent twice.
    with serving(Behaviour(close_after_s=CLOSE_AFTER_S)) as server:
        endpoint = Endpoint(base_url=server.base_url + "/v1", model="m")
        async with OpenAIClient(endpoint, timeout_s=10.0) as client:
            await client.post_json("/tokenize", {"prompt": "a b"})
            block_the_loop()
            outcome = await client.chat([{"role": "user", "content": "hi"}], max_tokens=4)
    assert outcome.error_kind == "connection", outcome
    assert server.connections == 1
    assert server.requests == ["POST /tokenize HTTP/1.1"]


# -- the pool's keep-alive: no connection idle past KEEPALIVE_TIMEOUT_S is reused ----------------


async def test_the_pools_open_a_new_connection_after_idling_past_the_keepalive() -> None:
    """Both pooled sessions (the measuring client's and the engines' helper one) reuse a connection
    right away but open a new one after KEEPALIVE_TIMEOUT_S of idling; the server never closes."""
    assert KEEPALIVE_TIMEOUT_S < 5.0  # vLLM's and SGLang's uvicorn close idle connections at 5 s
    with serving(Behaviour()) as client_server, serving(Behaviour()) as engine_server:
        endpoint = Endpoint(base_url=client_server.base_url + "/v1", model="m")
        async with OpenAIClient(endpoint, timeout_s=10.0) as client, contextlib.AsyncExitStack() as stack:
            tokenizer = ServerTokenizer(open_session(stack), engine_server.base_url, "m")
            for _ in range(2):
                await client.post_json("/tokenize", {"prompt": "a b"})
                await tokenizer.encode("a b")
            reused = (client_server.connections, engine_server.connections)
            await asyncio.sleep(KEEPALIVE_TIMEOUT_S + 0.3)  # the loop runs: nothing closes but the pool
            await client.post_json("/tokenize", {"prompt": "a b"})
            await tokenizer.encode("a b")
    assert reused == (1, 1)
    assert (client_server.connections, engine_server.connections) == (2, 2)
    assert len(client_server.requests) == len(engine_server.requests) == 3
