"""Aggregation: records (+ progress and engine-metric events) -> :class:`RunResult`.

A pure function of the stored files, so a run directory can always be re-aggregated offline.
Which records count: measured requests of each (arm, repetition, context length) group, taken
from the attempt that completed the group (or, for a group that never completed, from the latest
attempt that touched it). Records of superseded attempts are kept on disk and counted as discarded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from harness.scenario.spec import Scenario
from harness.store.events import ENGINE_RESTARTS, GroupDone, GroupKey, MetricsDelta
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from kvbench import __version__

from .run_result import (
    CacheStats,
    LatencyStats,
    PctDiff,
    RequestCounts,
    RunResult,
    TtftCell,
    pct_diff,
)
from .validity import judge_probe

NS_PER_MS = 1_000_000


def latency_stats(values_ns: Sequence[int] | pd.Series) -> LatencyStats | None:
    series = pd.Series(values_ns, dtype="float64") / NS_PER_MS
    if series.empty:
        return None
    return LatencyStats(
        n=int(series.size),
        median_ms=float(series.median()),
        p90_ms=float(series.quantile(0.9)),
        mean_ms=float(series.mean()),
        min_ms=float(series.min()),
        max_ms=float(series.max()),
    )


def chosen_attempts(records_df: pd.DataFrame, done: Iterable[GroupDone]) -> dict[GroupKey, int]:
    chosen: dict[GroupKey, int] = {}
    for event in done:
        # a later completion of the same group (a forced re-run) wins
        chosen[event.key] = max(event.attempt, chosen.get(event.key, -1))
    if not records_df.empty:
        latest = records_df.groupby(["arm", "repetition", "context_tokens"])["attempt"].max()
        for key, attempt in latest.items():
            assert isinstance(key, tuple)
            group: GroupKey = (str(key[0]), int(key[1]), int(key[2]))
            chosen.setdefault(group, int(attempt))
    return chosen


def _median_or_none(series: pd.Series) -> float | None:
    clean = series.dropna()
    return None if clean.empty else float(clean.median())


def aggregate(
    scenario: Scenario,
    run_id: str,
    records: Iterable[RequestRecord],
    done: Iterable[GroupDone],
    metrics: Iterable[MetricsDelta] = (),
) -> RunResult:
    done = list(done)
    rows = [record.model_dump(exclude={"itl_ns"}) for record in records]
    df = pd.DataFrame(rows)
    arms = [arm.name for arm in scenario.arms]
    contexts = list(scenario.probe_workload.context_tokens)
    turns = scenario.probe_workload.turns

    if df.empty:
        measured = df
        counts = RequestCounts(measured=0, ok=0, errors=0, warmup=0, filler=0, discarded=0)
        chosen: dict[GroupKey, int] = {}
    else:
        measure_all = df[df["phase"] == "measure"]
        chosen = chosen_attempts(measure_all, done)
        group_keys = zip(measure_all["arm"], measure_all["repetition"], measure_all["context_tokens"], strict=True)
        chosen_attempt = [chosen.get((str(a), int(r), int(c)), -1) for a, r, c in group_keys]
        keep = measure_all["attempt"] == pd.Series(chosen_attempt, index=measure_all.index)
        measured = measure_all[keep]
        errors = measured[~measured["ok"]]
        counts = RequestCounts(
            measured=len(measured),
            ok=int(measured["ok"].sum()),
            errors=len(errors),
            warmup=int((df["phase"] == "warmup").sum()),
            filler=int((df["phase"] == "filler").sum()),
            discarded=int((~keep).sum()),
            errors_by_kind={str(k): int(v) for k, v in errors["error_kind"].value_counts().items()},
        )

    cells: list[TtftCell] = []
    for arm in arms:
        for context in contexts:
            for turn in range(1, turns + 1):
                if measured.empty:
                    subset = measured
                else:
                    subset = measured[
                        (measured["arm"] == arm) & (measured["context_tokens"] == context) & (measured["turn"] == turn)
                    ]
                if subset.empty:
                    continue
                good = subset[subset["ok"]]
                cells.append(
                    TtftCell(
                        arm=arm,
                        context_tokens=context,
                        turn=turn,
                        ttft=latency_stats(good["ttft_ns"].dropna().astype("int64")),
                        errors=int((~subset["ok"]).sum()),
                        prompt_tokens_median=_median_or_none(good["prompt_tokens"]),
                        cached_tokens_median=_median_or_none(good["cached_tokens"]),
                    )
                )

    by_key = {(c.arm, c.context_tokens, c.turn): c for c in cells}
    diffs: list[PctDiff] = []
    baseline = scenario.baseline_arm
    for arm in arms:
        if arm == baseline:
            continue
        for context in contexts:
            for turn in range(1, turns + 1):
                base_cell = by_key.get((baseline, context, turn))
                arm_cell = by_key.get((arm, context, turn))
                if base_cell is None or arm_cell is None:
                    continue
                value = pct_diff(
                    base_cell.ttft.median_ms if base_cell.ttft else None,
                    arm_cell.ttft.median_ms if arm_cell.ttft else None,
                )
                diffs.append(PctDiff(arm=arm, baseline=baseline, context_tokens=context, turn=turn, value=value))

    metrics = list(metrics)
    cache = _cache_stats(metrics, chosen, arms, contexts, turns)
    planned = {(arm, rep, ctx) for arm in arms for rep in range(scenario.repetitions) for ctx in contexts}
    completed = {event.key for event in done}
    return RunResult(
        kvbench_version=__version__,
        run_id=run_id,
        scenario_name=scenario.name,
        workload_kind=scenario.workload.kind,
        arms=arms,
        baseline_arm=baseline,
        context_tokens=contexts,
        turns=turns,
        repetitions=scenario.repetitions,
        complete=planned <= completed,
        cells=cells,
        pct_diff=diffs,
        cache=cache,
        requests=counts,
        validity=judge_probe(scenario, counts, cells, cache, _restarts(metrics, chosen)),
    )


def _restarts(metrics: Iterable[MetricsDelta], chosen: Mapping[GroupKey, int]) -> dict[str, int]:
    """Engine restarts seen per arm, in the attempt chosen for each group."""
    out: dict[str, int] = {}
    for delta in metrics:
        if chosen.get(delta.key) == delta.attempt:
            out[delta.arm] = out.get(delta.arm, 0) + int(delta.values.get(ENGINE_RESTARTS, 0.0))
    return out


_CACHE_TAGS = {
    "gpu_queries": "gpu_prefix_queries",
    "gpu_hits": "gpu_prefix_hits",
    "external_queries": "external_prefix_queries",
    "external_hits": "external_prefix_hits",
    "prompt_tokens": "prompt_tokens",
}


def _cache_stats(
    metrics: Iterable[MetricsDelta],
    chosen: Mapping[GroupKey, int],
    arms: Sequence[str],
    contexts: Sequence[int],
    turns: int,
) -> list[CacheStats]:
    totals: dict[tuple[str, int, int], dict[str, float]] = {}
    for delta in metrics:
        if chosen.get(delta.key) != delta.attempt:
            continue
        bucket = totals.setdefault((delta.arm, delta.context_tokens, delta.turn), {})
        for field, tag in _CACHE_TAGS.items():
            if tag in delta.values:
                bucket[field] = bucket.get(field, 0.0) + delta.values[tag]
    out = []
    for arm in arms:
        for context in contexts:
            for turn in range(1, turns + 1):
                found = totals.get((arm, context, turn))
                if found is not None:
                    out.append(CacheStats(arm=arm, context_tokens=context, turn=turn, **found))
    return out


def summarize_run_dir(run_dir: RunDir) -> RunResult:
    """Aggregate a probe run directory's stored files into summary.json (used by run and report)."""
    scenario = run_dir.scenario()
    result = aggregate(scenario, run_dir.run_id, run_dir.records(), run_dir.groups_done(), run_dir.metrics())
    result.write_file(run_dir.summary_file)
    return result
