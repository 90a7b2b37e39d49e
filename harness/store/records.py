"""Immutable per-request records and the append-only JSONL file they live in.

Every request becomes one :class:`RequestRecord` the moment it completes. Records are appended
to ``records.jsonl``, flushed at once and fsynced per batch, so a killed run keeps what it
measured. Times are integer nanoseconds from a monotonic clock; milliseconds appear only in
reports.

Records are validated on load as strictly as they are written: integers are JSON integers (the
string ``"12"`` is refused, not converted), counts and clock readings are non-negative, durations
(TTFT, end-to-end, inter-token gaps) lie in ``[0, MAX_DURATION_NS]`` (one day: no request of a
benchmark takes longer, so a larger value is a corrupt file), and a successful request has a TTFT.
The clock readings of one request come in the order they happen, all on one monotonic clock:

    first_chunk_ns <= ttft_ns <= first_content_ns <= e2e_ns,   sum(itl_ns) <= e2e_ns - ttft_ns

(the inter-token gaps lie between the first token and the last byte), and ``cached_tokens <= prompt_tokens``.
A bad line is a one-line error naming the file, the line and the field; reports refuse it rather
than average an impossible number.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from common.private import open_private
from harness.client.errors import ErrorKind

from .jsonl import iter_jsonl, repair_torn_tail

Phase = Literal["warmup", "measure", "filler"]

MAX_DURATION_NS = 86_400 * 1_000_000_000
"""One day in nanoseconds: the bound of every stored duration."""
# strict: a JSON string or float is not an integer ("12" is refused, not converted)
DurationNs = Annotated[int, Field(strict=True, ge=0, le=MAX_DURATION_NS)]
Count = Annotated[int, Field(strict=True, ge=0)]


def _in_order(value: int | None, info: ValidationInfo, fields: tuple[str, ...], *, after: bool, why: str) -> int | None:
    """``value`` (monotonic ns) checked against each of ``fields`` validated before it: not earlier than them
    (``after``), else not later; ValueError naming the field and ``why``."""
    for field in fields:
        other = info.data.get(field)
        if value is not None and other is not None and (value < other if after else value > other):
            raise ValueError(f"{value} is {'earlier' if after else 'later'} than {field} {other} ({why})")
    return value


class RequestRecord(BaseModel):
    """What one request did, as seen by the client."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    arm: str
    attempt: Count = Field(description="Which invocation of the run wrote it (0 = first, resumes count up).")
    phase: Phase
    repetition: int = Field(strict=True, ge=-1, description="0-based repetition; -1 for warm-up requests.")
    context_tokens: Count = Field(description="Target context length of the conversation (the table row).")
    conversation: Count
    turn: int = Field(strict=True, ge=1, description="1-based turn within the conversation.")
    request_id: str
    api: Literal["chat", "completions"]
    started_ns: Count = Field(description="time.monotonic_ns() when the request was sent.")
    ttft_ns: DurationNs | None = Field(
        description="First chunk with generated text of any kind (content or reasoning) minus start: the first token."
    )
    first_content_ns: DurationNs | None = Field(
        default=None,
        description="First chunk with answer text (content, not reasoning) minus start: later than ttft_ns when a "
        "reasoning model streamed its reasoning first (None: no answer text, or a record written before the field).",
    )
    e2e_ns: DurationNs | None = Field(description="Last byte of the response minus start.")
    itl_ns: list[DurationNs] = Field(default_factory=list, description="Gaps between content chunks.")
    output_chunks: Count = Field(default=0, description="Chunks that carried generated text (content or reasoning).")
    # -- stream accounting (absent, i.e. None, in records written before these fields existed) --
    first_chunk_ns: DurationNs | None = Field(
        default=None,
        description="First chunk standing for a generated token, text or not (an empty content delta counts), "
        "minus start; ttft_ns later than this means the first token(s) streamed no text.",
    )
    empty_token_chunks: Count | None = Field(
        default=None, description="Chunks with an empty content delta: tokens that streamed no text."
    )
    finish_reason: str | None = Field(default=None, description="The stream's last finish_reason (length, stop).")
    prompt_tokens: Count | None = Field(default=None, description="From the server's usage block.")
    completion_tokens: Count | None = None
    cached_tokens: Count | None = Field(default=None, description="usage.prompt_tokens_details.cached_tokens.")
    expected_prompt_tokens: Count | None = Field(default=None, description="What the workload built.")
    http_status: Count | None = None
    ok: bool = Field(strict=True)
    error_kind: ErrorKind | None = None
    error: str | None = None
    # -- load runs (kvbench sweep/soak); absent from probe records ----------------------------
    point: Count | None = Field(default=None, description="Index of the sweep load point.")
    load: float | None = Field(
        default=None, strict=True, ge=0, description="The point's load: concurrency (users) or requests/s."
    )
    user: Count | None = Field(default=None, description="The user (its context); conversation is the session.")
    scheduled_ns: Count | None = Field(
        default=None, description="Open-loop arrival time the request was due (monotonic ns); started_ns - it = lag."
    )
    # -- fleets (engine.replicas > 1); absent for one engine ----------------------------------
    replica: Count | None = Field(default=None, description="The replica that served it (0-based).")
    moved: bool | None = Field(
        default=None, description="Served by another replica than the conversation's previous request (turn >= 2)."
    )
    # -- shards (--shard I/N); absent from an unsharded run -----------------------------------
    shard: Count | None = Field(
        default=None, description="The shard that sent it (0-based I of --shard I/N); kvbench merge keeps it."
    )
    # -- trace replays (kvbench replay); absent otherwise -------------------------------------
    trace_line: int | None = Field(
        default=None, strict=True, ge=1, description="1-based line of the trace file this request replays."
    )
    call_id: str | None = Field(default=None, description="An agent trace's id of the call this request replays.")
    parent_call: str | None = Field(
        default=None, description="The call_id of the call it waited for (sent only after that one completed)."
    )

    @field_validator("first_content_ns")
    @classmethod
    def _content_after_first_token(cls, value: int | None, info: ValidationInfo) -> int | None:
        return _in_order(value, info, ("ttft_ns",), after=True, why="answer text cannot precede the first token")

    @field_validator("e2e_ns")
    @classmethod
    def _end_after_first_token(cls, value: int | None, info: ValidationInfo) -> int | None:
        why = "a request cannot end before its first token"
        return _in_order(value, info, ("ttft_ns", "first_content_ns"), after=True, why=why)

    @field_validator("itl_ns")
    @classmethod
    def _gaps_within_the_stream(cls, value: list[int], info: ValidationInfo) -> list[int]:
        ttft, e2e = info.data.get("ttft_ns"), info.data.get("e2e_ns")
        if value and ttft is not None and e2e is not None and sum(value) > e2e - ttft:
            raise ValueError(
                f"the gaps add up to {sum(value)}, more than e2e_ns - ttft_ns = {e2e - ttft} "
                "(they lie between the first token and the end)"
            )
        return value

    @field_validator("first_chunk_ns")
    @classmethod
    def _first_chunk_first(cls, value: int | None, info: ValidationInfo) -> int | None:
        return _in_order(value, info, ("ttft_ns", "e2e_ns"), after=False, why="the first chunk comes first")

    @field_validator("cached_tokens")
    @classmethod
    def _cached_within_prompt(cls, value: int | None, info: ValidationInfo) -> int | None:
        prompt = info.data.get("prompt_tokens")
        if value is not None and prompt is not None and value > prompt:
            raise ValueError(f"{value} is more than prompt_tokens {prompt} (a cache hit is part of the prompt)")
        return value

    @field_validator("ok")
    @classmethod
    def _success_has_a_ttft(cls, ok: bool, info: ValidationInfo) -> bool:
        # the client fails a stream without generated text (empty_response): ok with no TTFT is a corrupt line
        if ok and "ttft_ns" in info.data and info.data["ttft_ns"] is None:
            raise ValueError("true needs a TTFT, and ttft_ns is null")
        return ok


class RecordWriter:
    """Appends records to a JSONL file: flush on every record, fsync every ``fsync_every``.

    Opening repairs a torn last line first (:func:`repair_torn_tail`); ``repaired_bytes`` says how
    many bytes were moved aside. When a write fails (a full disk), closing still closes the file
    and the write's error is the one that propagates.
    """

    def __init__(self, path: Path, fsync_every: int = 16) -> None:
        self._path = path
        self._fsync_every = fsync_every
        self._pending = 0
        self.repaired_bytes = repair_torn_tail(path)
        # 0600: error records carry server text (scrubbed of known secrets, but still the server's words)
        self._file = os.fdopen(open_private(path, os.O_WRONLY | os.O_APPEND), "a", encoding="utf-8")

    def append(self, record: RequestRecord) -> None:
        # an unsharded run's record is written as before shards existed: its shard is absent, not null
        self._file.write(record.model_dump_json(exclude=None if record.shard is not None else {"shard"}) + "\n")
        self._file.flush()
        self._pending += 1
        if self._pending >= self._fsync_every:
            self.sync()

    def sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._pending = 0

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            self.sync()
        finally:
            # the buffered bytes that sync() could not write fail again here; sync's error is the one to see
            with contextlib.suppress(OSError):
                self._file.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
            return
        with contextlib.suppress(OSError):  # e.g. the disk is still full: the error already propagating says why
            self.close()


def read_records(path: Path) -> Iterator[RequestRecord]:
    """Yield the records of a JSONL file; a torn last line (a killed writer) is skipped."""
    return iter_jsonl(path, RequestRecord)
