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

The gate knows its power. For every cell it computes the **smallest change it could detect** at
``alpha`` with the samples it has (80 % power, :data:`POWER`), and a cell that cannot detect the
gate's own threshold is *inconclusive*, with the samples per side it would need; it is never a PASS.

* TTFT cell: ``MDE% = (exp(δ) − 1) × 100`` with ``δ = (z(1−alpha) + z(POWER)) × σ × √(1/n_b + 1/n_c)
  / √(3/π)``; ``σ`` is the pooled robust spread of ln(TTFT) (1.4826 × the median absolute deviation
  of each side from its own median), ``3/π`` the efficiency of Mann-Whitney against the t-test under
  normal noise. Mann-Whitney's smallest p-value is ``1 / C(n_b + n_c, n_b)``: when that is above
  ``alpha`` (n = 2 per side at alpha 0.01) no change is detectable, ``MDE = ∞``. The threshold to
  detect is the larger of ``ttft_max_increase_pct`` and ``ttft_min_increase_ms`` over the baseline
  median; ``need n ≥ N`` solves ``MDE(N, N) ≤ threshold`` together with ``1 / C(2N, N) ≤ alpha``.
* Hit-rate cell: the same with the ratios themselves (``δ`` is the detectable absolute drop).
* Error rate: the smallest CURRENT error rate Fisher's test would call significant, less the
  baseline's rate. An arm whose error rate rose by less than the test can detect is inconclusive;
  one whose errors did not rise has nothing to judge.

The verdict is ``regression`` (exit 1) when any metric regressed, else ``inconclusive`` (exit 3, the
exit code kvbench gives every verdict that cannot tell) when any cell could not detect its
threshold, else ``pass`` (exit 0). The median change of a TTFT cell comes with a seeded bootstrap
confidence interval.

Two result sets of a different scenario (name, engine, model, arms, workload) or different hardware
(the engine's hardware label, the GPUs in the manifest) are not compared at all: exit code 2.
The renderers of the result (Markdown, JUnit, JSON) are outputs of the registry, ``reports/gate.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import ValidationError
from scipy import stats

from common import __version__
from common.errors import KvbenchError
from common.jsonfile import clipped, short_repr
from common.schema import VersionedFile
from harness.results.run_result import Frozen
from harness.results.verdict import EXIT_INCONCLUSIVE
from harness.scenario.spec import GateSpec, Scenario
from harness.store.manifest import read_manifest
from harness.store.records import read_records
from harness.store.rundir import RunDir
from workloads.config import MultiRoundQAProbe

COMPARE_SCHEMA_VERSION = 2
NS_PER_MS = 1_000_000
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 20240607
CONFIDENCE = 0.95
POWER = 0.80
"""Probability of detecting a change of exactly the smallest detectable size (the usual 80 %)."""
MANN_WHITNEY_EFFICIENCY = 3.0 / math.pi
"""Asymptotic relative efficiency of Mann-Whitney U against the t-test under normal noise."""
MAD_TO_SIGMA = 1.4826
"""Median absolute deviation × this = standard deviation, for normal noise (robust to outliers)."""

EXIT_PASS = 0
EXIT_REGRESSION = 1
EXIT_INCOMPARABLE = 2

Metric = Literal["ttft", "error_rate", "hit_rate"]
Status = Literal["pass", "regression", "improvement", "inconclusive"]
Verdict = Literal["pass", "regression", "inconclusive", "incomparable"]
EXIT_CODES: dict[Verdict, int] = {
    "pass": EXIT_PASS,
    "regression": EXIT_REGRESSION,
    "incomparable": EXIT_INCOMPARABLE,
    "inconclusive": EXIT_INCONCLUSIVE,
}

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


def robust_spread(*samples: np.ndarray) -> float:
    """Pooled noise of the samples: 1.4826 × the median absolute deviation, each from its own median."""
    deviations = [np.abs(sample - np.median(sample)) for sample in samples if sample.size]
    if not deviations:
        return math.nan
    return MAD_TO_SIGMA * float(np.median(np.concatenate(deviations)))


def detectable_shift(n_baseline: int, n_current: int, spread: float, alpha: float) -> float:
    """Smallest shift Mann-Whitney detects at ``alpha`` with :data:`POWER` (units of ``spread``); ∞ if none.

    ``δ = (z(1−alpha) + z(POWER)) × spread × √(1/n_b + 1/n_c) / √(3/π)``, and ∞ when even a complete
    separation of the samples cannot reach ``alpha`` (``1 / C(n_b + n_c, n_b) > alpha``).
    """
    if min_mannwhitney_p(n_baseline, n_current) > alpha or math.isnan(spread):
        return math.inf
    z = float(stats.norm.ppf(1.0 - alpha) + stats.norm.ppf(POWER))
    return z * spread * math.sqrt(1.0 / n_baseline + 1.0 / n_current) / math.sqrt(MANN_WHITNEY_EFFICIENCY)


def samples_needed(spread: float, alpha: float, shift: float) -> int | None:
    """Samples per side so that :func:`detectable_shift` ≤ ``shift``; None when no number suffices."""
    floor = 1
    while min_mannwhitney_p(floor, floor) > alpha:
        floor += 1
    if math.isnan(spread) or (shift <= 0 and spread > 0):
        return None
    if spread == 0:
        return floor
    z = float(stats.norm.ppf(1.0 - alpha) + stats.norm.ppf(POWER))
    by_noise = math.ceil(2.0 * (z * spread / shift) ** 2 / MANN_WHITNEY_EFFICIENCY)
    return max(floor, by_noise)


def fisher_greater(current_errors: int, current_n: int, baseline_errors: int, baseline_n: int) -> float:
    """One-sided Fisher p-value of H1: CURRENT's error rate is higher than BASELINE's."""
    table = np.array([[current_errors, current_n - current_errors], [baseline_errors, baseline_n - baseline_errors]])
    return float(stats.fisher_exact(table, alternative="greater").pvalue)


def detectable_error_increase(baseline_errors: int, baseline_n: int, current_n: int, alpha: float) -> float:
    """Smallest rise of the error rate (absolute) Fisher's test calls significant at ``alpha``; ∞ if none.

    The smallest CURRENT error count ``k`` with ``p(k) < alpha`` (p falls as ``k`` grows: a binary
    search), as a rate, less the baseline's rate.
    """
    if fisher_greater(current_n, current_n, baseline_errors, baseline_n) >= alpha:
        return math.inf
    low, high = 0, current_n  # p(high) < alpha
    while low < high:
        middle = (low + high) // 2
        if fisher_greater(middle, current_n, baseline_errors, baseline_n) < alpha:
            high = middle
        else:
            low = middle + 1
    return high / current_n - baseline_errors / baseline_n


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
    min_detectable_change: float | None = None
    """Smallest change the test detects here (``change_unit``); None when no change is detectable."""
    needed_n: int | None = None
    """Samples per side (requests per cell, or per arm) the threshold needs; set on inconclusive metrics."""
    status: Status
    detail: str

    @property
    def name(self) -> str:
        if self.context_tokens is None:
            return f"{self.metric} {self.arm}" + (f" t{self.turn}" if self.turn is not None else "")
        return f"{self.metric} {self.arm} {self.context_tokens} tok t{self.turn}"


class CompareResult(VersionedFile):
    """What ``kvbench compare`` decided, with every comparison behind it (``--json`` writes it)."""

    FILE_NAME: ClassVar[str] = "compare.json"
    REBUILD_HINT: ClassVar[str] = "rebuild it with `kvbench compare BASELINE CURRENT --json FILE`"

    schema_version: Literal[2] = 2
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
        return EXIT_CODES[self.verdict]

    @property
    def regressions(self) -> list[MetricComparison]:
        return [c for c in self.comparisons if c.status == "regression"]

    @property
    def inconclusive(self) -> list[MetricComparison]:
        return [c for c in self.comparisons if c.status == "inconclusive"]

    @property
    def needed_ttft_n(self) -> int | None:
        """Requests per TTFT cell every inconclusive TTFT cell needs (None: none inconclusive or none suffices)."""
        needs = [c.needed_n for c in self.inconclusive if c.metric == "ttft" and c.needed_n is not None]
        return max(needs) if needs else None


def _undetectable(
    what: str, sizes: tuple[int, int], alpha: float, mde: str | None, needed: int | None, unit: str
) -> str:
    """Why a Mann-Whitney metric is inconclusive: what it could detect, and the samples per side it needs."""
    floor = min_mannwhitney_p(*sizes)
    requests = f"{sizes[0]} vs {sizes[1]} requests"
    if floor > alpha:
        could = f"the test cannot reach alpha {alpha:g} with {requests} (smallest p {floor:.3g})"
    elif mde is None:
        could = f"no change is detectable at alpha {alpha:g} with {requests}"
    else:
        could = f"smallest detectable change {mde} at alpha {alpha:g} with {requests} ({POWER:.0%} power)"
    need = f"need n ≥ {needed} {unit}" if needed is not None else f"no number of requests {unit} suffices"
    return f"cannot detect {what}: {could}; {need}"


def compare_ttft_cell(
    arm: str, context: int, turn: int, baseline: np.ndarray, current: np.ndarray, rules: GateSpec
) -> MetricComparison:
    """Per-request TTFTs (ms) of one cell: Mann-Whitney U, the median-change threshold and the test's power."""
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
    # the change the gate must be able to see: both conditions of a regression, as a ratio of medians
    target_pct = max(rules.ttft_max_increase_pct, rules.ttft_min_increase_ms / b_med * 100.0 if b_med > 0 else 0.0)
    spread = robust_spread(np.log(baseline[baseline > 0]), np.log(current[current > 0]))
    shift = detectable_shift(baseline.size, current.size, spread, rules.alpha)
    mde = (math.exp(shift) - 1.0) * 100.0 if shift < math.log(1e6) else math.inf
    values = {**base, "baseline_value": b_med, "current_value": c_med, "change": change, "ci_low": low,
              "ci_high": high}  # fmt: skip
    values["min_detectable_change"] = None if math.isinf(mde) else mde
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
    if mde > target_pct:
        needed = samples_needed(spread, rules.alpha, math.log1p(target_pct / 100.0))
        sizes = (int(baseline.size), int(current.size))
        could = None if math.isinf(mde) else f"+{mde:.1f}%"
        detail = _undetectable(f"+{target_pct:.3g}%", sizes, rules.alpha, could, needed, "per cell")
        return MetricComparison(**values, p_value=p_worse, needed_n=needed, status="inconclusive", detail=detail)
    why = (
        f"p={p_worse:.2g} ≥ {rules.alpha:g}"
        if p_worse >= rules.alpha
        else f"change {change:+.1f}% within {rules.ttft_max_increase_pct:g}%"
        if change <= rules.ttft_max_increase_pct
        else f"change {c_med - b_med:+.3f} ms within {rules.ttft_min_increase_ms:g} ms"
    )
    return MetricComparison(
        **values, p_value=p_worse, status="pass", detail=f"no regression ({why}; detectable: +{mde:.1f}%)"
    )


def compare_error_rate(arm: str, baseline: pd.Series, current: pd.Series, rules: GateSpec) -> MetricComparison:
    """Failed / measured requests of one arm: Fisher's exact test, the absolute threshold and the test's power."""
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
    p_value = fisher_greater(c_err, c_n, b_err, b_n)
    mde = detectable_error_increase(b_err, b_n, c_n, rules.alpha)
    counts = f"errors {b_err}/{b_n} → {c_err}/{c_n}"
    values = {**base, "p_value": p_value, "min_detectable_change": None if math.isinf(mde) else mde}
    if p_value < rules.alpha and change > rules.error_rate_max_increase:
        detail = (
            f"{counts} (+{change * 100:.1f} points > {rules.error_rate_max_increase * 100:g}), Fisher p={p_value:.2g}"
        )
        return MetricComparison(**values, status="regression", detail=detail)
    if change > 0 and mde > rules.error_rate_max_increase:
        # errors rose, and the test could not have told a rise of the threshold's size from chance
        could = "none" if math.isinf(mde) else f"+{mde * 100:.1f} points"
        detail = (
            f"{counts}: cannot detect +{rules.error_rate_max_increase * 100:g} points with these requests "
            f"(smallest detectable rise {could}, Fisher p={p_value:.2g}); need more requests per arm"
        )
        return MetricComparison(**values, status="inconclusive", detail=detail)
    return MetricComparison(**values, status="pass", detail=f"{counts} (Fisher p={p_value:.2g})")


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
    spread = robust_spread(baseline, current)
    mde = detectable_shift(baseline.size, current.size, spread, rules.alpha)
    base: dict[str, Any] = {
        "metric": "hit_rate", "arm": arm, "turn": turn, "unit": "ratio", "baseline_n": int(baseline.size),
        "current_n": int(current.size), "baseline_value": b_mean, "current_value": c_mean, "change": change,
        "change_unit": "abs", "threshold": rules.hit_rate_max_decrease,
    }  # fmt: skip
    base["min_detectable_change"] = None if math.isinf(mde) else mde
    p_value = mannwhitney_greater(baseline, current)  # H1: CURRENT's ratios are smaller
    if p_value < rules.alpha and -change > rules.hit_rate_max_decrease:
        return MetricComparison(
            **base, p_value=p_value, status="regression",
            detail=f"mean hit ratio {b_mean:.3f} → {c_mean:.3f} ({change * 100:+.1f} points), "
            f"Mann-Whitney p={p_value:.2g}",
        )  # fmt: skip
    if mde > rules.hit_rate_max_decrease:
        needed = samples_needed(spread, rules.alpha, rules.hit_rate_max_decrease)
        what = f"−{rules.hit_rate_max_decrease * 100:g} points"
        sizes = (int(baseline.size), int(current.size))
        could = None if math.isinf(mde) else f"−{mde * 100:.1f} points"
        detail = _undetectable(what, sizes, rules.alpha, could, needed, "per arm and turn")
        return MetricComparison(**base, p_value=p_value, needed_n=needed, status="inconclusive", detail=detail)
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
            raise CompareError(f"--threshold {short_repr(flag)}: expected NAME=VALUE with NAME one of: {allowed}")
        try:
            value = float(text)
        except ValueError:
            raise CompareError(f"--threshold {short_repr(flag)}: {short_repr(text)} is not a number") from None
        try:  # each flag alone, so the error names the one that is out of range
            GateSpec.model_validate(rules.model_dump() | {field: value})
        except ValidationError:
            raise CompareError(
                f"--threshold {name.strip()}={clipped(text.strip())}: must be a finite number "
                f"{_allowed_range(field)} (a scenario's gate.{field})"
            ) from None
        updates[field] = value
    return GateSpec.model_validate(rules.model_dump() | updates)


def _allowed_range(field: str) -> str:
    """The bounds a :class:`GateSpec` field declares, as text: ``> 0 and < 0.5``."""
    symbols = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    bounds = [
        f"{symbol} {getattr(constraint, name):g}"
        for constraint in GateSpec.model_fields[field].metadata
        for name, symbol in symbols.items()
        if hasattr(constraint, name)
    ]
    return " and ".join(bounds)


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
    statuses = {c.status for c in comparisons}
    verdict: Verdict = (
        "regression" if "regression" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"
    )
    return CompareResult(**common, verdict=verdict, reasons=[], comparisons=comparisons)


def compare_paths(baseline: Path, current: Path, threshold_flags: Iterable[str] = ()) -> CompareResult:
    """Load both result sets and compare them (what the CLI calls)."""
    base_set = load_result_set(baseline)
    current_set = load_result_set(current)
    rules = apply_threshold_flags(current_set.scenario.gate, threshold_flags)
    return compare_sets(base_set, current_set, rules)
