"""Timestamped request traces: loading (Mooncake and kvbench JSONL), their statistics, prompts, synthesis.

A trace is a list of :class:`TraceRequest`, one per line of a JSON Lines file, in arrival order.
The agent formats (bailian, claude-code, tokens, text; calls with parents) are read by
:mod:`.agent_trace`, their ceilings and shape computed by :mod:`.agent_trace_stats`; ``auto`` tells a
file's format from its first line. Two request formats (documented in ``docs/traces.md``, schema in
``docs/trace.schema.json``):

* ``mooncake``: Mooncake's published format, ``{"timestamp": ms, "input_length": tokens,
  "output_length": tokens, "hash_ids": [int, ...]}``; ``hash_ids`` holds one id per
  ``block_tokens``-token block of the prompt (512 in Mooncake's traces), the last block possibly
  partial, and equal ids mean equal content *including everything before it* (a prefix hash).
* ``kvbench``: the same fields plus ``session`` (a string or integer conversation id) and ``turn``
  (1-based), and either ``hash_ids`` or ``text`` (the prompt itself). An optional first line
  ``{"kvbench_trace": 1, "block_tokens": B, ...}`` is a header naming the block size of its ids.

Loading (:func:`load_trace`) reads the file and nothing else; every bad input is a
:class:`TraceError` naming file, line and field: invalid UTF-8, invalid JSON, a truncated last
line, a missing or mistyped field, a timestamp earlier than the line before, a timestamp more than
:data:`MAX_GAP_MS` (one hour) after the line before (a corrupt or concatenated trace a replay would
sit out in silence; ``allow_gaps`` accepts it), a hash list whose
``len(hash_ids) != ceil(input_length / block_tokens)``.

Statistics (:func:`trace_stats`) are pure: the **infinite-cache hit rate** is the token-weighted
share of prompt tokens in blocks that a prefix cache without capacity limit could have served,

    hit tokens of a request = Σ size(block k) over its longest prefix of blocks seen earlier,
    infinite_cache_hit_rate = Σ hit tokens / Σ input_length,

where size(block) is ``block_tokens`` except for a last partial block, and a block counts only up
to the size in which it was seen before. :func:`lru_hit_rate` is the same with an LRU cache of
``capacity`` tokens (blocks touched by each request become most recent; least recent blocks are
evicted until the cached blocks fit).

Prompts (:class:`TracePrompts`) turn hash ids into text with the engine's tokenizer: every id is
a block of ``block_tokens`` tokens of seeded prose (seeded by ``(seed, id)``), so equal ids are
byte-identical text and different ids differ; a partial last block is the first tokens of its
id's block. Each block starts with a space, so the tokenizers kvbench meets (pre-tokenizing on
word boundaries) never merge a token across two blocks.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from common.jsonfile import JsonProblem, parse_json, short_repr

from .prefix_lru import PrefixLru
from .salt import salted
from .text import fit_to_tokens
from .tokenizer import Tokenizer
from .trace_model import (
    FORMAT_CHOICES as FORMAT_CHOICES,
)
from .trace_model import (
    FORMATS as FORMATS,
)
from .trace_model import (
    HEADER_KEY as HEADER_KEY,
)
from .trace_model import (
    HEADER_VERSION as HEADER_VERSION,
)
from .trace_model import (
    MAX_GAP_MS as MAX_GAP_MS,
)
from .trace_model import (
    MOONCAKE_BLOCK_TOKENS as MOONCAKE_BLOCK_TOKENS,
)
from .trace_model import (
    CallType as CallType,
)
from .trace_model import (
    FormatChoice as FormatChoice,
)
from .trace_model import (
    HashId as HashId,
)
from .trace_model import (
    Percentiles as Percentiles,
)
from .trace_model import (
    Trace as Trace,
)
from .trace_model import (
    TraceError as TraceError,
)
from .trace_model import (
    TraceFormat as TraceFormat,
)
from .trace_model import (
    TraceRequest as TraceRequest,
)
from .trace_model import (
    _Line as _Line,
)
from .trace_model import (
    _type_name as _type_name,
)
from .trace_model import (
    percentiles as percentiles,
)

if TYPE_CHECKING:
    from .agent_trace_stats import Ceilings, Shape


BUNDLED_TRACES = Path(__file__).resolve().parent / "data"
"""The sample traces kvbench ships (``sample-bailian.jsonl``, ...), found by name when no such file is here."""


def resolve_trace_path(path: str) -> Path:
    """``path`` itself, or the bundled sample of that name when ``path`` is a bare name no file here has."""
    given = Path(path)
    bundled = BUNDLED_TRACES / given.name
    if not given.exists() and given.name == path and bundled.is_file():
        return bundled
    return given


def _read_lines(path: Path) -> Iterator[_Line]:
    """Each non-blank line, parsed, as the file is read: one line's text and JSON in memory at a time (a trace of
    a million lines is hundreds of MB of text, and several times that once parsed whole). Invalid UTF-8 names its
    line and column; a last line without its newline that is not JSON is a truncated line."""
    interned: dict[HashId, HashId] = {}  # one object per distinct block id, however many prompts name it
    try:
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                terminated = raw.endswith(b"\n")
                chunk = raw[:-1] if terminated else raw
                try:
                    text = chunk.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise TraceError(
                        f"{path}:{number}: not UTF-8 (byte 0x{chunk[error.start]:02x} at column {error.start + 1})"
                    ) from None
                if text.strip():
                    yield _Line(str(path), number, _parse_json(path, number, text, not terminated), interned)
    except OSError as error:
        raise TraceError(f"{path}: cannot read trace ({error.strerror or error})") from None


def _parse_json(path: Path, number: int, text: str, last_unterminated: bool) -> dict[str, object]:
    try:
        data = parse_json(text)
    except JsonProblem as error:
        if last_unterminated:
            raise TraceError(
                f"{path}:{number}: truncated last line (no newline and not a complete JSON object: {error.reason})"
            ) from None
        where = "" if error.column is None else f" at column {error.column}"
        raise TraceError(f"{path}:{number}: not valid JSON ({error.reason}{where})") from None
    if not isinstance(data, dict):
        raise TraceError(f"{path}:{number}: expected a JSON object, got {_type_name(data)}")
    return data


def load_trace(path: Path, format: FormatChoice, *, block_tokens: int | None = None, allow_gaps: bool = False) -> Trace:
    """Read and check a trace file (see the module docstring); ``format`` ``auto`` tells it from the first line;
    ``block_tokens`` overrides the default (512 for mooncake, the header's for kvbench, the format's for the
    agent formats) and must agree with a header or ``block_size`` that names one; ``allow_gaps`` accepts
    consecutive requests more than :data:`MAX_GAP_MS` apart."""
    # imported here: the agent formats build on this module's request and line types
    from .agent_trace import AGENT_FORMATS, detect_format, parse_agent_trace

    if format not in FORMAT_CHOICES:
        raise TraceError(f"{path}: unknown trace format {short_repr(format)}; allowed: {', '.join(FORMAT_CHOICES)}")
    lines = _read_lines(path)
    first = next(lines, None)
    if first is None:
        raise TraceError(f"{path}: no requests in the trace")
    resolved: TraceFormat = detect_format(str(path), first) if format == "auto" else format
    block = block_tokens
    if resolved in AGENT_FORMATS:
        agent = next(f for f in AGENT_FORMATS if f == resolved)
        block, agent_requests = parse_agent_trace(agent, itertools.chain([first], lines), block_tokens, str(path))
        return _checked(path, resolved, block, agent_requests, allow_gaps)
    body: Iterable[_Line] = itertools.chain([first], lines)
    if HEADER_KEY in first.data:
        header, body = first, lines
        if resolved != "kvbench":
            raise TraceError(
                f"{path}:{header.number}: a kvbench trace header in a {resolved} trace (use format kvbench)"
            )
        if header.data[HEADER_KEY] != HEADER_VERSION:
            raise header.error(HEADER_KEY, f"version {header.data[HEADER_KEY]!r}; this kvbench reads {HEADER_VERSION}")
        if "block_tokens" in header.data:
            stated = header.integer("block_tokens", 1)
            if block is not None and block != stated:
                raise header.error("block_tokens", f"the header says {stated}, the replay asks for {block}")
            block = stated
    block = block or MOONCAKE_BLOCK_TOKENS
    requests = [
        _mooncake_request(line, block) if resolved == "mooncake" else _kvbench_request(line, block) for line in body
    ]
    return _checked(path, resolved, block, requests, allow_gaps)


def _checked(path: Path, format: TraceFormat, block: int, requests: list[TraceRequest], allow_gaps: bool) -> Trace:
    """The trace, once its arrival times are known to be in order and without an hour-long gap."""
    previous: tuple[int, float] | None = None
    for request in requests:
        line = _Line(str(path), request.line, {})
        if previous is not None and request.timestamp_ms < previous[1]:
            raise line.error(
                "timestamp",
                f"{request.timestamp_ms:g} is earlier than line {previous[0]}'s {previous[1]:g} "
                "(timestamps must not decrease)",
            )
        if previous is not None and not allow_gaps and request.timestamp_ms - previous[1] > MAX_GAP_MS:
            raise line.error(
                "timestamp",
                f"{(request.timestamp_ms - previous[1]) / 1000:g} s after line {previous[0]}'s; a gap longer than "
                f"{MAX_GAP_MS / 3_600_000:g} h is refused (a corrupt or concatenated trace?); --allow-gaps accepts it",
            )
        previous = (line.number, request.timestamp_ms)
    return Trace(str(path), format, block, tuple(requests))


def _mooncake_request(line: _Line, block_tokens: int) -> TraceRequest:
    input_length = line.integer("input_length", 1)
    return TraceRequest(
        line=line.number,
        timestamp_ms=line.number_field("timestamp"),
        input_length=input_length,
        output_length=line.integer("output_length", 1),
        hash_ids=line.hash_ids(input_length, block_tokens),
    )


_KVBENCH_FIELDS = frozenset({"timestamp", "session", "turn", "input_length", "output_length", "hash_ids", "text"})


def _kvbench_request(line: _Line, block_tokens: int) -> TraceRequest:
    unknown = sorted(set(line.data) - _KVBENCH_FIELDS)
    if unknown:
        raise line.error(unknown[0], f"unknown field; allowed: {', '.join(sorted(_KVBENCH_FIELDS))}")
    session = line.require("session")
    if isinstance(session, bool) or not isinstance(session, int | str):
        raise line.error("session", f"must be a string or an integer, got {session!r}")
    input_length = line.integer("input_length", 1)
    has_ids, has_text = "hash_ids" in line.data, "text" in line.data
    if has_ids == has_text:
        raise TraceError(f"{line.path}:{line.number}: give exactly one of the fields 'hash_ids' and 'text'")
    text: str | None = None
    if has_text:
        value = line.data["text"]
        if not isinstance(value, str) or not value:
            raise line.error("text", f"must be a non-empty string, got {_type_name(value)}")
        text = value
    return TraceRequest(
        line=line.number,
        timestamp_ms=line.number_field("timestamp"),
        input_length=input_length,
        output_length=line.integer("output_length", 1),
        hash_ids=line.hash_ids(input_length, block_tokens) if has_ids else None,
        text=text,
        session=str(session),
        turn=line.integer("turn", 1),
    )


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


def lru_hit_rate(trace: Trace, capacity: int | None) -> float | None:
    """Prefix-cache hit rate of ``trace`` with an LRU cache of ``capacity`` tokens (None: infinite).

    None when no request carries hash ids (a text trace has no block structure before tokenizing).
    """
    cache = PrefixLru(capacity)
    hits = 0
    total = 0
    for request in trace.requests:
        if request.hash_ids is None:
            continue
        total += request.input_length
        hits += cache.visit(list(zip(request.hash_ids, request.block_sizes(trace.block_tokens), strict=True)))[0]
    return hits / total if total else None


@dataclass(frozen=True)
class TraceStats:
    """What ``kvbench trace stats`` prints (and the replay stores beside its results)."""

    path: str
    format: TraceFormat
    block_tokens: int
    requests: int
    sessions: int | None
    duration_s: float
    mean_rate_rps: float | None
    rate_bucket_s: float
    rate_over_time: tuple[float, ...]
    """Requests per second in consecutive buckets of ``rate_bucket_s`` from the first timestamp."""
    input_tokens: Percentiles
    output_tokens: Percentiles
    prompt_tokens_total: int
    unique_blocks: int | None
    infinite_cache_hit_rate: float | None
    lru_hit_rates: tuple[tuple[int, float | None], ...]
    """(cache size in tokens, hit rate) per requested size."""
    ceilings: Ceilings | None = None
    """The ceilings at every block size, under a context cap and for a tier size (:mod:`.agent_trace_stats`)."""
    shape: Shape | None = None
    """Sessions, depth, branching and reuse distance (:mod:`.agent_trace_stats`)."""


def rate_over_time(timestamps_ms: Sequence[float], bucket_s: float) -> tuple[float, ...]:
    if not timestamps_ms:
        return ()
    start = timestamps_ms[0]
    buckets = int((timestamps_ms[-1] - start) / 1000.0 // bucket_s) + 1
    counts = [0] * buckets
    for stamp in timestamps_ms:
        counts[min(int((stamp - start) / 1000.0 // bucket_s), buckets - 1)] += 1
    return tuple(count / bucket_s for count in counts)


def trace_stats(
    trace: Trace,
    cache_tokens: Iterable[int] = (),
    *,
    rate_buckets: int = 20,
    max_context: int | None = None,
    tier_tokens: int | None = None,
) -> TraceStats:
    """The trace's statistics; ``max_context`` and ``tier_tokens`` are the assumptions of its :class:`Ceilings`."""
    # imported here: the ceilings module builds on this one's trace types
    from .agent_trace_stats import ceilings, own_block_hit_rate, shape

    requests = trace.requests
    sessions = {r.session for r in requests if r.session is not None}
    duration = trace.duration_s
    bucket = max(duration / rate_buckets, 1.0)
    ids = {block for r in requests if r.hash_ids is not None for block in r.hash_ids}
    has_ids = any(r.hash_ids is not None for r in requests)
    return TraceStats(
        path=trace.path,
        format=trace.format,
        block_tokens=trace.block_tokens,
        requests=len(requests),
        sessions=len(sessions) if sessions else None,
        duration_s=duration,
        mean_rate_rps=len(requests) / duration if duration > 0 else None,
        rate_bucket_s=bucket,
        rate_over_time=rate_over_time([r.timestamp_ms for r in requests], bucket),
        input_tokens=percentiles([r.input_length for r in requests]),
        output_tokens=percentiles([r.output_length for r in requests]),
        prompt_tokens_total=sum(r.input_length for r in requests),
        unique_blocks=len(ids) if has_ids else None,
        # a token or text trace has no hash ids: its ceiling is the prefix scan's (token ids, characters)
        infinite_cache_hit_rate=own_block_hit_rate(trace)
        if trace.format in ("tokens", "text")
        else lru_hit_rate(trace, None),
        lru_hit_rates=tuple((size, lru_hit_rate(trace, size)) for size in cache_tokens),
        ceilings=ceilings(trace, max_context=max_context, tier_tokens=tier_tokens),
        shape=shape(trace),
    )


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------


def _block_stream(seed: int, block: HashId) -> random.Random:
    return random.Random(f"kvbench:trace:{seed}:{type(block).__name__}:{block}")


class TracePrompts:
    """Prompt texts of a trace's requests, built with the engine's ``tokenizer`` (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, *, seed: int, block_tokens: int, salt: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.seed = seed
        self.salt = salt
        """Heads every block (:mod:`.salt`): a repeated replay finds no block of an earlier run's."""
        self.block_tokens = block_tokens
        self._blocks: dict[HashId, str] = {}
        self._partial: dict[tuple[HashId, int], str] = {}

    async def block(self, block: HashId, size: int) -> str:
        """The text of ``block``: ``size`` tokens (a whole block, or the first ``size`` tokens of it)."""
        full = self._blocks.get(block)
        if full is None:
            header = " " + salted(f"[{block}] ", self.salt)  # the leading blank keeps blocks apart when joined
            full = await fit_to_tokens(self.tokenizer, header, _block_stream(self.seed, block), self.block_tokens)
            self._blocks[block] = full
        if size >= self.block_tokens:
            return full
        partial = self._partial.get((block, size))
        if partial is None:
            ids = await self.tokenizer.encode(full)
            partial = await self.tokenizer.decode(ids[:size])
            self._partial[(block, size)] = partial
        return partial

    async def prompt(self, request: TraceRequest) -> str:
        """The request's prompt: its text, or the concatenated texts of its hash blocks."""
        if request.text is not None:
            return request.text
        assert request.hash_ids is not None
        parts = []
        for block, size in zip(request.hash_ids, request.block_sizes(self.block_tokens), strict=True):
            parts.append(await self.block(block, size))
            await asyncio.sleep(0)  # building is CPU work; keep the event loop responsive
        return "".join(parts)
