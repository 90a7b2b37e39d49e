"""A prefill/decode arm's TTFT taken apart, and its KV transfers checked against physics (``pd-breakdown.json``).

Sources, per arm of engine kind ``vllm-pd`` and per group (a probe's cell: context length and turn; a sweep's load
point): the client's records (``records.jsonl``), the P/D proxy's phase log (``logs/ARM/pd-proxy.jsonl``,
:mod:`harness.engines.pd_proxy`), the engines' ``/metrics`` deltas over the group (``engine_metrics.jsonl`` or
``points.jsonl``: the ``pd_*`` and ``kv_transfer*`` tags of ``harness/client/metrics.yaml``) and the manifest's
``kv_bytes_per_tok``, ``kv_block_size`` and ``kv_link_gbps`` (:mod:`harness.engines.vllm_pd`).

Joining: both processes stamp ``time.monotonic_ns()`` (CLOCK_MONOTONIC, one clock for the host). A record is joined
to the earliest unused phase line received within its TTFT after it was sent (``started_ns <= received_ns <=
started_ns + ttft_ns``); records without one are counted (``unmatched``), not used.

The parts, means in ms over the joined requests (``s`` = the record's send, ``r`` ... ``f`` the phase line's
received, prefill sent / answered, decode sent / first byte; Q, P the engines' queue and prefill histograms as
Δ _sum ÷ Δ _count, X = Σ NIXL transfer time ÷ joined requests)::

    to proxy        = r - s
    proxy           = (prefill sent - r) + (decode sent - prefill answered)
    prefill queue   = Q(prefill)
    prefill         = P(prefill)                       # first scheduling -> first token, tier loads included
    prefill other   = (prefill answered - prefill sent) - Q(prefill) - P(prefill)   # HTTP, tokenizing, answer
    decode admission= Q(decode)                        # queued until the decode side allocates the blocks
    kv transfer     = X
    first token     = P(decode) - X                    # the decode side's prefill interval holds the push's wait
    decode other    = (f - decode sent) - Q(decode) - P(decode)
    back to client  = client TTFT - (f - s)            # the first byte's way to the client, and its parsing

They sum to the client's mean TTFT by construction; what is checked is that none is impossible: ``back to
client`` within ±max(:data:`TOLERANCE_MS`, :data:`TOLERANCE_FRACTION` x TTFT) (beyond it, the proxy's clock or
its stream did not match the client's), and ``prefill other``, ``first token`` and ``decode other`` not below
-max(...) (below it, an engine histogram holds more than the leg the proxy timed: a window or metric mismatch).
Any breach is a flag on the row.

Physics of the transfer, per group: ``bytes`` (Σ NIXL bytes) against ``tokens`` (the decode side's external
prefix hits: what came over the connector) x ``kv_bytes_per_token``: off by more than
:data:`BYTES_TOLERANCE_FRACTION` plus one KV block per joined request (vLLM moves whole blocks) is flagged, as is
no byte for transferred tokens. Throughput two ways: vLLM's own, ``bytes ÷ Σ transfer durations``, biased low
when transfers overlap (each overlapping transfer's duration counts in full); and kvbench's, ``bytes ÷ |∪ of the
decode legs|`` (the wall time during which at least one request was between decode sent and decode first byte,
each of which holds its request's push): not inflated by overlap, and a lower bound of the link's rate while
transferring. Either above ``kv_link_gbps`` (NVLink 4 on H200: 900 GB/s aggregate; PCIe Gen5 x16: 64 GB/s), or
not positive where bytes moved, is flagged. GB/s is 10^9 bytes per second.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from common.packed import read_stored_bytes
from common.schema import VersionedFile
from harness.engines.vllm_pd import KV_BLOCK_DETAIL, KV_BYTES_DETAIL, KV_LINK_GBPS_DETAIL, PROXY_LOG
from harness.store.events import MetricsDelta, PointDone
from harness.store.manifest import read_manifest
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir

from .aggregate import engine_details

TOLERANCE_MS = 5.0
TOLERANCE_FRACTION = 0.05
"""The parts must account for the client's TTFT within ±max(5 ms, 5 % of the mean TTFT)."""
BYTES_TOLERANCE_FRACTION = 0.10
"""Transferred bytes may differ from tokens x KV bytes per token by 10 %, plus one KV block per request."""
NS_PER_MS = 1e6


class PhaseLine(BaseModel):
    """One line of the proxy's phase log (times: ``time.monotonic_ns()``; None: the request never got there)."""

    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)

    received_ns: int
    prefill_sent_ns: int | None = None
    prefill_answered_ns: int | None = None
    decode_sent_ns: int | None = None
    decode_first_byte_ns: int | None = None
    done_ns: int | None = None
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.error is None and None not in (
            self.prefill_sent_ns,
            self.prefill_answered_ns,
            self.decode_sent_ns,
            self.decode_first_byte_ns,
        )


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class TtftParts(Frozen):
    """Where the joined requests' mean TTFT went (ms, means; the module docstring has the formulas)."""

    to_proxy_ms: float
    proxy_ms: float
    prefill_queue_ms: float | None
    prefill_ms: float | None
    prefill_other_ms: float | None
    decode_admission_ms: float | None
    kv_transfer_ms: float | None
    first_token_ms: float | None
    decode_other_ms: float | None
    back_to_client_ms: float

    def total_ms(self) -> float:
        parts: list[float | None] = [getattr(self, name) for name in type(self).model_fields]
        return sum(value for value in parts if value is not None)


class KvTransfer(Frozen):
    """The group's KV transfers (engine metrics) and the physics they were checked against."""

    bytes: float
    transfers: float
    descriptors: float | None
    failures: float | None
    seconds: float
    tokens: float | None
    expected_bytes: float | None
    union_s: float
    gbps_vllm: float | None
    """bytes ÷ Σ transfer durations: vLLM's figure, biased low when transfers overlap."""
    gbps_union: float | None
    """bytes ÷ |∪ decode legs|: not inflated by overlap."""
    link_gbps: float | None


class PdRow(Frozen):
    arm: str
    group: str
    """``8000 tok, turn 2`` (a probe's cell) or ``load 8`` (a sweep's point)."""
    requests: int
    matched: int
    client_ttft_ms: float
    parts: TtftParts
    transfer: KvTransfer | None
    flags: list[str]


class PdBreakdownResult(VersionedFile):
    FILE_NAME = "pd-breakdown.json"
    schema_version: Literal[1] = 1
    scenario: str
    tolerance_ms: float
    tolerance_fraction: float
    rows: list[PdRow]

    @property
    def flagged(self) -> list[PdRow]:
        return [row for row in self.rows if row.flags]


@dataclass(frozen=True)
class Group:
    """One arm's requests of one cell or point, and the engine counter deltas over them."""

    arm: str
    label: str
    records: Sequence[RequestRecord]
    metrics: Mapping[str, float]


@dataclass(frozen=True)
class Geometry:
    """From the manifest: KV bytes per token, tokens per block, the link's limit (GB/s); None where unknown."""

    kv_bytes_per_token: float | None
    block_size: int | None
    link_gbps: float | None


def read_phase_log(path: Path) -> list[PhaseLine]:
    """The proxy's lines, in file order (a line that is not one, e.g. cut by a kill, is skipped); the log packed as
    ``.xz`` in a kept run reads the same."""
    data = read_stored_bytes(path)
    if data is None:
        return []
    lines: list[PhaseLine] = []
    for text in data.decode("utf-8", errors="replace").splitlines():
        try:
            lines.append(PhaseLine.model_validate_json(text))
        except ValidationError:
            continue
    return lines


def join(records: Sequence[RequestRecord], lines: Sequence[PhaseLine]) -> list[tuple[RequestRecord, PhaseLine]]:
    """Each successful record with the earliest unused complete phase line received within its TTFT."""
    free = sorted((line for line in lines if line.complete), key=lambda line: line.received_ns)
    used = [False] * len(free)
    pairs: list[tuple[RequestRecord, PhaseLine]] = []
    for record in sorted(records, key=lambda record: record.started_ns):
        if not record.ok or record.ttft_ns is None:
            continue
        end = record.started_ns + record.ttft_ns
        for index, line in enumerate(free):
            if line.received_ns > end:
                break
            if not used[index] and line.received_ns >= record.started_ns:
                used[index] = True
                pairs.append((record, line))
                break
    return pairs


def union_seconds(intervals: Iterable[tuple[int, int]]) -> float:
    """|∪ intervals| in seconds (ns endpoints)."""
    total = 0
    end = None
    start = 0
    for low, high in sorted(intervals):
        if end is None or low > end:
            if end is not None:
                total += end - start
            start, end = low, high
        else:
            end = max(end, high)
    if end is not None:
        total += end - start
    return total / 1e9


def _mean_ms(metrics: Mapping[str, float], seconds: str, count: str) -> float | None:
    counted = metrics.get(count, 0.0)
    return 1000.0 * metrics.get(seconds, 0.0) / counted if counted > 0 else None


def _minus(value: float, *parts: float | None) -> float | None:
    return None if any(part is None for part in parts) else value - sum(part for part in parts if part is not None)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def breakdown(group: Group, lines: Sequence[PhaseLine], geometry: Geometry) -> PdRow | None:
    """The group's row (None when no record joined a phase line)."""
    pairs = join(group.records, lines)
    if not pairs:
        return None
    ms = NS_PER_MS

    def mean_of(span: Callable[[RequestRecord, PhaseLine], float]) -> float:
        return _mean([span(record, line) / ms for record, line in pairs])

    ttft = mean_of(lambda r, _: float(r.ttft_ns or 0))
    to_proxy = mean_of(lambda r, p: p.received_ns - r.started_ns)
    proxy = mean_of(
        lambda _, p: (_at(p.prefill_sent_ns) - p.received_ns) + (_at(p.decode_sent_ns) - _at(p.prefill_answered_ns))
    )
    prefill_leg = mean_of(lambda _, p: _at(p.prefill_answered_ns) - _at(p.prefill_sent_ns))
    decode_leg = mean_of(lambda _, p: _at(p.decode_first_byte_ns) - _at(p.decode_sent_ns))
    back = ttft - mean_of(lambda r, p: _at(p.decode_first_byte_ns) - r.started_ns)
    metrics = group.metrics
    p_queue = _mean_ms(metrics, "pd_prefill_queue_seconds", "pd_prefill_queued")
    p_prefill = _mean_ms(metrics, "pd_prefill_seconds", "pd_prefilled")
    d_queue = _mean_ms(metrics, "pd_decode_queue_seconds", "pd_decode_queued")
    d_prefill = _mean_ms(metrics, "pd_decode_prefill_seconds", "pd_decode_prefilled")
    transfers = metrics.get("kv_transfers")
    xfer = 1000.0 * metrics.get("kv_transfer_seconds", 0.0) / len(pairs) if transfers is not None else None
    first_token = None if d_prefill is None or xfer is None else d_prefill - xfer
    parts = TtftParts(
        to_proxy_ms=to_proxy,
        proxy_ms=proxy,
        prefill_queue_ms=p_queue,
        prefill_ms=p_prefill,
        prefill_other_ms=_minus(prefill_leg, p_queue, p_prefill),
        decode_admission_ms=d_queue,
        kv_transfer_ms=xfer,
        first_token_ms=first_token,
        decode_other_ms=_minus(decode_leg, d_queue, d_prefill),
        back_to_client_ms=back,
    )
    tolerance = max(TOLERANCE_MS, TOLERANCE_FRACTION * ttft)
    flags: list[str] = []
    if abs(back) > tolerance:
        flags.append(
            f"the proxy's first byte and the client's TTFT differ by {back:.1f} ms (tolerance ±{tolerance:.1f} ms)"
        )
    for name, value in (
        ("prefill other", parts.prefill_other_ms),
        ("first token", parts.first_token_ms),
        ("decode other", parts.decode_other_ms),
    ):
        if value is not None and value < -tolerance:
            flags.append(f"{name} is {value:.1f} ms: the engine's histograms hold more than the leg the proxy timed")
    legs = [(_at(p.decode_sent_ns), _at(p.decode_first_byte_ns)) for _, p in pairs]
    transfer = _transfer(metrics, len(pairs), union_seconds(legs), geometry, flags)
    return PdRow(
        arm=group.arm,
        group=group.label,
        requests=sum(1 for record in group.records if record.ok),
        matched=len(pairs),
        client_ttft_ms=ttft,
        parts=parts,
        transfer=transfer,
        flags=flags,
    )


def _at(value: int | None) -> int:
    if value is None:
        raise ValueError("a complete phase line has every time")
    return value


def _transfer(
    metrics: Mapping[str, float], requests: int, union_s: float, geometry: Geometry, flags: list[str]
) -> KvTransfer | None:
    if "kv_transfers" not in metrics and "kv_transfer_bytes" not in metrics:
        flags.append("no NIXL transfer metrics (vllm:nixl_*) over the group")
        return None
    moved = metrics.get("kv_transfer_bytes", 0.0)
    seconds = metrics.get("kv_transfer_seconds", 0.0)
    tokens = metrics.get("pd_transferred_tokens")
    per_token = geometry.kv_bytes_per_token
    expected = tokens * per_token if tokens is not None and per_token is not None else None
    gbps_vllm = moved / seconds / 1e9 if seconds > 0 else None
    gbps_union = moved / union_s / 1e9 if union_s > 0 else None
    if expected is not None and per_token is not None:
        slack = BYTES_TOLERANCE_FRACTION * expected + requests * (geometry.block_size or 0) * per_token
        if abs(moved - expected) > slack:
            flags.append(
                f"{moved:.3g} bytes moved for {tokens:.0f} tokens x {per_token:.0f} B/token = {expected:.3g} bytes "
                f"(tolerance ±{slack:.3g})"
            )
    if (tokens or 0) > 0 and moved <= 0:
        flags.append(f"{tokens:.0f} tokens came over the connector, but NIXL reports no bytes")
    link = geometry.link_gbps
    for name, rate in (("vLLM's bytes ÷ Σ durations", gbps_vllm), ("bytes ÷ |∪ decode legs|", gbps_union)):
        if moved > 0 and (rate is None or rate <= 0):
            flags.append(f"{name}: no positive rate for {moved:.3g} bytes")
        elif rate is not None and link is not None and rate > link:
            flags.append(f"{name} = {rate:.1f} GB/s, above the link's {link:g} GB/s")
    return KvTransfer(
        bytes=moved,
        transfers=metrics.get("kv_transfers", 0.0),
        descriptors=metrics.get("kv_transfer_descriptors"),
        failures=metrics.get("kv_transfer_failures"),
        seconds=seconds,
        tokens=tokens,
        expected_bytes=expected,
        union_s=union_s,
        gbps_vllm=gbps_vllm,
        gbps_union=gbps_union,
        link_gbps=link,
    )


def probe_groups(records: Sequence[RequestRecord], metrics: Sequence[MetricsDelta], arm: str) -> list[Group]:
    """A probe arm's cells: measured records and the Σ of their turns' counter deltas per (context, turn)."""
    totals: dict[tuple[int, int], dict[str, float]] = defaultdict(dict)
    for delta in metrics:
        if delta.arm == arm:
            bucket = totals[(delta.context_tokens, delta.turn)]
            for tag, value in delta.values.items():
                bucket[tag] = bucket.get(tag, 0.0) + value
    mine: dict[tuple[int, int], list[RequestRecord]] = defaultdict(list)
    for record in records:
        if record.arm == arm and record.phase == "measure":
            mine[(record.context_tokens, record.turn)].append(record)
    return [
        Group(arm, f"{context} tok, turn {turn}", mine[(context, turn)], totals.get((context, turn), {}))
        for context, turn in sorted(mine)
    ]


def sweep_groups(records: Sequence[RequestRecord], points: Sequence[PointDone], arm: str) -> list[Group]:
    """A sweep arm's points: the records sent in each point's measurement window, its counter deltas."""
    groups = []
    for point in sorted((p for p in points if p.arm == arm), key=lambda p: (p.point, p.attempt)):
        inside = [
            record
            for record in records
            if record.arm == arm
            and record.point == point.point
            and record.attempt == point.attempt
            and point.window_start_ns <= record.started_ns <= point.window_end_ns
        ]
        groups.append(Group(arm, f"load {point.load:g}", inside, point.metrics or {}))
    return groups


def geometry_of(details: Mapping[str, str]) -> Geometry:
    """The manifest's KV geometry and link limit of a vllm-pd arm."""

    def number(key: str) -> float | None:
        try:
            return float(details[key])
        except (KeyError, ValueError):
            return None

    block = number(KV_BLOCK_DETAIL)
    return Geometry(number(KV_BYTES_DETAIL), None if block is None else int(block), number(KV_LINK_GBPS_DETAIL))


def build(
    scenario: str, groups: Mapping[str, tuple[Sequence[Group], Sequence[PhaseLine], Geometry]]
) -> PdBreakdownResult:
    """The result over every P/D arm's groups (arm -> its groups, proxy lines and geometry)."""
    rows = [
        row
        for arm_groups, lines, geometry in groups.values()
        for group in arm_groups
        if (row := breakdown(group, lines, geometry)) is not None
    ]
    return PdBreakdownResult(
        scenario=scenario, tolerance_ms=TOLERANCE_MS, tolerance_fraction=TOLERANCE_FRACTION, rows=rows
    )


def pd_breakdown_of(run_dir: RunDir) -> PdBreakdownResult | None:
    """The breakdown of a probe's or sweep's P/D arms (those whose manifest records a KV geometry); None
    without any (every other run, kept runs included, is left as it was)."""
    if run_dir.kind not in ("probe", "sweep") or not run_dir.manifest_file.exists():
        return None
    details = engine_details(read_manifest(run_dir.manifest_file))
    arms = [arm for arm, found in details.items() if KV_BYTES_DETAIL in found]
    if not arms:
        return None
    records = run_dir.records()
    metrics = run_dir.metrics() if run_dir.kind == "probe" else []
    points = run_dir.points() if run_dir.kind == "sweep" else []
    per_arm = {}
    for arm in arms:
        groups = probe_groups(records, metrics, arm) if run_dir.kind == "probe" else sweep_groups(records, points, arm)
        per_arm[arm] = (groups, read_phase_log(run_dir.log_dir(arm) / PROXY_LOG), geometry_of(details[arm]))
    return build(run_dir.scenario().name, per_arm)


def summarize_pd(run_dir: RunDir) -> PdBreakdownResult | None:
    """pd_breakdown_of, written to pd-breakdown.json when the run has P/D arms."""
    result = pd_breakdown_of(run_dir)
    if result is not None:
        result.write_file(run_dir.path / result.FILE_NAME)
    return result
