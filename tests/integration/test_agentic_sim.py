"""A real, short agentic ``kvbench sweep`` on the simulator: two arms, two agents counts, SLO tiers.

The simulator (Llama-3.1-8B on one H100) has its HBM held to 1,000 blocks (16k tokens), so at 8 agents the
sessions' growing contexts no longer fit: AMG-OFF recomputes them, AMG-ON loads them from its CPU tier. About
40 s on 2 cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.results.agentic_result import AgenticResult, TierCapacity
from harness.store.records import read_records
from tests.scenarios import squeezed_gpu_ab
from tests.support import kvbench_scenario
from workloads.agentic import AgentSessions
from workloads.config import AgenticSessions

pytestmark = pytest.mark.integration

WORKLOAD = {
    "kind": "agentic",
    "agents": [2, 8],
    "system_prompt_tokens": 1000,
    "task_tokens": {"dist": "uniform", "low": 300, "high": 600},
    "calls": {"dist": "uniform", "low": 3, "high": 8},
    "tool_result_tokens": {"dist": "uniform", "low": 800, "high": 2000},
    "output_tokens": 24,
    "tool_time_s": {"dist": "exponential", "mean": 0.2, "max": 1},
    "subagent_probability": 0.2,
    "subagent_calls": 2,
    "max_context_tokens": 16000,
    "tiers": [
        {"name": "interactive", "ttft_s": 0.5, "min_output_tokens_per_s": 30},
        {"name": "batch", "ttft_s": 10, "min_output_tokens_per_s": 5},
    ],
    "cost": {"usd_per_gpu_hour": 2.0},
    "warmup_s": 2,
    "window_s": 5,
    "drain_timeout_s": 20,
    "warmup_requests": 1,
}
SCENARIO = squeezed_gpu_ab("it-agentic", WORKLOAD, seed=6)


def _value(cap: TierCapacity | None) -> float:
    """Agents at SLO as a number to compare: none met is 0."""
    assert cap is not None and cap.status != "inconclusive"
    return cap.agents_at_slo or 0.0


def test_agentic_sweep_on_the_simulator(tmp_path: Path) -> None:
    done, run_dir = kvbench_scenario("sweep", SCENARIO, tmp_path)
    assert "agents at SLO" in done.stdout and "simulated" in done.stdout
    assert "VALID: every validity gate passed (run directory: " in done.stderr  # a sweep's verdict line
    result = AgenticResult.read_file(run_dir / "agentic.json")
    assert result.complete and result.requests.errors == 0 and result.gpus == 1
    assert [(p.arm, p.agents) for p in result.points] == [("AMG-OFF", 2), ("AMG-OFF", 8), ("AMG-ON", 2), ("AMG-ON", 8)]
    for p in result.points:
        assert p.point.measured >= 5 and p.tokens_per_s and p.usd_per_mtok is not None
        assert p.hit_rate is not None and p.ceiling is not None
        # nothing outside the plan's reuse can hit: the measured rate stays at or under the ceiling
        assert p.hit_rate <= p.ceiling + 0.02
        assert len(p.tiers) == 2
        energy = p.energy  # the simulator's power model, labelled as such
        assert energy is not None and energy.source == "simulated" and energy.joules_per_token, energy
        assert energy.avg_watts and energy.agents_per_kw == p.agents / (energy.avg_watts / 1000), energy
    off, on = (next(p for p in result.points if p.arm == arm and p.agents == 8) for arm in ("AMG-OFF", "AMG-ON"))
    assert on.hit_rate is not None and off.hit_rate is not None and on.hit_rate > off.hit_rate + 0.1
    for tier in ("interactive", "batch"):
        assert _value(result.capacity_of("AMG-ON", tier)) >= _value(result.capacity_of("AMG-OFF", tier))

    # every record is a call of the plan: its prompt is the plan's size, its turn the call's position
    sessions = AgentSessions(AgenticSessions.model_validate(WORKLOAD), seed=6)
    calls = [r for r in read_records(run_dir / "records.jsonl") if r.point is not None]
    assert calls and all(
        r.expected_prompt_tokens == sessions.plan(r.conversation).call(r.turn - 1).prompt_tokens for r in calls
    )
    assert {(r.conversation // 1_000_000) for r in calls} == {0, 1}
    report = run_dir / "report"
    assert (report / "agents.md").exists() and (report / "agents_ttft.svg").exists()
    assert "agents at SLO" in (report / "agents.md").read_text()
    assert "J/token" in (report / "agents.md").read_text() and "energy (simulated)" in done.stdout
