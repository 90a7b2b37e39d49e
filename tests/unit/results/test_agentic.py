"""Agents at SLO: the tier check of a point's calls, the interpolation between grid points, the ratio to the
baseline, and each way a tier can be unplaceable (every point passed, none passed, the next point measured
too few calls to judge)."""

from __future__ import annotations

from typing import cast

import pandas as pd
import pytest

from harness.results.agentic import tier_capacity, tier_check, with_ratios
from harness.results.agentic_result import AgentPoint, TierCheck
from harness.results.sweep_metrics import derive_columns
from harness.results.sweep_result import PointResult
from workloads.config import SloTier

TIER = SloTier(name="interactive", ttft_s=2.0, min_output_tokens_per_s=30.0, percentile=90.0)
S = 1_000_000_000


def point(arm: str, agents: int, attainment: float | None, usd: float | None = 1.0) -> AgentPoint:
    meets = None if attainment is None else attainment >= 0.9
    check = TierCheck(
        tier="interactive",
        attainment=attainment,
        meets=meets,
        ttft_s_at_percentile=None,
        output_tokens_per_s_at_percentile=None,
    )
    # the capacity reads only the arm, agents, tier checks and $/Mtok: the sweep point underneath is not needed
    return AgentPoint.model_construct(
        arm=arm,
        agents=agents,
        point=cast(PointResult, None),
        tokens_per_s=None,
        prompt_tokens_per_s=None,
        output_tokens_per_s=None,
        usd_per_mtok=usd,
        hit_rate=None,
        ceiling=None,
        tiers=[check],
    )


def test_agents_at_slo_interpolates_between_the_last_pass_and_the_next_fail() -> None:
    points = [point("ON", 2, 1.0), point("ON", 4, 0.95, usd=0.5), point("ON", 8, 0.75), point("ON", 16, 0.1)]
    cap = tier_capacity("ON", TIER, points, gpus=2)
    # f = (0.95 - 0.90) / (0.95 - 0.75) = 0.25 of the way from 4 to 8
    assert cap.status == "met" and cap.agents_at_slo == pytest.approx(5.0)
    assert cap.measured_agents == 4 and cap.failing_agents == 8 and cap.coarse  # 8 > 1.5 x 4
    assert cap.agents_at_slo_per_gpu == pytest.approx(2.5) and cap.usd_per_mtok == 0.5


def test_a_fine_grid_is_not_coarse_and_a_dip_below_the_best_pass_does_not_hide_it() -> None:
    points = [point("ON", 4, 0.8), point("ON", 5, 0.92), point("ON", 6, 0.6)]
    cap = tier_capacity("ON", TIER, points, gpus=1)
    assert cap.status == "met" and not cap.coarse and cap.measured_agents == 5
    assert cap.agents_at_slo == pytest.approx(5 + (0.92 - 0.9) / (0.92 - 0.6))


def test_every_point_passing_is_a_lower_bound_and_none_passing_has_no_value() -> None:
    above = tier_capacity("A", TIER, [point("A", 1, 1.0), point("A", 2, 0.95)], gpus=1)
    assert above.status == "above-grid" and above.agents_at_slo == 2 and above.describe().startswith(">= 2")
    none = tier_capacity("B", TIER, [point("B", 1, 0.5), point("B", 2, 0.2)], gpus=1)
    assert none.status == "none-met" and none.agents_at_slo is None and none.describe() == "none met"


def test_a_next_point_without_measured_calls_is_inconclusive() -> None:
    cap = tier_capacity("A", TIER, [point("A", 1, 1.0), point("A", 2, None)], gpus=1)
    assert cap.status == "inconclusive" and cap.agents_at_slo is None and cap.describe() == "INCONCLUSIVE"


def test_ratios_to_the_baseline_say_when_they_are_bounds_or_missing() -> None:
    points = [point("OFF", 2, 0.95), point("OFF", 4, 0.5), point("ON", 2, 1.0), point("ON", 4, 0.97)]
    points += [point("BAD", 2, 0.1), point("BAD", 4, 0.1)]
    caps = with_ratios([tier_capacity(arm, TIER, points, gpus=1) for arm in ("OFF", "ON", "BAD")], "OFF")
    off, on, bad = caps
    assert off.ratio_vs_baseline is None and off.agents_at_slo == pytest.approx(2 + 2 * 0.05 / 0.45)
    assert off.agents_at_slo is not None
    assert on.ratio_vs_baseline == pytest.approx(4 / off.agents_at_slo) and on.ratio_note.startswith("at least")
    assert bad.ratio_vs_baseline is None and "none met" in bad.ratio_note


def test_tier_check_needs_both_ttft_and_output_speed_and_fails_errors() -> None:
    rows = [
        # (ttft s, e2e s, tokens, ok): speed = (tokens - 1) / (e2e - ttft)
        (1.0, 2.0, 101, True),  # 100 tok/s, fast: meets
        (1.5, 11.5, 101, True),  # 10 tok/s: too slow
        (3.0, 3.5, 11, True),  # TTFT over 2 s
        (0.5, 0.5, 1, True),  # one token: judged on TTFT alone, meets
        (None, 1.0, 0, False),  # failed call
    ]
    frame = pd.DataFrame(
        {
            "ttft_ns": [None if t is None else int(t * S) for t, _, _, _ in rows],
            "e2e_ns": [int(e * S) for _, e, _, _ in rows],
            "completion_tokens": [n for _, _, n, _ in rows],
            "output_chunks": [n for _, _, n, _ in rows],
            "started_ns": [0] * len(rows),
            "ok": [ok for *_, ok in rows],
        }
    )
    ten = pd.concat([frame, frame], ignore_index=True)  # 10 calls: the fewest that judge a p90
    check = tier_check(derive_columns(ten), TIER)
    assert check.attainment == pytest.approx(2 / 5) and check.meets is False
    assert tier_check(derive_columns(frame.iloc[:0]), TIER).meets is None


def test_a_tier_is_judged_from_ten_calls_at_p90_never_from_fewer() -> None:
    def calls(n: int, slow: int) -> pd.DataFrame:
        ttft = [0.5] * (n - slow) + [5.0] * slow
        frame = pd.DataFrame(
            {
                "ttft_ns": [int(t * S) for t in ttft],
                "e2e_ns": [int((t + 1.0) * S) for t in ttft],
                "completion_tokens": [101] * n,
                "output_chunks": [101] * n,
                "started_ns": [0] * n,
                "ok": [True] * n,
            }
        )
        return derive_columns(frame)

    nine_fast, nine_one_slow = tier_check(calls(9, 0), TIER), tier_check(calls(9, 1), TIER)
    assert nine_fast.attainment == 1.0 and nine_fast.meets is None  # the p90 of 9 calls is their slowest
    assert nine_one_slow.meets is None
    assert tier_check(calls(10, 1), TIER).meets is True and tier_check(calls(10, 2), TIER).meets is False


def test_no_pass_is_none_met_only_when_the_fewest_agents_failed_judged() -> None:
    judged = tier_capacity("A", TIER, [point("A", 1, 0.5), point("A", 2, None)], gpus=1)
    assert judged.status == "none-met"
    unjudged = tier_capacity("A", TIER, [point("A", 1, None), point("A", 2, 0.5)], gpus=1)
    assert unjudged.status == "inconclusive" and unjudged.describe() == "INCONCLUSIVE"
