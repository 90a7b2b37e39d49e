"""Server-sent events: an incremental parser and an interpreter of OpenAI streaming chunks.

Two layers, both free of I/O so they can be tested byte by byte:

* :class:`SSEParser` turns bytes, fed in whatever pieces the network delivers, into complete
  :class:`SSEEvent` values, following the WHATWG ``text/event-stream`` rules: ``\\n``, ``\\r\\n`` and
  bare ``\\r`` line endings (a ``\\r\\n`` split across two reads is one line ending), comment lines
  (``: keep-alive``), ``data:`` fields spread over several lines, fields with or without a space
  after the colon, ``event:``/``id:``/``retry:`` fields and a leading byte-order mark. Lines are
  split on bytes and decoded only once complete, so a read that ends inside a multi-byte UTF-8
  character is harmless. Feeding a stream one byte at a time gives the same events as feeding it
  whole. A line that is not valid UTF-8 is decoded with U+FFFD replacements (as the standard
  says) *and* recorded in :attr:`SSEParser.invalid_utf8`, so a client can refuse the response
  instead of measuring text the server never sent.
* Only events of the default type (``message``: no ``event:`` field) carry OpenAI chunks;
  :func:`is_chunk_event` says so, and events of any other type (``event: ping`` with its own
  JSON) are counted in :attr:`SSEParser.other_events` and otherwise ignored.
* :func:`interpret_chunk` classifies the ``data`` of one event of an OpenAI-compatible stream
  (chat: ``choices[0].delta.content``; completions: ``choices[0].text``) as a :class:`Frame` of a
  :class:`FrameKind`: content, reasoning, role-only, empty, usage-only, error, malformed or the
  ``[DONE]`` sentinel.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import Literal

Api = Literal["chat", "completions"]

_EOL = re.compile(rb"\r\n|[\r\n]")
_BOM = b"\xef\xbb\xbf"
DONE_SENTINEL = "[DONE]"
DEFAULT_EVENT = "message"
"""The type of an event without an ``event:`` field; the only type whose data is an OpenAI chunk."""


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event. ``data`` has its lines joined with ``\\n`` (no trailing newline)."""

    data: str
    event: str = DEFAULT_EVENT
    id: str | None = None
    """The last event id seen on the stream so far (``id:`` fields persist across events)."""
    retry_ms: int | None = None
    """The ``retry:`` value given in this event, if any."""


class SSEParser:
    """Incremental ``text/event-stream`` parser: :meth:`feed` bytes, get the events they complete.

    An event is dispatched at the blank line that ends it; an event without ``data`` lines (only
    comments, or only ``event:``/``id:``) dispatches nothing, as the standard requires. At end of
    stream, call :meth:`finish`.
    """

    __slots__ = (
        "_bom_checked",
        "_buf",
        "_data",
        "_event",
        "_has_fields",
        "_last_id",
        "_retry",
        "_skip_lf",
        "comments",
        "invalid_utf8",
        "other_events",
        "truncated",
    )

    def __init__(self) -> None:
        self._buf = b""
        self._skip_lf = False  # the last read ended with \r: a \n starting the next read belongs to it
        self._bom_checked = False
        self._data: list[str] = []
        self._event = ""
        self._retry: int | None = None
        self._last_id: str | None = None
        self._has_fields = False  # any field line since the last dispatch (for `truncated`)
        self.comments = 0
        """Comment lines seen so far (``: keep-alive`` and friends)."""
        self.invalid_utf8: list[str] = []
        """One entry per line that was not valid UTF-8: where the bad bytes were, for the error record."""
        self.other_events = 0
        """Dispatched events of a type other than the default ``message`` (not chunks)."""
        self.truncated = False
        """Set by :meth:`finish` when the stream ended inside a line or before an event's blank line."""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume ``chunk`` and return the events it completes (possibly none)."""
        if not chunk:
            return []
        buf = self._buf + chunk if self._buf else chunk
        if not self._bom_checked:
            if len(buf) < len(_BOM) and _BOM.startswith(buf):
                self._buf = buf  # could still become a BOM: wait for more bytes
                return []
            self._bom_checked = True
            if buf.startswith(_BOM):
                buf = buf[len(_BOM) :]
        if self._skip_lf and buf:
            self._skip_lf = False
            if buf[:1] == b"\n":
                buf = buf[1:]
        events: list[SSEEvent] = []
        start = 0
        for match in _EOL.finditer(buf):
            self._line(buf[start : match.start()], events)
            start = match.end()
        if start == len(buf) and buf.endswith(b"\r"):
            self._skip_lf = True
        self._buf = buf[start:]
        return events

    def finish(self) -> list[SSEEvent]:
        """End of stream: return a last event whose only missing part is the closing blank line.

        The standard discards such an event; servers that forget the final blank line after
        ``data: [DONE]`` are common enough that this parser dispatches it instead. An unterminated
        last line is not trusted and is discarded. Either case sets :attr:`truncated`.
        """
        events: list[SSEEvent] = []
        if self._buf:
            self.truncated = True
            self._buf = b""
        if self._has_fields:
            self.truncated = True
            self._line(b"", events)
        return events

    def _line(self, raw: bytes, events: list[SSEEvent]) -> None:
        if not raw:
            self._dispatch(events)
            return
        if raw[:1] == b":":
            self.comments += 1
            return
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            self.invalid_utf8.append(f"byte {error.start} of a {len(raw)}-byte line: {error.reason}")
            line = raw.decode("utf-8", errors="replace")
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        self._has_fields = True
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\x00" not in value:
                self._last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        # any other field name is ignored, as the standard says

    def _dispatch(self, events: list[SSEEvent]) -> None:
        if self._data:
            if self._event not in ("", DEFAULT_EVENT):
                self.other_events += 1
            events.append(
                SSEEvent(
                    data="\n".join(self._data),
                    event=self._event or DEFAULT_EVENT,
                    id=self._last_id,
                    retry_ms=self._retry,
                )
            )
        self._data = []
        self._event = ""
        self._retry = None
        self._has_fields = False


def is_chunk_event(event: SSEEvent) -> bool:
    """True for events of the default type: OpenAI-compatible servers send their chunks only as those."""
    return event.event == DEFAULT_EVENT


def parse_sse(payload: bytes) -> list[SSEEvent]:
    """Parse a whole stream at once (tests and offline tools)."""
    parser = SSEParser()
    return parser.feed(payload) + parser.finish()


class FrameKind(enum.Enum):
    """What one ``data:`` payload of an OpenAI-compatible stream carries."""

    CONTENT = "content"
    """Non-empty generated text (``delta.content`` or ``text``)."""
    REASONING = "reasoning"
    """Chat only: no content but non-empty ``delta.reasoning_content``/``delta.reasoning``."""
    ROLE_ONLY = "role_only"
    """Chat only: ``delta.role`` with no (or empty) content, usually the first chunk."""
    EMPTY = "empty"
    """A well-formed chunk without text: a finish chunk, an empty delta, ``choices: []`` alone."""
    USAGE_ONLY = "usage_only"
    """``choices`` empty or absent, ``usage`` present: the ``include_usage`` chunk."""
    ERROR = "error"
    """``{"error": ...}`` (vLLM, SGLang) or ``{"object": "error", ...}`` sent mid-stream."""
    MALFORMED = "malformed"
    """Not JSON, or JSON of the wrong shape."""
    DONE = "done"
    """The ``[DONE]`` sentinel."""


@dataclass(frozen=True, slots=True)
class Usage:
    """The ``usage`` block of a chunk; a field the server left out is ``None``."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    """``usage.prompt_tokens_details.cached_tokens`` (vLLM needs ``--enable-prompt-tokens-details``)."""


@dataclass(frozen=True, slots=True)
class Frame:
    """The interpretation of one event's data."""

    kind: FrameKind
    text: str = ""
    """Generated text (empty unless ``kind`` is CONTENT)."""
    reasoning: str = ""
    """Reasoning text of reasoning models (chat); never part of :attr:`text`."""
    usage: Usage | None = None
    """Usage attached to this chunk, whatever its kind (servers may attach it to every chunk)."""
    finish_reason: str | None = None
    error: str | None = None
    """Server message (ERROR) or what is wrong (MALFORMED); not redacted here."""
    empty_token: bool = False
    """An EMPTY chunk that still stands for a generated token: a chat delta with a ``content`` string
    and no ``role``, or a completions choice with a ``text`` string, both empty. Servers that stream
    one chunk per token (vLLM) send these for tokens that decode to no text yet: a special token, or
    bytes of a character that is not complete."""

    @property
    def carries_tokens(self) -> bool:
        """True when this frame delivered generated tokens (counts for TTFT and ITL)."""
        return self.kind is FrameKind.CONTENT or self.kind is FrameKind.REASONING


def _malformed(why: str) -> Frame:
    return Frame(FrameKind.MALFORMED, error=why)


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _parse_usage(raw: object) -> Usage | Literal[False] | None:
    """``None`` when absent/null, ``False`` when present but not an object."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        return False
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt_tokens=_int_or_none(raw.get("prompt_tokens")),
        completion_tokens=_int_or_none(raw.get("completion_tokens")),
        cached_tokens=_int_or_none(cached),
    )


def _error_message(raw: object) -> str:
    if isinstance(raw, dict):
        message = raw.get("message")
        if isinstance(message, str) and message:
            kind = raw.get("type")
            return f"{kind}: {message}" if isinstance(kind, str) and kind else message
        return json.dumps(raw, sort_keys=True, default=str)
    return str(raw)


def _text_field(container: dict[str, object], key: str) -> str | Literal[False] | None:
    """The string at ``key``: ``None`` when absent/null, ``False`` when present but not a string."""
    value = container.get(key)
    if value is None or isinstance(value, str):
        return value
    return False


def interpret_chunk(data: str, api: Api) -> Frame:
    """Classify the data of one SSE event of a chat or completions stream. Never raises."""
    if data.strip() == DONE_SENTINEL:
        return Frame(FrameKind.DONE)
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, RecursionError) as exc:
        return _malformed(f"invalid JSON: {exc}")
    if not isinstance(obj, dict):
        return _malformed(f"expected a JSON object, got {type(obj).__name__}")
    if obj.get("error") is not None:
        return Frame(FrameKind.ERROR, error=_error_message(obj["error"]))
    if obj.get("object") == "error":
        return Frame(FrameKind.ERROR, error=_error_message(obj))

    usage = _parse_usage(obj.get("usage"))
    if usage is False:
        return _malformed("usage is not an object")
    choices = obj.get("choices")
    if choices is None or choices == []:
        if usage is not None:
            return Frame(FrameKind.USAGE_ONLY, usage=usage)
        if choices is None:
            return _malformed("no choices and no usage")
        return Frame(FrameKind.EMPTY)
    if not isinstance(choices, list):
        return _malformed("choices is not a list")
    choice = choices[0]
    if not isinstance(choice, dict):
        return _malformed("choices[0] is not an object")
    finish = choice.get("finish_reason")
    finish_reason = finish if isinstance(finish, str) else None

    if api == "completions":
        text = _text_field(choice, "text")
        if text is False:
            return _malformed("choices[0].text is not a string")
        kind = FrameKind.CONTENT if text else FrameKind.EMPTY
        return Frame(kind, text=text or "", usage=usage, finish_reason=finish_reason, empty_token=text == "")

    delta = choice.get("delta")
    if delta is None:
        delta = {}
    if not isinstance(delta, dict):
        return _malformed("choices[0].delta is not an object")
    content = _text_field(delta, "content")
    if content is False:
        return _malformed("choices[0].delta.content is not a string")
    if content:
        return Frame(FrameKind.CONTENT, text=content, usage=usage, finish_reason=finish_reason)
    reasoning = _text_field(delta, "reasoning_content") or _text_field(delta, "reasoning")
    if reasoning:
        return Frame(FrameKind.REASONING, reasoning=reasoning, usage=usage, finish_reason=finish_reason)
    if delta.get("role"):
        return Frame(FrameKind.ROLE_ONLY, usage=usage, finish_reason=finish_reason)
    return Frame(FrameKind.EMPTY, usage=usage, finish_reason=finish_reason, empty_token=content == "")
