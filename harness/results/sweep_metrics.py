"""Per-point sweep metrics, declared in one table: tag, unit, and the formula as the docstring.

Each load point of each arm is one steady-state window ``[window_start, window_end]``. Its records
are split two ways:

* **measured**: requests *sent* inside the window (``phase == "measure"``), the population of every
  latency distribution, of goodput and of SLO attainment;
* **completed in window**: successful requests of any phase whose last byte arrived inside the
  window, the population of the throughput rates (what the server delivered during the window).

Per request (integer ns in the record): ``tokens`` = usage ``completion_tokens`` (else the number of
token-carrying chunks); ``TPOT = (e2e − ttft) / (tokens − 1)``; decode speed
``= (tokens − 1) / (e2e − ttft)``. Quantiles are pandas' linear-interpolation quantiles.

:func:`point_result` evaluates every entry of :data:`SCALAR_METRICS` and
:data:`LATENCY_METRICS` into a :class:`~harness.results.sweep_result.PointResult`.

:data:`VERSUS_METRICS` compares an arm's point with the baseline arm's point at the same load (users, agents
or req/s: the matched decode batch, since points do not record the engine's mean running requests); reports
compute them from the stored points (:func:`decode_taxes`), so they are in no result file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

import numpy as np
import pandas as pd

from harness.store.events import PointDone
from offload.hits import counter_hit_rate, usage_hit_rate

from .energy import EnergySample, energy_sample
from .sweep_result import PointResult, Quantiles, SloLimits

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class PointData:
    """What the metric formulas see for one (arm, point)."""

    measured: pd.DataFrame
    """Requests sent inside the window; columns of RequestRecord plus tokens, tpot_ns, decode_tps, end_ns."""
    completed: pd.DataFrame
    """Successful requests (any phase) whose last byte arrived inside the window."""
    itl_ns: np.ndarray
    """Every inter-token gap of the successful measured requests."""
    window_s: float
    gpus: int
    slo: SloLimits
    done: PointDone


def derive_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``tokens``, ``end_ns``, ``tpot_ns`` and ``decode_tps`` to a frame of records."""
    out = df.copy()
    if out.empty:
        for column in ("tokens", "end_ns", "tpot_ns", "decode_tps"):
            out[column] = pd.Series(dtype="float64")
        return out
    tokens = out["completion_tokens"].astype("float64").fillna(out["output_chunks"].astype("float64"))
    out["tokens"] = tokens
    out["end_ns"] = out["started_ns"].astype("float64") + out["e2e_ns"].astype("float64")
    decode_ns = out["e2e_ns"].astype("float64") - out["ttft_ns"].astype("float64")
    steps = tokens - 1.0
    valid = out["ok"].astype(bool) & (steps >= 1) & (decode_ns > 0)
    out["tpot_ns"] = (decode_ns / steps).where(valid)
    out["decode_tps"] = (steps / (decode_ns / NS_PER_S)).where(valid)
    return out


# ---------------------------------------------------------------------------------------------
# The declarative table
# ---------------------------------------------------------------------------------------------

Kind = Literal["scalar", "latency"]


@dataclass(frozen=True)
class PointMetric:
    """One metric of a load point: ``tag`` (the PointResult field), ``unit``, formula = docstring."""

    tag: str
    unit: str
    kind: Kind
    compute: Callable[[PointData], object]

    @property
    def formula(self) -> str:
        return " ".join((self.compute.__doc__ or "").split())


_SCALARS: dict[str, PointMetric] = {}
_LATENCIES: dict[str, PointMetric] = {}


ScalarFormula = Callable[[PointData], float | None]


def _scalar(tag: str, unit: str) -> Callable[[ScalarFormula], ScalarFormula]:
    def register(func: ScalarFormula) -> ScalarFormula:
        _SCALARS[tag] = PointMetric(tag, unit, "scalar", func)
        return func

    return register


def _latency(tag: str) -> Callable[[Callable[[PointData], pd.Series]], Callable[[PointData], pd.Series]]:
    def register(func: Callable[[PointData], pd.Series]) -> Callable[[PointData], pd.Series]:
        _LATENCIES[tag] = PointMetric(tag, "ms", "latency", func)
        return func

    return register


def _ok(data: PointData) -> pd.DataFrame:
    df = data.measured
    return df[df["ok"]] if not df.empty else df


def _decode_tps(data: PointData) -> pd.Series:
    """Each successful measured request's decode speed, (tokens − 1) / (e2e − ttft), where it has one."""
    return _ok(data)["decode_tps"].dropna() if not data.measured.empty else pd.Series(dtype="float64")


@_scalar("rps", "requests/s")
def _rps(data: PointData) -> float | None:
    """Successful requests completed inside the window / window length (s)."""
    return len(data.completed) / data.window_s if data.window_s > 0 else None


@_scalar("rps_per_gpu", "requests/s/GPU")
def _rps_per_gpu(data: PointData) -> float | None:
    """rps / GPUs, with GPUs = TP × PP × DP × replicas of the deployment."""
    rps = _rps(data)
    return None if rps is None else rps / data.gpus


@_scalar("output_tps", "tokens/s")
def _output_tps(data: PointData) -> float | None:
    """Σ output tokens of the requests completed inside the window / window length (s)."""
    if data.window_s <= 0:
        return None
    return float(data.completed["tokens"].sum()) / data.window_s if not data.completed.empty else 0.0


@_scalar("output_tps_per_gpu", "tokens/s/GPU")
def _output_tps_per_gpu(data: PointData) -> float | None:
    """output_tps / GPUs, GPUs = TP × PP × DP × replicas."""
    tps = _output_tps(data)
    return None if tps is None else tps / data.gpus


@_scalar("tps_user_mean", "tokens/s")
def _tps_user_mean(data: PointData) -> float | None:
    """Mean over successful measured requests of (tokens − 1) / (e2e − ttft): a user's decode speed."""
    values = _decode_tps(data)
    return None if values.empty else float(values.mean())


@_scalar("tps_user_p50", "tokens/s")
def _tps_user_p50(data: PointData) -> float | None:
    """Median over successful measured requests of (tokens − 1) / (e2e − ttft)."""
    values = _decode_tps(data)
    return None if values.empty else float(values.median())


def slo_checks(df: pd.DataFrame, slo: SloLimits) -> tuple[pd.Series, ...]:
    """Per request of ``df`` (records with ``tpot_ns``), one boolean series per SLO limit given: ok and
    within that limit. A request with one output token has no TPOT and meets any TPOT limit."""
    checks = []
    if slo.ttft_ms is not None:
        checks.append(df["ok"].astype(bool) & (df["ttft_ns"].astype("float64") <= slo.ttft_ms * NS_PER_MS))
    if slo.tpot_ms is not None:
        tpot = df["tpot_ns"]
        checks.append(df["ok"].astype(bool) & (tpot.isna() | (tpot <= slo.tpot_ms * NS_PER_MS)))
    if slo.e2e_ms is not None:
        checks.append(df["ok"].astype(bool) & (df["e2e_ns"].astype("float64") <= slo.e2e_ms * NS_PER_MS))
    return tuple(checks)


def slo_attainment(df: pd.DataFrame, slo: SloLimits) -> float | None:
    """Requests that succeeded within every SLO limit (TTFT, TPOT, E2E) / requests; None without limits."""
    checks = slo_checks(df, slo)
    if not checks or df.empty:
        return None
    joint = checks[0]
    for check in checks[1:]:
        joint = joint & check
    return float(joint.mean())


def _within_limits(data: PointData) -> tuple[pd.Series, ...]:
    """Per measured request, one boolean series per SLO limit given (:func:`slo_checks`)."""
    return slo_checks(data.measured, data.slo)


@_scalar("slo_attainment", "fraction")
def _slo_attainment(data: PointData) -> float | None:
    """Measured requests that succeeded within every SLO limit (TTFT, TPOT, E2E) / measured requests."""
    return slo_attainment(data.measured, data.slo)


@_scalar("goodput_rps", "requests/s")
def _goodput_rps(data: PointData) -> float | None:
    """Measured requests that succeeded within every SLO limit / window length (s)."""
    attainment = _slo_attainment(data)
    if attainment is None or data.window_s <= 0:
        return None
    return attainment * len(data.measured) / data.window_s


@_scalar("goodput_rps_per_gpu", "requests/s/GPU")
def _goodput_rps_per_gpu(data: PointData) -> float | None:
    """goodput_rps / GPUs, GPUs = TP × PP × DP × replicas."""
    goodput = _goodput_rps(data)
    return None if goodput is None else goodput / data.gpus


def requests_to_judge(percentile: float) -> int:
    """Measured requests a point needs before its ``percentile`` can be judged: ``⌈1 / (1 − p/100)⌉`` (p50: 2,
    p90: 10, p95: 20, p99: 100). With fewer, the percentile is the slowest request and one request decides the
    verdict either way, so the point is unjudged (``None``), never a pass or a fail."""
    miss_share = 1.0 - percentile / 100.0
    return 1 if miss_share <= 0 else max(1, math.ceil(round(1.0 / miss_share, 9)))


def meets_slo(data: PointData) -> bool | None:
    """The point meets the SLO when, for each limit given, at least ``percentile`` % of the measured
    requests succeeded within it (i.e. the percentile of that latency, failures counting as
    infinite, is within the limit). None when the scenario gives no limit, or the point measured fewer
    requests than :func:`requests_to_judge` asks for the percentile."""
    checks = _within_limits(data)
    if not checks or len(data.measured) < requests_to_judge(data.slo.percentile):
        return None
    need = data.slo.percentile / 100.0
    return all(float(check.mean()) >= need for check in checks)


@_scalar("prompt_tokens_mean", "tokens")
def _prompt_tokens_mean(data: PointData) -> float | None:
    """Mean usage prompt_tokens of successful measured requests (server-counted, template included)."""
    values = _ok(data)["prompt_tokens"].dropna() if not data.measured.empty else pd.Series(dtype="float64")
    return None if values.empty else float(values.astype("float64").mean())


@_scalar("cached_share", "fraction")
def _cached_share(data: PointData) -> float | None:
    """Σ usage cached_tokens / Σ usage prompt_tokens over successful measured requests reporting both."""
    ok = _ok(data)
    if ok.empty:
        return None
    both = ok.dropna(subset=["cached_tokens", "prompt_tokens"])
    return usage_hit_rate(float(both["prompt_tokens"].sum()), float(both["cached_tokens"].sum()))


@_scalar("cached_share_later", "fraction")
def _cached_share_later(data: PointData) -> float | None:
    """cached_share over the successful measured requests of rounds ≥ 2 only (returning users)."""
    ok = _ok(data)
    if ok.empty:
        return None
    later = ok[ok["turn"] >= 2].dropna(subset=["cached_tokens", "prompt_tokens"])
    return usage_hit_rate(float(later["prompt_tokens"].sum()), float(later["cached_tokens"].sum()))


@_scalar("prompt_tokens_later_mean", "tokens")
def _prompt_tokens_later_mean(data: PointData) -> float | None:
    """Mean usage prompt_tokens of successful measured requests of rounds ≥ 2."""
    ok = _ok(data)
    values = ok[ok["turn"] >= 2]["prompt_tokens"].dropna() if not ok.empty else pd.Series(dtype="float64")
    return None if values.empty else float(values.astype("float64").mean())


@_scalar("prompt_tokens_round1_mean", "tokens")
def _prompt_tokens_round1_mean(data: PointData) -> float | None:
    """Mean usage prompt_tokens of successful measured round-1 requests."""
    ok = _ok(data)
    values = ok[ok["turn"] == 1]["prompt_tokens"].dropna() if not ok.empty else pd.Series(dtype="float64")
    return None if values.empty else float(values.astype("float64").mean())


@_scalar("output_tokens_mean", "tokens")
def _output_tokens_mean(data: PointData) -> float | None:
    """Mean output tokens of successful measured requests."""
    values = _ok(data)["tokens"].dropna() if not data.measured.empty else pd.Series(dtype="float64")
    return None if values.empty else float(values.mean())


def _metric(data: PointData, tag: str) -> float | None:
    return None if data.done.metrics is None else data.done.metrics.get(tag)


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den <= 0 else num / den


@_scalar("gpu_hit_rate", "fraction")
def _gpu_hit_rate(data: PointData) -> float | None:
    """Δ gpu_prefix_hits / Δ gpu_prefix_queries over the window (engine /metrics)."""
    return _ratio(_metric(data, "gpu_prefix_hits"), _metric(data, "gpu_prefix_queries"))


@_scalar("external_hit_rate", "fraction")
def _external_hit_rate(data: PointData) -> float | None:
    """Δ external_prefix_hits / Δ external_prefix_queries over the window (offload tier, /metrics)."""
    return _ratio(_metric(data, "external_prefix_hits"), _metric(data, "external_prefix_queries"))


@_scalar("hit_rate", "fraction")
def _hit_rate(data: PointData) -> float | None:
    """Prompt tokens served from any cache (:mod:`offload.hits`): ``cached_share`` when the requests report
    usage, else (Δ gpu_prefix_hits + Δ external_prefix_hits) / Δ prompt_tokens, unknown where they overlap."""
    share = _cached_share(data)
    if share is not None:
        return share
    prompt = _metric(data, "prompt_tokens") or _metric(data, "gpu_prefix_queries")
    return counter_hit_rate(prompt, _metric(data, "gpu_prefix_hits"), _metric(data, "external_prefix_hits"))


@_scalar("lag_p99_ms", "ms")
def _lag_p99(data: PointData) -> float | None:
    """p99 of started_ns − scheduled_ns over measured open-loop requests: how late the client sent."""
    df = data.measured
    if df.empty or "scheduled_ns" not in df or df["scheduled_ns"].isna().all():
        return None
    lag = (df["started_ns"].astype("float64") - df["scheduled_ns"].astype("float64")).dropna() / NS_PER_MS
    return float(lag.quantile(0.99))


@_latency("ttft")
def _ttft(data: PointData) -> pd.Series:
    """Time to first token of successful measured requests."""
    return _ok(data)["ttft_ns"]


@_latency("ttft_round1")
def _ttft_round1(data: PointData) -> pd.Series:
    """TTFT of successful measured round-1 requests (a user's first question: context not cached)."""
    ok = _ok(data)
    return ok[ok["turn"] == 1]["ttft_ns"]


@_latency("ttft_later")
def _ttft_later(data: PointData) -> pd.Series:
    """TTFT of successful measured requests of rounds ≥ 2 (a returning user: history reusable)."""
    ok = _ok(data)
    return ok[ok["turn"] >= 2]["ttft_ns"]


@_latency("tpot")
def _tpot(data: PointData) -> pd.Series:
    """Per request (e2e − ttft) / (tokens − 1), successful measured requests with ≥ 2 tokens."""
    return _ok(data)["tpot_ns"]


@_latency("itl")
def _itl(data: PointData) -> pd.Series:
    """Every gap between token-carrying chunks of successful measured requests, pooled."""
    return pd.Series(data.itl_ns, dtype="float64")


@_latency("e2e")
def _e2e(data: PointData) -> pd.Series:
    """Request start to the last byte of the stream, successful measured requests."""
    return _ok(data)["e2e_ns"]


SCALAR_METRICS: Mapping[str, PointMetric] = MappingProxyType(_SCALARS)
LATENCY_METRICS: Mapping[str, PointMetric] = MappingProxyType(_LATENCIES)


@dataclass(frozen=True)
class VersusMetric:
    """One metric of an arm's point against the baseline's point at the same load: formula = docstring."""

    tag: str
    unit: str
    compute: Callable[[PointResult, PointResult], float | None]

    @property
    def formula(self) -> str:
        return " ".join((self.compute.__doc__ or "").split())


VersusFormula = Callable[[PointResult, PointResult], float | None]
_VERSUS: dict[str, VersusMetric] = {}
MIN_TPOT_REQUESTS = 2
"""Requests with a TPOT each point needs for its median to be judged (:func:`requests_to_judge` of p50)."""


def _versus(tag: str, unit: str) -> Callable[[VersusFormula], VersusFormula]:
    def register(func: VersusFormula) -> VersusFormula:
        _VERSUS[tag] = VersusMetric(tag, unit, func)
        return func

    return register


def _tpot_ratio_pct(arm: PointResult, baseline: PointResult, quantile: Literal["p50_ms", "p90_ms"]) -> float | None:
    ours, theirs = arm.tpot, baseline.tpot
    if ours is None or theirs is None or min(ours.n, theirs.n) < MIN_TPOT_REQUESTS:
        return None
    base = getattr(theirs, quantile)
    return None if base <= 0 else (getattr(ours, quantile) / base - 1.0) * 100.0


@_versus("decode_tax", "%")
def decode_tax(arm: PointResult, baseline: PointResult) -> float | None:
    """(TPOT p50 of the arm / TPOT p50 of the baseline − 1) × 100 at the same load, TPOT per request = (e2e −
    ttft) / (tokens − 1) over successful measured requests: how much slower a typical user's tokens arrive on
    the arm (positive: slower; a faster TTFT that costs decode speed shows here). None with fewer than 2 such
    requests on either side."""
    return _tpot_ratio_pct(arm, baseline, "p50_ms")


@_versus("decode_tax_p90", "%")
def decode_tax_p90(arm: PointResult, baseline: PointResult) -> float | None:
    """(TPOT p90 of the arm / TPOT p90 of the baseline − 1) × 100 at the same load: the decode tax of the
    slowest tenth of the users (what a tier's output-speed limit at p90 judges). None as for decode_tax."""
    return _tpot_ratio_pct(arm, baseline, "p90_ms")


VERSUS_METRICS: Mapping[str, VersusMetric] = MappingProxyType(_VERSUS)


@dataclass(frozen=True)
class DecodeTax:
    """The decode tax of one arm at one load, with the medians it divides."""

    arm: str
    baseline: str
    load: float
    tpot_p50_ms: float | None
    baseline_tpot_p50_ms: float | None
    tax_pct: float | None
    """:func:`decode_tax` (p50)."""
    tpot_p90_ms: float | None
    baseline_tpot_p90_ms: float | None
    tax_p90_pct: float | None
    """:func:`decode_tax_p90`."""


def decode_taxes(points: Sequence[PointResult], baseline: str) -> list[DecodeTax]:
    """:func:`decode_tax` of every non-baseline arm's point at each load the baseline measured too."""
    base = {p.load: p for p in points if p.arm == baseline}
    out = []
    for point in points:
        other = base.get(point.load)
        if point.arm == baseline or other is None:
            continue
        out.append(
            DecodeTax(
                arm=point.arm,
                baseline=baseline,
                load=point.load,
                tpot_p50_ms=None if point.tpot is None else point.tpot.p50_ms,
                baseline_tpot_p50_ms=None if other.tpot is None else other.tpot.p50_ms,
                tax_pct=decode_tax(point, other),
                tpot_p90_ms=None if point.tpot is None else point.tpot.p90_ms,
                baseline_tpot_p90_ms=None if other.tpot is None else other.tpot.p90_ms,
                tax_p90_pct=decode_tax_p90(point, other),
            )
        )
    return out


def quantiles(values_ns: pd.Series) -> Quantiles | None:
    series = pd.Series(values_ns, dtype="float64").dropna() / NS_PER_MS
    if series.empty:
        return None
    return Quantiles(
        n=int(series.size),
        p50_ms=float(series.quantile(0.5)),
        p90_ms=float(series.quantile(0.9)),
        p99_ms=float(series.quantile(0.99)),
        mean_ms=float(series.mean()),
        max_ms=float(series.max()),
    )


def point_data(records: pd.DataFrame, itl_ns: np.ndarray, done: PointDone, gpus: int, slo: SloLimits) -> PointData:
    """The :class:`PointData` of one point from its records (all phases, one attempt)."""
    df = derive_columns(records)
    if df.empty:
        measured = df
        completed = df
    else:
        measured = df[df["phase"] == "measure"]
        inside = (df["end_ns"] >= done.window_start_ns) & (df["end_ns"] <= done.window_end_ns)
        completed = df[df["ok"].astype(bool) & inside]
    window_s = (done.window_end_ns - done.window_start_ns) / NS_PER_S
    return PointData(
        measured=measured, completed=completed, itl_ns=itl_ns, window_s=window_s, gpus=gpus, slo=slo, done=done
    )


def _token_sum(df: pd.DataFrame, column: str) -> int | None:
    """Σ ``column`` over ``df`` (None: no row reports it)."""
    if df.empty or column not in df or df[column].isna().all():
        return None
    return int(df[column].astype("float64").sum())


def point_energy(data: PointData, *, mode: Literal["concurrency", "qps"]) -> EnergySample | None:
    """The window's energy (:mod:`.energy`) over the requests the throughput counts: prompt tokens = Σ usage
    prompt_tokens and generated tokens = Σ output tokens of the requests completed inside the window; agents =
    the users of a concurrency point (None at a req/s point)."""
    return energy_sample(
        data.done.energy,
        prompt_tokens=_token_sum(data.completed, "prompt_tokens"),
        generated_tokens=_token_sum(data.completed, "tokens"),
        agents=data.done.load if mode == "concurrency" else None,
    )


def point_result(data: PointData, *, mode: Literal["concurrency", "qps"]) -> PointResult:
    done = data.done
    measured = data.measured
    errors = measured[~measured["ok"].astype(bool)] if not measured.empty else measured
    values: dict[str, object] = {tag: spec.compute(data) for tag, spec in SCALAR_METRICS.items()}
    for tag, spec in LATENCY_METRICS.items():
        series = spec.compute(data)
        assert isinstance(series, pd.Series)
        values[tag] = quantiles(series)
    return PointResult.model_validate(
        {
            "arm": done.arm,
            "point": done.point,
            "load": done.load,
            "mode": mode,
            "gpus": data.gpus,
            "window_s": data.window_s,
            "sent": done.sent,
            "measured": len(measured),
            "ok": int(measured["ok"].astype(bool).sum()) if not measured.empty else 0,
            "errors": len(errors),
            "errors_by_kind": {str(k): int(v) for k, v in errors["error_kind"].value_counts().items()}
            if not errors.empty
            else {},
            "cancelled": done.cancelled,
            "late_arrivals": done.late_arrivals,
            "max_in_flight": done.max_in_flight,
            "sessions": done.sessions,
            "meets_slo": meets_slo(data),
            "energy": point_energy(data, mode=mode),
            "client": done.client,
            **values,
        }
    )
