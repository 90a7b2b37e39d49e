"""Where an LMCache request's TTFT goes, read from LMCache's own log lines beside the client's records.

LMCache's vLLM connector (in-process, lmcache 0.5.x) logs, in the engine's log, one line when the scheduler looks a
request up and, per worker, one line when its KV has been retrieved into GPU memory::

    [2026-11-27 10:03:20,610] LMCache INFO: Reqid: chatcmpl-…, Total tokens 96174, … LMCache hit tokens: 96000, …
    [2026-11-27 10:03:20,808] LMCache INFO: [req_id=chatcmpl-…] Retrieved 96000 out of 96000 required tokens …
        cost 167.6390 ms, …

The client's records hold when each request was sent (monotonic ns) and its TTFT. A probe sends one request at a
time, so the engine's lookups come in the order of the arm's records; :func:`timeline` pairs them by that order
(every pair must agree on the prompt's token count, or the arm is left out) and splits each TTFT, in ms:

* ``before_lookup`` = (lookup logged − sent) − min over the arm's requests of the same difference: HTTP, prompt
  rendering and tokenizing, the engine's intake of the request (block hashes) and LMCache's lookup. The log's
  wall clock and the client's monotonic clock differ by an unknown constant, taken as the smallest difference, so
  the value is relative to the arm's fastest request (a lower bound, ≥ 0; that request's own is a few ms);
* ``lookup_to_loaded`` = the last worker's "Retrieved" logged − lookup logged: scheduling and the load itself.
  With tensor parallelism every rank (worker) loads its share of the KV and logs its own line; the forward that
  follows runs on all ranks in step (each layer's all-reduce), so the slowest rank decides when it starts.
  ``retrieve`` = LMCache's own "cost" of the slowest rank's load; ``rank_spread`` = last − first worker's line,
  the time the other ranks wait for the slowest (None with one worker);
* ``after_load`` = TTFT − before_lookup − lookup_to_loaded: the prefill of the tokens not loaded, the first token
  and its trip back to the client (for a request with nothing to load: TTFT − before_lookup).

The connector also logs, per worker, each store of a request's new KV to the tier ("Stored N out of total N
tokens … cost X ms", one line per prefill chunk)::

    [2026-11-28 08:57:24,121] LMCache INFO: [req_id=chatcmpl-…] Stored 1580 out of total 1580 tokens. size: 0.1929 GB,
        cost 8.7233 ms, …

``store`` = the slowest worker's sum of those costs for the request (the step that computed each chunk waits for
its store), ``stored_tokens`` = what that worker stored: a turn 1 stores its whole prompt, a turn 2 after a tier hit
only the tokens past the hit's last whole chunk, or nothing (None).

Per (arm, context length, turn) the medians of the measured requests. Log timestamps have ms resolution. Arms
without such lines (no LMCache, its multi-process server, another version's wording), with several attempts
(a resumed arm: monotonic clocks of two processes do not compare) or whose lookups do not pair with the records
get no rows.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from harness.store.records import RequestRecord

from .run_result import LMCacheRank, LMCacheSplit

_STAMP = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]"
_LOOKUP = re.compile(_STAMP + r".*?Reqid: ([^,\s]+), Total tokens (\d+),.*?LMCache hit tokens: (\d+)")
_RETRIEVED = re.compile(
    _STAMP + r".*?\[req_id=([^\]\s]+)\] Retrieved (\d+) .*?(?:size: ([\d.]+) gb, )?cost ([\d.]+) ms"
)
_STORED = re.compile(_STAMP + r".*?\[req_id=([^\]\s]+)\] Stored (\d+) out of total \d+ tokens.*?cost ([\d.]+) ms")
# vLLM prefixes each process's lines with its name and pid, e.g. "(Worker_TP1 pid=4347)"
_WORKER = re.compile(r"^\((\S+) pid=\d+\)")


@dataclass(frozen=True)
class Lookup:
    at_s: float
    request_id: str
    total_tokens: int
    hit_tokens: int


@dataclass(frozen=True)
class Retrieval:
    worker: str
    at_s: float
    tokens: int
    cost_ms: float
    size_gb: float | None = None
    """The rank's share of the KV as LMCache logs it ("size: … gb")."""


@dataclass(frozen=True)
class Store:
    worker: str
    tokens: int
    cost_ms: float


@dataclass(frozen=True)
class RequestSplit:
    """One measured request's TTFT split (ms); ``None`` where it loaded nothing."""

    arm: str
    context_tokens: int
    turn: int
    prompt_tokens: int
    ttft_ms: float
    before_lookup_ms: float
    lookup_to_loaded_ms: float | None
    retrieve_ms: float | None
    rank_spread_ms: float | None
    after_load_ms: float
    store_ms: float | None = None
    stored_tokens: int | None = None


def _seconds(stamp: str) -> float:
    # the engine host's local time, without a zone: only differences are used
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


@dataclass(frozen=True)
class ParsedLog:
    """One engine log's LMCache lines (:func:`parse_log`)."""

    lookups: list[Lookup]
    """In log order, the first line of each request."""
    retrievals: dict[str, list[Retrieval]]
    """Per request, every worker's retrieval in log order."""
    stores: dict[str, list[Store]]
    """Per request, every worker's stores (one per prefill chunk) in log order."""


def parse_log(lines: Iterable[str]) -> ParsedLog:
    """LMCache's lookups, retrievals and stores."""
    lookups: list[Lookup] = []
    seen: set[str] = set()
    retrievals: dict[str, list[Retrieval]] = {}
    stores: dict[str, list[Store]] = {}
    for line in lines:
        if "LMCache" not in line:
            continue
        found = _LOOKUP.search(line)
        if found is not None:
            request_id = found[2]
            if request_id not in seen:
                seen.add(request_id)
                lookups.append(Lookup(_seconds(found[1]), request_id, int(found[3]), int(found[4])))
            continue
        # each worker logs one line per request (per chunk for stores); a line whose prefix was lost in interleaved
        # output keeps its place among them, with its rank unknown ("")
        process = _WORKER.match(line)
        worker = process[1] if process is not None else ""
        found = _RETRIEVED.search(line)
        if found is not None:
            size = float(found[4]) if found[4] is not None else None
            retrieval = Retrieval(worker, _seconds(found[1]), int(found[3]), float(found[5]), size)
            retrievals.setdefault(found[2], []).append(retrieval)
            continue
        found = _STORED.search(line)
        if found is not None:
            stores.setdefault(found[2], []).append(Store(worker, int(found[3]), float(found[4])))
    return ParsedLog(lookups, retrievals, stores)


def _slowest_store(stores: Sequence[Store]) -> tuple[float, int] | None:
    """(ms, tokens) of the worker whose stores of one request took longest in sum; None without stores. Lines that
    lost their worker prefix count only when no line has one (they may mix ranks)."""
    named = [store for store in stores if store.worker]
    by_worker: dict[str, tuple[float, int]] = {}
    for store in named or stores:
        cost, tokens = by_worker.get(store.worker, (0.0, 0))
        by_worker[store.worker] = (cost + store.cost_ms, tokens + store.tokens)
    return max(by_worker.values()) if by_worker else None


def split_requests(records: Sequence[RequestRecord], lines: Iterable[str]) -> list[RequestSplit]:
    """Every measured request of one arm's engine, split (empty when the log and the records do not pair)."""
    return _split(records, parse_log(lines))


def _split(records: Sequence[RequestRecord], log: ParsedLog) -> list[RequestSplit]:
    lookups, retrievals = log.lookups, log.retrievals
    if not lookups or len({record.attempt for record in records}) != 1:
        return []
    sent = sorted(records, key=lambda record: record.started_ns)
    if len(sent) != len(lookups):
        return []
    pairs = list(zip(sent, lookups, strict=True))
    if any(r.prompt_tokens is not None and r.prompt_tokens != k.total_tokens for r, k in pairs):
        return []
    offset = min(lookup.at_s - record.started_ns / 1e9 for record, lookup in pairs)
    out = []
    for record, lookup in pairs:
        if record.phase != "measure" or not record.ok or record.ttft_ns is None:
            continue
        ttft = record.ttft_ns / 1e6
        before = (lookup.at_s - record.started_ns / 1e9 - offset) * 1000.0
        workers = retrievals.get(lookup.request_id, []) if lookup.hit_tokens > 0 else []
        last = max(workers, key=lambda item: item.at_s) if workers else None
        to_loaded = (last.at_s - lookup.at_s) * 1000.0 if last is not None else None
        spread = (last.at_s - min(item.at_s for item in workers)) * 1000.0 if last and len(workers) > 1 else None
        stored = _slowest_store(log.stores.get(lookup.request_id, []))
        out.append(
            RequestSplit(
                arm=record.arm,
                context_tokens=record.context_tokens,
                turn=record.turn,
                prompt_tokens=lookup.total_tokens,
                ttft_ms=ttft,
                before_lookup_ms=before,
                lookup_to_loaded_ms=to_loaded,
                retrieve_ms=max(item.cost_ms for item in workers) if workers else None,
                rank_spread_ms=spread,
                after_load_ms=ttft - before - (to_loaded or 0.0),
                store_ms=stored[0] if stored else None,
                stored_tokens=stored[1] if stored else None,
            )
        )
    return out


def _median(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def timeline(records: Sequence[RequestRecord], logs: Mapping[str, ParsedLog]) -> list[LMCacheSplit]:
    """Per (arm, context length, turn), medians of :func:`split_requests` over the arms whose parsed log is in
    ``logs``."""
    cells: dict[tuple[str, int, int], list[RequestSplit]] = {}
    for arm, log in logs.items():
        for split in _split([record for record in records if record.arm == arm], log):
            cells.setdefault((split.arm, split.context_tokens, split.turn), []).append(split)
    out = []
    for (arm, context_tokens, turn), splits in cells.items():
        out.append(
            LMCacheSplit(
                arm=arm,
                context_tokens=context_tokens,
                turn=turn,
                requests=len(splits),
                ttft_ms=statistics.median(s.ttft_ms for s in splits),
                before_lookup_ms=statistics.median(s.before_lookup_ms for s in splits),
                lookup_to_loaded_ms=_median([s.lookup_to_loaded_ms for s in splits]),
                retrieve_ms=_median([s.retrieve_ms for s in splits]),
                rank_spread_ms=_median([s.rank_spread_ms for s in splits]),
                after_load_ms=statistics.median(s.after_load_ms for s in splits),
                store_ms=_median([s.store_ms for s in splits]),
            )
        )
    return out


RANK_MIN_TOKENS = 16_000
"""Loads this large or larger count in :func:`ranks`: below it a load's fixed costs blur its rate."""


def ranks(logs: Mapping[str, ParsedLog]) -> list[LMCacheRank]:
    """Per arm and worker, over its loads of :data:`RANK_MIN_TOKENS` tokens or more: the median and lowest rate
    (LMCache's logged size over its logged cost, GB/s as LMCache counts them) and in how many loads with several
    ranks it took the longest (the forward waits for that rank). Lines that lost their worker prefix count for
    no rank (a few per run at TP=4, where four processes write at once)."""
    out = []
    for arm, log in logs.items():
        rates: dict[str, list[float]] = {}
        slowest: dict[str, int] = {}
        for workers in log.retrievals.values():
            sized = [item for item in workers if item.size_gb is not None and item.cost_ms > 0]
            if not sized or sized[0].tokens < RANK_MIN_TOKENS:
                continue
            for item in sized:
                if item.worker:
                    rates.setdefault(item.worker, []).append((item.size_gb or 0.0) / (item.cost_ms / 1000.0))
            last = max(sized, key=lambda item: item.cost_ms).worker
            if len(sized) > 1 and last:
                slowest[last] = slowest.get(last, 0) + 1
        for worker in sorted(rates):
            values = rates[worker]
            out.append(
                LMCacheRank(
                    arm=arm,
                    worker=worker,
                    loads=len(values),
                    median_gbps=statistics.median(values),
                    min_gbps=min(values),
                    slowest_loads=slowest.get(worker, 0),
                )
            )
    return out
