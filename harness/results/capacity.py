"""Capacity at the SLO, GPUs saved and their cost, and the analytical prefill model beside the sweep.

Capacity of an arm
    ``max_rps_per_gpu_at_slo`` = the highest RPS/GPU over the arm's load points that meet the SLO
    (a measured point, never an interpolation, so it is a lower bound of the true capacity). Where the next
    load point fails the SLO, ``between`` reads the boundary between the two by interpolating the SLO
    attainment (:class:`~.sweep_result.GridCrossing`), marked as an estimate; two loads more than
    :data:`COARSE_GRID` apart make the grid too coarse to place the capacity, and reports say so.

GPUs for a target load
    A deployment (one replica) has ``g = TP × PP × DP`` GPUs and serves ``c·g`` requests/s at
    ``c`` RPS/GPU, so a target of ``L`` requests/s needs ``D = ⌈L / (c·g)⌉`` deployments, i.e.
    ``D·g`` GPUs; cost per year = GPUs × $/GPU-hour × hours per year. GPUs saved = baseline GPUs −
    arm GPUs.

The analytical model (:mod:`offload.analytical`) is evaluated per treatment arm (an arm
with an offload tier) at the lowest load, where prefill runs nearly alone, as the model assumes:
``N`` = mean later-round prompt tokens, ``a`` = their cached share, ``T`` from the model and
hardware profiles (simulator) or from the baseline's round-1 TTFT / N, ``R`` and ``W`` from the
arm's first tier (its bandwidths: a profile's figures or a tier probe's pasted into it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from harness.scenario.spec import Arm, CostSpec, EngineConfig
from harness.sim.config import SimEngineConfig
from offload import analytical
from offload.profiles import OffloadProfile

from .modelshape import hf_config
from .sweep_result import (
    AnalyticalComparison,
    AnalyticalInputs,
    ArmCapacity,
    GpuSavings,
    GridCrossing,
    PointResult,
)


def gpus_needed(target_rps: float, rps_per_gpu: float, gpus_per_deployment: int) -> tuple[int, int]:
    """(deployments, GPUs) to serve ``target_rps`` at ``rps_per_gpu``: ``D = ⌈L / (c·g)⌉``, GPUs = D·g."""
    if target_rps <= 0 or rps_per_gpu <= 0 or gpus_per_deployment < 1:
        raise ValueError("target_rps and rps_per_gpu must be > 0 and gpus_per_deployment >= 1")
    # a hair of tolerance so that 10.000000001 deployments' worth of float error is still 10
    deployments = max(1, math.ceil(target_rps / (rps_per_gpu * gpus_per_deployment) - 1e-9))
    return deployments, deployments * gpus_per_deployment


def usd_per_year(gpus: int, cost: CostSpec) -> float:
    """GPUs × $/GPU-hour × hours per year."""
    return gpus * cost.usd_per_gpu_hour * cost.hours_per_year


COARSE_GRID = 1.5
"""Two neighbouring load points further apart than this (ratio of loads) leave the capacity unplaced."""


def grid_crossing(mine: list[PointResult], best: PointResult, need: float) -> GridCrossing | None:
    """The SLO boundary between ``best`` (the best passing point) and the next higher load that fails."""
    above = sorted((p for p in mine if p.load > best.load), key=lambda p: p.load)
    # the next point that did not pass; an unjudged one (too few requests) leaves the crossing unplaced
    failing = next((p for p in above if p.meets_slo is not True), None)
    if failing is None or failing.meets_slo is None:
        return None
    if best.slo_attainment is None or failing.slo_attainment is None:
        return None
    drop = best.slo_attainment - failing.slo_attainment
    share = min(max((best.slo_attainment - need) / drop, 0.0), 1.0) if drop > 0 else 0.0
    return GridCrossing(
        load_pass=best.load,
        load_fail=failing.load,
        rps_per_gpu_pass=best.rps_per_gpu,
        rps_per_gpu_fail=failing.rps_per_gpu,
        interpolated_rps_per_gpu=best.rps_per_gpu + share * (failing.rps_per_gpu - best.rps_per_gpu),
        coarse=failing.load > COARSE_GRID * best.load,
    )


def arm_capacity(
    arm: str, points: list[PointResult], cost: CostSpec | None, gpus_per_deployment: int, slo_percentile: float
) -> ArmCapacity:
    mine = [p for p in points if p.arm == arm]
    passing = [p for p in mine if p.meets_slo]
    best = max(passing, key=lambda p: p.rps_per_gpu, default=None)
    capacity = best.rps_per_gpu if best is not None and best.rps_per_gpu > 0 else None
    deployments = gpus = None
    cost_year = None
    if capacity is not None and cost is not None:
        deployments, gpus = gpus_needed(cost.target_rps, capacity, gpus_per_deployment)
        cost_year = usd_per_year(gpus, cost)
    return ArmCapacity(
        arm=arm,
        max_rps_per_gpu_at_slo=capacity,
        at_load=best.load if best is not None else None,
        tps_user_at_max=best.tps_user_mean if best is not None else None,
        max_rps_per_gpu=max((p.rps_per_gpu for p in mine), default=None),
        gpus_needed=gpus,
        deployments_needed=deployments,
        usd_per_year=cost_year,
        between=grid_crossing(mine, best, slo_percentile / 100.0) if best is not None else None,
    )


def savings(capacities: list[ArmCapacity], baseline: str, cost: CostSpec | None) -> list[GpuSavings]:
    """Each non-baseline arm against the baseline at ``cost.target_rps`` (empty without a cost section)."""
    if cost is None:
        return []
    by_arm = {c.arm: c for c in capacities}
    base = by_arm.get(baseline)
    out = []
    for capacity in capacities:
        if capacity.arm == baseline or base is None:
            continue
        saved = None
        dollars = None
        if base.gpus_needed is not None and capacity.gpus_needed is not None:
            saved = base.gpus_needed - capacity.gpus_needed
            dollars = usd_per_year(saved, cost)
        ratio = None
        if base.max_rps_per_gpu_at_slo and capacity.max_rps_per_gpu_at_slo is not None:
            ratio = capacity.max_rps_per_gpu_at_slo / base.max_rps_per_gpu_at_slo
        out.append(
            GpuSavings(
                arm=capacity.arm,
                baseline=baseline,
                target_rps=cost.target_rps,
                usd_per_gpu_hour=cost.usd_per_gpu_hour,
                gpus_baseline=base.gpus_needed,
                gpus_arm=capacity.gpus_needed,
                gpus_saved=saved,
                usd_per_year_saved=dollars,
                capacity_ratio=ratio,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# Model and hardware shapes for the analytical model
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shapes:
    """What the engine section tells about the model and the GPU (either may be unknown)."""

    model: analytical.ModelShape | None
    hardware: analytical.Hardware | None
    tp: int
    notes: tuple[str, ...] = ()


def engine_shapes(engine: EngineConfig) -> Shapes:
    """Model and hardware of a scenario's engine: simulator profiles, or a vLLM model directory."""
    if isinstance(engine, SimEngineConfig):
        return _sim_shapes(engine)
    # every other kind names a model directory (or synth:SHAPE); an 'openai' endpoint's model is a
    # served name, whose config.json is not here
    return _model_dir_shapes(engine)


def _sim_shapes(engine: SimEngineConfig) -> Shapes:
    from offload.shapes import Deployment

    tp = engine.parallelism.tp
    try:
        deployment = Deployment.resolve(engine.model, engine.hardware, tp, engine.dtype, engine.kv_dtype)
    except ValueError as error:
        return Shapes(None, None, tp, (f"simulator profiles: {error}",))
    m = deployment.model
    hw = deployment.hardware
    model = analytical.ModelShape(
        name=m.name,
        param_count=m.body_params,
        layers=m.layers,
        hidden=m.hidden_size,
        kv_heads=m.kv_heads,
        head_dim=m.head_dim,
        dtype_bytes=deployment.kv_dtype_bytes,  # the analytical model's dtype is the KV cache's
        attention_dim=m.heads * m.head_dim,
    )
    hardware = analytical.Hardware(
        name=hw.name,
        peak_flops=hw.peak_flops(deployment.dtype),
        mfu=hw.mfu,
        hbm_gbps=hw.hbm_bytes_per_s / 1e9,
        tp=tp,
    )
    return Shapes(model, hardware, tp)


_TORCH_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def _model_dir_shapes(engine: EngineConfig) -> Shapes:
    """A real engine's model shape from its model directory's config.json (synth: shapes included)."""
    tp = engine.parallelism.tp
    config, where = hf_config(engine.model)
    if config is None:
        return Shapes(None, None, tp, (f"model shape unknown: {where}",))
    try:
        layers = _positive_int(config, "num_hidden_layers")
        hidden = _positive_int(config, "hidden_size")
        heads = _positive_int(config, "num_attention_heads")
        kv_heads = _positive_int(config, "num_key_value_heads", heads)
        head_dim = _positive_int(config, "head_dim", hidden // heads)
        intermediate = _positive_int(config, "intermediate_size")
    except (KeyError, TypeError, ValueError) as error:
        return Shapes(None, None, tp, (f"{where}: missing architecture field {error}",))
    configured = getattr(engine, "dtype", None)  # engine kinds that take --dtype
    dtype = configured if configured not in (None, "auto") else str(config.get("torch_dtype", "bfloat16"))
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    model = analytical.ModelShape(
        name=str(config.get("_name_or_path") or Path(engine.model).name),
        param_count=float(layers * (attention + 3 * hidden * intermediate)),
        layers=layers,
        hidden=hidden,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype_bytes=_TORCH_DTYPE_BYTES.get(str(dtype), 2),
        attention_dim=heads * head_dim,
    )
    note = f"{engine.kind}: no hardware profile, T is measured and the E2E bound needs an HBM bandwidth"
    return Shapes(model, None, tp, (f"model shape from {where}", note))


def _positive_int(config: dict[str, object], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        raise KeyError(key)
    if not isinstance(value, int | str | float):
        raise TypeError(f"{key}: {value!r}")
    number = int(value)
    if number <= 0:
        raise ValueError(f"{key}: {value!r}")
    return number


# ---------------------------------------------------------------------------------------------
# Predicted vs measured
# ---------------------------------------------------------------------------------------------


@dataclass
class AnalyticalReport:
    comparisons: list[AnalyticalComparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _common_loads(points: list[PointResult], arm: str, baseline: str) -> list[tuple[PointResult, PointResult]]:
    base = {p.load: p for p in points if p.arm == baseline}
    mine = {p.load: p for p in points if p.arm == arm}
    return [(base[load], mine[load]) for load in sorted(set(base) & set(mine))]


def _structural_reuse(profile: OffloadProfile, point: PointResult, question_tokens_mean: float) -> float:
    """Reuse a later round would have if everything but its new question were cached."""
    if not profile.offload_enabled and not profile.prefix_caching:
        return 0.0
    n = point.prompt_tokens_later_mean
    if not n:
        return 0.0
    return max(0.0, min(1.0, 1.0 - question_tokens_mean / n))


@dataclass(frozen=True)
class Reuse:
    """Cached share of later-round prompts, split into GPU-memory hits and offload-tier hits."""

    a: float
    a_gpu: float
    a_tier: float
    source: str


def _clamp(value: float) -> float:
    return min(max(value, 0.0), 1.0)


def measured_reuse(profile: OffloadProfile, point: PointResult, question_tokens_mean: float) -> Reuse:
    """``a`` from the engine's per-request cached_tokens (else the workload's structure); the GPU/tier
    split from the window's /metrics hit counters (else: all from the tier if the arm has one)."""
    if point.cached_share_later is not None:
        a, source = _clamp(point.cached_share_later), "usage cached_tokens / prompt_tokens of rounds ≥ 2"
    else:
        a = _structural_reuse(profile, point, question_tokens_mean)
        source = "structure: 1 − new question / prompt (the engine reports no cached_tokens)"
    if point.hit_rate and point.gpu_hit_rate is not None:
        tier_share = _clamp((point.hit_rate - point.gpu_hit_rate) / point.hit_rate)
        source += "; GPU/tier split from /metrics hit counters"
    else:
        tier_share = 1.0 if profile.offload_enabled else 0.0
        source += "; no /metrics split: " + ("all hits from the tier" if profile.offload_enabled else "all from GPU")
    a_tier = a * tier_share if profile.offload_enabled else 0.0
    return Reuse(a=a, a_gpu=a - a_tier, a_tier=a_tier, source=source)


def predicted_ttft(n: float, reuse: Reuse, t_s: float, r_s: float | None, w_s: float | None) -> float:
    """Later-round prefill time: the deck's ``TTFT_KV`` on the part of the prompt not in GPU memory.

    ``N' = (1 − a_gpu)·N``, ``a' = a_tier / (1 − a_gpu)``; with a tier ``max(a'·N'·R, (1−a')·N'·W,
    (1−a')·N'·T)`` = ``max(a_tier·N·R, m·N·W, m·N·T)``; without one ``(1 − a)·N·T``.
    """
    rest = 1.0 - reuse.a_gpu
    if rest <= 1e-12:
        return 0.0
    if r_s is None or w_s is None:
        return (1.0 - reuse.a) * n * t_s
    return analytical.ttft_kv(n * rest, _clamp(reuse.a_tier / rest), t_s, r_s, w_s)


def analytical_comparisons(
    points: list[PointResult],
    arms: list[Arm],
    baseline: str,
    shapes: Shapes,
    capacities: list[ArmCapacity],
    *,
    question_tokens_mean: float,
) -> AnalyticalReport:
    """Predicted (analytical model) vs measured later-round TTFT, speedup and regime, for each arm with
    an offload tier against the baseline, at every load both measured. The model describes prefill
    alone: it is closest at low load, where requests do not queue behind one another."""
    report = AnalyticalReport(notes=list(shapes.notes))
    by_name = {arm.name: arm for arm in arms}
    capacity = {c.arm: c.max_rps_per_gpu_at_slo for c in capacities}
    base_arm = by_name[baseline]
    if shapes.model is None:
        report.notes.append("analytical model skipped: the model shape is unknown")
        return report
    model = shapes.model
    kv = analytical.model_kv_bytes_per_token(model, shapes.tp)
    for arm in arms:
        if arm.name == baseline:
            continue
        tiers = arm.profile.tiers
        if not tiers:
            report.notes.append(f"{arm.name}: no offload tier, so the prefill model does not apply")
            continue
        pairs = _common_loads(points, arm.name, baseline)
        if not pairs:
            report.notes.append(f"{arm.name}: no load point in common with {baseline}")
            continue
        lowest_base = pairs[0][0]
        n_round1 = lowest_base.prompt_tokens_round1_mean
        t_measured = (
            lowest_base.ttft_round1.p50_ms / 1e3 / n_round1
            if lowest_base.ttft_round1 is not None and n_round1
            else None
        )
        tier = tiers[0]
        r_s = analytical.read_time_per_token(kv, tier.effective_read_gbps)
        w_s = analytical.write_time_per_token(kv, tier.effective_write_gbps)
        base_tiers = base_arm.profile.tiers
        base_r = analytical.read_time_per_token(kv, base_tiers[0].effective_read_gbps) if base_tiers else None
        base_w = analytical.write_time_per_token(kv, base_tiers[0].effective_write_gbps) if base_tiers else None
        base_capacity, arm_capacity_ = capacity.get(baseline), capacity.get(arm.name)
        ratio = arm_capacity_ / base_capacity if base_capacity and arm_capacity_ is not None else None
        for base_point, arm_point in pairs:
            n = arm_point.prompt_tokens_later_mean
            if not n:
                report.notes.append(f"{arm.name} @ {arm_point.load:g}: no later-round requests")
                continue
            if shapes.hardware is not None:
                t_s = analytical.model_time_per_token(model, shapes.hardware, round(n))
                t_source = f"model+hardware profiles ({model.name} on {shapes.hardware.name}, TP{shapes.tp})"
            elif t_measured is not None:
                t_s = t_measured
                t_source = f"measured: {baseline} round-1 TTFT p50 / prompt tokens at load {lowest_base.load:g}"
            else:
                report.notes.append(f"{arm.name}: no T (no hardware profile and no round-1 TTFT)")
                break
            reuse = measured_reuse(arm.profile, arm_point, question_tokens_mean)
            base_reuse = measured_reuse(base_arm.profile, base_point, question_tokens_mean)
            rest = max(1.0 - reuse.a_gpu, 1e-12)
            prediction = analytical.predict(
                max(1, round(n * rest)), _clamp(reuse.a_tier / rest), t_s=t_s, r_s=r_s, w_s=w_s
            )
            arm_ttft = predicted_ttft(n, reuse, t_s, r_s, w_s)
            base_ttft = predicted_ttft(n, base_reuse, t_s, base_r, base_w)
            measured_arm = arm_point.ttft_later.p50_ms if arm_point.ttft_later is not None else None
            measured_base = base_point.ttft_later.p50_ms if base_point.ttft_later is not None else None
            measured = measured_base / measured_arm if measured_arm and measured_base is not None else None
            n_out = arm_point.output_tokens_mean or 1.0
            bound = None
            if shapes.hardware is not None and shapes.hardware.hbm_gbps is not None:
                kv_one = analytical.decode_kv_bytes(kv, n, n_out)
                bound = analytical.e2e_tps_gain_bound(n * t_s, n_out, kv_one, shapes.hardware.hbm_gbps)
            tps_ratio = arm_point.output_tps / base_point.output_tps if base_point.output_tps > 0 else None
            report.comparisons.append(
                AnalyticalComparison(
                    arm=arm.name,
                    baseline=baseline,
                    load=arm_point.load,
                    inputs=AnalyticalInputs(
                        n_tokens=n,
                        n_out=n_out,
                        a=reuse.a,
                        a_gpu=reuse.a_gpu,
                        a_tier=reuse.a_tier,
                        a_source=reuse.source,
                        a_baseline=base_reuse.a,
                        a_baseline_gpu=base_reuse.a_gpu,
                        t_s=t_s,
                        t_source=t_source,
                        t_measured_s=t_measured,
                        r_s=r_s,
                        w_s=w_s,
                        tier=f"{tier.kind}: read {tier.effective_read_gbps:g} GB/s, "
                        f"write {tier.effective_write_gbps:g} GB/s",
                        kv_bytes_per_token=kv,
                        hbm_gbps=shapes.hardware.hbm_gbps if shapes.hardware is not None else None,
                    ),
                    prediction=prediction,
                    predicted_ttft_ms=arm_ttft * 1e3,
                    predicted_baseline_ttft_ms=base_ttft * 1e3,
                    predicted_speedup_vs_baseline=base_ttft / arm_ttft if arm_ttft > 0 else None,
                    measured_ttft_ms=measured_arm,
                    measured_baseline_ttft_ms=measured_base,
                    measured_speedup=measured,
                    regime=prediction.regime,
                    e2e_gain_bound=bound,
                    measured_capacity_ratio=ratio,
                    measured_output_tps_ratio=tps_ratio,
                )
            )
    return report
