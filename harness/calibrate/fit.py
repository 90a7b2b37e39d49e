"""Fit a simulator calibration from real runs: a pure function of stored run directories.

``calibrate([RUN_DIR, ...])`` reads each run's scenario, manifest, records and ``/metrics`` deltas and fits
:class:`harness.sim.calibration.Calibration` for the one deployment they share (two deployments are an error
naming both). Least squares on relative residuals ``predicted / measured - 1``, so a 50 ms and a 10 s request
weigh the same. :func:`calibrate` reads top-down; its steps, with the simulator's own formulas
(``P`` prompt tokens, ``b`` decoding batch, ``c`` context tokens):

0. :func:`fit_front_growth`: ``request_overhead_s_per_ktoken`` = slope of the front-end time (the client's TTFT
   minus the engine's queue and prefill time, or LMCache's log) against ``P``, where lengths are 4x apart.
1. :class:`DecodeFit`: a decode step ``max(step_overhead + per_seq x b + extra_backend, (weights + b x c x KV
   bytes) / (HBM bw x hbm_eff))`` against each (run, arm, load point or probe length)'s mean clean step
   (:func:`.samples.decode_samples`: gaps while no other request prefilled).
2. :func:`fit_ttft`: a probe request's unloaded TTFT ``overhead(P) + [latency_b + loaded GB / load_gbps_b] +
   prefill(P | cached)`` (:func:`harness.sim.calibration.unloaded_ttft_s`; ``soft_l1`` loss), with and without a
   prefill step's own host time (kept where it binds and fits better by :data:`PREFILL_FLOOR_MARGIN`).
3. :func:`fit_blocking`: a sweep request's decode window = the sum of its rebuilt steps (:mod:`.engine_steps`)
   ``+ share x overhead(P)`` of each arrival charged to them ``+ busy_intake_s`` per arrival at a busy engine.
4. With ``decode_read`` (:func:`fit_decode_read`), steps 0-3 see the probe runs alone, and the load runs' decode
   steps fit one more term, ``+ read x b x c / 1000``, every other parameter kept.

A parameter is free only where the runs determine it (lengths or loads :data:`SPREAD` apart, batches
:data:`BATCH_SPREAD` apart, an arm without a tier, ...); otherwise it keeps its default and its ``source`` says
why. :func:`gather` leaves outlier requests out and :func:`bound_warnings` flags values stuck on a bound; both land
in the file's ``warnings``. ``holdout`` lengths and ``holdout_loads`` stay out of every step.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from common.errors import CalibrationError
from harness.sim.calibration import (
    BackendCalibration,
    Calibration,
    DecodeResidual,
    FitParam,
    Residual,
)
from harness.sim.timemodel import StepWork
from offload.shapes import Deployment

from .model import (
    PREFILL_HOST_NAME,
    DecodeWindows,
    Free,
    Params,
    decode_windows,
    free_param,
    keyed,
    params_of,
    predict_decode,
    predict_ttft,
    prefill_host,
    rms,
    setter,
    solve,
    timing_of,
)
from .samples import (
    ENGINE_CLOCK,
    ArmFacts,
    DecodeSample,
    FitData,
    FrontSample,
    RunFacts,
    StepsWindow,
    TtftSample,
    cells_of,
    collect,
    decode_groups,
    front_samples,
    run_facts,
)

ATTENTION_MIN_TOKENS = 16_000
MEMORY_BOUND_MARGIN = 0.001
"""The decode fit's memory-bound start replaces the host-bound one only when its RMS relative step error
is lower by this much (0.1 % of a step)."""
PREFILL_FLOOR_MARGIN = 0.002
"""The TTFT fit with a prefill step's own host time replaces the one without only when its RMS relative error
is lower by this much (0.2 % of a TTFT): one more free parameter always fits a little better."""
SPREAD = 4.0
"""Sizes (loads) must differ by this factor for a slope to be determined."""
BATCH_SPREAD = 2.0
"""Decode batches (for the decode KV read: batch x context) must differ by this factor for the per-sequence step
cost (the read) to be determined."""
DECODE_READ_NAME = "decode_s_per_ktoken"
KV_SPREAD = 0.5
"""The KV bytes the decode steps read must differ by this share of the weights' bytes for the HBM
efficiency to be determined: the step then grows visibly with batch x context. Below it (a sweep
of short contexts), the weights dominate every step, which fixes only their sum with the step
overhead; the efficiency keeps its datasheet value and the overhead takes the rest."""


def _fit_ttft(
    deployment: Deployment,
    params: Params,
    chunk: int,
    samples: Sequence[TtftSample],
    frees: Sequence[Free],
    residuals: Callable[[Params], np.ndarray],
) -> str:
    """Step 2's least squares, without and with a prefill step's own host time; keeps the better.

    Under ``max(GPU, host)`` the floor has no gradient where no prompt is host-bound, so the second fit
    starts it at the shortest prompts' median TTFT, host-bound. It is bounded below by the decode step's
    overhead: a prefill step launches the same layers and samples too, so its host work is not less (left
    free, it would take a share of the short tier hits' time that the load latency explains). It stands
    only when it changes some prediction and lowers the RMS error by :data:`PREFILL_FLOOR_MARGIN`.
    Returns what determined it (the requests its floor holds up), or "" when it was not kept
    (``params.prefill_host_s`` None).
    """
    params.prefill_host_s = None
    if not samples:
        solve(frees, params, residuals)
        return ""
    shortest = min(s.prompt_tokens for s in samples)
    floored = copy.deepcopy(params)
    floored.prefill_host_s = max(
        float(np.median([s.ttft_s for s in samples if s.prompt_tokens == shortest])), params.step_overhead_s
    )
    floor = Free(PREFILL_HOST_NAME, prefill_host, setter(PREFILL_HOST_NAME), params.step_overhead_s, 1.0)
    plain_rms = rms(solve(frees, params, residuals), len(samples))
    floored_rms = rms(solve([*frees, floor], floored, residuals), len(samples))
    without = replace(floored, prefill_host_s=None)
    moved = (
        np.abs(predict_ttft(deployment, floored, chunk, samples) - predict_ttft(deployment, without, chunk, samples))
        > 1e-6
    )
    if not moved.any() or floored_rms > plain_rms - PREFILL_FLOOR_MARGIN:
        return ""
    for name, value in vars(floored).items():
        setattr(params, name, value)
    return _span([s for s, m in zip(samples, moved, strict=True) if m])


def _kv_spread(deployment: Deployment, groups: Sequence[DecodeSample]) -> bool:
    """Whether the KV the groups' steps read varies by ``KV_SPREAD`` of the weights' bytes (HBM rate determined)."""
    kv_read = [g.context_tokens * g.batch * deployment.kv_bytes_per_token_per_gpu for g in groups]
    return max(kv_read) - min(kv_read) >= KV_SPREAD * deployment.streamed_weight_bytes_per_gpu


def _spread(values: Sequence[float]) -> bool:
    positive = [v for v in values if v > 0]
    return bool(positive) and max(positive) >= SPREAD * min(positive)


def _memory_binds(deployment: Deployment, params: Params, groups: Sequence[DecodeSample]) -> bool:
    """Whether any group's decode step is as long as its GPU part (weights and KV reads), so that the HBM
    rate shows in it; an eager-mode step's host work often outlasts it."""
    for g in groups:
        work = StepWork()
        for _ in range(max(1, round(g.batch))):
            work.add_decode(g.context_tokens)
        cost = timing_of(deployment, params, g.backend).cost(work)
        if cost.gpu_s >= cost.overhead_s + cost.host_s:
            return True
    return False


def front_slope(samples: Sequence[FrontSample]) -> float:
    """Seconds per 1000 prompt tokens: the least-squares slope of the median front time per (run, context length,
    turn) against the median prompt length (the intercept is not the overhead's: LMCache's log times relative to
    the arm's fastest request). Never below 0."""
    cells: dict[tuple[str, int, int], list[FrontSample]] = defaultdict(list)
    for s in samples:
        cells[(s.run, s.context_tokens, s.turn)].append(s)
    x = np.array([np.median([s.prompt_tokens for s in cell]) / 1000 for cell in cells.values()])
    y = np.array([np.median([s.front_s for s in cell]) for cell in cells.values()])
    if len(x) < 2 or float(np.ptp(x)) == 0.0:
        return 0.0
    slope = float(np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2))
    return max(slope, 0.0)


def _front_source(samples: Sequence[FrontSample]) -> str:
    lengths = sorted({s.context_tokens for s in samples})
    runs = ", ".join(sorted({s.run for s in samples}))
    span = f"{lengths[0]:,}-{lengths[-1]:,} tokens ({runs})"
    if samples[0].source == ENGINE_CLOCK:
        return (
            f"slope of the client's TTFT minus the engine's queue and prefill time (the engine's histograms) vs "
            f"prompt length, {len(samples)} groups of requests, {span}"
        )
    return (
        f"slope of the time before the scheduler's LMCache lookup (LMCache's log) vs prompt length, "
        f"{len(samples)} requests, {span}"
    )


def _span(samples: Sequence[TtftSample]) -> str:
    if not samples:
        return "no requests"
    lengths = sorted({s.context_tokens for s in samples})
    return f"{len(samples)} requests, {lengths[0]:,}-{lengths[-1]:,} tokens"


# -- the fit, step by step ----------------------------------------------------------------------


@dataclass(frozen=True)
class Gathered:
    """The runs' samples, split into fitted and held out, and what the runs say about their deployment."""

    facts: list[RunFacts]
    fit: FitData
    held: FitData
    backend_facts: dict[str, ArmFacts]
    backends: list[str]
    warnings: list[str]


def read_deployment(paths: Sequence[Path], model: str | None, hardware: str | None) -> list[RunFacts]:
    """Each run's facts; an error naming both when two runs are of different deployments."""
    if not paths:
        raise CalibrationError("give at least one run directory")
    facts = [run_facts(path, model, hardware) for path in paths]
    first = facts[0]
    for other in facts[1:]:
        if not other.deployment.agrees(first.deployment):
            raise CalibrationError(
                f"{other.source.path} is {other.deployment.label} but {first.source.path} is "
                f"{first.deployment.label}: calibrate one deployment at a time"
            )
    return facts


def gather(
    paths: Sequence[Path], facts: Sequence[RunFacts], holdout: Sequence[int], holdout_loads: Sequence[float]
) -> Gathered:
    """Every run's samples (:func:`collect`), outliers left out and named (:func:`drop_outliers`)."""
    fit, held = FitData(), FitData()
    backend_facts: dict[str, ArmFacts] = {}
    for path, fact in zip(paths, facts, strict=True):
        part_fit, part_held = collect(path, fact, holdout, holdout_loads)
        fit.add(part_fit)
        held.add(part_held)
        backend_facts.update({a.backend: a for a in fact.arms.values() if a.backend is not None})
    fit.ttft, warnings = drop_outliers(fit.ttft)
    if not fit.ttft and not fit.decode:
        raise CalibrationError(
            f"{', '.join(map(str, paths))}: no measured requests to fit outside the held-out lengths {list(holdout)}"
            + (f" and loads {list(holdout_loads)}" if holdout_loads else "")
        )
    backends = sorted({s.backend for s in fit.ttft if s.backend is not None} | set(backend_facts))
    return Gathered(list(facts), fit, held, backend_facts, backends, warnings)


OUTLIER_FACTOR = 3.0
"""A request whose TTFT is more than this factor off its cell's median (or not positive) is left out of the fit."""


def drop_outliers(samples: Sequence[TtftSample]) -> tuple[list[TtftSample], list[str]]:
    """The samples without outliers, and one warning per cell that had any.

    An outlier is a TTFT that is not positive or lies more than :data:`OUTLIER_FACTOR` from its cell's median
    (arm, context, turn): a clock step or a stalled request, which a least-squares fit would follow far enough
    to move every efficiency to a bound.
    """
    kept: list[TtftSample] = []
    warnings: list[str] = []
    for (arm, context, turn), cell in sorted(cells_of(samples).items()):
        positive = [s.ttft_s for s in cell if s.ttft_s > 0]
        median = float(np.median(positive)) if positive else 0.0
        good = [s for s in cell if s.ttft_s > 0 and median / OUTLIER_FACTOR <= s.ttft_s <= median * OUTLIER_FACTOR]
        dropped = [s.ttft_s for s in cell if s not in good]
        if dropped:
            shown = ", ".join(f"{t * 1e3:.0f} ms" for t in dropped)
            warnings.append(
                f"outlier: {len(dropped)} of {len(cell)} requests of {arm} {context:,} tokens turn {turn} left out "
                f"of the fit (TTFT {shown}; the cell's median is {median * 1e3:.0f} ms)"
            )
        kept += good
    return kept, warnings


def starting_params(deployment: Deployment, backends: Sequence[str]) -> Params:
    """The datasheet's efficiencies and a backend at 25 GB/s without fixed costs: where every fit starts."""
    hw = deployment.hardware
    params = Params(linear=hw.mfu, attention=hw.mfu, hbm=hw.hbm_efficiency)
    for b in backends:
        params.load_s_per_gb[b] = 1 / 25.0
        params.load_latency_s[b] = 0.0
        params.store_s_per_gb[b] = 0.0
        params.store_latency_s[b] = 0.0
        params.busy_intake_s[b] = 0.0
        params.step_extra_s[b] = 0.0
    return params


def fit_front_growth(samples: Sequence[FrontSample], params: Params) -> list[FrontSample]:
    """Step 0: the request overhead's growth with the prompt, where the engine's clock or LMCache's log times the
    requests' way in; fixed here, so the TTFT fit leaves it out of the GEMM rate and the load rates. Returns the
    samples it was fitted from (none: not determined)."""
    fronts = front_samples(samples)
    if not _spread([float(s.context_tokens) for s in fronts]):
        return []
    params.overhead_s_per_ktoken = front_slope(fronts)
    return fronts


@dataclass
class DecodeFit:
    """Step 1: the decode step's parameters, in stages.

    The GPU's HBM rate from the probe runs' batch-1 steps (their contexts span 1k-128k), then the host's
    step overhead and per-sequence cost from the sweeps' load points, where capacity is decided (a probe's
    steps ran on an otherwise idle engine: on the 1x H100, 14.6 ms mean at batch 1 against 17-23 ms at
    batch 2.5-9 in the sweep). A backend's ``step_extra_s`` is fitted against the arm without a tier.
    """

    deployment: Deployment
    probe_groups: list[DecodeSample]
    sweep_groups: list[DecodeSample]
    stages: list[tuple[list[DecodeSample], list[Free]]]

    @classmethod
    def plan(cls, deployment: Deployment, samples: Sequence[DecodeSample], backends: Sequence[str]) -> DecodeFit:
        probe = decode_groups([s for s in samples if s.load is None])
        sweep = decode_groups([s for s in samples if s.load is not None])
        overhead = free_param("step_overhead_s", 0.0, 0.5)
        hbm = free_param("hbm", 0.05, 1.0)
        per_seq = free_param("step_s_per_seq", 0.0, 0.05)
        extras = [
            Free(f"step_extra_s[{b}]", *keyed("step_extra_s", b), 0.0, 0.5)
            for b in backends
            if any(g.backend is None for g in probe) and any(g.backend == b for g in probe)
        ]
        stages: list[tuple[list[DecodeSample], list[Free]]] = []
        if probe:
            stages.append((probe, [overhead, *([hbm] if _kv_spread(deployment, probe) else []), *extras]))
        if sweep:
            batches = [g.batch for g in sweep]
            frees = [overhead]
            if max(batches) >= BATCH_SPREAD * min(batches):
                frees.append(per_seq)
            if not probe and _kv_spread(deployment, sweep):
                frees.append(hbm)
            stages.append((sweep, frees))
        return cls(deployment, probe, sweep, stages)

    @property
    def free_names(self) -> set[str]:
        return {f.name for _, stage in self.stages for f in stage}

    def run(self, params: Params, first: bool) -> None:
        """Fit every stage with squared residuals (a group's mean step already pools its requests, and slow
        stretches are real steps). ``first``: choose between the host-bound and memory-bound starts."""
        for groups, stage in self.stages:
            measured = np.array([g.step_s for g in groups])

            def residuals(
                p: Params, groups: list[DecodeSample] = groups, measured: np.ndarray = measured
            ) -> np.ndarray:
                return np.asarray(predict_decode(self.deployment, p, groups) / measured - 1.0, dtype=float)

            if first and any(f.name == "step_overhead_s" for f in stage):
                self._best_start(params, groups, stage, residuals)
            else:
                solve(stage, params, residuals, robust=False)

    def _best_start(
        self, params: Params, groups: list[DecodeSample], stage: list[Free], residuals: Callable[[Params], np.ndarray]
    ) -> None:
        """A step is max(GPU, host): a parameter of the side that does not bind has no gradient, so start
        host-bound (from the datasheet's 1 ms the memory time binds every step and the fit would explain
        eager-mode steps by a slow HBM) and, where the HBM rate is free, also with the group that reads the most
        memory-bound; keep the memory-bound reading only when it fits clearly better (by
        :data:`MEMORY_BOUND_MARGIN`: where both fit to rounding the HBM rate is not identified)."""
        params.step_overhead_s = float(min(g.step_s for g in groups))
        starts = [copy.deepcopy(params)]
        hbm = next((f for f in stage if f.name == "hbm"), None)
        if hbm is not None:
            heaviest = max(groups, key=lambda g: g.batch * g.context_tokens)
            dep = self.deployment
            reads = dep.streamed_weight_bytes_per_gpu + (
                heaviest.batch * heaviest.context_tokens * dep.kv_bytes_per_token_per_gpu
            )
            bound = copy.deepcopy(params)
            bound.hbm = min(max(reads / (dep.hardware.hbm_bytes_per_s * heaviest.step_s), hbm.low), hbm.high)
            starts.append(bound)
        fits = [(rms(solve(stage, start, residuals, robust=False), len(groups)), start) for start in starts]
        best = fits[0][1]
        for error, start in fits[1:]:
            if error < fits[0][0] - MEMORY_BOUND_MARGIN:
                best = start
        for name, value in vars(best).items():
            setattr(params, name, value)


@dataclass(frozen=True)
class TtftFit:
    """Step 2's outcome: the free parameters' names, and the requests a prefill step's own host time holds up
    ("" when it was not kept)."""

    free_names: set[str]
    prefill_floor: str


def ttft_frees(samples: Sequence[TtftSample], backends: Sequence[str], front_fitted: bool) -> list[Free]:
    """The TTFT parameters these requests determine; each needs its own spread of the data (module docstring)."""
    frees: list[Free] = []
    if not samples:
        return frees
    frees.append(free_param("overhead_s", 0.0, 2.0))
    # intercept and slope need whole prompts computed at lengths SPREAD apart: over one length they are one number
    computed = [float(s.prompt_tokens) for s in samples if s.loaded_tokens == 0 and 2 * s.hbm_tokens < s.prompt_tokens]
    if _spread(computed):
        frees.append(free_param("linear", 0.02, 1.0))
    if any(s.hbm_tokens >= s.prompt_tokens // 2 for s in samples) and not front_fitted:
        frees.append(free_param("overhead_s_per_ktoken", 0.0, 1.0))
    if any(s.prompt_tokens >= ATTENTION_MIN_TOKENS for s in samples) and _spread(computed):
        frees.append(free_param("attention", 0.02, 1.0))
    no_tier = any(s.backend is None for s in samples)
    for b in backends:
        loads = [float(s.loaded_tokens) for s in samples if s.backend == b and s.loaded_tokens > 0]
        if loads:
            frees.append(Free(f"load_s_per_gb[{b}]", *keyed("load_s_per_gb", b), 1e-3, 10.0))
        if _spread(loads):
            frees.append(Free(f"load_latency_s[{b}]", *keyed("load_latency_s", b), 0.0, 2.0))
        if no_tier and any(s.backend == b for s in samples):
            frees.append(Free(f"store_s_per_gb[{b}]", *keyed("store_s_per_gb", b), 0.0, 10.0))
            if _spread([float(s.prompt_tokens) for s in samples if s.backend == b and s.loaded_tokens == 0]):
                frees.append(Free(f"store_latency_s[{b}]", *keyed("store_latency_s", b), 0.0, 2.0))
    return frees


def fit_ttft(
    deployment: Deployment,
    params: Params,
    chunk: int,
    samples: Sequence[TtftSample],
    backends: Sequence[str],
    front_fitted: bool,
) -> TtftFit:
    """Step 2: unloaded TTFT of the probe runs' requests (relative residuals, ``soft_l1``)."""
    frees = ttft_frees(samples, backends, front_fitted)
    measured = np.array([s.ttft_s for s in samples])

    def residuals(p: Params) -> np.ndarray:
        return np.asarray(predict_ttft(deployment, p, chunk, samples) / measured - 1.0, dtype=float)

    floor = _fit_ttft(deployment, params, chunk, samples, frees, residuals)
    return TtftFit({f.name for f in frees} | ({PREFILL_HOST_NAME} if floor else set()), floor)


def fit_blocking(
    deployment: Deployment, params: Params, windows: Sequence[StepsWindow], backends: Sequence[str]
) -> tuple[DecodeWindows, set[str]]:
    """Step 3: the engine-blocking share of the request overhead and each backend's ``busy_intake_s``, from
    sweep requests' whole decode windows, the other parameters fixed."""
    fitted = decode_windows(deployment, params, windows)
    frees: list[Free] = []
    if fitted.requests and float(fitted.intake_s.sum()) > 0:
        frees.append(free_param("blocking_share", 0.0, 1.0))
    for b in backends:
        if float(fitted.arrivals[[x == b for x in fitted.backends]].sum()) > 0:
            frees.append(Free(f"busy_intake_s[{b}]", *keyed("busy_intake_s", b), 0.0, 0.5))

    def residuals(p: Params) -> np.ndarray:
        return np.asarray(fitted.predicted_s(p) / fitted.measured_s - 1.0, dtype=float)

    solve(frees, params, residuals)
    return fitted, {f.name for f in frees}


def fit_decode_read(deployment: Deployment, params: Params, groups: Sequence[DecodeSample]) -> set[str]:
    """Step 4: ``decode_s_per_ktoken`` alone on the load runs' decode steps (``{DECODE_READ_NAME}``, or none where
    the KV those steps read, batch x context, differs by less than :data:`BATCH_SPREAD`).

    Decode attention reads every running sequence's context in every step. Eager mode's host work hides it on an
    idle engine (a probe's batch-1 steps take the same 12-20 ms from 1k to 128k tokens on one H200), not under load:
    fitted on the 8B H200 eager agentic run (30k-token contexts), it put the held-out decode-tax sweep's steps
    (10k-token contexts, batch 5-9) at -11 % mean, where a cost per sequence fitted on the same run put them at
    +31 % (lab/simulator-log.md)."""
    reads = [g.batch * g.context_tokens for g in groups]
    if not reads or max(reads) < BATCH_SPREAD * min(reads):
        return set()
    measured = np.array([g.step_s for g in groups])

    def residuals(p: Params) -> np.ndarray:
        return np.asarray(predict_decode(deployment, p, groups) / measured - 1.0, dtype=float)

    solve([free_param(DECODE_READ_NAME, 0.0, 0.01)], params, residuals, robust=False)
    return {DECODE_READ_NAME}


def settle_hbm(deployment: Deployment, params: Params, decode: DecodeFit, free_names: set[str]) -> str:
    """Where no decode step is memory-bound the HBM rate changed no prediction: back to the datasheet's, and
    the reason it was not fitted."""
    if "hbm" in free_names and not _memory_binds(deployment, params, [*decode.probe_groups, *decode.sweep_groups]):
        params.hbm = deployment.hardware.hbm_efficiency
        free_names.discard("hbm")
        return "every decode step is host-bound (its host work outlasts its weight and KV reads): datasheet"
    return f"KV read per step varies by less than {KV_SPREAD:g}x the weights: datasheet"


BOUND_SHARE = 1e-4
"""A fitted value within this share of a (non-zero) bound is reported as stuck there; 0 is a physical value
(no cost), not a bound the data pushed the fit against."""


def bound_warnings(params: Params, free_names: set[str], frees: Sequence[Free]) -> list[str]:
    """A fitted parameter that ended on its bound is not determined by the runs: one warning each."""
    out: list[str] = []
    for f in frees:
        if f.name not in free_names:
            continue
        value = f.get(params)
        for bound in (f.low, f.high):
            if bound != 0.0 and abs(value - bound) <= BOUND_SHARE * abs(bound):
                out.append(
                    f"not identified: {f.name} = {value:.6g} ended on its bound {bound:g}; the runs do not "
                    "determine it (too few lengths, or outliers)"
                )
    return out


def calibrate(
    paths: Sequence[Path],
    holdout: Sequence[int] = (),
    model: str | None = None,
    hardware: str | None = None,
    holdout_loads: Sequence[float] = (),
    decode_read: bool = False,
) -> Calibration:
    """Fit a calibration from run directories (all of one deployment); ``holdout`` lengths (probe runs) and
    ``holdout_loads`` (sweep load points) are not fitted. Steps 1 and 2 alternate (the prefill efficiencies
    enter large-batch decode steps, the step overhead enters prefill steps), then 3; with ``decode_read`` steps 0-3
    fit the probe runs alone and step 4 the decode KV read on the load runs (:func:`fit_decode_read`)."""
    facts = read_deployment(paths, model, hardware)
    deployment = facts[0].deployment.resolve()
    chunk = facts[0].max_batch_tokens
    every = gather(paths, facts, holdout, holdout_loads)
    loaded = [s for s in every.fit.decode if s.load is not None]
    data = every
    if decode_read:  # the load runs teach the read alone; every other term is the probe runs'
        data = replace(
            every, fit=replace(every.fit, decode=[s for s in every.fit.decode if s.load is None], windows=[])
        )
    params = starting_params(deployment, data.backends)

    fronts = fit_front_growth(data.fit.front, params)
    decode = DecodeFit.plan(deployment, data.fit.decode, data.backends)
    decode.run(params, first=True)
    ttft = fit_ttft(deployment, params, chunk, data.fit.ttft, data.backends, bool(fronts))
    decode.run(params, first=False)
    windows, blocking_names = fit_blocking(deployment, params, data.fit.windows, data.backends)
    read_names = fit_decode_read(deployment, params, decode_groups(loaded)) if decode_read else set()

    free_names = ttft.free_names | decode.free_names | blocking_names | read_names
    free_names |= {"overhead_s_per_ktoken"} if fronts else set()
    hbm_why = settle_hbm(deployment, params, decode, free_names)
    all_frees = [
        *ttft_frees(data.fit.ttft, data.backends, bool(fronts)),
        *(f for _, stage in decode.stages for f in stage),
    ]
    warnings = [*data.warnings, *bound_warnings(params, free_names, all_frees)]
    why = Why(data, ttft.prefill_floor, fronts, windows, hbm_why)
    read_span = f"{_decode_span(loaded)} ({why.runs}); every other term the probe runs'" if decode_read else None
    calibration = assemble(data, params, free_names, why, chunk, holdout, holdout_loads, warnings, read_span)
    return calibration.model_copy(
        update={
            "residuals": residuals(calibration, deployment, every.fit.ttft, every.held.ttft),
            "decode_residuals": decode_fit_residuals(calibration, deployment, every.fit.decode, every.held.decode),
            "tpot_residuals": window_fit_residuals(calibration, deployment, every.fit.windows, every.held.windows),
        }
    )


# -- writing the calibration: each parameter with what determined it, or why it kept its default ----------------


@dataclass(frozen=True)
class Why:
    """What the steps used, for the parameters' ``source`` texts."""

    data: Gathered
    prefill_floor: str
    fronts: list[FrontSample]
    windows: DecodeWindows
    hbm_why: str

    @property
    def runs(self) -> str:
        return ", ".join(f.source.run_id for f in self.data.facts)

    @property
    def probe_runs(self) -> str:
        return ", ".join(f.source.run_id for f in self.data.facts if f.kind == "probe") or "no probe run"


def _param_maker(free_names: set[str]) -> Callable[[str, float, str, str, str], FitParam]:
    def param(name: str, value: float, unit: str, source: str, default_why: str) -> FitParam:
        fitted = name in free_names
        return FitParam(value=value, unit=unit, fitted=fitted, source=source if fitted else default_why)

    return param


def backend_params(b: str, params: Params, free_names: set[str], why: Why) -> BackendCalibration:
    """One offload backend's entry."""
    param = _param_maker(free_names)
    samples = why.data.fit.ttft
    mine = [s for s in samples if s.backend == b]
    hits = [s for s in mine if s.loaded_tokens > 0]
    no_tier = _span([s for s in samples if s.backend is None])
    arm = why.data.backend_facts.get(b)
    sweep_requests = sum(x == b for x in why.windows.backends)
    return BackendCalibration(
        version=arm.version if arm else None,
        tier=arm.tier if arm and arm.tier else "cpu",
        load_gbps=param(
            f"load_s_per_gb[{b}]",
            1.0 / params.load_s_per_gb[b],
            "GB/s",
            f"tier hits of {_span(hits)} ({why.probe_runs})",
            "no tier hits in the fitted requests: default",
        ),
        load_latency_s=param(
            f"load_latency_s[{b}]",
            params.load_latency_s[b],
            "s",
            f"intercept of load time vs loaded bytes, {_span(hits)}",
            "loads of one size only: the latency is folded into the load rate",
        ),
        store_s_per_gb=param(
            f"store_s_per_gb[{b}]",
            params.store_s_per_gb[b],
            "s/GB",
            f"turn-1 TTFT of {_span(mine)} against {no_tier} without a tier",
            "no arm without a tier: the store cost is folded into the prefill efficiencies",
        ),
        store_latency_s=param(
            f"store_latency_s[{b}]",
            params.store_latency_s[b],
            "s",
            f"intercept of the arm's extra TTFT vs prompt length, {_span(mine)} against {no_tier} without a tier",
            f"no arm without a tier, or computed prompts differ by less than {SPREAD:g}x: in the request overhead",
        ),
        step_extra_s=param(
            f"step_extra_s[{b}]",
            params.step_extra_s[b],
            "s per engine step",
            f"decode steps of the arm with this backend against the arm without a tier ({why.probe_runs})",
            "no probe run with this backend's arm and an arm without a tier: 0",
        ),
        busy_intake_s=param(
            f"busy_intake_s[{b}]",
            params.busy_intake_s[b],
            "s per request arriving at a busy engine",
            f"decode windows of {sweep_requests} sweep requests of the arm with this backend ({why.runs})",
            "no sweep of an arm with this backend whose engine steps can be reconstructed: 0",
        ),
    )


def assemble(
    data: Gathered,
    params: Params,
    free_names: set[str],
    why: Why,
    chunk: int,
    holdout: Sequence[int],
    holdout_loads: Sequence[float],
    warnings: list[str],
    read_span: str | None,
) -> Calibration:
    """The calibration file's content; its residuals are empty until the caller adds them. ``read_span``: what
    the decode KV read was fitted on (None: not asked for)."""
    param = _param_maker(free_names)
    samples = data.fit.ttft
    decode_span = f"{_decode_span(data.fit.decode)} ({why.runs})"
    growth = _front_source(why.fronts) if why.fronts else "requests served from the HBM prefix cache"
    return Calibration(
        deployment=data.facts[0].deployment,
        sources=[f.source for f in data.facts],
        fit_context_tokens=sorted({s.context_tokens for s in samples}),
        holdout_context_tokens=sorted(set(holdout)),
        holdout_loads=sorted({float(x) for x in holdout_loads}),
        max_batch_tokens=chunk,
        request_overhead_s=param(
            "overhead_s",
            params.overhead_s,
            "s",
            f"intercept of TTFT vs prompt length, {_span(samples)} ({why.probe_runs})",
            "no probe requests",
        ),
        request_overhead_s_per_ktoken=param(
            "overhead_s_per_ktoken",
            params.overhead_s_per_ktoken,
            "s per 1000 prompt tokens",
            growth,
            "no requests served from the HBM prefix cache: the growth is in the linear efficiency and load rates",
        ),
        linear_efficiency=param(
            "linear",
            params.linear,
            "fraction of dense peak",
            f"slope of TTFT vs prompt length, {_span(samples)}",
            f"computed prompts differ by less than {SPREAD:g}x (or no probe requests): datasheet",
        ),
        attention_efficiency=param(
            "attention",
            params.attention,
            "fraction of BF16 dense peak",
            f"curvature of TTFT vs prompt length, {_span(samples)}",
            f"no prompts of {ATTENTION_MIN_TOKENS:,}+ tokens among lengths {SPREAD:g}x apart: datasheet",
        ),
        step_overhead_s=param(
            "step_overhead_s", params.step_overhead_s, "s", decode_span, "no output of 2+ tokens: default"
        ),
        step_s_per_seq=param(
            "step_s_per_seq",
            params.step_s_per_seq,
            "s per sequence in the step",
            decode_span,
            f"the load runs fit the decode KV read ({DECODE_READ_NAME}) instead: 0"
            if read_span is not None
            else f"decode batches differ by less than {BATCH_SPREAD:g}x (no sweep): in the step overhead",
        ),
        decode_s_per_ktoken=param(
            DECODE_READ_NAME,
            params.decode_s_per_ktoken,
            "s per 1000 KV tokens the step's decode tokens attend to",
            read_span or "",
            f"the KV that load points' decode steps read differs by less than {BATCH_SPREAD:g}x (no sweep): 0"
            if read_span is not None
            else "not asked for (kvbench sim calibrate --decode-read): the decode step's load term is step_s_per_seq",
        ),
        hbm_efficiency=param("hbm", params.hbm, "fraction of HBM bandwidth", decode_span, why.hbm_why),
        prefill_host_s=param(
            PREFILL_HOST_NAME,
            prefill_host(params),
            "s per prefill step",
            f"the floor of TTFT vs prompt length, {why.prefill_floor}",
            "no fitted request's prefill step is host-bound, or one more parameter fits them no better than "
            f"{PREFILL_FLOOR_MARGIN:.1%}: the step overhead",
        ),
        engine_blocking_share=param(
            "blocking_share",
            params.blocking_share,
            "fraction of the request overhead",
            f"decode windows of {len(why.windows.requests)} sweep requests (every step, arrivals' overheads "
            f"charged) ({why.runs})",
            "no sweep whose engine steps can be reconstructed: the overhead blocks nobody",
        ),
        backends={b: backend_params(b, params, free_names, why) for b in data.backends},
        warnings=warnings,
        residuals=[],
        decode_residuals=[],
        tpot_residuals=[],
        power=None,  # fitted apart, from NVML energy windows: kvbench sim calibrate-power
    )


def window_fit_residuals(
    calibration: Calibration, deployment: Deployment, fitted: Sequence[StepsWindow], held: Sequence[StepsWindow]
) -> list[DecodeResidual]:
    """Per (run, arm, load point): median over its requests of the mean step of their whole decode windows,
    measured vs predicted (every step's modelled time plus the intake charged to it), fitted and held out."""
    params = params_of(calibration)
    out: list[DecodeResidual] = []
    for used, windows in ((True, fitted), (False, held)):
        for w in sorted(windows, key=lambda w: (w.run, w.arm, w.load or 0.0)):
            got = decode_windows(deployment, params, [w])
            if not got.requests:
                continue
            predicted = got.predicted_s(params)
            steps = w.steps(params.overhead_s, params.overhead_s_per_ktoken)
            batch = [
                float(np.mean([len(steps.decodes[k]) for k in range(steps.first[i] + 1, steps.last[i] + 1)]))
                for _, i in got.requests
            ]
            contexts = [steps.records[i].prompt_tokens or 0 for _, i in got.requests]
            out.append(
                DecodeResidual(
                    run=w.run,
                    arm=w.arm,
                    load=w.load,
                    requests=len(got.requests),
                    batch=float(np.mean(batch)),
                    context_tokens=round(float(np.mean(contexts))),
                    measured_ms=float(np.median(got.measured_s / got.steps)) * 1e3,
                    predicted_ms=float(np.median(predicted / got.steps)) * 1e3,
                    used_in_fit=used,
                )
            )
    return out


def _decode_span(samples: Sequence[DecodeSample]) -> str:
    if not samples:
        return "no decode samples"
    batches = [s.batch for s in samples]
    contexts = [s.context_tokens for s in samples]
    return (
        f"decode steps of {len(samples)} requests (inter-token gaps while no other request prefilled), "
        f"batch {min(batches):.1f}-{max(batches):.1f}, context {min(contexts):,}-{max(contexts):,} tokens"
    )


def decode_fit_residuals(
    calibration: Calibration, deployment: Deployment, fitted: Sequence[DecodeSample], held: Sequence[DecodeSample]
) -> list[DecodeResidual]:
    """Mean decode step per (run, arm, load point or probe length), measured vs predicted, fitted and held out."""
    params = params_of(calibration)
    out: list[DecodeResidual] = []
    for used, samples in ((True, fitted), (False, held)):
        groups = decode_groups(samples)
        for group, predicted in zip(groups, predict_decode(deployment, params, groups), strict=True):
            out.append(
                DecodeResidual(
                    run=group.run,
                    arm=group.arm,
                    load=group.load,
                    requests=group.requests,
                    batch=group.batch,
                    context_tokens=group.context_tokens,
                    measured_ms=group.step_s * 1e3,
                    predicted_ms=float(predicted) * 1e3,
                    used_in_fit=used,
                )
            )
    return out


def residuals(
    calibration: Calibration, deployment: Deployment, fitted: Sequence[TtftSample], held: Sequence[TtftSample]
) -> list[Residual]:
    """Median predicted vs measured TTFT per (arm, context, turn), for fitted and held-out requests."""
    params = params_of(calibration)
    out: list[Residual] = []
    for used, samples in ((True, fitted), (False, held)):
        for (arm, context, turn), cell in sorted(cells_of(samples).items()):
            predicted = predict_ttft(deployment, params, calibration.max_batch_tokens, cell)
            out.append(
                Residual(
                    arm=arm,
                    backend=cell[0].backend or "none",
                    context_tokens=context,
                    turn=turn,
                    requests=len(cell),
                    measured_ms=float(np.median([s.ttft_s for s in cell])) * 1e3,
                    predicted_ms=float(np.median(predicted)) * 1e3,
                    used_in_fit=used,
                )
            )
    return out
