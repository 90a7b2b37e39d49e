"""GPU power fitted on NVML energy windows: the simulator's power terms (``Calibration.power``).

A kept load run (sweep or agentic) stores, per load point, the joules NVML's energy counter read over the
point's measurement window ``[a, b]`` (``points.jsonl``, ``energy``). Its records give the window's token work:

* prefill tokens = Σ (usage prompt_tokens − usage cached_tokens) of the requests whose first token arrived in
  ``[a, b]`` (what the GPU computed; tokens served from HBM or an offload tier are not computed);
* decode tokens = Σ over requests of (completion_tokens − 1) × (the share of the request's decode span
  ``[first token, last byte]`` inside ``[a, b]``): tokens are taken as evenly spaced over the span.

Per window of ``T`` s on ``g`` GPUs, with rates ``p`` = prefill tokens / T and ``d`` = decode tokens / T
(tokens/s), the candidate models of the window's mean power ``W`` = joules / T (W, all its GPUs) are::

    constant:  W = g × base_w
    prefill:   W = g × base_w + j_per_prefill_token × p
    tokens:    W = g × base_w + j_per_prefill_token × p + j_per_decode_token × d

each fitted by least squares on W. The terms are J per token. ``base_w`` is an intercept: the board's draw
while an engine serves, extrapolated to no tokens; an idle board reads less (77-90 W on an H200).

Held out: with two runs or more, each run is predicted by the model fitted on the others; with one run,
each arm by the model fitted on the other arms (the arms share the GPU, not the windows). The model kept is
the one with the smallest median held-out |error| of J/token, a term entering only where it lowers it; the
shipped terms are then fitted on every window of the fit's runs. J/token of a window = joules / (prompt +
generated tokens of the requests completed inside it), as :mod:`harness.results.energy` counts it, so its
predicted/measured ratio equals that of W. A run named in ``holdout`` is left out of every fit and
predicted by the shipped terms.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import numpy as np

from common.errors import CalibrationError
from harness.sim.calibration import FitParam, PowerFit, PowerResidual
from harness.store.events import PointDone
from harness.store.jsonl import read_jsonl
from harness.store.records import RequestRecord, read_records

NS = 1_000_000_000
PowerModel = Literal["constant", "prefill", "tokens"]
MODELS: tuple[PowerModel, ...] = get_args(PowerModel)
"""In order of terms: a later model is kept only where it lowers the held-out error."""
MIN_WINDOWS = 3


@dataclass(frozen=True)
class PowerWindow:
    """One measurement window with NVML joules and its token work (module docstring)."""

    run: str
    arm: str
    load: float
    gpus: int
    seconds: float
    joules: float
    prefill_tokens: float
    decode_tokens: float
    tokens: int
    """Prompt + generated tokens of the requests completed inside the window (the J/token denominator)."""

    @property
    def watts(self) -> float:
        """All the window's GPUs together, W."""
        return self.joules / self.seconds

    def features(self, model: PowerModel) -> list[float]:
        """The least-squares row: GPUs (the base term is per GPU), then the model's token rates (tokens/s)."""
        rates = {"constant": [], "prefill": [self.prefill_tokens], "tokens": [self.prefill_tokens, self.decode_tokens]}
        return [float(self.gpus), *(count / self.seconds for count in rates[model])]


def _window(run: str, done: PointDone, records: Sequence[RequestRecord]) -> PowerWindow | None:
    energy = done.energy
    if energy is None or energy.source != "nvml" or energy.joules is None or energy.seconds <= 0:
        return None
    a, b = done.window_start_ns, done.window_end_ns
    prefill = decode = 0.0
    tokens = 0
    for r in records:
        if r.arm != done.arm or r.attempt != done.attempt or not r.ok or r.ttft_ns is None or r.e2e_ns is None:
            continue
        first, last = r.started_ns + r.ttft_ns, r.started_ns + r.e2e_ns
        if a <= first <= b:
            prefill += max(0, (r.prompt_tokens or 0) - (r.cached_tokens or 0))
        steps = (r.completion_tokens or r.output_chunks) - 1
        if steps > 0 and last > first:
            decode += steps * max(0, min(b, last) - max(a, first)) / (last - first)
        if a <= last <= b:
            tokens += (r.prompt_tokens or 0) + (r.completion_tokens or r.output_chunks)
    if tokens == 0:
        return None
    return PowerWindow(run, done.arm, done.load, energy.gpus, energy.seconds, energy.joules, prefill, decode, tokens)


def energy_windows(run_dir: Path) -> list[PowerWindow]:
    """Every window of ``run_dir`` with NVML joules (the last attempt of each point), in file order; a run
    without one is an error naming it (a simulated run's energy is the model's, never a fit's input)."""
    points = run_dir / "points.jsonl"
    if not points.exists() and not (run_dir / "points.jsonl.xz").exists():
        raise CalibrationError(f"{run_dir}: no points.jsonl: a sweep or agentic run directory is needed")
    latest: dict[tuple[str, int], PointDone] = {}
    for done in read_jsonl(points, PointDone):
        latest[done.key] = done
    records = list(read_records(run_dir / "records.jsonl"))
    windows = [w for w in (_window(run_dir.name, done, records) for done in latest.values()) if w is not None]
    if not windows:
        raise CalibrationError(
            f"{run_dir}: no window with NVML joules and completed requests (points.jsonl energy.source must be nvml)"
        )
    return windows


def fit_terms(windows: Sequence[PowerWindow], model: PowerModel) -> tuple[float, float, float]:
    """(base_w, j_per_prefill_token, j_per_decode_token) of ``model`` by least squares on W (absent terms: 0)."""
    x = np.array([w.features(model) for w in windows], dtype="float64")
    y = np.array([w.watts for w in windows], dtype="float64")
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    terms = [float(c) for c in coef] + [0.0] * (3 - len(coef))
    return terms[0], terms[1], terms[2]


def predict_w(terms: tuple[float, float, float], window: PowerWindow, tdp_w: float) -> float:
    """W of ``window``'s GPUs under ``terms``, within 0..``tdp_w`` per GPU."""
    base, per_prefill, per_decode = terms
    tokens_w = (per_prefill * window.prefill_tokens + per_decode * window.decode_tokens) / window.seconds
    return min(window.gpus * tdp_w, max(0.0, window.gpus * base + tokens_w))


def _residual(window: PowerWindow, predicted_w: float, held_out: str) -> PowerResidual:
    return PowerResidual(
        run=window.run,
        arm=window.arm,
        load=window.load,
        held_out=held_out,
        seconds=window.seconds,
        tokens=window.tokens,
        measured_w=window.watts,
        predicted_w=predicted_w,
        measured_j_per_token=window.joules / window.tokens,
        predicted_j_per_token=predicted_w * window.seconds / window.tokens,
    )


def held_out_residuals(windows: Sequence[PowerWindow], model: PowerModel, tdp_w: float) -> list[PowerResidual]:
    """Each group's windows predicted by ``model`` fitted on the other groups: runs, or arms of a lone run."""
    by_run = len({w.run for w in windows}) > 1

    def group(w: PowerWindow) -> str:
        return f"run {w.run}" if by_run else f"arm {w.arm}"

    out: list[PowerResidual] = []
    for name in dict.fromkeys(group(w) for w in windows):
        rest = [w for w in windows if group(w) != name]
        if len(rest) < MIN_WINDOWS:
            raise CalibrationError(f"power fit: leaving out {name} leaves {len(rest)} windows; {MIN_WINDOWS} needed")
        terms = fit_terms(rest, model)
        out += [_residual(w, predict_w(terms, w, tdp_w), name) for w in windows if group(w) == name]
    return out


def median_error(residuals: Sequence[PowerResidual]) -> float:
    return statistics.median(abs(r.error) for r in residuals)


def fit_power(runs: Sequence[Path], tdp_w: float, holdout: Sequence[Path] = ()) -> PowerFit:
    """The power terms of ``runs``' NVML windows (module docstring); ``holdout`` runs are only predicted."""
    windows = [w for run in runs for w in energy_windows(run)]
    if len(windows) < MIN_WINDOWS:
        names = ", ".join(str(run) for run in runs) or "no runs"
        raise CalibrationError(f"power fit: {len(windows)} NVML energy windows in {names}; {MIN_WINDOWS} needed")
    if len({w.arm for w in windows}) < 2 and len({w.run for w in windows}) < 2:
        raise CalibrationError("power fit: one run of one arm; nothing to hold out (give more runs or arms)")
    tried = {model: held_out_residuals(windows, model, tdp_w) for model in MODELS}
    kept: PowerModel = MODELS[0]
    for model in MODELS[1:]:
        if median_error(tried[model]) < median_error(tried[kept]):
            kept = model
    base, per_prefill, per_decode = terms = fit_terms(windows, kept)
    residuals = list(tried[kept])
    for run in holdout:
        residuals += [
            _residual(w, predict_w(terms, w, tdp_w), f"run {w.run} (not fitted)") for w in energy_windows(run)
        ]
    span = f"{len(windows)} NVML windows of {', '.join(sorted({w.run for w in windows}))}"
    errors = ", ".join(f"{m} {median_error(tried[m]):.1%}" for m in MODELS)

    def term(value: float, unit: str, name: str) -> FitParam:
        if name == "base" or (name == "prefill" and kept != "constant") or (name == "decode" and kept == "tokens"):
            return FitParam(value=value, unit=unit, fitted=True, source=f"{span}; held-out median |error|: {errors}")
        return FitParam(
            value=0.0, unit=unit, fitted=False, source=f"left out: it did not lower the held-out error ({errors})"
        )

    return PowerFit(
        model=kept,
        base_w=term(base, "W per GPU", "base"),
        j_per_prefill_token=term(per_prefill, "J per computed prompt token", "prefill"),
        j_per_decode_token=term(per_decode, "J per generated token", "decode"),
        tdp_w=tdp_w,
        runs=[str(run) for run in runs],
        residuals=residuals,
    )


def power_table(fit: PowerFit) -> list[str]:
    """The held-out table in Markdown: predicted vs measured W and J/token per window."""
    lines = [
        "| Run | Arm | Load | Held out | W predicted / NVML | J/token predicted / NVML | Error |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    for r in fit.residuals:
        lines.append(
            f"| {r.run} | {r.arm} | {r.load:g} | {r.held_out} | {r.predicted_w:.0f} / {r.measured_w:.0f} | "
            f"{r.predicted_j_per_token:.4f} / {r.measured_j_per_token:.4f} | {r.error:+.1%} |"
        )
    return lines
