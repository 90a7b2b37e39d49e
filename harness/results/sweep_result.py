"""The versioned sweep result (``sweep.json``): what ``kvbench sweep`` measured, and all its reports read.

Reports (curves, CSV, the console table) read this file alone, so ``kvbench sweep --report RUN_DIR``
can redraw everything offline. Bump its ``schema_version`` on any incompatible change;
``SweepResult.read_file`` refuses versions it does not know. Latencies are milliseconds and rates
per second here (display units); the records underneath keep integer nanoseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from harness.store.events import ClientLag
from offload.analytical import Prediction, Regime

from .energy import EnergySample
from .header import ResultHeader
from .run_result import Frozen
from .verdict import Outcome, Validity, outcome_of

if TYPE_CHECKING:
    from harness.scenario.spec import SLO


class Quantiles(Frozen):
    """Distribution of one latency over a set of requests (milliseconds)."""

    n: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float


class PointResult(Frozen):
    """One (arm, load point): the steady-state window and everything measured in it.

    Every field's formula is in :mod:`harness.results.sweep_metrics` (the tag is the field name).
    """

    arm: str
    point: int
    load: float
    mode: Literal["concurrency", "qps"]
    gpus: int
    window_s: float
    sent: int
    measured: int
    ok: int
    errors: int
    errors_by_kind: dict[str, int] = Field(default_factory=dict)
    cancelled: int = 0
    late_arrivals: int = 0
    max_in_flight: int = 0
    sessions: int = 0
    rps: float
    rps_per_gpu: float
    output_tps: float
    output_tps_per_gpu: float
    tps_user_mean: float | None
    tps_user_p50: float | None
    ttft: Quantiles | None
    ttft_round1: Quantiles | None
    ttft_later: Quantiles | None
    tpot: Quantiles | None
    itl: Quantiles | None
    e2e: Quantiles | None
    goodput_rps: float | None
    goodput_rps_per_gpu: float | None
    slo_attainment: float | None
    meets_slo: bool | None = Field(
        description="None when the scenario sets no SLO limit, or the point measured too few requests to judge its "
        "percentile (fewer than ⌈1 / (1 − p/100)⌉: 10 at p90)."
    )
    prompt_tokens_mean: float | None
    prompt_tokens_round1_mean: float | None
    prompt_tokens_later_mean: float | None
    output_tokens_mean: float | None
    cached_share: float | None = Field(description="Σ usage cached_tokens / Σ prompt_tokens (engine-reported).")
    cached_share_later: float | None
    gpu_hit_rate: float | None
    external_hit_rate: float | None
    hit_rate: float | None
    lag_p99_ms: float | None
    energy: EnergySample | None = Field(
        default=None,
        description="The GPUs' energy over the window, per token and per kW (harness.results.energy); None: "
        "a run that metered none.",
    )
    client: ClientLag | None = Field(
        default=None,
        description="How far behind its schedule the client fell over the window (harness.store.events.ClientLag); "
        "None: a point stored before the client measured it.",
    )


class SloLimits(Frozen):
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    percentile: float

    @classmethod
    def of(cls, slo: SLO) -> SloLimits:
        """The limits a scenario's ``slo`` section sets."""
        return cls(ttft_ms=slo.ttft_ms, tpot_ms=slo.tpot_ms, e2e_ms=slo.e2e_ms, percentile=slo.percentile)

    @property
    def has_limits(self) -> bool:
        return any(limit is not None for limit in (self.ttft_ms, self.tpot_ms, self.e2e_ms))


class GridCrossing(Frozen):
    """The SLO boundary between the best passing load point and the next, failing one, read by interpolation.

    ``f = (a_pass − need) / (a_pass − a_fail)``, clipped to [0, 1], with ``a`` each point's SLO attainment (the
    share of requests within every limit) and ``need`` the SLO percentile; the capacity read there is
    ``rps_pass + f × (rps_fail − rps_pass)`` RPS/GPU. An estimate, never a measurement: reports mark it.
    """

    load_pass: float
    load_fail: float
    rps_per_gpu_pass: float
    rps_per_gpu_fail: float
    interpolated_rps_per_gpu: float
    coarse: bool = Field(description="The two loads are more than 1.5x apart: the grid cannot place the capacity.")


class ArmCapacity(Frozen):
    """The most each arm serves per GPU within the SLO, and what a target load then needs."""

    arm: str
    max_rps_per_gpu_at_slo: float | None = Field(description="Best RPS/GPU over the points that meet the SLO.")
    at_load: float | None
    tps_user_at_max: float | None
    max_rps_per_gpu: float | None = Field(description="Best RPS/GPU over all points, SLO or not.")
    gpus_needed: int | None = Field(description="GPUs for cost.target_rps at max_rps_per_gpu_at_slo.")
    deployments_needed: int | None
    usd_per_year: float | None
    between: GridCrossing | None = Field(
        default=None,
        description="Where the SLO is crossed between two load points (None: no failing point above the best "
        "passing one, or no SLO): the capacity read between them, marked as interpolated.",
    )


class GpuSavings(Frozen):
    """GPUs (and dollars) an arm saves against the baseline at the target load within the SLO."""

    arm: str
    baseline: str
    target_rps: float
    usd_per_gpu_hour: float
    gpus_baseline: int | None
    gpus_arm: int | None
    gpus_saved: int | None
    usd_per_year_saved: float | None
    capacity_ratio: float | None = Field(description="Arm's max RPS/GPU at SLO / the baseline's.")


class AnalyticalInputs(Frozen):
    """Where each input of the prefill model came from.

    A later-round prompt of N tokens splits into ``a_gpu·N`` tokens still in GPU memory (free),
    ``a_tier·N`` tokens loaded from the offload tier and ``(1 − a_gpu − a_tier)·N`` recomputed.
    The deck's model is applied to the part not in GPU memory: ``N' = (1 − a_gpu)·N`` with reuse
    ``a' = a_tier / (1 − a_gpu)``, so ``TTFT_KV = max(a_tier·N·R, m·N·W, m·N·T)``, m the miss share.
    """

    n_tokens: float = Field(description="Mean prompt tokens of the arm's later-round requests at this load.")
    n_out: float = Field(description="Mean output tokens per request.")
    a: float = Field(description="Reuse of the arm's later rounds: cached prompt tokens / prompt tokens.")
    a_gpu: float = Field(description="Part of a served from GPU memory.")
    a_tier: float = Field(description="Part of a served from the offload tier.")
    a_source: str
    a_baseline: float
    a_baseline_gpu: float
    t_s: float
    t_source: str
    t_measured_s: float | None = Field(description="Baseline round-1 TTFT p50 / its prompt tokens.")
    r_s: float
    w_s: float
    tier: str
    kv_bytes_per_token: float | None
    hbm_gbps: float | None


class AnalyticalComparison(Frozen):
    """The Pliops prefill model beside the measurement: one treatment arm vs the baseline at one load."""

    arm: str
    baseline: str
    load: float
    inputs: AnalyticalInputs
    prediction: Prediction = Field(description="analytical.predict(N', a', T, R, W): the arm's prefill beyond HBM.")
    predicted_ttft_ms: float = Field(description="Predicted later-round prefill time of the arm.")
    predicted_baseline_ttft_ms: float = Field(description="(1 − a_baseline)·N·T, or the same model with its tier.")
    predicted_speedup_vs_baseline: float | None = Field(description="None when the arm's predicted prefill is 0.")
    measured_ttft_ms: float | None = Field(description="Arm's later-round TTFT p50 at this load.")
    measured_baseline_ttft_ms: float | None
    measured_speedup: float | None = Field(description="Baseline / arm later-round TTFT p50 at this load.")
    regime: Regime
    e2e_gain_bound: float | None = Field(description="1 + AP/AH; None without an HBM bandwidth.")
    measured_capacity_ratio: float | None
    measured_output_tps_ratio: float | None = Field(description="Arm / baseline output TPS at this load.")


class SweepCounts(Frozen):
    sent: int
    measured: int
    ok: int
    errors: int
    warmup: int
    discarded: int = Field(description="Records of points re-run after an interrupted attempt.")


class SweepResult(ResultHeader):
    FILE_NAME: ClassVar[str] = "sweep.json"
    """Everything the sweep reports need, aggregated from records.jsonl and points.jsonl."""
    schema_version: Literal[3] = 3  # 2: provenance; 3: points[].client

    engine_kind: str
    model: str
    hardware: str
    gpus: int = Field(description="GPUs of the deployment: replicas × GPUs per replica (TP × PP × DP).")
    mode: Literal["concurrency", "qps"]
    loads: list[float]
    arms: list[str]
    baseline_arm: str
    slo: SloLimits
    complete: bool
    points: list[PointResult]
    capacity: list[ArmCapacity]
    savings: list[GpuSavings]
    analytical: list[AnalyticalComparison]
    analytical_notes: list[str] = Field(default_factory=list)
    requests: SweepCounts
    validity: Validity | None = Field(
        default=None, description="The error gates' verdict; None in files written before they existed."
    )

    def outcome(self) -> Outcome:
        return outcome_of(self.validity)

    def point(self, arm: str, load: float) -> PointResult | None:
        for item in self.points:
            if item.arm == arm and item.load == load:
                return item
        return None

    def arm_points(self, arm: str) -> list[PointResult]:
        return sorted((p for p in self.points if p.arm == arm), key=lambda p: p.load)

    def capacity_of(self, arm: str) -> ArmCapacity | None:
        return next((c for c in self.capacity if c.arm == arm), None)
