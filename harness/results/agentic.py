"""An agentic sweep's result: a pure function of its stored records and point events -> ``agentic.json``.

Per (arm, agents) point the attempt that finished it is kept (:mod:`.points`, as for a sweep); the sweep's metric
formulas (:mod:`.sweep_metrics`) give its latencies, throughput and measured hit rate, and on top of them:

* **tier check**: a measured call meets tier ``t`` when ``ttft ≤ t.ttft_s`` and its output speed
  ``(tokens − 1) / (e2e − ttft) ≥ t.min_output_tokens_per_s`` (a call of one token has no speed and is judged on
  TTFT alone); a failed call meets no tier. ``attainment`` = meeting calls / measured calls; the point meets the
  tier when ``attainment ≥ percentile / 100``, judged only with at least ``⌈1 / (1 − percentile/100)⌉`` measured
  calls (:func:`~.sweep_metrics.requests_to_judge`: 10 at p90); with fewer, ``meets`` is None.
* **agents at SLO** (:func:`tier_capacity`): ``a_pass`` = the largest agents count that meets the tier; where the
  next larger count ``a_fail`` fails, the boundary is interpolated on the attainment (as the sweep's
  :class:`~.sweep_result.GridCrossing`): ``a_pass + f × (a_fail − a_pass)``, ``f = (att_pass − need) /
  (att_pass − att_fail)`` clipped to [0, 1]. Every point passing: ``a_pass`` as a lower bound (``above-grid``);
  none passing: ``none-met`` when the fewest agents failed, judged; ``inconclusive`` when the fewest agents, or the
  point above ``a_pass``, measured too few calls to judge. Per GPU:
  divided by the deployment's GPUs (``engine.fleet_gpus``, as RPS/GPU is). Ratio: arm / baseline arm, same tier.
* **$/Mtok**: ``usd_per_gpu_hour × GPUs / (tokens_per_s × 3600 / 10⁶)`` with tokens = prompt + generated tokens of
  the calls completed inside the window; a tier's $/Mtok is the one at its measured passing point.
* **ceiling**: the infinite-cache hit rate (:func:`workloads.agentic.infinite_cache_hits`) of the point's measured
  calls, every call of the point (warm-up included) replayed in the order sent; the measured ``hit_rate`` can
  only exceed it through reuse the plan does not describe (the engine caching its own answers).
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from common.errors import KvbenchError
from harness.scenario.spec import Scenario
from harness.store.events import PointDone
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from workloads.agentic import AgentSessions, infinite_cache_hits
from workloads.config import SloTier

from .agentic_result import AgenticResult, AgentPoint, TierCapacity, TierCheck
from .capacity import COARSE_GRID
from .energy import energy_sample
from .header import header_fields, with_provenance
from .points import errors_by_kind, stored_grid
from .sweep_metrics import NS_PER_S, derive_columns, point_result, requests_to_judge
from .sweep_result import SloLimits
from .validity import judge_errors, with_engines_down

CEILING_SESSIONS = 200
"""Sessions the workload's headline ceiling is computed over (sent one after another)."""


def tier_check(measured: pd.DataFrame, tier: SloTier) -> TierCheck:
    """The tier at one point, from its measured calls (a frame with derive_columns' columns)."""
    if measured.empty:
        return TierCheck(
            tier=tier.name,
            attainment=None,
            meets=None,
            ttft_s_at_percentile=None,
            output_tokens_per_s_at_percentile=None,
        )
    judged = len(measured) >= requests_to_judge(tier.percentile)
    ok = measured["ok"].astype(bool)
    ttft_s = measured["ttft_ns"].astype("float64") / NS_PER_S
    speed = measured["decode_tps"].astype("float64")
    fast_enough = speed.isna() | (speed >= tier.min_output_tokens_per_s)
    meeting = ok & (ttft_s <= tier.ttft_s) & fast_enough
    attainment = float(meeting.mean())
    q = tier.percentile / 100.0
    good_ttft = ttft_s[ok].dropna()
    good_speed = speed[ok].dropna()
    return TierCheck(
        tier=tier.name,
        attainment=attainment,
        meets=attainment >= q - 1e-12 if judged else None,
        ttft_s_at_percentile=float(good_ttft.quantile(q)) if not good_ttft.empty else None,
        output_tokens_per_s_at_percentile=float(good_speed.quantile(1.0 - q)) if not good_speed.empty else None,
    )


def tier_capacity(arm: str, tier: SloTier, points: list[AgentPoint], gpus: int) -> TierCapacity:
    """Agents at SLO of ``arm`` for ``tier`` over its points (formula in the module docstring)."""
    mine = sorted((p for p in points if p.arm == arm), key=lambda p: p.agents)
    checks = [next(t for t in p.tiers if t.tier == tier.name) for p in mine]
    passing = [i for i, check in enumerate(checks) if check.meets]

    def result(status: str, **fields: object) -> TierCapacity:
        agents = fields.get("agents_at_slo")
        per_gpu = float(agents) / gpus if isinstance(agents, int | float) else None
        values: dict[str, object] = {
            "arm": arm,
            "tier": tier.name,
            "status": status,
            "agents_at_slo": None,
            "measured_agents": None,
            "failing_agents": None,
            "agents_at_slo_per_gpu": per_gpu,
            "usd_per_mtok": None,
            "ratio_vs_baseline": None,
        }
        return TierCapacity.model_validate(values | fields)

    if not passing:
        # fewest agents failing, judged: no larger count passes either; unjudged: nothing can be said
        return result("none-met" if checks and checks[0].meets is False else "inconclusive")
    best = passing[-1]
    point, check = mine[best], checks[best]
    base = {"measured_agents": point.agents, "usd_per_mtok": point.usd_per_mtok, "energy": point.energy}
    if best == len(mine) - 1:
        return result("above-grid", agents_at_slo=float(point.agents), **base)
    above, above_check = mine[best + 1], checks[best + 1]
    if above_check.meets is None or above_check.attainment is None or check.attainment is None:
        return result("inconclusive", failing_agents=above.agents, **base)
    need = tier.percentile / 100.0
    drop = check.attainment - above_check.attainment
    share = min(max((check.attainment - need) / drop, 0.0), 1.0) if drop > 0 else 0.0
    return result(
        "met",
        agents_at_slo=point.agents + share * (above.agents - point.agents),
        failing_agents=above.agents,
        coarse=above.agents > COARSE_GRID * point.agents,
        **base,
    )


def with_ratios(capacities: list[TierCapacity], baseline: str) -> list[TierCapacity]:
    """Each capacity with its ratio to the baseline arm's for the same tier (and what bounds it)."""
    by_key = {(c.arm, c.tier): c for c in capacities}
    out = []
    for cap in capacities:
        base = by_key.get((baseline, cap.tier))
        ratio, note = None, ""
        if cap.arm == baseline or base is None:
            pass
        elif base.agents_at_slo is None or cap.agents_at_slo is None:
            note = f"no ratio: {baseline} {base.describe()}, {cap.arm} {cap.describe()}"
        else:
            ratio = cap.agents_at_slo / base.agents_at_slo
            if base.status == "above-grid" and cap.status == "above-grid":
                note = "not measured: both arms met it at every point"
                ratio = None
            elif cap.status == "above-grid":
                note = "at least: this arm met it at every point"
            elif base.status == "above-grid":
                note = f"at most: {baseline} met it at every point"
        out.append(cap.model_copy(update={"ratio_vs_baseline": ratio, "ratio_note": note}))
    return out


def _ceiling(sessions: AgentSessions, frame: pd.DataFrame) -> float | None:
    """Infinite-cache hit rate of the frame's measured calls, every call replayed in send order."""
    if frame.empty:
        return None
    ordered = frame.sort_values("started_ns")
    seen: set[int] = set()
    hits = total = 0
    for conversation, turn, phase in zip(ordered["conversation"], ordered["turn"], ordered["phase"], strict=True):
        calls = sessions.plan(int(conversation)).calls
        if not 1 <= int(turn) <= len(calls):
            continue  # not a call of the plan (a warm-up request of the engine)
        hit, prompt = infinite_cache_hits([calls[int(turn) - 1]], seen)
        if phase == "measure":
            hits, total = hits + hit, total + prompt
    return hits / total if total else None


def _tokens_per_s(completed: pd.DataFrame, column: str, window_s: float) -> float | None:
    if window_s <= 0:
        return None
    if completed.empty:
        return 0.0
    return float(completed[column].astype("float64").fillna(0.0).sum()) / window_s


def _token_sum(completed: pd.DataFrame, column: str) -> int:
    return 0 if completed.empty else int(completed[column].astype("float64").fillna(0.0).sum())


def aggregate_agentic(
    scenario: Scenario, run_id: str, records: Iterable[RequestRecord], points: Iterable[PointDone]
) -> AgenticResult:
    """A pure function of the stored records and point events (a run can be re-aggregated offline)."""
    config = scenario.agentic_workload
    engine = scenario.engine
    gpus = engine.fleet_gpus
    price = config.cost.usd_per_gpu_hour if config.cost is not None else None
    sessions = AgentSessions(config, seed=scenario.seed)
    slo = SloLimits(ttft_ms=None, tpot_ms=None, e2e_ms=None, percentile=90.0)
    arm_names = [arm.name for arm in scenario.arms]
    grid = stored_grid(arm_names, len(config.agents), records, points, gpus, slo)
    results: list[AgentPoint] = []
    for stored in grid.points:
        agents = config.agents[stored.index]
        data = stored.data
        sweep_point = point_result(data, mode="concurrency")
        completed = derive_columns(data.completed)
        prompt_tps = _tokens_per_s(completed, "prompt_tokens", data.window_s)
        output_tps = _tokens_per_s(completed, "tokens", data.window_s)
        tps = prompt_tps + output_tps if prompt_tps is not None and output_tps is not None else None
        energy = energy_sample(
            data.done.energy,
            prompt_tokens=_token_sum(completed, "prompt_tokens"),
            generated_tokens=_token_sum(completed, "tokens"),
            agents=float(agents),
        )
        usd = price * gpus / (tps * 3600 / 1e6) if price is not None and tps else None
        results.append(
            AgentPoint(
                arm=stored.arm,
                agents=agents,
                point=sweep_point,
                tokens_per_s=tps,
                prompt_tokens_per_s=prompt_tps,
                output_tokens_per_s=output_tps,
                usd_per_mtok=usd,
                hit_rate=sweep_point.hit_rate,
                ceiling=_ceiling(sessions, stored.records),
                tiers=[tier_check(data.measured, tier) for tier in config.tiers],
                energy=energy,
            )
        )
    capacities = [tier_capacity(arm, tier, results, gpus) for arm in arm_names for tier in config.tiers]
    workload_calls = [call for s in range(CEILING_SESSIONS) for call in sessions.plan(s).calls]
    hits, total = infinite_cache_hits(workload_calls)
    sweep_points = [p.point for p in results]
    counts = grid.counts(sweep_points)
    return AgenticResult(
        **header_fields(run_id, scenario.name),
        engine_kind=engine.kind,
        model=engine.model,
        hardware=engine.hardware,
        gpus=gpus,
        agents=list(config.agents),
        arms=arm_names,
        baseline_arm=scenario.baseline_arm,
        tiers=[tier.model_dump() for tier in config.tiers],
        usd_per_gpu_hour=price,
        workload_ceiling=hits / total if total else None,
        complete=grid.complete,
        points=results,
        capacity=with_ratios(capacities, scenario.baseline_arm),
        requests=counts,
        # the points store the client's lag but are not gated on it yet: building an agent's long prompts blocks
        # the loop (about 30-45 ms p99 on a shared 2-core VM), and would judge most agentic runs client-limited
        validity=judge_errors(
            counts.measured, counts.ok, errors_by_kind(sweep_points), scenario.validity.max_error_rate
        ),
    )


def agentic_result_of(run_dir: RunDir) -> AgenticResult:
    """Aggregate an agentic run directory's stored files into its agentic.json content; writes nothing."""
    scenario = run_dir.scenario()
    if scenario.workload.kind != "agentic":
        raise KvbenchError(f"{run_dir.path}: workload kind {scenario.workload.kind!r} is not agentic")
    result = aggregate_agentic(scenario, run_dir.run_id, run_dir.records(), run_dir.points())
    if result.validity is not None:
        judged = with_engines_down(result.validity, run_dir.engines_down(), run_dir.attempts_started() - 1)
        result = result.model_copy(update={"validity": judged})
    result = with_provenance(result, run_dir)
    return result
