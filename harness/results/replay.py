"""A replay's result: a pure function of its stored records, metric samples and trace info -> ``replay.json``.

Per arm, the attempt that finished it (its latest :class:`~harness.store.events.ReplayDone`) is kept,
else the latest attempt with records (``complete: false``). Over that attempt's records:

* latencies (TTFT, TPOT = (e2e − ttft) / (tokens − 1), E2E) of successful requests, pandas'
  linear quantiles (:func:`~harness.results.sweep_metrics.quantiles`);
* SLO attainment = requests that succeeded within every limit / requests
  (:func:`~harness.results.sweep_metrics.slo_attainment`);
* send lag = started_ns − scheduled_ns (open loop); ``late`` counts lag > ``late_ms``; the arm
  ``fell_behind`` when the lag's p99 exceeds ``behind_ms``;
* causal order (agent traces): a child call is a violation when its ``started_ns`` precedes its parent's
  ``started_ns + e2e_ns`` (the parent's record found by ``call_id``);
* verdict (``validity``): the error gates (:func:`~harness.results.validity.judge_errors`) over the kept
  attempts' requests, FAILED above ``validity.max_error_rate`` or with no successful request, plus an
  ``engine_died`` finding (FAILED) for an arm whose engine died mid-replay;
* hit rate = Σ (Δ gpu_prefix_hits + Δ external_prefix_hits) / Σ Δ prompt_tokens over the arm's
  ``/metrics`` samples (Δ gpu_prefix_queries where the engine has no prompt-token counter), beside
  the trace's ``infinite_cache_hit_rate`` (the ceiling any cache could reach on that window).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd

from common.errors import RunDirError
from harness.scenario.spec import Scenario
from harness.store.events import ReplayDone, ReplaySample, TraceInfo
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from offload.hits import counter_hit_rate, usage_hit_rate

from .header import header_fields, with_provenance
from .replay_result import ArmReplay, ReplayComparison, ReplayResult, TimelinePoint
from .run_result import pct_diff
from .sweep_metrics import derive_columns, quantiles, slo_attainment
from .sweep_result import Quantiles, SloLimits
from .validity import judge_errors, with_engines_down

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
PROMPT_TOKENS_TOLERANCE = 0.02


def _chosen_attempts(records: pd.DataFrame, done: Iterable[ReplayDone]) -> dict[str, tuple[int, bool]]:
    chosen: dict[str, tuple[int, bool]] = {}
    for event in done:
        if event.arm not in chosen or event.attempt >= chosen[event.arm][0]:
            chosen[event.arm] = (event.attempt, True)
    if not records.empty:
        for arm, attempt in records.groupby("arm")["attempt"].max().items():
            chosen.setdefault(str(arm), (int(attempt), False))
    return chosen


def _total(samples: Sequence[ReplaySample], tag: str) -> float | None:
    values = [s.values[tag] for s in samples if tag in s.values]
    return float(sum(values)) if values else None


def _prompt_total(samples: Sequence[ReplaySample]) -> float | None:
    prompt = _total(samples, "prompt_tokens")
    return prompt if prompt else _total(samples, "gpu_prefix_queries")


def _causal(df: pd.DataFrame) -> tuple[int | None, int | None]:
    """(child calls, children sent before their parent completed) of one arm's records; None without parents."""
    if df.empty or "parent_call" not in df or not df["parent_call"].notna().any():
        return None, None
    ends = {
        str(call): int(start) + int(e2e)
        for call, start, e2e in zip(df["call_id"], df["started_ns"], df["e2e_ns"], strict=True)
        if isinstance(call, str) and pd.notna(e2e)
    }
    children = df[df["parent_call"].notna()]
    early = sum(
        1
        for parent, start in zip(children["parent_call"], children["started_ns"], strict=True)
        if str(parent) in ends and int(start) < ends[str(parent)]
    )
    return len(children), early


def _rate(sample: ReplaySample, tag: str) -> float | None:
    value = sample.values.get(tag)
    return None if value is None or sample.duration_s <= 0 else value / sample.duration_s


def _arm_result(
    arm: str,
    attempt: int,
    complete: bool,
    df: pd.DataFrame,
    samples: Sequence[ReplaySample],
    slo: SloLimits,
    late_ms: float,
    behind_ms: float,
) -> ArmReplay:
    df = derive_columns(df)
    ok = df[df["ok"].astype(bool)] if not df.empty else df
    errors = df[~df["ok"].astype(bool)] if not df.empty else df
    lag: Quantiles | None = None
    late = 0
    if not df.empty and df["scheduled_ns"].notna().any():
        lag_ns = (df["started_ns"].astype("float64") - df["scheduled_ns"].astype("float64")).dropna()
        lag = quantiles(lag_ns)
        late = int((lag_ns > late_ms * NS_PER_MS).sum())
    wall = None
    if not df.empty:
        wall = float((df["end_ns"].max() - df["started_ns"].min()) / NS_PER_S)
    cached_share = None
    if not ok.empty:
        both = ok.dropna(subset=["cached_tokens", "prompt_tokens"])
        cached_share = usage_hit_rate(float(both["prompt_tokens"].sum()), float(both["cached_tokens"].sum()))
    off = 0
    if not ok.empty:
        checked = ok.dropna(subset=["expected_prompt_tokens", "prompt_tokens"])
        expected = checked["expected_prompt_tokens"].astype("float64")
        difference = (checked["prompt_tokens"].astype("float64") - expected).abs()
        off = int((difference > PROMPT_TOKENS_TOLERANCE * expected).sum())
    prompt = _prompt_total(samples)
    gpu = _total(samples, "gpu_prefix_hits")
    external = _total(samples, "external_prefix_hits")
    by_kind = {str(k): int(v) for k, v in errors["error_kind"].value_counts().items()} if not errors.empty else {}
    children, violations = _causal(df)
    return ArmReplay(
        arm=arm,
        attempt=attempt,
        complete=complete,
        requests=len(df),
        ok=len(ok),
        errors=len(errors),
        errors_by_kind=by_kind,
        wall_s=wall,
        ttft=quantiles(ok["ttft_ns"]) if not ok.empty else None,
        tpot=quantiles(ok["tpot_ns"]) if not ok.empty else None,
        e2e=quantiles(ok["e2e_ns"]) if not ok.empty else None,
        slo_attainment=slo_attainment(df, slo),
        lag=lag,
        late=late,
        fell_behind=lag is not None and lag.p99_ms > behind_ms,
        prompt_tokens=prompt,
        gpu_hit_tokens=gpu,
        external_hit_tokens=external,
        hit_rate=counter_hit_rate(prompt, gpu, external),
        cached_share=cached_share,
        prompt_tokens_off=off,
        child_calls=children,
        causal_violations=violations,
    )


def _pct(baseline: Quantiles | None, arm: Quantiles | None, field: str) -> float | None:
    if baseline is None or arm is None:
        return None
    return pct_diff(float(getattr(baseline, field)), float(getattr(arm, field)))


def aggregate_replay(
    scenario: Scenario,
    run_id: str,
    trace: TraceInfo,
    records: Iterable[RequestRecord],
    samples: Iterable[ReplaySample],
    done: Iterable[ReplayDone],
) -> ReplayResult:
    """A pure function of the stored files (so a replay can be re-aggregated offline)."""
    config = scenario.trace_workload
    slo = SloLimits.of(scenario.slo)
    rows = [r.model_dump(exclude={"itl_ns"}) for r in records if r.trace_line is not None and r.phase == "measure"]
    df = pd.DataFrame(rows)
    chosen = _chosen_attempts(df, done)
    samples = list(samples)
    results: list[ArmReplay] = []
    timeline: list[TimelinePoint] = []
    for arm in scenario.arms:
        if arm.name not in chosen:
            continue
        attempt, complete = chosen[arm.name]
        subset = df[(df["arm"] == arm.name) & (df["attempt"] == attempt)] if not df.empty else df
        mine = [s for s in samples if s.arm == arm.name and s.attempt == attempt]
        results.append(_arm_result(arm.name, attempt, complete, subset, mine, slo, config.late_ms, config.behind_ms))
        timeline += [
            TimelinePoint(
                arm=arm.name,
                t_s=s.t_s,
                duration_s=s.duration_s,
                prompt_tps=_rate(s, "prompt_tokens") or _rate(s, "gpu_prefix_queries"),
                gpu_hit_tps=_rate(s, "gpu_prefix_hits"),
                external_hit_tps=_rate(s, "external_prefix_hits"),
            )
            for s in mine
        ]
    by_arm = {item.arm: item for item in results}
    baseline = scenario.baseline_arm
    comparisons = []
    base = by_arm.get(baseline)
    for item in results:
        if item.arm == baseline or base is None:
            continue
        comparisons.append(
            ReplayComparison(
                arm=item.arm,
                baseline=baseline,
                ttft_p50_pct=_pct(base.ttft, item.ttft, "p50_ms"),
                ttft_p90_pct=_pct(base.ttft, item.ttft, "p90_ms"),
                ttft_p99_pct=_pct(base.ttft, item.ttft, "p99_ms"),
                e2e_p50_pct=_pct(base.e2e, item.e2e, "p50_ms"),
                hit_rate_arm=item.hit_rate,
                hit_rate_baseline=base.hit_rate,
            )
        )
    errors_by_kind: dict[str, int] = {}
    for item in results:
        for kind, count in item.errors_by_kind.items():
            errors_by_kind[kind] = errors_by_kind.get(kind, 0) + count
    measured, ok = sum(item.requests for item in results), sum(item.ok for item in results)
    engine = scenario.engine
    return ReplayResult(
        **header_fields(run_id, scenario.name),
        engine_kind=engine.kind,
        model=engine.model,
        hardware=engine.hardware,
        arms=[arm.name for arm in scenario.arms],
        baseline_arm=baseline,
        complete=all(by_arm.get(a.name) is not None and by_arm[a.name].complete for a in scenario.arms),
        trace=trace,
        slo=slo,
        late_ms=config.late_ms,
        behind_ms=config.behind_ms,
        results=results,
        timeline=timeline,
        comparisons=comparisons,
        validity=judge_errors(measured, ok, errors_by_kind, scenario.validity.max_error_rate),
    )


def replay_result_of(run_dir: RunDir) -> ReplayResult:
    """Aggregate a replay run directory's stored files into its replay.json content; writes nothing."""
    trace = run_dir.trace_info()
    if trace is None:
        raise RunDirError(f"{run_dir.path}: no trace.json, so the replay never started")
    result = aggregate_replay(
        run_dir.scenario(), run_dir.run_id, trace, run_dir.records(), run_dir.samples(), run_dir.replayed()
    )
    judged = with_engines_down(result.validity, run_dir.engines_down(), run_dir.attempts_started() - 1)
    result = result.model_copy(update={"validity": judged})
    result = with_provenance(result, run_dir)
    return result
