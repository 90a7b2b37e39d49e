"""The regression gate: ``kvbench compare BASELINE CURRENT``.

Two *result sets* are compared metric by metric. A result set is a run directory written by
``kvbench run``, or a folder whose sub-folders are run directories of one scenario (their
repetitions are pooled). Only stored files are read: ``scenario.yaml``, ``manifest.json``,
``records.jsonl`` and ``progress.jsonl``.

Rules are noise-aware. Every metric has a distribution on each side (per-request TTFTs of one
(arm, context length, turn) cell from ``records.jsonl``; per-request errors; per-request cache hit
ratios), and a metric **regresses** only when

1. a one-sided test says CURRENT is worse than BASELINE at significance ``alpha`` (Mann-Whitney U
   for TTFT and hit ratios, Fisher's exact test for error counts), *and*
2. the change exceeds the metric's threshold (TTFT: median up by more than ``ttft_max_increase_pct``
   and ``ttft_min_increase_ms``; error rate up by more than ``error_rate_max_increase``; mean hit
   ratio down by more than ``hit_rate_max_decrease``).

A cell too small for the test to ever reach ``alpha`` is *inconclusive* (reported, never a
failure). The median change of a TTFT cell comes with a seeded bootstrap confidence interval.

Two result sets of a different scenario (name, engine, model, arms, workload) or different hardware
(the engine's hardware label, the GPUs in the manifest) are not compared at all: exit code 2.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from scipy import stats

from common import __version__
from common.errors import KvbenchError
from common.markup import md_text
from harness.results.run_result import Frozen
from harness.scenario.spec import GateSpec, Scenario
from harness.store.manifest import read_manifest
from harness.store.records import read_records
from harness.store.rundir import RunDir
from workloads.config import MultiRoundQAProbe

COMPARE_SCHEMA_VERSION = 1
NS_PER_MS = 1_000_000
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 20240607
CONFIDENCE = 0.95

EXIT_PASS = 0
EXIT_REGRESSION = 1
EXIT_INCOMPARABLE = 2

Metric = Literal["ttft", "error_rate", "hit_rate"]
Status = Literal["pass", "regression", "improvement", "inconclusive"]
Verdict = Literal["pass", "regression", "incomparable"]

THRESHOLD_FLAGS: dict[str, str] = {
    "alpha": "alpha",
    "ttft": "ttft_max_increase_pct",
    "ttft_ms": "ttft_min_increase_ms",
    "error_rate": "error_rate_max_increase",
    "hit_rate": "hit_rate_max_decrease",
}
"""``--threshold NAME=VALUE`` names and the :class:`GateSpec` field each one sets."""

# Engine settings that say where or how patiently kvbench talks to an engine, not what it is.
_ENGINE_KEYS_IGNORED = frozenset(
    {"host", "port", "base_url", "arm_urls", "api_key_env", "startup_timeout_s", "stop_grace_s", "python",
     "launcher", "env", "faults"}
)  # fmt: skip
_HARDWARE_KEYS = ("hardware", "parallelism", "device")
_SCENARIO_KEYS_IGNORED = frozenset({"description", "output", "gate", "soak", "repetitions", "seed"})


class CompareError(KvbenchError):
    """A result set cannot be read (missing files, not a run directory, mixed scenarios)."""


# --------------------------------------------------------------------------------------------
# Result sets
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResultSet:
    """One side of a comparison: one or more run directories of one scenario, pooled."""

    path: Path
    run_dirs: tuple[RunDir, ...]
    scenario: Scenario
    manifests: tuple[dict[str, Any], ...]
    measured: pd.DataFrame
    """Measured requests of the attempts that count, one row per request (ttft_ms, ok, ...)."""

    @property
    def label(self) -> str:
        return str(self.path)

    @property
    def gpus(self) -> list[str]:
        names: set[str] = set()
        for manifest in self.manifests:
            for gpu in manifest.get("host", {}).get("gpus") or []:
                names.add(str(gpu.get("name")))
        return sorted(names)


def _is_run_dir(path: Path) -> bool:
    return (path / "scenario.yaml").is_file()


def _run_dirs(path: Path) -> list[RunDir]:
    if not path.exists():
        raise CompareError(f"{path}: no such file or directory")
    if not path.is_dir():
        raise CompareError(f"{path}: not a directory (give a run directory or a folder of run directories)")
    if _is_run_dir(path):
        return [RunDir.open(path)]
    found = sorted(child for child in path.iterdir() if child.is_dir() and _is_run_dir(child))
    if not found:
        raise CompareError(f"{path}: neither a run directory (no scenario.yaml) nor a folder of run directories")
    return [RunDir.open(child) for child in found]


def _measured_frame(run_dir: RunDir) -> pd.DataFrame:
    """Measured records of the attempt that counts for each (arm, repetition, context) group."""
    columns = ["arm", "attempt", "repetition", "context_tokens", "turn", "ok", "error_kind", "ttft_ns",
               "prompt_tokens", "cached_tokens"]  # fmt: skip
    rows = [
        {name: getattr(record, name) for name in columns}
        for record in read_records(run_dir.records_file)
        if record.phase == "measure"
    ]
    frame = pd.DataFrame(rows, columns=columns)
    if frame.empty:
        return frame
    chosen: dict[tuple[str, int, int], int] = {}
    for event in run_dir.groups_done():
        chosen[event.key] = max(event.attempt, chosen.get(event.key, -1))
    latest = frame.groupby(["arm", "repetition", "context_tokens"])["attempt"].max()
    for key, attempt in latest.items():
        assert isinstance(key, tuple)
        chosen.setdefault((str(key[0]), int(key[1]), int(key[2])), int(attempt))
    wanted = [
        chosen.get((str(a), int(r), int(c)), -1)
        for a, r, c in zip(frame["arm"], frame["repetition"], frame["context_tokens"], strict=True)
    ]
    keep = frame["attempt"] == pd.Series(wanted, index=frame.index)
    return frame[keep].reset_index(drop=True)


def load_result_set(path: Path) -> ResultSet:
    """Read a run directory (or a folder of run directories of one scenario) for comparison."""
    runs = _run_dirs(path)
    scenarios = [run.scenario() for run in runs]
    names = sorted({scenario.name for scenario in scenarios})
    if len(names) > 1:
        raise CompareError(f"{path}: its run directories hold different scenarios ({', '.join(names)})")
    frames = []
    for index, run in enumerate(runs):
        frame = _measured_frame(run)
        frame["run"] = index
        frames.append(frame)
    measured = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if measured.empty:
        raise CompareError(f"{path}: no measured requests in records.jsonl")
    measured["ttft_ms"] = measured["ttft_ns"].astype("float64") / NS_PER_MS
    return ResultSet(
        path=path,
        run_dirs=tuple(runs),
        scenario=scenarios[0],
        manifests=tuple(read_manifest(run.manifest_file) for run in runs),
        measured=measured,
    )


# --------------------------------------------------------------------------------------------
# Comparability
# --------------------------------------------------------------------------------------------


def _flatten(value: object, prefix: str, out: dict[str, object]) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def scenario_fingerprint(scenario: Scenario) -> dict[str, object]:
    """The scenario settings two result sets must share (flattened ``a.b.c`` paths)."""
    data = scenario.model_dump(mode="json", exclude=set(_SCENARIO_KEYS_IGNORED))
    engine = {k: v for k, v in data.pop("engine").items() if k not in _ENGINE_KEYS_IGNORED}
    hardware = {k: engine.pop(k) for k in _HARDWARE_KEYS if k in engine}
    out: dict[str, object] = {}
    _flatten({"scenario": {**data, "engine": engine}}, "", out)
    _flatten({"hardware": hardware}, "", out)
    return out


def incomparable_reasons(baseline: ResultSet, current: ResultSet) -> list[str]:
    """Why the two sets cannot be compared (empty when they can)."""
    reasons: list[str] = []
    left, right = scenario_fingerprint(baseline.scenario), scenario_fingerprint(current.scenario)
    for key in sorted(set(left) | set(right)):
        if left.get(key) != right.get(key):
            kind = "different hardware" if key.startswith("hardware.") else "different scenario"
            field = key.removeprefix("hardware.").removeprefix("scenario.")
            reasons.append(f"{kind}: {field} is {left.get(key)!r} in BASELINE, {right.get(key)!r} in CURRENT")
    if baseline.gpus != current.gpus:
        reasons.append(f"different hardware: GPUs {baseline.gpus or ['none']} vs {current.gpus or ['none']}")
    return reasons


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


def min_mannwhitney_p(n1: int, n2: int) -> float:
    """The smallest one-sided p-value Mann-Whitney U can give for these sample sizes: 1 / C(n1+n2, n1)."""
    if n1 == 0 or n2 == 0:
        return 1.0
    return 1.0 / math.comb(n1 + n2, n1)


def mannwhitney_greater(current: np.ndarray, baseline: np.ndarray) -> float:
    """One-sided p-value of H1: CURRENT tends to be larger than BASELINE."""
    if current.size == 0 or baseline.size == 0:
        return 1.0
    if np.all(current == current[0]) and np.all(baseline == current[0]):
        return 1.0  # identical constant samples: no evidence either way
    result = stats.mannwhitneyu(current, baseline, alternative="greater")
    return float(result.pvalue)


def bootstrap_median_change_pct(
    baseline: np.ndarray, current: np.ndarray, *, samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """Percentile bootstrap CI (``CONFIDENCE``) of ``(median(current) / median(baseline) − 1) × 100``."""
    rng = np.random.default_rng(seed)
    b = baseline[rng.integers(0, baseline.size, size=(samples, baseline.size))]
    c = current[rng.integers(0, current.size, size=(samples, current.size))]
    b_med = np.median(b, axis=1)
    c_med = np.median(c, axis=1)
    valid = b_med > 0
    ratios = (c_med[valid] / b_med[valid] - 1.0) * 100.0
    if ratios.size == 0:
        return (math.nan, math.nan)
    tail = (1.0 - CONFIDENCE) / 2.0 * 100.0
    low, high = np.percentile(ratios, [tail, 100.0 - tail])
    return (float(low), float(high))


# --------------------------------------------------------------------------------------------
# The comparison
# --------------------------------------------------------------------------------------------


class MetricComparison(Frozen):
    """One metric of one arm (and cell) compared."""

    metric: Metric
    arm: str
    context_tokens: int | None = None
    turn: int | None = None
    unit: str
    baseline_n: int
    current_n: int
    baseline_value: float | None = None
    current_value: float | None = None
    change: float | None = None
    change_unit: str = ""
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    threshold: float
    status: Status
    detail: str

    @property
    def name(self) -> str:
        if self.context_tokens is None:
            return f"{self.metric} {self.arm}" + (f" t{self.turn}" if self.turn is not None else "")
        return f"{self.metric} {self.arm} {self.context_tokens} tok t{self.turn}"


class CompareResult(Frozen):
    """What ``kvbench compare`` decided, with every comparison behind it."""

    schema_version: Literal[1] = 1
    kvbench_version: str
    baseline: str
    current: str
    scenario_name: str
    verdict: Verdict
    reasons: list[str]
    rules: GateSpec
    comparisons: list[MetricComparison]

    @property
    def exit_code(self) -> int:
        return {"pass": EXIT_PASS, "regression": EXIT_REGRESSION, "incomparable": EXIT_INCOMPARABLE}[self.verdict]

    @property
    def regressions(self) -> list[MetricComparison]:
        return [c for c in self.comparisons if c.status == "regression"]


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}"


def compare_ttft_cell(
    arm: str, context: int, turn: int, baseline: np.ndarray, current: np.ndarray, rules: GateSpec
) -> MetricComparison:
    """Per-request TTFTs (ms) of one cell: Mann-Whitney U plus the median-change threshold."""
    base: dict[str, Any] = {
        "metric": "ttft", "arm": arm, "context_tokens": context, "turn": turn, "unit": "ms",
        "baseline_n": int(baseline.size), "current_n": int(current.size), "change_unit": "%",
        "threshold": rules.ttft_max_increase_pct,
    }  # fmt: skip
    if baseline.size == 0:
        return MetricComparison(**base, status="inconclusive", detail="no successful request in BASELINE")
    b_med = float(np.median(baseline))
    if current.size == 0:
        return MetricComparison(
            **base, baseline_value=b_med, status="regression", detail="no successful request in CURRENT"
        )
    c_med = float(np.median(current))
    change = (c_med / b_med - 1.0) * 100.0 if b_med > 0 else math.inf
    low, high = bootstrap_median_change_pct(baseline, current)
    p_worse = mannwhitney_greater(current, baseline)
    p_better = mannwhitney_greater(baseline, current)
    values = {**base, "baseline_value": b_med, "current_value": c_med, "change": change, "ci_low": low,
              "ci_high": high}  # fmt: skip
    floor = min_mannwhitney_p(baseline.size, current.size)
    if floor > rules.alpha:
        return MetricComparison(
            **values, p_value=p_worse, status="inconclusive",
            detail=f"too few requests ({baseline.size} vs {current.size}): the test cannot reach alpha "
            f"{rules.alpha:g} (smallest p {floor:.3g})",
        )  # fmt: skip
    if p_worse < rules.alpha and change > rules.ttft_max_increase_pct and c_med - b_med > rules.ttft_min_increase_ms:
        return MetricComparison(
            **values, p_value=p_worse, status="regression",
            detail=f"median {b_med:.3f} → {c_med:.3f} ms (+{change:.1f}% > {rules.ttft_max_increase_pct:g}%), "
            f"Mann-Whitney p={p_worse:.2g} < {rules.alpha:g}",
        )  # fmt: skip
    if p_better < rules.alpha and change < -rules.ttft_max_increase_pct:
        return MetricComparison(
            **values, p_value=p_better, status="improvement",
            detail=f"median {b_med:.3f} → {c_med:.3f} ms ({change:.1f}%), Mann-Whitney p={p_better:.2g}",
        )  # fmt: skip
    why = (
        f"p={p_worse:.2g} ≥ {rules.alpha:g}"
        if p_worse >= rules.alpha
        else f"change {change:+.1f}% within {rules.ttft_max_increase_pct:g}%"
        if change <= rules.ttft_max_increase_pct
        else f"change {c_med - b_med:+.3f} ms within {rules.ttft_min_increase_ms:g} ms"
    )
    return MetricComparison(**values, p_value=p_worse, status="pass", detail=f"no regression ({why})")


def compare_error_rate(arm: str, baseline: pd.Series, current: pd.Series, rules: GateSpec) -> MetricComparison:
    """Failed / measured requests of one arm: Fisher's exact test plus the absolute threshold."""
    b_err, b_n = int((~baseline).sum()), int(baseline.size)
    c_err, c_n = int((~current).sum()), int(current.size)
    b_rate = b_err / b_n if b_n else 0.0
    c_rate = c_err / c_n if c_n else 0.0
    change = c_rate - b_rate
    base: dict[str, Any] = {
        "metric": "error_rate", "arm": arm, "unit": "ratio", "baseline_n": b_n, "current_n": c_n,
        "baseline_value": b_rate, "current_value": c_rate, "change": change, "change_unit": "abs",
        "threshold": rules.error_rate_max_increase,
    }  # fmt: skip
    if b_n == 0 or c_n == 0:
        return MetricComparison(**base, status="inconclusive", detail="no measured request on one side")
    table = np.array([[c_err, c_n - c_err], [b_err, b_n - b_err]], dtype=np.int64)
    p_value = float(stats.fisher_exact(table, alternative="greater").pvalue)
    if p_value < rules.alpha and change > rules.error_rate_max_increase:
        return MetricComparison(
            **base, p_value=p_value, status="regression",
            detail=f"errors {b_err}/{b_n} → {c_err}/{c_n} (+{change * 100:.1f} points > "
            f"{rules.error_rate_max_increase * 100:g}), Fisher p={p_value:.2g}",
        )  # fmt: skip
    return MetricComparison(
        **base, p_value=p_value, status="pass", detail=f"errors {b_err}/{b_n} → {c_err}/{c_n} (Fisher p={p_value:.2g})"
    )


def _hit_ratios(frame: pd.DataFrame) -> np.ndarray:
    good = frame[frame["ok"] & frame["cached_tokens"].notna() & (frame["prompt_tokens"].fillna(0) > 0)]
    ratios = good["cached_tokens"].astype("float64") / good["prompt_tokens"].astype("float64")
    return ratios.to_numpy(dtype="float64")


def compare_hit_rate(
    arm: str, turn: int, baseline: np.ndarray, current: np.ndarray, rules: GateSpec
) -> MetricComparison | None:
    """Per-request cached/prompt tokens of one arm and turn (``usage.cached_tokens``); None without data."""
    if baseline.size == 0 or current.size == 0:
        return None
    b_mean, c_mean = float(baseline.mean()), float(current.mean())
    change = c_mean - b_mean
    base: dict[str, Any] = {
        "metric": "hit_rate", "arm": arm, "turn": turn, "unit": "ratio", "baseline_n": int(baseline.size),
        "current_n": int(current.size), "baseline_value": b_mean, "current_value": c_mean, "change": change,
        "change_unit": "abs", "threshold": rules.hit_rate_max_decrease,
    }  # fmt: skip
    floor = min_mannwhitney_p(baseline.size, current.size)
    p_value = mannwhitney_greater(baseline, current)  # H1: CURRENT's ratios are smaller
    if floor > rules.alpha:
        return MetricComparison(**base, p_value=p_value, status="inconclusive", detail="too few requests for the test")
    if p_value < rules.alpha and -change > rules.hit_rate_max_decrease:
        return MetricComparison(
            **base, p_value=p_value, status="regression",
            detail=f"mean hit ratio {b_mean:.3f} → {c_mean:.3f} ({change * 100:+.1f} points), "
            f"Mann-Whitney p={p_value:.2g}",
        )  # fmt: skip
    return MetricComparison(
        **base, p_value=p_value, status="pass", detail=f"mean hit ratio {b_mean:.3f} → {c_mean:.3f}"
    )


def apply_threshold_flags(rules: GateSpec, flags: Iterable[str]) -> GateSpec:
    """``NAME=VALUE`` overrides (names: :data:`THRESHOLD_FLAGS`) applied to the scenario's rules."""
    updates: dict[str, float] = {}
    for flag in flags:
        name, sep, text = flag.partition("=")
        field = THRESHOLD_FLAGS.get(name.strip())
        if not sep or field is None:
            allowed = ", ".join(f"{key}=VALUE" for key in THRESHOLD_FLAGS)
            raise CompareError(f"--threshold {flag!r}: expected NAME=VALUE with NAME one of: {allowed}")
        try:
            updates[field] = float(text)
        except ValueError:
            raise CompareError(f"--threshold {flag!r}: {text!r} is not a number") from None
    try:
        return GateSpec.model_validate(rules.model_dump() | updates)
    except ValueError as error:
        raise CompareError(f"--threshold: {error}") from None


def compare_sets(baseline: ResultSet, current: ResultSet, rules: GateSpec | None = None) -> CompareResult:
    """Compare two loaded result sets under ``rules`` (default: CURRENT's scenario ``gate`` section)."""
    rules = rules or current.scenario.gate
    common = {
        "kvbench_version": __version__,
        "baseline": baseline.label,
        "current": current.label,
        "scenario_name": current.scenario.name,
        "rules": rules,
    }
    reasons = incomparable_reasons(baseline, current)
    if reasons:
        return CompareResult(**common, verdict="incomparable", reasons=reasons, comparisons=[])
    workload = current.scenario.workload
    if not isinstance(workload, MultiRoundQAProbe):
        raise CompareError(
            f"{current.label}: workload kind {workload.kind!r} is not gated yet; "
            "kvbench compare reads multi_round_qa runs (kvbench run)"
        )
    comparisons: list[MetricComparison] = []
    b_df, c_df = baseline.measured, current.measured
    arms = [arm.name for arm in current.scenario.arms]
    turns = rules.turns or list(range(1, workload.turns + 1))
    for arm in arms:
        b_arm, c_arm = b_df[b_df["arm"] == arm], c_df[c_df["arm"] == arm]
        for context in workload.context_tokens:
            for turn in turns:
                b_cell = b_arm[(b_arm["context_tokens"] == context) & (b_arm["turn"] == turn) & b_arm["ok"]]
                c_cell = c_arm[(c_arm["context_tokens"] == context) & (c_arm["turn"] == turn) & c_arm["ok"]]
                b_ttft = b_cell["ttft_ms"].dropna().to_numpy(dtype="float64")
                c_ttft = c_cell["ttft_ms"].dropna().to_numpy(dtype="float64")
                comparisons.append(compare_ttft_cell(arm, context, turn, b_ttft, c_ttft, rules))
        comparisons.append(compare_error_rate(arm, b_arm["ok"].astype(bool), c_arm["ok"].astype(bool), rules))
        for turn in turns:
            if turn < 2:
                continue  # turn 1 of a fresh conversation has nothing to hit
            hit = compare_hit_rate(
                arm, turn, _hit_ratios(b_arm[b_arm["turn"] == turn]), _hit_ratios(c_arm[c_arm["turn"] == turn]), rules
            )
            if hit is not None:
                comparisons.append(hit)
    verdict: Verdict = "regression" if any(c.status == "regression" for c in comparisons) else "pass"
    return CompareResult(**common, verdict=verdict, reasons=[], comparisons=comparisons)


def compare_paths(baseline: Path, current: Path, threshold_flags: Iterable[str] = ()) -> CompareResult:
    """Load both result sets and compare them (what the CLI calls)."""
    base_set = load_result_set(baseline)
    current_set = load_result_set(current)
    rules = apply_threshold_flags(current_set.scenario.gate, threshold_flags)
    return compare_sets(base_set, current_set, rules)


# --------------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------------

_STATUS_MARK = {"pass": "✅ pass", "regression": "❌ REGRESSION", "improvement": "🟢 improvement",
                "inconclusive": "⚪ inconclusive"}  # fmt: skip


def _value(c: MetricComparison, value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3f} ms" if c.unit == "ms" else f"{value * 100:.2f}%"


def _change(c: MetricComparison) -> str:
    if c.change is None or math.isinf(c.change):
        return "—"
    if c.change_unit == "%":
        ci = f" [{_fmt(c.ci_low, 1)}, {_fmt(c.ci_high, 1)}]" if c.ci_low is not None else ""
        return f"{c.change:+.1f}%{ci}"
    return f"{c.change * 100:+.2f} pts"


def _threshold(c: MetricComparison) -> str:
    if c.metric == "ttft":
        return f"+{c.threshold:g}%"
    return f"{'-' if c.metric == 'hit_rate' else '+'}{c.threshold * 100:g} pts"


def describe_rules(rules: GateSpec) -> str:
    return (
        f"one-sided tests at alpha {rules.alpha:g}; TTFT median +{rules.ttft_max_increase_pct:g}% "
        f"and +{rules.ttft_min_increase_ms:g} ms; error rate +{rules.error_rate_max_increase * 100:g} pts; "
        f"hit rate −{rules.hit_rate_max_decrease * 100:g} pts"
    )


def render_markdown(result: CompareResult) -> str:
    """The Markdown summary ``kvbench compare`` prints (and a CI job can post)."""
    title = {"pass": "✅ PASS: no regression", "regression": "❌ REGRESSION",
             "incomparable": "⚠️ CANNOT COMPARE"}[result.verdict]  # fmt: skip
    lines = [
        f"## kvbench compare — {title}",
        "",
        f"* scenario: {md_text(result.scenario_name)}",
        f"* baseline: {md_text(result.baseline)}",
        f"* current: {md_text(result.current)}",
        f"* rules: {describe_rules(result.rules)}",
        "",
    ]
    if result.verdict == "incomparable":
        lines.append("The result sets are not comparable:")
        lines.append("")
        lines.extend(f"* {md_text(reason)}" for reason in result.reasons)
        return "\n".join(lines) + "\n"
    counts = {status: sum(c.status == status for c in result.comparisons) for status in _STATUS_MARK}
    lines.append(", ".join(f"{n} {status}" for status, n in counts.items()))
    lines.append("")
    lines.append("| metric | arm | tokens | turn | baseline | current | change [95% CI] | p | threshold | status |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    order = {"regression": 0, "improvement": 1, "inconclusive": 2, "pass": 3}
    for c in sorted(result.comparisons, key=lambda c: order[c.status]):
        lines.append(
            "| " + " | ".join([
                c.metric, md_text(c.arm), str(c.context_tokens or "—"), str(c.turn or "—"),
                f"{_value(c, c.baseline_value)} (n={c.baseline_n})", f"{_value(c, c.current_value)} (n={c.current_n})",
                _change(c), _fmt(c.p_value, 4) if c.p_value is not None else "—", _threshold(c),
                _STATUS_MARK[c.status],
            ]) + " |"
        )  # fmt: skip
    regressions = result.regressions
    if regressions:
        lines += ["", "Regressions:", ""]
        lines += [f"* **{md_text(c.name)}**: {md_text(c.detail)}" for c in regressions]
    return "\n".join(lines) + "\n"


def render_junit(result: CompareResult) -> str:
    """JUnit XML: one test case per comparison; regressions fail, inconclusive cells are skipped."""
    suite = ET.Element(
        "testsuite",
        name=f"kvbench.compare.{result.scenario_name}",
        tests="0",
        failures="0",
        errors="0",
        skipped="0",
    )
    props = ET.SubElement(suite, "properties")
    for key, value in (("baseline", result.baseline), ("current", result.current), ("verdict", result.verdict)):
        ET.SubElement(props, "property", name=key, value=value)
    tests = failures = errors = skipped = 0
    if result.verdict == "incomparable":
        case = ET.SubElement(suite, "testcase", classname="kvbench.compare", name="comparable")
        error = ET.SubElement(case, "error", message="result sets are not comparable", type="incomparable")
        error.text = "\n".join(result.reasons)
        tests, errors = 1, 1
    for c in result.comparisons:
        tests += 1
        case = ET.SubElement(suite, "testcase", classname=f"kvbench.compare.{c.metric}", name=c.name)
        if c.status == "regression":
            failures += 1
            failure = ET.SubElement(case, "failure", message=c.detail, type="regression")
            failure.text = c.detail
        elif c.status == "inconclusive":
            skipped += 1
            ET.SubElement(case, "skipped", message=c.detail)
        else:
            ET.SubElement(case, "system-out").text = c.detail
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def write_outputs(
    result: CompareResult, *, markdown: Path | None = None, junit: Path | None = None, json_path: Path | None = None
) -> list[Path]:
    """Write whichever of the Markdown summary, JUnit XML and JSON result were asked for."""
    written: list[Path] = []
    for path, text in (
        (markdown, render_markdown(result) if markdown else ""),
        (junit, render_junit(result) if junit else ""),
        (json_path, result.model_dump_json(indent=2) + "\n" if json_path else ""),
    ):
        if path is None:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
