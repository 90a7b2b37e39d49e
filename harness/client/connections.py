"""Pooled HTTP connections the server has closed: how kvbench avoids them, and the one resend it allows.

An OpenAI-compatible engine's HTTP server closes a kept-alive connection after it sat idle for its
keep-alive timeout. vLLM runs uvicorn with ``timeout_keep_alive=envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE``
(``vllm/entrypoints/openai/api_server.py``), and ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` defaults to 5 s
(``vllm/envs.py``), uvicorn's own ``--timeout-keep-alive`` default; SGLang passes
``timeout_keep_alive=5`` to ``uvicorn.run`` (``python/sglang/srt/entrypoints/http_server.py``),
and vllm-router sits in front of such servers. aiohttp keeps idle pooled
connections for 15 s by default, so between 5 and 15 s of idling the pool may hand out a connection
the server already closed. aiohttp normally notices the close and drops the connection, but only
when its event loop gets to read the FIN; a loop busy in synchronous work (building a long prompt)
hands the dead connection out first, and the request fails on its first write or read: ``Broken
pipe`` when the body is large (a long prompt sent to ``/tokenize``: ``ClientOSError: [Errno 32]``
stopped a Llama-3.1-70B TP=4 run on vLLM 0.26.0 after ~5 minutes, the engine healthy),
``Connection reset by peer`` or :class:`aiohttp.ServerDisconnectedError` when it is small.

Two rules, both here:

* :func:`new_session`: every long-lived session kvbench opens to an engine pools connections for at
  most :data:`KEEPALIVE_TIMEOUT_S` = 3 s of idling, below the servers' 5 s. aiohttp compares the
  idle time with the monotonic clock when it hands a connection out, so a blocked loop cannot get a
  connection the server had time to close. This covers every request, measured ones included.
* :func:`idempotent_request`: requests whose effect does not depend on how often they are sent
  (``POST /tokenize``, ``/detokenize``, ``/reset_prefix_cache``, ``GET /metrics``, ``/health``,
  ``/v1/models``, ``/version``) are sent once more, on a new connection, when the first try failed
  the way a closed pooled connection fails (:func:`is_stale_connection`) before the response head
  arrived. Once the head arrived nothing is resent: a failure while reading the body is the
  server's. A server that also drops the resend is an error as before. (aiohttp itself already
  resends a GET once on a pooled connection, RFC 9112 section 9.3.1, but never a POST.)

Measured requests (``/v1/chat/completions``, ``/v1/completions``) never come here: a resend would
hide a failure and fold a second request's time into the first one's TTFT.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import AsyncIterator, Mapping

import aiohttp

from .redirects import redirect_trace

log = logging.getLogger(__name__)

KEEPALIVE_TIMEOUT_S = 3.0
"""Seconds a pooled connection may sit idle before the client closes it instead of reusing it.

Below the 5 s after which vLLM's and SGLang's uvicorn servers close an idle connection, with 2 s to
spare for the time between the server sending a response and the client putting the connection
back (aiohttp starts its idle clock then; uvicorn starts its own when the response is sent).
"""

STALE_ERRNOS = frozenset({errno.EPIPE, errno.ECONNRESET})
"""Socket errors of a write or read on a connection whose far end has gone."""


def new_session(
    *,
    timeout: aiohttp.ClientTimeout,
    headers: Mapping[str, str] | None = None,
    limit: int = 100,
) -> aiohttp.ClientSession:
    """A pooled session (at most ``limit`` connections) that never reuses a connection idle > 3 s, and
    never follows a redirect to another origin (:mod:`harness.client.redirects`)."""
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=KEEPALIVE_TIMEOUT_S)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        headers=headers,
        raise_for_status=False,
        trace_configs=[redirect_trace()],
    )


def is_stale_connection(error: BaseException) -> bool:
    """True for how a request fails on a connection the server closed: EPIPE, ECONNRESET, no answer.

    A failure to open a new connection (:class:`aiohttp.ClientConnectorError`, e.g. connection
    refused) is not: the server is not there, and a resend would only meet it again.
    """
    if isinstance(error, aiohttp.ClientConnectorError):
        return False
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return True
    return isinstance(error, OSError) and error.errno in STALE_ERRNOS


@contextlib.asynccontextmanager
async def idempotent_request(
    session: aiohttp.ClientSession, method: str, url: str, *, json: object = None
) -> AsyncIterator[aiohttp.ClientResponse]:
    """``session.request(method, url, json=json)``, resent once on a new connection if the first
    connection turned out to be closed (see the module docstring); yields the response.

    Only for requests that may be sent twice; ``json=None`` sends no body. The resend goes through
    a one-connection session with ``session``'s headers, timeout and auth, so it cannot draw
    another pooled connection that died the same way (a restarted server closes all of them).
    """
    try:
        response = await session.request(method, url, json=json)
    except (aiohttp.ClientError, OSError) as error:
        if not is_stale_connection(error):
            raise
        log.info(
            "%s %s: the pooled connection was closed (%s: %s); sending it once more",
            method,
            url,
            type(error).__name__,
            error,
        )
    else:
        async with response:
            yield response
        return
    fresh = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True),
        headers=session.headers,
        timeout=session.timeout,
        auth=session.auth,
        raise_for_status=False,
        trace_configs=[redirect_trace()],
    )
    async with fresh, fresh.request(method, url, json=json) as response:
        yield response
