"""The stability window's result files, per-interval aggregation, and the PASS/FAIL verdict.

A soak directory holds, beside the usual ``scenario.yaml``, ``manifest.json`` and raw
``records.jsonl``:

* ``intervals.jsonl`` -- one :class:`IntervalStats` per finished interval, appended and fsynced
  the moment the interval closes (a crash loses at most the interval in flight);
* ``soak.json`` -- the versioned :class:`SoakResult`: window, totals and the :class:`SoakVerdict`,
  rebuilt from ``intervals.jsonl`` alone by :func:`evaluate` (``kvbench report`` does it offline).

Only aggregates live in memory: :class:`IntervalAccumulator` keeps a few numbers per request of the
*current* interval and drops them when the interval closes, so memory stays flat over a 24 h
window. Timestamps are integer nanoseconds; milliseconds appear only in the aggregates.

Criteria (:class:`~harness.scenario.spec.SoakCriteria`), judged on the intervals after
``warmup_intervals``:

* ``slo_compliance`` -- share of requests that succeeded within ``slo.ttft_ms``/``slo.tpot_ms``/
  ``slo.e2e_ms`` over the window, at least ``slo_compliance_min``; judged from at least
  ``⌈1 / (1 − slo_compliance_min)⌉`` requests (20 at 95 %); with fewer it is ``too_few`` (the verdict
  INCOMPLETE) unless its misses already sink it (it would fail even if every request up to that count met the
  SLO);
* ``error_rate`` -- failed / all requests over the window, at most ``max_error_rate``;
* ``drift`` -- no significant upward trend of the per-interval ``drift_metric`` (TTFT p99 by
  default): one-sided Mann-Kendall test (Kendall's tau of value against time, tie-corrected) at
  ``drift_confidence``, *and* a Theil-Sen line that rises by more than ``drift_min_increase_pct``
  over the window; both are robust to outliers, so one spike is not a trend;
* ``hit_rate_floor`` -- every judged interval's prefix-cache hit rate at least the floor;
* ``restarts`` -- engine restarts (cumulative ``/metrics`` counters going down) at most
  ``max_restarts``.

Each failed criterion names the intervals that broke it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from harness.scenario.spec import SLO, SoakCriteria, SoakSpec
from harness.store.events import FaultEvent, IntervalStats
from harness.store.records import RequestRecord
from offload.hits import usage_hit_rate

from .header import ResultHeader
from .run_result import Frozen
from .sweep_metrics import requests_to_judge
from .verdict import EXIT_FAILED, EXIT_INCONCLUSIVE, EXIT_OK, Outcome

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
MIN_DRIFT_POINTS = 4

CriterionName = Literal["slo_compliance", "error_rate", "drift", "hit_rate_floor", "restarts"]
CriterionStatus = Literal["pass", "fail", "not_evaluated", "too_few"]
"""``not_evaluated``: the scenario does not ask for it; ``too_few``: it asks, but the window has too little to judge."""
VerdictValue = Literal["PASS", "FAIL", "INCOMPLETE"]


class CriterionResult(Frozen):
    """One stability criterion: observed value, limit, and the intervals that broke it."""

    name: CriterionName
    status: CriterionStatus
    observed: float | None = None
    limit: float | None = None
    reason: str
    intervals: list[int] = Field(default_factory=list)
    details: dict[str, float | str] = Field(default_factory=dict)


class SoakVerdict(Frozen):
    verdict: VerdictValue
    reasons: list[str]
    criteria: list[CriterionResult]

    def criterion(self, name: CriterionName) -> CriterionResult | None:
        return next((c for c in self.criteria if c.name == name), None)


class SoakTotals(Frozen):
    requests: int
    ok: int
    errors: int
    errors_by_kind: dict[str, int] = Field(default_factory=dict)
    http_statuses: dict[str, int] = Field(default_factory=dict)


class FaultOutcome(Frozen):
    """What one rehearsed failure (``soak.faults``) did to the window.

    ``slo_broken_s`` = start of the first measured request sent after the fault that succeeded
    within the SLO − the moment the fault began (monotonic clock of the records); requests sent in
    between all missed it (``missed``). None when no request after the fault met the SLO.
    """

    kind: str
    at_s: float
    attempt: int
    start_unix_ns: int
    recovery_s: float | None = Field(description="kill_engine / restart_tier: SIGKILL until healthy again.")
    held_s: float = Field(description="From the signal until the engine answered again (or got SIGCONT).")
    slo_broken_s: float | None
    missed: int = Field(description="Measured requests sent after the fault, before the first within the SLO.")
    error: str | None = None

    def describe(self) -> str:
        recovery = f", back after {self.recovery_s:.1f} s" if self.recovery_s is not None else ""
        held = f", stopped {self.held_s:.1f} s" if self.kind == "pause_engine" else ""
        broken = (
            "the SLO never recovered"
            if self.slo_broken_s is None
            else f"SLO broken for {self.slo_broken_s:.1f} s ({self.missed} requests missed it)"
        )
        failed = f"; the drill failed: {self.error}" if self.error else ""
        return f"{self.kind} at {self.at_s:g} s{recovery}{held}: {broken}{failed}"


class SoakResult(ResultHeader):
    """``soak.json``: what a stability window showed and its verdict (intervals live in intervals.jsonl)."""

    FILE_NAME: ClassVar[str] = "soak.json"
    schema_version: Literal[2] = 2  # 2: provenance

    arm: str
    engine_kind: str
    load: str = Field(description="The target load, in words (e.g. '4 concurrent users').")
    window_s: float
    interval_s: float
    planned_intervals: int
    completed_intervals: int
    complete: bool
    attempts: int
    slo: SLO
    criteria_spec: SoakCriteria
    warmup_intervals: int
    totals: SoakTotals
    verdict: SoakVerdict
    faults: list[FaultOutcome] = Field(
        default_factory=list, description="Each rehearsed failure (soak.faults) and how long the SLO was broken."
    )

    def outcome(self) -> Outcome:
        """PASS completes (exit 0), FAIL fails (exit 1), INCOMPLETE is inconclusive (exit 3): the same codes
        whether the window just ended (``kvbench soak``) or its files are re-read (``kvbench report``)."""
        reasons = tuple(self.verdict.reasons)
        if self.verdict.verdict == "PASS":
            return Outcome(status="completed", exit_code=EXIT_OK, reasons=reasons)
        if self.verdict.verdict == "FAIL":
            return Outcome(status="failed", exit_code=EXIT_FAILED, reasons=reasons)
        return Outcome(status="inconclusive", exit_code=EXIT_INCONCLUSIVE, reasons=reasons)


# --------------------------------------------------------------------------------------------
# Per-interval aggregation
# --------------------------------------------------------------------------------------------


def tpot_ns(record: RequestRecord) -> int | None:
    """Time per output token after the first: (e2e − ttft) / (output tokens − 1)."""
    if not record.ok or record.ttft_ns is None or record.e2e_ns is None:
        return None
    tokens = record.completion_tokens if record.completion_tokens is not None else record.output_chunks
    if tokens is None or tokens < 2:
        return None
    return (record.e2e_ns - record.ttft_ns) // (tokens - 1)


def slo_misses(record: RequestRecord, slo: SLO) -> tuple[str, ...]:
    """Which SLO targets a request missed: ``failed`` for an error, else ``ttft``/``tpot``/``e2e``."""
    if not record.ok:
        return ("failed",)
    missed = []
    if slo.ttft_ms is not None and (record.ttft_ns is None or record.ttft_ns > slo.ttft_ms * NS_PER_MS):
        missed.append("ttft")
    if slo.tpot_ms is not None:
        tpot = tpot_ns(record)
        if tpot is not None and tpot > slo.tpot_ms * NS_PER_MS:
            missed.append("tpot")
    if slo.e2e_ms is not None and (record.e2e_ns is None or record.e2e_ns > slo.e2e_ms * NS_PER_MS):
        missed.append("e2e")
    return tuple(missed)


def within_slo(record: RequestRecord, slo: SLO) -> bool:
    return not slo_misses(record, slo)


def slo_has_targets(slo: SLO) -> bool:
    return any(value is not None for value in (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms))


@dataclass
class IntervalAccumulator:
    """The current interval's per-request numbers (a handful of ints each); cleared when it closes."""

    slo: SLO
    rows: list[tuple[int | None, int | None, bool, str | None, int | None, int | None, int | None, bool]] = field(
        default_factory=list
    )
    missed: dict[str, int] = field(default_factory=dict)
    missed_cached: int = 0

    def add(self, record: RequestRecord) -> None:
        misses = slo_misses(record, self.slo) if slo_has_targets(self.slo) else ()
        for name in misses:
            self.missed[name] = self.missed.get(name, 0) + 1
        if misses and record.ok and (record.cached_tokens or 0) > 0:
            self.missed_cached += 1
        self.rows.append(
            (
                record.ttft_ns,
                tpot_ns(record),
                record.ok,
                record.error_kind,
                record.http_status,
                record.prompt_tokens,
                record.cached_tokens,
                not misses,
            )
        )

    def __len__(self) -> int:
        return len(self.rows)

    def close(
        self, *, index: int, attempt: int, start_unix_ns: int, duration_ns: int, metrics: MetricsReading | None = None
    ) -> IntervalStats:
        """Aggregate the buffered requests (with pandas) into one :class:`IntervalStats`, then clear."""
        frame = pd.DataFrame(
            self.rows, columns=["ttft_ns", "tpot_ns", "ok", "error_kind", "http_status", "prompt", "cached", "slo"]
        )
        missed, missed_cached = self.missed, self.missed_cached
        self.rows, self.missed, self.missed_cached = [], {}, 0
        ok = frame[frame["ok"]] if not frame.empty else frame
        failed = frame[~frame["ok"]] if not frame.empty else frame
        seconds = duration_ns / NS_PER_S
        ttft = ok["ttft_ns"].dropna().astype("float64") / NS_PER_MS
        tpot = ok["tpot_ns"].dropna().astype("float64") / NS_PER_MS
        errors_by_kind = {str(k): int(v) for k, v in failed["error_kind"].fillna("unknown").value_counts().items()}
        statuses = failed["http_status"].dropna().astype("int64")
        http_statuses = {str(k): int(v) for k, v in statuses.value_counts().items()}
        hit_rate: float | None = None
        source: Literal["metrics", "usage"] | None = None
        # the requests' own usage first: /metrics counters overlap under asynchronous tier loads (offload.hits)
        usable = ok[ok["prompt"].notna() & ok["cached"].notna()]
        usage = usage_hit_rate(float(usable["prompt"].sum()), float(usable["cached"].sum()))
        if usage is not None:
            hit_rate, source = usage, "usage"
        elif metrics is not None and metrics.hit_rate is not None:
            hit_rate, source = metrics.hit_rate, "metrics"
        return IntervalStats(
            index=index,
            attempt=attempt,
            start_unix_ns=start_unix_ns,
            duration_ns=duration_ns,
            requests=len(frame),
            ok=len(ok),
            errors=len(failed),
            errors_by_kind=errors_by_kind,
            http_statuses=http_statuses,
            rps=len(frame) / seconds if seconds > 0 else 0.0,
            ttft_p50_ms=_quantile(ttft, 0.5),
            ttft_p99_ms=_quantile(ttft, 0.99),
            tpot_p50_ms=_quantile(tpot, 0.5),
            tpot_p99_ms=_quantile(tpot, 0.99),
            slo_met=int(frame["slo"].sum()) if slo_has_targets(self.slo) else None,
            slo_missed=missed,
            slo_missed_cached=missed_cached,
            hit_rate=hit_rate,
            hit_rate_source=source,
            kv_usage=metrics.kv_usage if metrics else None,
            restarts=metrics.restarts if metrics else 0,
            metrics_error=metrics.error if metrics else None,
            counters=dict(metrics.counters) if metrics else {},
        )


def _quantile(series: pd.Series, q: float) -> float | None:
    return None if series.empty else float(series.quantile(q))


@dataclass(frozen=True)
class MetricsReading:
    """What one interval's /metrics scrapes said."""

    hit_rate: float | None = None
    kv_usage: float | None = None
    restarts: int = 0
    error: str | None = None
    counters: Mapping[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Trend test
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trend:
    """Mann-Kendall (one-sided, upward) and Theil-Sen over a series sampled at times ``t``."""

    n: int
    tau: float
    p_value: float
    slope: float
    """Theil-Sen slope, value units per unit of t."""
    slope_low: float
    slope_high: float
    start_level: float
    """Median of the first quarter of the points (at least 3): the level the series started at."""
    rise: float
    """The Theil-Sen line's rise from the first to the last point."""

    @property
    def relative_rise(self) -> float:
        return self.rise / self.start_level if self.start_level > 0 else math.inf if self.rise > 0 else 0.0


def trend(t: Sequence[float], values: Sequence[float], confidence: float) -> Trend:
    """Mann-Kendall upward-trend test and Theil-Sen slope with its ``confidence`` interval."""
    x = np.asarray(t, dtype="float64")
    y = np.asarray(values, dtype="float64")
    if x.size < 3:
        raise ValueError(f"a trend needs at least 3 points, got {x.size}")
    if np.all(y == y[0]):
        return Trend(int(x.size), 0.0, 1.0, 0.0, 0.0, 0.0, float(y[0]), 0.0)
    # scipy.stats takes about a second to import: every run, sweep and soak process would pay it at start
    from scipy import stats

    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    kendall = stats.kendalltau(x, y, alternative="greater")
    tau = float(kendall.statistic)
    p_value = float(kendall.pvalue)
    if math.isnan(p_value):
        p_value, tau = 1.0, 0.0
    slope, _, low, high = stats.theilslopes(y, x, alpha=confidence)
    start = float(np.median(y[: max(3, y.size // 4)]))
    rise = float(slope * (x[-1] - x[0]))
    return Trend(int(x.size), tau, p_value, float(slope), float(low), float(high), start, rise)


# --------------------------------------------------------------------------------------------
# Verdict
# --------------------------------------------------------------------------------------------

_DRIFT_LABEL = {"ttft_p99": "TTFT p99", "ttft_p50": "TTFT p50", "tpot_p99": "TPOT p99", "tpot_p50": "TPOT p50"}


def _pct(value: float) -> str:
    return f"{value * 100:.2f}%"


def _kinds(intervals: Iterable[IntervalStats]) -> tuple[dict[str, int], dict[str, int]]:
    kinds: dict[str, int] = {}
    statuses: dict[str, int] = {}
    for item in intervals:
        for kind, count in item.errors_by_kind.items():
            kinds[kind] = kinds.get(kind, 0) + count
        for status, count in item.http_statuses.items():
            statuses[status] = statuses.get(status, 0) + count
    return kinds, statuses


def describe_errors(kinds: Mapping[str, int], statuses: Mapping[str, int]) -> str:
    parts = []
    for kind, count in sorted(kinds.items(), key=lambda kv: -kv[1]):
        if kind == "http_status" and statuses:
            codes = ", ".join(f"HTTP {code} ×{n}" for code, n in sorted(statuses.items()))
            parts.append(f"{kind} {count} ({codes})")
        else:
            parts.append(f"{kind} {count}")
    return ", ".join(parts)


def _span(intervals: Sequence[int]) -> str:
    if not intervals:
        return ""
    shown = ", ".join(str(i) for i in intervals[:12])
    more = f" and {len(intervals) - 12} more" if len(intervals) > 12 else ""
    return f"; intervals {shown}{more}"


def check_slo(judged: Sequence[IntervalStats], spec: SoakSpec, slo: SLO) -> CriterionResult:
    limit = spec.criteria.slo_compliance_min
    result = partial(CriterionResult, name="slo_compliance", limit=limit)
    if not slo_has_targets(slo):
        return result(status="not_evaluated", reason="the scenario sets no slo.ttft_ms, slo.tpot_ms or slo.e2e_ms")
    requests = sum(i.requests for i in judged)
    met = sum(i.slo_met or 0 for i in judged)
    if requests == 0:
        return result(status="fail", reason="no request completed in the judged intervals")
    observed = met / requests
    needed = requests_to_judge(100.0 * limit)
    # too few to judge, unless the misses already sink it: with every request up to `needed` within the SLO, the
    # window would still miss the minimum
    if requests < needed and (met + needed - requests) / needed >= limit:
        return result(
            status="too_few",
            observed=observed,
            reason=f"SLO compliance cannot be judged from {requests} requests: a {_pct(limit)} minimum needs at least "
            f"{needed} (lengthen soak.window or add users)",
        )
    broken = [
        i.index
        for i in judged
        if i.requests >= spec.min_interval_requests and (i.slo_compliance is not None and i.slo_compliance < limit)
    ]
    targets = ", ".join(
        f"{name} ≤ {value:g} ms"
        for name, value in (("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms), ("E2E", slo.e2e_ms))
        if value is not None
    )
    if observed < limit:
        missed: dict[str, int] = {}
        for item in judged:
            for name, count in item.slo_missed.items():
                missed[name] = missed.get(name, 0) + count
        cached = sum(i.slo_missed_cached for i in judged)
        slow = sum(missed.get(k, 0) for k in ("ttft", "tpot", "e2e"))
        limits = {"ttft": ("TTFT", slo.ttft_ms), "tpot": ("TPOT", slo.tpot_ms), "e2e": ("E2E", slo.e2e_ms)}

        def label(key: str) -> str:
            name, value = limits.get(key, (key, None))
            return f"{name} > {value:g} ms" if value is not None else name

        breakdown = ", ".join(f"{label(k)} ×{v}" for k, v in sorted(missed.items(), key=lambda kv: -kv[1]))
        where = f"; {cached} of the slow requests were served from a cache" if slow else ""
        details: dict[str, float | str] = {f"missed:{k}": float(v) for k, v in missed.items()}
        details["missed_cached"] = float(cached)
        return result(
            status="fail",
            observed=observed,
            intervals=broken,
            details=details,
            reason=f"SLO compliance {_pct(observed)} < {_pct(limit)} ({met}/{requests} requests succeeded with "
            f"{targets}; missed: {breakdown}{where}){_span(broken)}",
        )
    return result(
        status="pass",
        observed=observed,
        intervals=broken,
        reason=f"SLO compliance {_pct(observed)} ≥ {_pct(limit)} ({targets})",
    )


def check_errors(judged: Sequence[IntervalStats], spec: SoakSpec) -> CriterionResult:
    limit = spec.criteria.max_error_rate
    result = partial(CriterionResult, name="error_rate", limit=limit)
    requests = sum(i.requests for i in judged)
    errors = sum(i.errors for i in judged)
    if requests == 0:
        return result(status="fail", reason="no request completed in the judged intervals")
    observed = errors / requests
    broken = [i.index for i in judged if i.requests >= spec.min_interval_requests and (i.error_rate or 0.0) > limit]
    kinds, statuses = _kinds(judged)
    details: dict[str, float | str] = {f"kind:{k}": float(v) for k, v in kinds.items()}
    details.update({f"http:{k}": float(v) for k, v in statuses.items()})
    if observed > limit:
        return result(
            status="fail",
            observed=observed,
            intervals=broken,
            details=details,
            reason=f"error rate {_pct(observed)} > {_pct(limit)} ({errors}/{requests} failed: "
            f"{describe_errors(kinds, statuses)}){_span(broken)}",
        )
    tail = f" ({describe_errors(kinds, statuses)})" if errors else ""
    return result(
        status="pass",
        observed=observed,
        intervals=broken,
        details=details,
        reason=f"error rate {_pct(observed)} ≤ {_pct(limit)}{tail}",
    )


def check_drift(judged: Sequence[IntervalStats], spec: SoakSpec) -> CriterionResult:
    criteria = spec.criteria
    label = _DRIFT_LABEL[criteria.drift_metric]
    limit = criteria.drift_min_increase_pct / 100.0
    result = partial(CriterionResult, name="drift", limit=limit)
    points = [
        (i.index, i.elapsed_start_s / 60.0, value)
        for i in judged
        if i.requests >= spec.min_interval_requests and (value := i.metric(criteria.drift_metric)) is not None
    ]
    if len(points) < MIN_DRIFT_POINTS:
        return result(
            status="not_evaluated",
            reason=f"{label} drift needs at least {MIN_DRIFT_POINTS} intervals with requests, got {len(points)}",
        )
    minutes = [p[1] for p in points]
    values = [p[2] for p in points]
    found = trend(minutes, values, criteria.drift_confidence)
    alpha = 1.0 - criteria.drift_confidence
    significant = found.p_value < alpha
    rel = found.relative_rise
    details: dict[str, float | str] = {
        "tau": found.tau,
        "p_value": found.p_value,
        "slope_ms_per_min": found.slope,
        "slope_low": found.slope_low,
        "slope_high": found.slope_high,
        "start_ms": found.start_level,
        "rise_ms": found.rise,
        "confidence": criteria.drift_confidence,
        "points": float(found.n),
    }
    stats_text = (
        f"Theil-Sen {found.slope:+.3g} ms/min ({criteria.drift_confidence:.0%} CI [{found.slope_low:+.3g}, "
        f"{found.slope_high:+.3g}]), {rel * 100:+.1f}% over the window; Mann-Kendall tau={found.tau:.2f}, "
        f"p={found.p_value:.2g}"
    )
    if significant and rel > limit:
        threshold = found.start_level * (1.0 + limit)
        broken = [index for index, _, value in points if value > threshold]
        return result(
            status="fail",
            observed=rel,
            intervals=broken,
            details=details,
            reason=f"{label} drifts upward: {stats_text} < {alpha:.2g} and rise > {criteria.drift_min_increase_pct:g}%"
            f"{_span(broken)}",
        )
    why = "no significant upward trend" if not significant else f"rise within {criteria.drift_min_increase_pct:g}%"
    return result(status="pass", observed=rel, details=details, reason=f"{label}: {why} ({stats_text})")


def check_hit_rate(judged: Sequence[IntervalStats], spec: SoakSpec) -> CriterionResult:
    floor = spec.criteria.hit_rate_floor
    result = partial(CriterionResult, name="hit_rate_floor", limit=floor)
    if floor is None:
        return result(status="not_evaluated", reason="no hit_rate_floor set")
    rated = [i for i in judged if i.requests >= spec.min_interval_requests and i.hit_rate is not None]
    if not rated:
        return result(
            status="fail",
            reason="hit-rate floor set, but no interval has a hit rate (no /metrics prefix-cache counters and no "
            "usage.cached_tokens)",
        )
    lowest = min(i.hit_rate for i in rated if i.hit_rate is not None)
    broken = [i.index for i in rated if i.hit_rate is not None and i.hit_rate < floor]
    if broken:
        return result(
            status="fail",
            observed=lowest,
            intervals=broken,
            reason=f"cache hit rate fell to {_pct(lowest)} < floor {_pct(floor)} in {len(broken)} interval(s)"
            f"{_span(broken)}",
        )
    return result(
        status="pass",
        observed=lowest,
        reason=f"cache hit rate ≥ {_pct(floor)} in every interval (lowest {_pct(lowest)})",
    )


def check_restarts(
    intervals: Sequence[IntervalStats], spec: SoakSpec, drilled: int = 0, deaths: Sequence[str] = ()
) -> CriterionResult:
    """Unplanned restarts: those /metrics showed, less the ``drilled`` ones kvbench caused (kill_engine).

    An engine that died under the window (``deaths``: how, from ``engine_events.jsonl``) fails it whatever the
    limit: a stability window in which the engine went down did not hold, even if a resumed attempt went on.
    """
    limit = spec.criteria.max_restarts
    result = partial(CriterionResult, name="restarts", limit=float(limit))
    if deaths:
        return result(
            status="fail", observed=float(len(deaths)), reason=f"the engine died under the window: {'; '.join(deaths)}"
        )
    total = max(sum(i.restarts for i in intervals) - drilled, 0)
    broken = [i.index for i in intervals if i.restarts]
    scraped = sum(1 for i in intervals if i.metrics_error is None and i.counters)
    if total > limit:
        return result(
            status="fail",
            observed=float(total),
            intervals=broken,
            reason=f"engine restarted {total} time(s) (> {limit}; /metrics counters went back){_span(broken)}",
        )
    if scraped == 0:
        return result(status="not_evaluated", reason="restarts cannot be seen: no interval has /metrics counters")
    return result(
        status="pass",
        observed=float(total),
        reason=f"{total} engine restart(s) (≤ {limit}) over {scraped} scraped interval(s)"
        + (f", besides {drilled} caused by kill_engine drills" if drilled else ""),
    )


def evaluate(
    intervals: Sequence[IntervalStats],
    spec: SoakSpec,
    slo: SLO,
    *,
    planned: int,
    drilled_restarts: int = 0,
    deaths: Sequence[str] = (),
) -> SoakVerdict:
    """Judge a window's intervals against the criteria: PASS, FAIL, or INCOMPLETE (not all measured)."""
    judged = [i for i in intervals if i.index >= spec.warmup_intervals]
    criteria = [
        check_slo(judged, spec, slo),
        check_errors(judged, spec),
        check_drift(judged, spec),
        check_hit_rate(judged, spec),
        check_restarts(intervals, spec, drilled_restarts, deaths),
    ]
    reasons = [c.reason for c in criteria if c.status == "fail"]
    if reasons:
        return SoakVerdict(verdict="FAIL", reasons=reasons, criteria=criteria)
    if len(intervals) < planned:
        return SoakVerdict(
            verdict="INCOMPLETE",
            reasons=[f"only {len(intervals)} of {planned} intervals measured; continue with `kvbench soak --resume`"],
            criteria=criteria,
        )
    unjudged = [c.reason for c in criteria if c.status == "too_few"]
    if unjudged:  # a window too thin to judge a criterion it asks for cannot pass it
        return SoakVerdict(verdict="INCOMPLETE", reasons=unjudged, criteria=criteria)
    return SoakVerdict(verdict="PASS", reasons=[], criteria=criteria)


def totals(intervals: Iterable[IntervalStats]) -> SoakTotals:
    items = list(intervals)
    kinds, statuses = _kinds(items)
    return SoakTotals(
        requests=sum(i.requests for i in items),
        ok=sum(i.ok for i in items),
        errors=sum(i.errors for i in items),
        errors_by_kind=kinds,
        http_statuses=statuses,
    )


def planned_intervals(window_s: float, interval_s: float) -> int:
    return max(1, math.ceil(window_s / interval_s - 1e-9))


def fault_outcomes(
    events: Sequence[FaultEvent], read_records: Callable[[], Iterable[RequestRecord]], slo: SLO
) -> list[FaultOutcome]:
    """How long each fault broke the SLO, from the measured records of its attempt.

    ``read_records`` is called twice (two streaming passes, so a long window's records are never
    all in memory): first for each fault's first request within the SLO, then to count the misses
    before it.
    """

    def after(record: RequestRecord, event: FaultEvent) -> bool:
        return record.phase == "measure" and record.attempt == event.attempt and record.started_ns >= event.started_ns

    recovered: dict[int, int] = {}
    for record in read_records():
        if not (record.ok and record.ttft_ns is not None and within_slo(record, slo)):
            continue
        for event in events:
            if after(record, event) and record.started_ns < recovered.get(event.index, record.started_ns + 1):
                recovered[event.index] = record.started_ns
    missed = dict.fromkeys((event.index for event in events), 0)
    for record in read_records():
        for event in events:
            end = recovered.get(event.index)
            if after(record, event) and (end is None or record.started_ns < end):
                missed[event.index] += 1
    return [_fault_outcome(event, recovered.get(event.index), missed[event.index]) for event in events]


def _fault_outcome(event: FaultEvent, recovered_ns: int | None, missed: int) -> FaultOutcome:
    return FaultOutcome(
        kind=event.kind,
        at_s=event.at_s,
        attempt=event.attempt,
        start_unix_ns=event.start_unix_ns,
        recovery_s=event.recovery_s,
        held_s=(event.ended_ns - event.started_ns) / NS_PER_S,
        slo_broken_s=None if recovered_ns is None else (recovered_ns - event.started_ns) / NS_PER_S,
        missed=missed,
        error=event.error,
    )
