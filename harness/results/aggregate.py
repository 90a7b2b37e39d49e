"""Aggregation: records (+ progress and engine-metric events) -> :class:`RunResult`.

A pure function of the stored files, so a run directory can always be re-aggregated offline.
Which records count: measured requests of each (arm, repetition, context length) group, taken
from the attempt that completed the group (or, for a group that never completed, from the latest
attempt that touched it). Records of superseded attempts are kept on disk and counted as discarded.
The engine's ``/metrics`` deltas of a cell are summed over the same attempts: prefix-cache counters
(:class:`CacheStats`) and, where the engine has per-request histograms, its own TTFT, queue and prefill
time per request (:class:`EngineTiming`: mean = 1000 · Σ Δ _sum / Σ Δ _count, ms).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from harness.engines.openai import COUNTS_EXACT, PROMPTS_BUILT_WITH
from harness.scenario.spec import Scenario
from harness.store.events import ENGINE_RESTARTS, GroupDone, GroupKey, MetricsDelta
from harness.store.manifest import prompt_salt_of, read_manifest
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir

from .header import header_fields, with_provenance
from .lmcache_log import parse_log, ranks, timeline
from .run_result import (
    STREAM_RATIO_WARN,
    BetweenTurnsMethod,
    CacheStats,
    EngineTiming,
    LatencyStats,
    PassMedians,
    PctDiff,
    PromptLengths,
    RequestCounts,
    RunResult,
    StreamCheck,
    TtftCell,
    pct_diff,
)
from .validity import judge_probe, with_engines_down, with_reset_unavailable, with_warm_turn1

NS_PER_MS = 1_000_000
CellKey = tuple[str, int, int]
"""(arm, context tokens, turn)."""


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


def chosen_measured(run_dir: RunDir) -> list[RequestRecord]:
    """A probe run's measured records from the attempt chosen for each group (:func:`keep_chosen`)."""
    return keep_chosen([r for r in run_dir.records() if r.phase == "measure"], run_dir.groups_done())


def keep_chosen(measured: Sequence[RequestRecord], done: Iterable[GroupDone]) -> list[RequestRecord]:
    """The ``measured`` records of the attempt chosen for their group (:func:`chosen_attempts`).

    What every probe result counts: a group re-run after a failure (``--resume``) keeps only its
    completing attempt's requests; the superseded ones stay on disk.
    """
    if not measured:
        return []
    frame = pd.DataFrame(
        [
            {"arm": r.arm, "repetition": r.repetition, "context_tokens": r.context_tokens, "attempt": r.attempt}
            for r in measured
        ]
    )
    chosen = chosen_attempts(frame, done)
    return [r for r in measured if chosen.get((r.arm, r.repetition, r.context_tokens)) == r.attempt]


def _median_or_none(series: pd.Series) -> float | None:
    clean = series.dropna()
    return None if clean.empty else float(clean.median())


def aggregate(
    scenario: Scenario,
    run_id: str,
    records: Iterable[RequestRecord],
    done: Iterable[GroupDone],
    metrics: Iterable[MetricsDelta] = (),
    engine_logs: Mapping[str, Iterable[str]] | None = None,
    command: Sequence[str] = (),
    details: Mapping[str, Mapping[str, str]] | None = None,
) -> RunResult:
    """``engine_logs``: arm -> its engine log's lines, for :mod:`harness.results.lmcache_log` (read once);
    ``command``: the run's command line (:func:`~.validity.judge_probe`); ``details``: the manifest's
    ``engines.ARM.details`` (:func:`engine_details`), which say what ran between turns."""
    lmcache_logs = {arm: parse_log(lines) for arm, lines in (engine_logs or {}).items()}
    done = list(done)
    records = list(records)
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
                        text_chunks_per_token=_text_ratio(good),
                        answer=_answer_stats(good),
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
    totals = _cell_totals(metrics, chosen)
    cache = _cache_stats(totals, arms, contexts, turns)
    planned = {(arm, rep, ctx) for arm in arms for rep in range(scenario.repetitions) for ctx in contexts}
    completed = {event.key for event in done}
    methods = between_turns_methods(scenario, details or {})
    return RunResult(
        **header_fields(run_id, scenario.name),
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
        validity=judge_probe(
            scenario,
            counts,
            cells,
            cache,
            _restarts(metrics, chosen),
            moved_cells=_moved_cells(measured),
            command=command,
            methods={method.arm: method for method in methods},
        ),
        stream=stream_check(
            measured,
            cells,
            answer_tokens=scenario.probe_workload.answer_tokens,
            ignore_eos=scenario.probe_workload.ignore_eos,
        ),
        engine_timing=_engine_timing(totals, arms, contexts, turns),
        lmcache_timeline=sorted(
            timeline(records, lmcache_logs), key=lambda c: (arms.index(c.arm), c.context_tokens, c.turn)
        ),
        lmcache_ranks=sorted(ranks(lmcache_logs), key=lambda r: (arms.index(r.arm), r.worker)),
        pass_medians=pass_medians(measured, arms, contexts, turns),
        between_turns=methods,
    )


def medians_by_pass(samples: Iterable[tuple[CellKey, int, int]]) -> dict[CellKey, list[float]]:
    """``samples``: (cell, pass, TTFT ns) of successful measured requests. Per cell measured in 2 passes or more, the
    median TTFT in ms over its first k passes, k = 1, 2, … in pass order (:class:`PassMedians`)."""
    by_cell: dict[CellKey, dict[int, list[int]]] = {}
    for cell, repetition, ttft_ns in samples:
        by_cell.setdefault(cell, {}).setdefault(repetition, []).append(ttft_ns)
    out = {}
    for cell, passes in by_cell.items():
        if len(passes) < 2:
            continue
        so_far: list[int] = []
        medians = []
        for repetition in sorted(passes):
            so_far += passes[repetition]
            medians.append(statistics.median(so_far) / NS_PER_MS)
        out[cell] = medians
    return out


def pass_medians(measured: pd.DataFrame, arms: Sequence[str], contexts: Sequence[int], turns: int) -> list[PassMedians]:
    """:func:`medians_by_pass` of the chosen measured requests, in the TTFT table's cell order."""
    if measured.empty:
        return []
    good = measured[measured["ok"] & measured["ttft_ns"].notna()]
    samples = (
        ((str(arm), int(context), int(turn)), int(repetition), int(ttft))
        for arm, context, turn, repetition, ttft in zip(
            good["arm"], good["context_tokens"], good["turn"], good["repetition"], good["ttft_ns"], strict=True
        )
    )
    by_cell = medians_by_pass(samples)
    return [
        PassMedians(arm=arm, context_tokens=context, turn=turn, medians_ms=by_cell[(arm, context, turn)])
        for arm in arms
        for context in contexts
        for turn in range(1, turns + 1)
        if (arm, context, turn) in by_cell
    ]


def _moved_cells(measured: pd.DataFrame) -> set[tuple[str, int, int]]:
    """(arm, context, turn) cells of a fleet whose every measured request moved to another replica.

    Such a turn cannot hit a per-replica tier by construction; the fleet report (same vs moved)
    measures that, so the offload-hit validity gate does not apply to it.
    """
    if measured.empty or "moved" not in measured.columns:
        return set()
    moved = measured[measured["turn"] >= 2].copy()
    moved["moved"] = moved["moved"].fillna(False).astype(bool)
    groups = moved.groupby(["arm", "context_tokens", "turn"])["moved"].all()
    cells: set[tuple[str, int, int]] = set()
    for key, every in groups.items():
        assert isinstance(key, tuple)
        if every:
            cells.add((str(key[0]), int(key[1]), int(key[2])))
    return cells


def _with_usage(good: pd.DataFrame) -> pd.DataFrame:
    tokens = pd.to_numeric(good["completion_tokens"], errors="coerce")
    return good[tokens.notna() & (tokens > 0)]


def _text_ratio(good: pd.DataFrame) -> float | None:
    """Text-bearing chunks per generated token over successful requests that reported usage."""
    if good.empty:
        return None
    rows = _with_usage(good)
    tokens = float(pd.to_numeric(rows["completion_tokens"]).sum())
    return float(rows["output_chunks"].sum()) / tokens if tokens else None


def _optional_column(rows: pd.DataFrame, name: str) -> pd.Series | None:
    """A column of a field newer records have; None when no record carries it (older run directories)."""
    if name not in rows.columns:
        return None
    values = pd.to_numeric(rows[name], errors="coerce")
    return None if values.isna().all() else values


def stream_check(
    measured: pd.DataFrame, cells: Sequence[TtftCell], *, answer_tokens: int, ignore_eos: bool
) -> StreamCheck | None:
    """Text-bearing chunks against generated tokens over the measured successful requests.

    Warns when the chunks that carried text are fewer than :data:`STREAM_RATIO_WARN` of the tokens
    (over the run, or in some cells), when a request streamed an empty token chunk before its first
    text, and when answers came back shorter than ``answer_tokens`` although ``ignore_eos`` is set.
    """
    if measured.empty:
        return None
    rows = _with_usage(measured[measured["ok"]])
    if rows.empty:
        return None
    tokens = pd.to_numeric(rows["completion_tokens"])
    text = int(rows["output_chunks"].sum())
    total = int(tokens.sum())
    ratio = text / total
    empty = _optional_column(rows, "empty_token_chunks")
    first = _optional_column(rows, "first_chunk_ns")
    late = None
    if first is not None:
        ttft = pd.to_numeric(rows["ttft_ns"], errors="coerce")
        late = int((first.notna() & ttft.notna() & (ttft > first)).sum())
    short = int((tokens < answer_tokens).sum())
    warnings = []
    if ratio < STREAM_RATIO_WARN:
        warnings.append(
            f"text-bearing chunks are {ratio:.2f} of the generated tokens ({text} chunks for {total} tokens): "
            "TTFT may include decode steps (tokens that decode to no text, or several tokens per chunk)"
        )
    low = sorted(
        (
            cell
            for cell in cells
            if cell.text_chunks_per_token is not None and cell.text_chunks_per_token < STREAM_RATIO_WARN
        ),
        key=lambda cell: (cell.text_chunks_per_token, cell.arm, cell.context_tokens, cell.turn),
    )
    if low and ratio >= STREAM_RATIO_WARN:
        worst = low[0]
        warnings.append(
            f"{len(low)} of {len(cells)} cells have fewer than {STREAM_RATIO_WARN:.2f} text-bearing chunks per "
            f"generated token (lowest {worst.text_chunks_per_token:.2f}: {worst.arm}, {worst.context_tokens} tokens, "
            f"turn {worst.turn}): TTFT there may include decode steps"
        )
    if late:
        warnings.append(
            f"{late} requests streamed an empty token chunk before their first text: their TTFT includes "
            "decode steps (first_chunk_ns in records.jsonl has the first token's arrival)"
        )
    if short and ignore_eos:
        warnings.append(
            f"{short} answers have fewer than answer_tokens={answer_tokens} tokens although ignore_eos is set"
        )
    return StreamCheck(
        requests=len(rows),
        text_chunks=text,
        completion_tokens=total,
        ratio=ratio,
        empty_token_chunks=None if empty is None else int(empty.fillna(0).sum()),
        late_text=late,
        short_answers=short,
        answer_tokens=answer_tokens,
        warnings=warnings,
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


def _cell_totals(metrics: Iterable[MetricsDelta], chosen: Mapping[GroupKey, int]) -> dict[CellKey, dict[str, float]]:
    """Σ of every stored /metrics delta per cell, over the attempt chosen for each of its groups."""
    totals: dict[CellKey, dict[str, float]] = {}
    for delta in metrics:
        if chosen.get(delta.key) != delta.attempt:
            continue
        bucket = totals.setdefault((delta.arm, delta.context_tokens, delta.turn), {})
        for tag, value in delta.values.items():
            bucket[tag] = bucket.get(tag, 0.0) + value
    return totals


def _cells_in_order(arms: Sequence[str], contexts: Sequence[int], turns: int) -> Iterable[CellKey]:
    return ((arm, context, turn) for arm in arms for context in contexts for turn in range(1, turns + 1))


def _cache_stats(
    totals: Mapping[CellKey, Mapping[str, float]], arms: Sequence[str], contexts: Sequence[int], turns: int
) -> list[CacheStats]:
    out = []
    for key in _cells_in_order(arms, contexts, turns):
        found = totals.get(key)
        if found is not None:
            fields = {field: found[tag] for field, tag in _CACHE_TAGS.items() if tag in found}
            out.append(CacheStats(arm=key[0], context_tokens=key[1], turn=key[2], **fields))
    return out


_TIMING_TAGS = {
    "ttft_ms": ("engine_ttft_seconds", "engine_ttft_requests"),
    "queue_ms": ("queue_seconds", "queued_requests"),
    "prefill_ms": ("prefill_seconds", "prefilled_requests"),
}


def _engine_timing(
    totals: Mapping[CellKey, Mapping[str, float]], arms: Sequence[str], contexts: Sequence[int], turns: int
) -> list[EngineTiming]:
    """Mean ms per request = 1000 · Δ _sum / Δ _count per histogram; cells whose engine timed nothing are left out."""
    out = []
    for key in _cells_in_order(arms, contexts, turns):
        found = totals.get(key, {})
        means: dict[str, float | None] = {}
        for field, (seconds, count) in _TIMING_TAGS.items():
            timed = found.get(count, 0.0)
            means[field] = 1000.0 * found.get(seconds, 0.0) / timed if timed > 0 else None
        requests = int(found.get("engine_ttft_requests", 0.0))
        if requests > 0:
            out.append(EngineTiming(arm=key[0], context_tokens=key[1], turn=key[2], requests=requests, **means))
    return out


def _answer_stats(good: pd.DataFrame) -> LatencyStats | None:
    """Time to the first answer token of the cell's successful requests, where reasoning streamed before it."""
    if "first_content_ns" not in good or good.empty:
        return None
    answer = pd.to_numeric(good["first_content_ns"], errors="coerce")
    ttft = pd.to_numeric(good["ttft_ns"], errors="coerce")
    if not bool((answer > ttft).any()):
        return None
    return latency_stats(answer.dropna().astype("int64"))


def probe_result_of(run_dir: RunDir) -> RunResult:
    """Aggregate a probe run directory's stored files into its summary.json content; writes nothing."""
    scenario = run_dir.scenario()
    logs = {arm.name: lines for arm in scenario.arms if (lines := run_dir.engine_log(arm.name)) is not None}
    manifest = read_manifest(run_dir.manifest_file)
    command = manifest.get("command")
    details = engine_details(manifest)
    result = aggregate(
        scenario,
        run_dir.run_id,
        run_dir.records(),
        run_dir.groups_done(),
        run_dir.metrics(),
        engine_logs=logs,
        command=[str(arg) for arg in command] if isinstance(command, list) else (),
        details=details,
    )
    unavailable = {arm: why for arm, found in details.items() if (why := found.get(RESET_DETAIL))}
    lengths = prompt_lengths(chosen_measured(run_dir), details)
    result = with_provenance(result, run_dir).model_copy(
        update={"prompt_lengths": lengths, "reset_unavailable": unavailable}
    )
    if result.validity is not None:
        judged = with_engines_down(result.validity, run_dir.engines_down(), run_dir.attempts_started() - 1)
        judged = with_reset_unavailable(
            judged, unavailable, result.cells, result.cache, scenario.validity.max_reset_hit_rate
        )
        salting, _ = prompt_salt_of(manifest)
        if salting == "per_run":
            judged = with_warm_turn1(judged, result.cache, scenario.validity.max_turn1_hit_rate)
        result = result.model_copy(update={"validity": judged})
    return result


def summarize_run_dir(run_dir: RunDir) -> RunResult:
    """probe_result_of, written to summary.json (a run's end, --resume, ``kvbench report --rewrite``)."""
    result = probe_result_of(run_dir)
    result.write_file(run_dir.summary_file)
    return result


RESET_DETAIL = "prefix_cache_reset"
"""The manifest's ``engines.ARM.details`` key a probe writes when the arm's engine cannot reset its prefix cache."""
METHOD_DETAIL = "between_turns"
"""The ``engines.ARM.details`` key a probe of mode ``auto`` writes: the method it chose (:data:`ReturningMethod`),
with :data:`FILLER_TOKENS_DETAIL`, :data:`GPU_KV_TOKENS_DETAIL` and :data:`GPU_KV_SOURCE_DETAIL` for filler."""
FILLER_TOKENS_DETAIL = "filler_tokens"
GPU_KV_TOKENS_DETAIL = "gpu_kv_tokens"
GPU_KV_SOURCE_DETAIL = "gpu_kv_source"


def between_turns_methods(scenario: Scenario, details: Mapping[str, Mapping[str, str]]) -> list[BetweenTurnsMethod]:
    """Per arm, what made turn 2 a returning user: an explicit mode is what ran (``unavailable`` where a reset
    was asked for and the engine had none); mode ``auto`` is what the probe chose and noted in the manifest
    (an arm that never started has no note and no entry)."""
    spec = scenario.probe_workload.between_turns
    out: list[BetweenTurnsMethod] = []
    for arm in scenario.arms:
        found = details.get(arm.name, {})
        chosen = found.get(METHOD_DETAIL)
        if spec.mode != "auto":
            method = "unavailable" if spec.mode == "reset_prefix_cache" and found.get(RESET_DETAIL) else spec.mode
            filler = spec.filler_tokens if spec.mode == "filler" else None
            out.append(BetweenTurnsMethod(arm=arm.name, method=method, filler_tokens=filler))
        elif chosen is not None:
            out.append(
                BetweenTurnsMethod.model_validate(
                    {
                        "arm": arm.name,
                        "method": chosen,
                        "filler_tokens": found.get(FILLER_TOKENS_DETAIL),
                        "gpu_kv_tokens": found.get(GPU_KV_TOKENS_DETAIL),
                        "gpu_kv_source": found.get(GPU_KV_SOURCE_DETAIL),
                    }
                )
            )
    return out


def engine_details(manifest: Mapping[str, object]) -> dict[str, dict[str, str]]:
    """Every arm's ``engines.ARM.details`` from the run's manifest (strings only)."""
    engines = manifest.get("engines")
    out: dict[str, dict[str, str]] = {}
    for arm, entry in (engines or {}).items() if isinstance(engines, dict) else ():
        details = entry.get("details") if isinstance(entry, dict) else None
        if isinstance(details, dict):
            out[str(arm)] = {str(k): v for k, v in details.items() if isinstance(v, str)}
    return out


def prompt_lengths(measured: Sequence[RequestRecord], details: Mapping[str, Mapping[str, str]]) -> list[PromptLengths]:
    """Per arm whose prompts a tokenizer other than the engine's built: usage.prompt_tokens / counted − 1."""
    out: list[PromptLengths] = []
    for arm, found in details.items():
        if found.get(COUNTS_EXACT) != "false":
            continue
        diffs = [
            record.prompt_tokens / record.expected_prompt_tokens - 1.0
            for record in measured
            if record.arm == arm and record.ok and record.prompt_tokens and record.expected_prompt_tokens
        ]
        out.append(
            PromptLengths(
                arm=arm,
                built_with=found.get(PROMPTS_BUILT_WITH, "unknown"),
                requests=len(diffs),
                median_diff=statistics.median(diffs) if diffs else None,
                max_abs_diff=max(abs(d) for d in diffs) if diffs else None,
            )
        )
    return out
