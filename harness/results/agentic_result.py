"""The versioned agentic sweep result (``agentic.json``): agents at SLO per arm and tier, and every point.

Reports read this file alone (``kvbench report RUN_DIR`` redraws offline). Latencies are seconds here where a
tier states them in seconds (``ttft_s``), milliseconds inside the embedded sweep point (``point``). Every field's
formula is in :mod:`harness.results.agentic`. ``energy`` (:mod:`harness.results.energy`) is the GPUs' energy over
a point's window: NVML on GPUs (measured), the simulator's power model (simulated), or a ``not_sampled`` reason.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from .energy import EnergySample
from .header import ResultHeader
from .run_result import Frozen
from .sweep_result import PointResult, SweepCounts
from .verdict import Outcome, Validity, outcome_of


class TierCheck(Frozen):
    """One SLO tier at one point."""

    tier: str
    attainment: float | None = Field(description="Measured calls meeting both limits / measured calls.")
    meets: bool | None = Field(
        description="attainment >= percentile/100; None with too few measured calls to judge the percentile "
        "(fewer than ⌈1 / (1 − p/100)⌉: 10 at p90)."
    )
    ttft_s_at_percentile: float | None = Field(description="TTFT at the tier's percentile, s.")
    output_tokens_per_s_at_percentile: float | None = Field(
        description="Output speed that percentile % of the calls reach or exceed (the (100−p) quantile), tok/s."
    )


class AgentPoint(Frozen):
    """One (arm, agents) point: the sweep metrics of its window plus the agentic figures."""

    arm: str
    agents: int
    point: PointResult = Field(description="The sweep metrics of the window (load = agents, mode concurrency).")
    tokens_per_s: float | None = Field(
        description="(prompt + generated) tokens of calls completed inside the window / window seconds."
    )
    prompt_tokens_per_s: float | None
    output_tokens_per_s: float | None
    usd_per_mtok: float | None = Field(
        description="usd_per_gpu_hour × GPUs / (tokens_per_s × 3600 / 1e6); tokens = prompt + generated."
    )
    hit_rate: float | None = Field(description="Measured prefix-hit share of prompt tokens (the sweep's hit_rate).")
    ceiling: float | None = Field(
        description="Infinite-cache hit rate of the measured calls, given every call of the point sent before them."
    )
    tiers: list[TierCheck]
    energy: EnergySample | None = Field(
        default=None, description="The GPUs' energy over the window (None: no power source ran)."
    )


Status = Literal["met", "above-grid", "none-met", "inconclusive"]


class TierCapacity(Frozen):
    """Agents at SLO of one arm and tier."""

    arm: str
    tier: str
    status: Status = Field(
        description="met: placed between a passing and a failing point; above-grid: every point passed (a lower "
        "bound); none-met: no point passed and the fewest agents failed, judged; inconclusive: the fewest agents (none "
        "passing) or the point above the best passing one measured too few calls to judge."
    )
    agents_at_slo: float | None = Field(
        description="Largest passing agents count, interpolated toward the next failing one on the attainment."
    )
    measured_agents: int | None = Field(description="The largest grid point that met the tier (a measurement).")
    failing_agents: int | None = Field(description="The next grid point above it, which failed.")
    coarse: bool = Field(default=False, description="failing/measured > 1.5: the grid cannot place the boundary.")
    agents_at_slo_per_gpu: float | None
    usd_per_mtok: float | None = Field(description="$/Mtok at the measured passing point.")
    ratio_vs_baseline: float | None = Field(description="agents_at_slo / the baseline arm's, for this tier.")
    ratio_note: str = ""
    energy: EnergySample | None = Field(default=None, description="Energy at the measured passing point.")

    def describe(self) -> str:
        if self.status == "none-met":
            return "none met"
        if self.status == "inconclusive":
            return "INCONCLUSIVE"
        assert self.agents_at_slo is not None
        if self.status == "above-grid":
            return f">= {self.agents_at_slo:g} (every point met it)"
        text = f"{self.agents_at_slo:.3g}"
        return text + " (coarse grid)" if self.coarse else text


class AgenticResult(ResultHeader):
    """Everything an agentic sweep measured."""

    FILE_NAME: ClassVar[str] = "agentic.json"
    schema_version: Literal[3] = 3  # 2: provenance; 3: point.client (the sweep metrics' client lag)
    engine_kind: str
    model: str | None = None
    hardware: str | None = None
    gpus: int = Field(description="GPUs of the deployment (every replica's); per-GPU figures divide by it.")
    agents: list[int]
    arms: list[str]
    baseline_arm: str
    tiers: list[dict[str, float | str]] = Field(description="The tiers as configured.")
    usd_per_gpu_hour: float | None
    workload_ceiling: float | None = Field(
        description="Infinite-cache hit rate of the workload's first sessions sent one after another."
    )
    complete: bool
    points: list[AgentPoint]
    capacity: list[TierCapacity]
    requests: SweepCounts
    validity: Validity | None = None

    def outcome(self) -> Outcome:
        return outcome_of(self.validity)

    def capacity_of(self, arm: str, tier: str) -> TierCapacity | None:
        return next((c for c in self.capacity if c.arm == arm and c.tier == tier), None)
