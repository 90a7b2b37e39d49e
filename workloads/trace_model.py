"""The shapes every trace format loads into: :class:`TraceRequest` (one call) and :class:`Trace` (a file's calls in
arrival order), the format names, and :class:`TraceError` with the line context that names file, line and field.

Loading is :mod:`workloads.trace` (Mooncake, kvbench) and :mod:`workloads.agent_trace` (the agent formats); both
build these. Token counts are the engine's tokens, times milliseconds on the trace's clock.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from common.errors import KvbenchError
from common.jsonfile import short_repr

TraceFormat = Literal["mooncake", "kvbench", "bailian", "claude-code", "tokens", "text"]
FORMATS: tuple[TraceFormat, ...] = ("mooncake", "kvbench", "bailian", "claude-code", "tokens", "text")
FormatChoice = TraceFormat | Literal["auto"]
"""A format, or ``auto``: told from the first line's fields (:func:`workloads.agent_trace.detect_format`)."""
FORMAT_CHOICES: tuple[FormatChoice, ...] = ("auto", *FORMATS)
CallType = Literal["normal", "subagent", "side"]
MOONCAKE_BLOCK_TOKENS = 512
HEADER_KEY = "kvbench_trace"
HEADER_VERSION = 1
MAX_GAP_MS = 3_600_000.0
"""Longest gap between two consecutive requests a trace may have without ``allow_gaps`` (one hour, ms)."""
HashId = int | str


class TraceError(KvbenchError):
    """A trace file that cannot be read; the message names file, line and field."""


@dataclass(frozen=True, slots=True)  # slots: a trace holds a million of them
class TraceRequest:
    """One request of a trace (token counts in the engine's tokens; time in ms from the trace's clock)."""

    line: int
    """1-based line number in the trace file (kept in every record of its replay)."""
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[HashId, ...] | None = None
    text: str | None = None
    session: str | None = None
    turn: int | None = None
    call_id: str | None = None
    """The call's own id in an agent trace (``chat_id``, ``id#k``...), kept in its records."""
    parent: int | None = None
    """0-based position (in :attr:`Trace.requests`) of the call this one waits for: a replay sends it only after
    that call has completed (an agent's next step needs its previous answer); None for a root call."""
    call_type: CallType | None = None
    """normal, subagent or side call, where the trace says (agent traces)."""
    token_ids: tuple[int, ...] | None = None
    """The prompt's token ids where the trace records them (``tokens`` format): sent as they are."""
    messages: tuple[tuple[str, str], ...] | None = None
    """A text trace's prompt as chat messages ``(role, content)``, where it records them so: sent as they are."""

    def block_sizes(self, block_tokens: int) -> list[int]:
        """Tokens of each hash block: ``block_tokens`` each, the last one what is left of input_length."""
        if self.hash_ids is None:
            return []
        count = len(self.hash_ids)
        return [block_tokens] * (count - 1) + [self.input_length - (count - 1) * block_tokens] if count else []


@dataclass(frozen=True)
class Trace:
    path: str
    format: TraceFormat
    block_tokens: int
    requests: tuple[TraceRequest, ...]

    @property
    def duration_s(self) -> float:
        if not self.requests:
            return 0.0
        return (self.requests[-1].timestamp_ms - self.requests[0].timestamp_ms) / 1000.0

    def window(self, start: int = 0, limit: int | None = None) -> Trace:
        """Requests ``start .. start+limit`` (0-based positions), the same file and block size; a parent
        before the window is dropped (its child becomes a root of the window)."""
        end = None if limit is None else start + limit
        kept = self.requests[start:end]
        if start and any(request.parent is not None for request in kept):
            kept = tuple(
                dataclasses.replace(r, parent=None if r.parent is None or r.parent < start else r.parent - start)
                for r in kept
            )
        return Trace(self.path, self.format, self.block_tokens, kept)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


class _Line:
    """One parsed line and where it came from, for error messages; ``interned``: the load's one object per distinct
    block id (a JSON parser makes a new int or string for every mention, and a trace mentions its ids many times)."""

    def __init__(
        self, path: str, number: int, data: dict[str, object], interned: dict[HashId, HashId] | None = None
    ) -> None:
        self.path = path
        self.number = number
        self.data = data
        self.interned: dict[HashId, HashId] = {} if interned is None else interned

    def ids(self, values: Iterable[HashId]) -> tuple[HashId, ...]:
        """``values`` as a tuple of the load's shared id objects."""
        return tuple(self.interned.setdefault(value, value) for value in values)

    def error(self, field: str, message: str) -> TraceError:
        return TraceError(f"{self.path}:{self.number}: field {field!r}: {message}")

    def require(self, field: str) -> object:
        if field not in self.data:
            raise TraceError(f"{self.path}:{self.number}: missing field {field!r}")
        return self.data[field]

    def integer(self, field: str, minimum: int) -> int:
        value = self.require(field)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(field, f"must be an integer >= {minimum}, got {short_repr(value)}")
        return value

    def number_field(self, field: str) -> float:
        value = self.require(field)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise self.error(field, f"must be a finite number >= 0 (milliseconds), got {short_repr(value)}")
        return float(value)

    def hash_ids(self, input_length: int, block_tokens: int) -> tuple[HashId, ...]:
        value = self.require("hash_ids")
        if not isinstance(value, list) or not value:
            raise self.error("hash_ids", f"must be a non-empty list of block ids, got {_type_name(value)}")
        ids: list[HashId] = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int | str):
                raise self.error("hash_ids", f"ids must be integers or strings, got {short_repr(item)}")
            ids.append(item)
        needed = -(-input_length // block_tokens)
        if len(value) != needed:
            raise self.error(
                "hash_ids",
                f"{len(value)} ids of {block_tokens} tokens do not cover input_length {input_length} "
                f"(needs ceil({input_length}/{block_tokens}) = {needed} ids)",
            )
        return self.ids(ids)


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float
    max: float
    mean: float


def percentiles(values: Sequence[float]) -> Percentiles:
    """Linear-interpolation percentiles (numpy's default), max and mean of a non-empty sequence."""
    ordered = sorted(values)

    def at(q: float) -> float:
        position = q * (len(ordered) - 1)
        low = math.floor(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    return Percentiles(at(0.5), at(0.9), at(0.99), float(ordered[-1]), sum(ordered) / len(ordered))
