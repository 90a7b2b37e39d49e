"""The async OpenAI-compatible streaming client that measures every request.

One :class:`OpenAIClient` holds one pooled :class:`aiohttp.ClientSession` for a whole run (never a
session per request), which never reuses a connection idle longer than the servers' keep-alive
(:mod:`harness.client.connections`). :meth:`OpenAIClient.chat` and :meth:`OpenAIClient.completion` send a
streaming request and return a :class:`RequestOutcome`; they never raise for anything the server or
the network does — failures come back as an ``error_kind`` — and only :class:`asyncio.CancelledError`
propagates. They are never resent: a retry would hide a failure and time two sends as one.

Timing rules (all from :func:`time.monotonic_ns`):

* ``started_ns`` is taken just before the request is handed to aiohttp. It includes any wait for a
  free pooled connection, so keep the number of requests in flight at or below ``max_connections``.
* Each network read is timestamped the moment it returns, before it is parsed; every event it
  completes gets that timestamp.
* TTFT is the arrival of the first frame carrying generated tokens of any kind (non-empty content, or
  reasoning text of reasoning models): the engine's first token. ``first_content_ns`` is the arrival of
  the first frame with answer text (content): later than TTFT when a reasoning model streamed its
  reasoning first (time to first answer token). Role-only chunks, empty-content chunks, usage-only
  chunks, SSE comments and keep-alives count for neither.
* ``first_chunk_ns`` is the arrival of the first frame that stands for a generated token, with or
  without text: a token-carrying frame, or an empty content delta (see
  :attr:`~harness.client.sse.Frame.empty_token`). On a server that streams one chunk per token it
  is the true first-token time even when the first token decodes to no text; ``ttft_ns`` later
  than it means TTFT includes decode steps (a tokenizer that cannot show every id).
  ``output_chunks`` (frames with text) against the server's ``completion_tokens`` says the same
  over the whole answer.
* ITLs are the gaps between successive token-carrying arrivals. When one network read carries
  several token-carrying frames, the later ones get a gap of 0 (their true spacing was lost in the
  socket buffer).
* Only events of the default SSE type are chunks: ``event: ping`` (with its own JSON), comments,
  ``id:`` and ``retry:`` lines neither fail a request nor count as tokens. A line that is not valid
  UTF-8 fails the request as ``malformed_frame``: its text would not be what the server generated.
* Two time limits, both named in a ``timeout`` error: ``timeout_s`` bounds the whole request and
  ``read_timeout_s`` (the scenario's ``workload.stall_timeout_s``) bounds the silence between two
  reads, so a connection that goes quiet fails after the stall limit, not after the total one.
* An attached endpoint (one kvbench did not start, so it cannot see it die) gets a stall limit of
  :data:`ATTACHED_STALL_TIMEOUT_S` unless the scenario sets one; while a request waits for its first
  byte, ``on_note`` hears "waiting for first token from URL for N s" every :data:`WAITING_NOTE_S`
  (at most one such note per interval per client, however many requests wait). Bytes that trickle in
  without completing an event (keep-alive comments, a byte at a time) count as silence for the stall limit.
* A stream is read for at most ``2 * max_tokens +`` :data:`RUNAWAY_SLACK_FRAMES` chunk events: a
  server that streams on past what was asked for is cut off as ``malformed_frame`` (an endless
  stream would otherwise be read until the total limit).
* ``usage.prompt_tokens`` is set beside the prompt's size in UTF-8 bytes, ``B`` (token ids: their
  number), plus :data:`TEMPLATE_SLACK_TOKENS` per message for a chat template: no tokenizer gives more
  tokens than bytes. Above ``B + slack`` it is noted once per client (with the figures); above
  :data:`USAGE_REFUSE_FACTOR` times that plus :data:`USAGE_REFUSE_SLACK_TOKENS` it is refused: the
  request becomes a ``malformed_frame`` error, since a count no tokenizer can give is not this prompt's
  and would corrupt every prompt-length figure of the run (the timings of such a request are not
  trusted either). A refused count stays refused: the warm-up does not retry it.
* Redirects to another origin are refused (:mod:`harness.client.redirects`); 401, 403 and
  certificate failures come back with :attr:`RequestOutcome.permanent` set: sending again cannot help.
* E2E is the arrival of the last byte of the event stream: the read that completed
  ``data: [DONE]`` (what follows it, the end of the chunked body, is read so the connection can be
  reused, but not timed). On failures it is the last byte received, or the moment the failure was
  seen when nothing arrived.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

import aiohttp

from common.redact import redact_text

from .connections import idempotent_request, new_session
from .endpoint import Endpoint
from .errors import ErrorKind
from .redirects import CrossOriginRedirect
from .router import current_routing_key
from .sse import Api, Frame, FrameKind, SSEParser, Usage, interpret_chunk, is_chunk_event

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
METRICS_PATH = "/metrics"
SNIPPET_CHARS = 300
"""Error bodies and messages are cut to this many characters (after redaction)."""
_SNIPPET_READ_BYTES = 4096
DRAIN_TIMEOUT_S = 1.0
"""How long to wait for the end of the body after ``data: [DONE]``."""
ATTACHED_STALL_TIMEOUT_S = 300.0
"""Default silence limit (s) between two reads from an endpoint kvbench attached to (``workload.stall_timeout_s``
unset): servers send nothing until the prefill ends, so it leaves minutes for a long context on a loaded
server, and still sees a dead one well before the 600 s request limit (three warm-up tries: 30 minutes)."""
WAITING_NOTE_S = 30.0
"""Seconds between "waiting for first token" notes."""
RUNAWAY_SLACK_FRAMES = 64
"""Chunk events allowed beyond ``2 * max_tokens`` (role, finish, usage and keep-alive chunks)."""
TEMPLATE_SLACK_TOKENS = 64
"""Tokens a chat template may add per message (and a completion's BOS) on top of the prompt's bytes."""
USAGE_REFUSE_FACTOR = 4
USAGE_REFUSE_SLACK_TOKENS = 8192
"""``usage.prompt_tokens`` above ``USAGE_REFUSE_FACTOR * (bytes + slack) + USAGE_REFUSE_SLACK_TOKENS`` fails the
request; the constant term leaves room for a system prompt a gateway adds unseen to every request."""
PERMANENT_STATUSES = frozenset({401, 403, 407})
"""Refused credentials: another try sends the same ones."""


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What one streaming request did. Durations are nanoseconds relative to ``started_ns``."""

    started_ns: int
    """time.monotonic_ns() just before the request was sent."""
    ttft_ns: int | None = None
    e2e_ns: int | None = None
    itl_ns: tuple[int, ...] = ()
    output_chunks: int = 0
    """Token-carrying frames received: frames with generated text (content or reasoning)."""
    first_chunk_ns: int | None = None
    """First frame standing for a generated token, text or not (empty content deltas count)."""
    first_content_ns: int | None = None
    """First frame with answer text (content, not reasoning) minus start: TTFT unless reasoning streamed first."""
    empty_token_chunks: int = 0
    """Empty content deltas received (tokens that streamed no text)."""
    text: str = ""
    """The generated text (content only; reasoning text is not included)."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    http_status: int | None = None
    error_kind: ErrorKind | None = None
    error: str | None = None
    """Redacted, at most :data:`SNIPPET_CHARS` characters."""
    finish_reason: str | None = None
    replica: int | None = None
    """Fleets: the replica that served it (:class:`harness.client.fleet.FleetClient`); None for one engine."""
    moved: bool | None = None
    """Fleets: served by another replica than the conversation's previous request (None: its first)."""
    served_by: str | None = None
    """The response header the client was asked to capture (an external router's serving replica)."""
    permanent: bool = False
    """A failure another try would meet again (credentials refused, certificate rejected, redirected to
    another origin): not retried. Not stored in records."""

    @property
    def ok(self) -> bool:
        return self.error_kind is None


def _snippet(text: str, secrets: tuple[str, ...] = ()) -> str:
    # the key is scrubbed as a literal too: a server may echo it after any prefix ("key sk-...", "X-Key: ...")
    text = redact_text(" ".join(text.split()), secrets)
    return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 3] + "..."


def _describe(exc: BaseException) -> str:
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class _Stream:
    """Accumulates one streaming response: timings, text, usage, and the first failure."""

    def __init__(self, api: Api, started_ns: int, secrets: tuple[str, ...] = ()) -> None:
        self.api: Api = api
        self.started_ns = started_ns
        self.secrets = secrets
        self.http_status: int | None = None
        self.first_token_ns: int | None = None
        self.last_token_ns: int | None = None
        self.last_byte_ns: int | None = None
        self.itl: list[int] = []
        self.chunks = 0
        self.first_chunk_ns: int | None = None
        self.first_content_at: int | None = None
        self.empty_token_chunks = 0
        self.parts: list[str] = []
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.done = False

    def on_frame(self, frame: Frame, arrived_ns: int) -> tuple[ErrorKind, str] | None:
        """Account for one frame; return (error_kind, message) when it ends the request."""
        if frame.usage is not None:
            self.usage = frame.usage
        if frame.finish_reason is not None:
            self.finish_reason = frame.finish_reason
        kind = frame.kind
        if self.first_chunk_ns is None and (frame.carries_tokens or frame.empty_token):
            self.first_chunk_ns = arrived_ns
        if frame.empty_token:
            self.empty_token_chunks += 1
        if frame.carries_tokens:
            if self.last_token_ns is None:
                self.first_token_ns = arrived_ns
            else:
                self.itl.append(arrived_ns - self.last_token_ns)
            self.last_token_ns = arrived_ns
            self.chunks += 1
            if frame.text:
                self.parts.append(frame.text)
                if self.first_content_at is None:
                    self.first_content_at = arrived_ns
        elif kind is FrameKind.DONE:
            self.done = True
        elif kind is FrameKind.ERROR:
            return "server_error", frame.error or "error frame"
        elif kind is FrameKind.MALFORMED:
            return "malformed_frame", frame.error or "malformed frame"
        return None

    def outcome(
        self,
        error_kind: ErrorKind | None = None,
        error: str | None = None,
        *,
        failed_ns: int | None = None,
        permanent: bool = False,
    ) -> RequestOutcome:
        end_ns = self.last_byte_ns if self.last_byte_ns is not None else failed_ns
        usage = self.usage or Usage()
        return RequestOutcome(
            started_ns=self.started_ns,
            ttft_ns=None if self.first_token_ns is None else self.first_token_ns - self.started_ns,
            e2e_ns=None if end_ns is None else end_ns - self.started_ns,
            itl_ns=tuple(self.itl),
            output_chunks=self.chunks,
            first_chunk_ns=None if self.first_chunk_ns is None else self.first_chunk_ns - self.started_ns,
            first_content_ns=None if self.first_content_at is None else self.first_content_at - self.started_ns,
            empty_token_chunks=self.empty_token_chunks,
            text="".join(self.parts),
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
            http_status=self.http_status,
            error_kind=error_kind,
            error=None if error is None else _snippet(error, self.secrets),
            finish_reason=self.finish_reason,
            permanent=permanent,
        )


def prompt_size(base: Mapping[str, object]) -> tuple[int, int]:
    """(UTF-8 bytes of the prompt, or its number of token ids; messages or prompts in it)."""
    prompt = base.get("prompt")
    if isinstance(prompt, list):
        return len(prompt), 1
    if isinstance(prompt, str):
        return len(prompt.encode()), 1
    messages = base.get("messages")
    if not isinstance(messages, list):
        return 0, 1
    size = sum(len(json.dumps(message.get("content"), ensure_ascii=False).encode()) for message in messages)
    return size, max(1, len(messages))


RequestKind = Literal["chat", "completion"]
RequestBody = list[dict[str, str]] | str | list[int]
"""A request's body: a chat's messages, or a completion's prompt (text, or token ids the server takes as they are)."""


@dataclass(frozen=True)
class Request:
    """One streamed request as every client takes it (:meth:`RequestMethods.request`)."""

    kind: RequestKind
    body: RequestBody
    max_tokens: int
    ignore_eos: bool
    extra_body: Mapping[str, object] | None
    """Keys merged into the payload last (they win, except ``stream``)."""


class RequestMethods(abc.ABC):
    """``chat`` and ``completion`` (the :class:`~harness.client.pool.StreamingClient` interface) over the one
    :meth:`request` each client implements: one endpoint (:class:`OpenAIClient`), a pool of worker processes, a fleet.
    """

    async def chat(
        self,
        messages: Sequence[Mapping[str, str]],
        max_tokens: int,
        *,
        ignore_eos: bool = False,
        extra_body: Mapping[str, object] | None = None,
    ) -> RequestOutcome:
        """Stream a chat completion of ``messages``."""
        messages_copied = [dict(message) for message in messages]
        return await self.request(Request("chat", messages_copied, max_tokens, ignore_eos, extra_body))

    async def completion(
        self,
        prompt: str | list[int],
        max_tokens: int,
        *,
        ignore_eos: bool = False,
        extra_body: Mapping[str, object] | None = None,
    ) -> RequestOutcome:
        """Stream a completion of ``prompt``: text, or token ids the server takes as they are (no tokenizing)."""
        return await self.request(Request("completion", prompt, max_tokens, ignore_eos, extra_body))

    @abc.abstractmethod
    async def request(self, request: Request) -> RequestOutcome:
        """Stream ``request``."""


class ClosedOnExit(abc.ABC):
    """Leaving ``async with`` runs :meth:`close` (a client's session, a pool's worker processes)."""

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @abc.abstractmethod
    async def close(self) -> None:
        """Release what the client holds; a second call does nothing."""


_REQUEST_APIS: dict[RequestKind, tuple[Api, str, str]] = {
    "chat": ("chat", CHAT_PATH, "messages"),
    "completion": ("completions", COMPLETIONS_PATH, "prompt"),
}
"""Each request kind's stream parser, server path and the payload field its body goes in."""


class OpenAIClient(RequestMethods, ClosedOnExit):
    """Streaming client for an OpenAI-compatible server; use as ``async with OpenAIClient(...)``.

    ``endpoint.base_url`` is the server root (``http://host:port``); a trailing ``/v1`` is tolerated.
    ``timeout_s`` bounds a whole request (connection wait, connect, and reading the stream);
    ``connect_timeout_s`` and ``read_timeout_s`` optionally bound connecting and the silence between
    two reads. A connect timeout is a ``connection`` error; the other two are ``timeout``.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        timeout_s: float,
        max_connections: int = 512,
        connect_timeout_s: float | None = None,
        read_timeout_s: float | None = None,
        capture_header: str | None = None,
        session_header: str | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self._endpoint = endpoint
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s, sock_read=read_timeout_s)
        self._max_connections = max_connections
        self._capture_header = capture_header
        """A response header copied into every outcome's ``served_by`` (fleets behind a router)."""
        self._session_header = session_header
        """A request header carrying the conversation id (:func:`~.router.current_routing_key`), which a
        router's session-affine policy hashes; not sent for requests outside any conversation."""
        root = endpoint.base_url.rstrip("/")
        self._root = root.removesuffix("/v1")
        self._session: aiohttp.ClientSession | None = None
        self._on_note = on_note
        """Where notes for the user go (the run's progress): waiting for a first byte, a usage count off."""
        self._last_wait_note = 0.0
        self._usage_noted = False

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint

    @property
    def secrets(self) -> tuple[str, ...]:
        """What this client sends that must never be stored: its API key."""
        return (self._endpoint.api_key,) if self._endpoint.api_key else ()

    @property
    def session(self) -> aiohttp.ClientSession:
        """The pooled session (only between ``__aenter__`` and ``__aexit__``)."""
        if self._session is None or self._session.closed:
            raise RuntimeError("OpenAIClient is not open: use it as 'async with OpenAIClient(...)'")
        return self._session

    async def __aenter__(self) -> OpenAIClient:
        if self._session is not None and not self._session.closed:
            raise RuntimeError("OpenAIClient is already open")
        # pooled connections idle past KEEPALIVE_TIMEOUT_S are not reused: the server may have closed them
        self._session = new_session(timeout=self._timeout, headers=self._endpoint.headers, limit=self._max_connections)
        return self

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def url(self, path: str) -> str:
        """Absolute URL of a server path such as ``/metrics`` or ``/v1/completions``."""
        return self._root + (path if path.startswith("/") else "/" + path)

    # ------------------------------------------------------------------ streaming requests

    async def request(self, request: Request) -> RequestOutcome:
        api, path, field = _REQUEST_APIS[request.kind]
        payload: dict[str, object] = {field: request.body}
        return await self._stream(api, path, payload, request.max_tokens, request.ignore_eos, request.extra_body)

    def build_payload(
        self,
        base: Mapping[str, object],
        max_tokens: int,
        ignore_eos: bool,
        extra_body: Mapping[str, object] | None,
    ) -> dict[str, object]:
        """The request body: ``extra_body`` keys are merged last and win, except ``stream``."""
        payload: dict[str, object] = {"model": self._endpoint.model, **base}
        payload.update(
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        if ignore_eos:
            payload["ignore_eos"] = True
        if extra_body:
            payload.update(extra_body)
            payload["stream"] = True
        return payload

    async def _stream(
        self,
        api: Api,
        path: str,
        base: Mapping[str, object],
        max_tokens: int,
        ignore_eos: bool,
        extra_body: Mapping[str, object] | None,
    ) -> RequestOutcome:
        session = self.session
        body = self.build_payload(base, max_tokens, ignore_eos, extra_body)
        headers = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}
        key = current_routing_key()
        if self._session_header is not None and key is not None:
            headers[self._session_header] = key
        state = _Stream(api, time.monotonic_ns(), self.secrets)
        url = self.url(path)
        waiting = asyncio.create_task(self._note_waiting(url, state)) if self._on_note is not None else None
        try:
            return await self._send(session, url, body, headers, state, base)
        finally:
            if waiting is not None:
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting

    async def _note_waiting(self, url: str, state: _Stream) -> None:
        """Every WAITING_NOTE_S while no byte has arrived: say so (one note per interval per client)."""
        waited = 0.0
        while state.last_byte_ns is None:
            await asyncio.sleep(WAITING_NOTE_S)
            waited += WAITING_NOTE_S
            now = time.monotonic()
            quiet = now - self._last_wait_note >= WAITING_NOTE_S  # other requests may have said it already
            if state.last_byte_ns is None and self._on_note is not None and quiet:
                self._last_wait_note = now
                self._on_note(f"waiting for first token from {redact_text(url)} for {waited:g} s")

    async def _send(
        self,
        session: aiohttp.ClientSession,
        url: str,
        body: Mapping[str, object],
        headers: Mapping[str, str],
        state: _Stream,
        base: Mapping[str, object],
    ) -> RequestOutcome:
        phase: Literal["connect", "stream"] = "connect"
        max_tokens = body.get("max_tokens")
        frame_limit = 2 * max_tokens + RUNAWAY_SLACK_FRAMES if isinstance(max_tokens, int) else None
        try:
            async with session.post(url, json=body, headers=headers) as response:
                phase = "stream"
                state.http_status = response.status
                if response.status >= 300:  # 3xx: a redirect aiohttp did not follow (too many, or no Location)
                    snippet = await _read_snippet(response)
                    state.last_byte_ns = time.monotonic_ns()
                    reason = response.reason or ""
                    return state.outcome(
                        "http_status",
                        f"HTTP {response.status} {reason}: {snippet}",
                        permanent=response.status in PERMANENT_STATUSES,
                    )
                if response.content_type == "application/json":
                    snippet = await _read_snippet(response)
                    state.last_byte_ns = time.monotonic_ns()
                    return state.outcome("malformed_frame", f"expected an event stream, got JSON: {snippet}")
                stall = self._timeout.sock_read
                outcome = self._check_usage(await _consume(response, state, frame_limit, stall), base)
                if self._capture_header is None:
                    return outcome
                return dataclasses.replace(outcome, served_by=response.headers.get(self._capture_header))
        except CrossOriginRedirect as exc:
            return state.outcome("http_status", str(exc), failed_ns=time.monotonic_ns(), permanent=True)
        except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError) as exc:
            return state.outcome("connection", _describe(exc), failed_ns=time.monotonic_ns(), permanent=True)
        except aiohttp.ConnectionTimeoutError as exc:
            return state.outcome("connection", _describe(exc), failed_ns=time.monotonic_ns())
        except TimeoutError as exc:  # total timeout, or silence longer than read_timeout_s
            return state.outcome("timeout", self._timeout_message(exc), failed_ns=time.monotonic_ns())
        except aiohttp.ClientPayloadError as exc:
            return state.outcome("stream_dropped", _describe(exc), failed_ns=time.monotonic_ns())
        except aiohttp.ClientError as exc:
            kind: ErrorKind = "connection" if phase == "connect" else "stream_dropped"
            return state.outcome(kind, _describe(exc), failed_ns=time.monotonic_ns())
        except OSError as exc:  # a socket error aiohttp did not wrap
            kind = "connection" if phase == "connect" else "stream_dropped"
            return state.outcome(kind, _describe(exc), failed_ns=time.monotonic_ns())

    def _check_usage(self, outcome: RequestOutcome, base: Mapping[str, object]) -> RequestOutcome:
        """Note once, or refuse, a ``usage.prompt_tokens`` more than the prompt's bytes could give."""
        counted = outcome.prompt_tokens
        if counted is None or not outcome.ok:
            return outcome
        size, parts = prompt_size(base)
        most = size + TEMPLATE_SLACK_TOKENS * parts
        if counted <= most:
            return outcome
        figures = (
            f"usage.prompt_tokens={counted} for a prompt of {size} "
            f"{'token ids' if isinstance(base.get('prompt'), list) else 'bytes'} (at most {most} tokens, "
            "a chat template's included)"
        )
        if counted > USAGE_REFUSE_FACTOR * most + USAGE_REFUSE_SLACK_TOKENS:
            return dataclasses.replace(
                outcome,
                error_kind="malformed_frame",
                error=_snippet(f"{figures}: refused, the count is not this prompt's", self.secrets),
                permanent=True,  # the server counts the same way on every try
            )
        if not self._usage_noted and self._on_note is not None:
            self._usage_noted = True
            self._on_note(f"{redact_text(self._root)}: {figures}; prompt lengths from usage are suspect")
        return outcome

    def _timeout_message(self, exc: TimeoutError) -> str:
        """Which limit fired, with both limits, so a stall is never mistaken for a slow answer."""
        total = f"timeout_s={self._timeout.total:g}"
        stall = self._timeout.sock_read
        limits = f"{total}, stall_timeout_s={stall:g}" if stall is not None else f"{total}, no stall limit"
        if stall is not None and isinstance(exc, aiohttp.ServerTimeoutError):  # sock_read: nothing arrived
            return (
                f"connection silent for longer than stall_timeout_s={stall:g} ({limits}; "
                "workload.stall_timeout_s sets it): the endpoint stalled"
            )
        return f"no complete response within {total} ({limits})"

    # ------------------------------------------------------------------ plain helpers

    async def get_text(self, path: str) -> str:
        """GET a server path and return its body; raises aiohttp errors (status >= 400 included).

        Resent once on a new connection if the pooled one was closed (:func:`.connections.idempotent_request`).
        """
        async with idempotent_request(self.session, "GET", self.url(path)) as response:
            response.raise_for_status()
            return await response.text()

    async def post_json(self, path: str, payload: object) -> tuple[int, object]:
        """POST JSON; return the status and the decoded body (text if not JSON, None if empty).

        Raises aiohttp errors and :class:`TimeoutError`, but not for a status >= 400: callers such as
        ``/tokenize`` and ``/reset_prefix_cache`` decide what a status means. Only for idempotent
        POSTs: it is resent once on a new connection if the pooled one was closed.
        """
        async with idempotent_request(self.session, "POST", self.url(path), json=payload) as response:
            text = await response.text()
            if not text.strip():
                return response.status, None
            try:
                return response.status, json.loads(text)
            except json.JSONDecodeError:
                return response.status, text

    async def metrics_text(self) -> str:
        """The Prometheus ``/metrics`` page of the server."""
        return await self.get_text(self._endpoint.metrics_path or METRICS_PATH)


async def _read_snippet(response: aiohttp.ClientResponse) -> str:
    """Up to a few KiB of an error body, decoded leniently; empty if the body cannot be read."""
    try:
        raw = await response.content.read(_SNIPPET_READ_BYTES)
    except (aiohttp.ClientError, TimeoutError, OSError):
        return ""
    return raw.decode("utf-8", errors="replace")


async def _drain(response: aiohttp.ClientResponse) -> None:
    """Read what follows ``[DONE]`` (the end of the chunked body) so the connection can be reused.

    Bounded by :data:`DRAIN_TIMEOUT_S`; a server that keeps the stream open after ``[DONE]`` just
    loses its pooled connection. Nothing read here affects the outcome.
    """
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            async for _ in response.content.iter_any():
                pass
    except (TimeoutError, aiohttp.ClientError, OSError):
        pass


def _invalid_utf8_message(parser: SSEParser) -> str:
    return f"invalid UTF-8 in the event stream ({parser.invalid_utf8[0]})"


async def _consume(
    response: aiohttp.ClientResponse, state: _Stream, frame_limit: int | None, stall_s: float | None
) -> RequestOutcome:
    """Read the event stream to its end, timestamping each read on arrival; at most ``frame_limit`` chunk events.

    With ``stall_s``, bytes that keep trickling in (comments, a byte at a time) without completing a chunk event
    for longer than it are a stall too: aiohttp's read timeout only sees silence.
    """
    parser = SSEParser()
    api = state.api
    frames = 0
    last_event_ns = state.started_ns
    async for chunk in response.content.iter_any():
        arrived_ns = time.monotonic_ns()
        state.last_byte_ns = arrived_ns
        events = parser.feed(chunk)
        if any(is_chunk_event(event) for event in events):
            last_event_ns = arrived_ns
        elif stall_s is not None and arrived_ns - last_event_ns > stall_s * 1e9:
            return state.outcome(
                "timeout",
                f"bytes trickled in but no event for longer than stall_timeout_s={stall_s:g}: the endpoint stalled",
            )
        if parser.invalid_utf8:
            return state.outcome("malformed_frame", _invalid_utf8_message(parser))
        for event in events:
            if not is_chunk_event(event):
                continue  # event: ping and friends carry no chunk
            frames += 1
            if frame_limit is not None and frames > frame_limit:
                return state.outcome(
                    "malformed_frame",
                    f"the stream went on past {frame_limit} chunks (2 x max_tokens + {RUNAWAY_SLACK_FRAMES}) "
                    "without data: [DONE]; stopped reading",
                )
            failure = state.on_frame(interpret_chunk(event.data, api), arrived_ns)
            if failure is not None:
                return state.outcome(*failure)
            if state.done:
                break  # anything after [DONE] is ignored
        if state.done:
            await _drain(response)
            break
    if not state.done:
        events = parser.finish()
        if parser.invalid_utf8:
            return state.outcome("malformed_frame", _invalid_utf8_message(parser))
        for event in events:
            if not is_chunk_event(event):
                continue
            frame = interpret_chunk(event.data, api)
            if frame.kind is FrameKind.MALFORMED:
                break  # a frame cut off by the end of the stream: the stream dropped
            failure = state.on_frame(frame, state.last_byte_ns or time.monotonic_ns())
            if failure is not None:
                return state.outcome(*failure)
    if not state.done:
        return state.outcome("stream_dropped", "stream ended without data: [DONE]", failed_ns=time.monotonic_ns())
    if state.chunks == 0:
        return state.outcome("empty_response", "the stream carried no generated text")
    return state.outcome()
