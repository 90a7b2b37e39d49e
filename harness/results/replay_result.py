"""The versioned replay result (``replay.json``): what ``kvbench replay`` measured, and all its reports read.

Latencies are milliseconds and rates fractions here (display units); records keep integer ns.
Every formula is in :mod:`harness.results.replay`.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from harness.store.events import TraceInfo

from .header import ResultHeader
from .run_result import Frozen
from .sweep_result import Quantiles, SloLimits
from .verdict import Outcome, Validity


class ArmReplay(Frozen):
    """One arm's replay of the trace window."""

    arm: str
    attempt: int
    complete: bool = Field(description="The arm sent every request of the window in this attempt.")
    requests: int = Field(description="Records of this attempt (one per trace request sent).")
    ok: int
    errors: int
    errors_by_kind: dict[str, int] = Field(default_factory=dict)
    wall_s: float | None = Field(description="First send to last answer, seconds.")
    ttft: Quantiles | None
    tpot: Quantiles | None
    e2e: Quantiles | None
    slo_attainment: float | None
    lag: Quantiles | None = Field(description="started − scheduled of open-loop sends (client lag), ms.")
    late: int = Field(description="Requests sent more than late_ms after their time.")
    fell_behind: bool = Field(description="p99 send lag above behind_ms: the client could not keep the schedule.")
    prompt_tokens: float | None = Field(description="Δ prompt tokens over the replay (engine /metrics).")
    gpu_hit_tokens: float | None
    external_hit_tokens: float | None
    hit_rate: float | None = Field(description="(GPU + tier hit tokens) / prompt tokens (engine /metrics).")
    cached_share: float | None = Field(description="Σ usage cached_tokens / Σ usage prompt_tokens.")
    prompt_tokens_off: int = Field(
        description="Successful requests whose usage prompt_tokens differs from the trace's input_length by > 2 %."
    )
    child_calls: int | None = Field(
        default=None, description="Agent traces: calls that waited for a parent call (None: no call graph)."
    )
    causal_violations: int | None = Field(
        default=None, description="Child calls sent before their parent's answer completed (a causal replay: 0)."
    )


class TimelinePoint(Frozen):
    """One /metrics scrape interval of one arm: tokens per second by source."""

    arm: str
    t_s: float = Field(description="End of the interval, seconds since the arm's replay started.")
    duration_s: float
    prompt_tps: float | None
    gpu_hit_tps: float | None
    external_hit_tps: float | None


class ReplayComparison(Frozen):
    """An arm against the baseline: % diff = (baseline / arm − 1) × 100 on each latency percentile."""

    arm: str
    baseline: str
    ttft_p50_pct: float | None
    ttft_p90_pct: float | None
    ttft_p99_pct: float | None
    e2e_p50_pct: float | None
    hit_rate_arm: float | None
    hit_rate_baseline: float | None


class ReplayResult(ResultHeader):
    """Everything the replay reports need, aggregated from records.jsonl, samples.jsonl and trace.json."""

    FILE_NAME: ClassVar[str] = "replay.json"
    schema_version: Literal[3] = 3  # 2: the verdict (validity); 3: provenance

    engine_kind: str
    model: str
    hardware: str | None
    arms: list[str]
    baseline_arm: str
    complete: bool
    trace: TraceInfo
    slo: SloLimits
    late_ms: float
    behind_ms: float
    results: list[ArmReplay]
    timeline: list[TimelinePoint]
    comparisons: list[ReplayComparison]
    validity: Validity = Field(
        description="The error gates over every arm's requests, and an engine_died finding for an arm whose engine "
        "died mid-replay."
    )

    def outcome(self) -> Outcome:
        return self.validity.outcome()

    def arm(self, name: str) -> ArmReplay | None:
        return next((item for item in self.results if item.arm == name), None)
