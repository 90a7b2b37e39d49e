"""A simulator calibration: fitted parameters for one deployment, and how the simulator applies them.

A calibration file (``kvbench sim calibrate`` writes it, :mod:`harness.calibrate.fit`) replaces the
datasheet efficiency factors of one deployment -- model, hardware, tensor-parallel degree, weight dtype
(FP8 with vLLM's ``--quantization fp8``), KV-cache dtype, the engine and version it was measured on,
and whether the engine ran CUDA graphs -- with values fitted to real runs. Every parameter is physical
and says whether the runs determined it and from what (:class:`FitParam`). Units are seconds, GB
(10^9 bytes) and token counts; ``P`` is a request's prompt length in tokens.

* request overhead ``request_overhead_s + request_overhead_s_per_ktoken x P/1000``: the time a server
  spends on a request before its first engine step can start (HTTP, tokenising, scheduling); the
  simulator holds the request back that long. ``engine_blocking_share`` of it stalls the running
  requests (CPU work in the engine's own loop), charged to the first step after the arrival.
* prefill: GEMM at ``linear_efficiency`` of the dense peak, attention at ``attention_efficiency``
  of the BF16 peak (:mod:`.timemodel`).
* one engine step: ``max(GPU, host) + store + intake + read`` with ``host = step_overhead_s + step_s_per_seq
  x sequences + step_extra_s`` (``prefill_host_s`` in place of the step overhead in a step that runs a
  prefill chunk, where the fit kept it), the GPU's memory part at ``hbm_efficiency`` of the HBM
  bandwidth, and ``read = decode_s_per_ktoken x C/1000``, ``C`` the context tokens the step's decode tokens
  attend to (the running sequences' contexts: decode attention's KV read, where a fit learnt it from load runs).
* per offload backend: a turn-2 tier hit loads in ``load_latency_s + GB / load_gbps``; a prefill that
  stores to the tier adds ``store_latency_s + GB x store_s_per_gb``; a request that arrives while the
  engine is busy adds ``busy_intake_s`` of engine-loop work; every step adds ``step_extra_s``.
* GPU power (``power``, :class:`PowerFit`, fitted by ``kvbench sim calibrate-power`` from runs' NVML energy
  windows): ``W = base_w + j_per_prefill_token x prefill tokens/s + j_per_decode_token x decode tokens/s`` per
  replica; ``None``: the datasheet model of :mod:`harness.sim.power` (idle + (TDP - idle) x busy).

Every field is present in a file (schema version 4; 3 added ``power``, 4 ``decode_s_per_ktoken``); a file of
another version is refused with the command that refits it, and every value is range-checked on load
(:data:`RANGES`). Using a calibration for another deployment is an error naming both
(:meth:`Calibration.check_deployment`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from common.errors import CalibrationError
from common.schema import StrictModel, first_problem
from common.yamlfile import read_yaml_mapping
from harness.engines.host_link import HostLinkSummary
from offload.profiles import OffloadProfile, TierKind
from offload.shapes import Deployment, Dtype, dtype_label

from .timemodel import Efficiencies, TimeModel

SCHEMA_VERSION = 4
REFIT = "kvbench sim calibrate RUN_DIR... --holdout LENGTHS -o FILE"
"""The command that writes a calibration of this schema."""


@dataclass(frozen=True)
class Range:
    """Allowed values of a parameter: ``low`` to ``high``, ``low`` itself excluded when ``open_low`` (a rate
    or an efficiency of 0 would divide by zero)."""

    low: float
    high: float
    open_low: bool = False

    def admits(self, value: float) -> bool:
        return (value > self.low if self.open_low else value >= self.low) and value <= self.high

    def __str__(self) -> str:
        return f"{'(' if self.open_low else '['}{self.low:g}, {self.high:g}]"


RANGES: dict[str, Range] = {
    "request_overhead_s": Range(0.0, 10.0),
    "request_overhead_s_per_ktoken": Range(0.0, 1.0),
    "linear_efficiency": Range(0.0, 1.0, open_low=True),
    "attention_efficiency": Range(0.0, 1.0, open_low=True),
    "step_overhead_s": Range(0.0, 1.0),
    "step_s_per_seq": Range(0.0, 0.1),
    "decode_s_per_ktoken": Range(0.0, 0.01),
    "hbm_efficiency": Range(0.0, 1.0, open_low=True),
    "prefill_host_s": Range(0.0, 2.0),
    "engine_blocking_share": Range(0.0, 1.0),
}
"""Allowed values of the deployment's parameters (fractions of a peak; seconds)."""
BACKEND_RANGES: dict[str, Range] = {
    "load_gbps": Range(0.0, 10_000.0, open_low=True),
    "load_latency_s": Range(0.0, 10.0),
    "store_s_per_gb": Range(0.0, 100.0),
    "store_latency_s": Range(0.0, 10.0),
    "busy_intake_s": Range(0.0, 1.0),
    "step_extra_s": Range(0.0, 1.0),
}
"""Allowed values of an offload backend's parameters (GB/s; seconds; seconds per GB)."""


class FitParam(StrictModel):
    """One parameter: its value, unit, whether the runs determined it, and from what."""

    value: float
    unit: str
    fitted: bool = Field(description="False: kept at its default because the runs do not determine it.")
    source: str = Field(description="Which requests or cells determined it (or why it is a default).")


class SourceRun(StrictModel):
    """A run directory the calibration was fitted from."""

    path: str
    run_id: str
    manifest_sha256: str
    gpu: str = Field(description="The GPU the manifest recorded.")
    host_link: HostLinkSummary | None = Field(
        description="Pinned host -> GPU copy rates of the run's attempts (GB/s per GPU, median and minimum, alone "
        "and all GPUs at once); None: the run measured none (no GPU).",
    )


class PowerResidual(StrictModel):
    """Predicted against NVML-measured power of one measurement window, predicted by a fit that left it out."""

    run: str
    arm: str
    load: float
    held_out: str = Field(description="What the fit that predicted this window left out: a run, or an arm.")
    seconds: float = Field(description="Window length, s.")
    tokens: int = Field(description="Prompt + generated tokens of the requests completed inside the window.")
    measured_w: float
    predicted_w: float
    measured_j_per_token: float = Field(description="NVML joules / tokens, J.")
    predicted_j_per_token: float = Field(description="predicted_w x seconds / tokens, J.")

    @property
    def error(self) -> float:
        """predicted / measured - 1 of J/token (the same as of W: one window, one token count)."""
        return self.predicted_j_per_token / self.measured_j_per_token - 1.0


class PowerFit(StrictModel):
    """GPU power fitted on NVML energy windows: ``W = base_w + j_per_prefill_token x prefill tokens/s +
    j_per_decode_token x decode tokens/s`` per replica (:mod:`harness.calibrate.power`)."""

    model: Literal["constant", "prefill", "tokens"] = Field(
        description="Which terms the held-out error kept: constant (base_w alone), prefill (base_w and the "
        "prefill term), tokens (both token terms)."
    )
    base_w: FitParam = Field(
        description="Intercept, W per GPU: a GPU serving at a vanishing token rate. Not an idle board (77-90 W): "
        "an engine with nothing to run lies outside the fit's range."
    )
    j_per_prefill_token: FitParam
    j_per_decode_token: FitParam
    tdp_w: float = Field(gt=0, description="Board limit, W per GPU: no window is predicted above it.")
    runs: list[str] = Field(description="Run directories whose energy windows the fit used.")
    residuals: list[PowerResidual] = Field(
        description="Every window predicted by a fit that left it out: its run (two runs or more), else its arm."
    )

    @property
    def median_error(self) -> float:
        errors = sorted(abs(r.error) for r in self.residuals)
        return errors[len(errors) // 2] if errors else float("nan")

    def watts(self, prefill_tps: float, decode_tps: float, gpus: int = 1) -> float:
        """Predicted W of ``gpus`` GPUs at these token rates (tokens/s), capped at ``tdp_w`` per GPU."""
        modelled = (
            gpus * self.base_w.value
            + self.j_per_prefill_token.value * prefill_tps
            + self.j_per_decode_token.value * decode_tps
        )
        return min(modelled, gpus * self.tdp_w)


class CalibratedDeployment(StrictModel):
    """What a calibration applies to: the simulator's deployment and the engine it imitates.

    ``dtype`` is the weights' dtype (vLLM's ``--quantization fp8`` makes it ``fp8``), ``kv_dtype``
    the KV cache's when it differs (``None``: the same).
    FP8 weights with a BF16 KV cache and BF16 weights are different deployments: the GEMM peak, the
    weights and the fitted efficiencies all differ, so one's calibration is refused for the other.
    """

    model: str
    hardware: str
    tp: int
    dtype: Dtype
    kv_dtype: Dtype | None = Field(default=None, description="KV-cache dtype when it differs from dtype.")
    engine: str = Field(description="Engine kind the runs measured, e.g. 'vllm'.")
    engine_version: str
    cuda_graphs: bool | None = Field(
        description="Whether the engine ran with CUDA graphs (vLLM without --enforce-eager); None: the runs did "
        "not record it (engines kvbench does not configure). Eager steps cost the host several times more.",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, data: object) -> object:
        # a KV dtype equal to the weights' is the default: written as absent, so equal deployments compare equal
        if isinstance(data, dict) and data.get("kv_dtype") is not None and data.get("kv_dtype") == data.get("dtype"):
            return {k: v for k, v in data.items() if k != "kv_dtype"}
        return data

    @property
    def label(self) -> str:
        weights = dtype_label(self.dtype, self.kv_dtype)
        mode = {None: "", True: ", CUDA graphs", False: ", eager"}[self.cuda_graphs]
        return f"{self.model} {weights} on {self.tp}x {self.hardware} ({self.engine} {self.engine_version}{mode})"

    def agrees(self, other: CalibratedDeployment) -> bool:
        """The same deployment; an unrecorded ``cuda_graphs`` agrees with either."""
        if None in (self.cuda_graphs, other.cuda_graphs):
            return self.model_copy(update={"cuda_graphs": None}) == other.model_copy(update={"cuda_graphs": None})
        return self == other

    def resolve(self) -> Deployment:
        """The simulator's deployment of these profiles."""
        return Deployment.resolve(self.model, self.hardware, self.tp, self.dtype, self.kv_dtype)

    def matches(self, deployment: Deployment) -> bool:
        return (self.model, self.hardware, self.tp, self.dtype, self.kv_dtype or self.dtype) == (
            deployment.model.name,
            deployment.hardware.name,
            deployment.tp,
            deployment.dtype,
            deployment.kv_cache_dtype,
        )


class BackendCalibration(StrictModel):
    """An offload backend's measured costs (``backend`` of the offload profile)."""

    version: str | None = None
    tier: TierKind = Field(description="The tier kind the runs used; the calibration applies to it.")
    load_gbps: FitParam
    load_latency_s: FitParam
    store_s_per_gb: FitParam
    store_latency_s: FitParam
    busy_intake_s: FitParam
    step_extra_s: FitParam


class _Predicted(StrictModel):
    measured_ms: float
    predicted_ms: float
    used_in_fit: bool

    @property
    def error(self) -> float:
        return self.predicted_ms / self.measured_ms - 1.0


class Residual(_Predicted):
    """Predicted against measured median TTFT of one (arm, context length, turn) cell."""

    arm: str
    backend: str
    context_tokens: int
    turn: int
    requests: int


class DecodeResidual(_Predicted):
    """Predicted against measured median decode step of one (run, arm, load point or probe length) group."""

    run: str
    arm: str
    load: float | None = Field(description="The sweep point's load; None for a probe run.")
    requests: int
    batch: float = Field(description="Mean of the requests' time-averaged decoding batch.")
    context_tokens: int = Field(description="Mean context per decoding request.")


class Calibration(StrictModel):
    """The calibration file (``kvbench sim calibrate -o FILE``)."""

    schema_version: Literal[4] = 4
    deployment: CalibratedDeployment
    sources: list[SourceRun]
    fit_context_tokens: list[int] = Field(description="Context lengths whose requests the fit used.")
    holdout_context_tokens: list[int] = Field(description="Context lengths left out of the fit (for validation).")
    holdout_loads: list[float] = Field(description="Sweep load points left out of the fit (for validation).")
    max_batch_tokens: int = Field(ge=1, description="Prefill chunk (tokens per step) the fit assumed.")
    request_overhead_s: FitParam
    request_overhead_s_per_ktoken: FitParam
    linear_efficiency: FitParam
    attention_efficiency: FitParam
    step_overhead_s: FitParam
    step_s_per_seq: FitParam
    decode_s_per_ktoken: FitParam = Field(
        description="Seconds per 1000 KV-cache tokens that a step's decode tokens attend to, added to the step "
        "(decode attention's KV read; fitted from load runs with kvbench sim calibrate --decode-read, else 0)."
    )
    hbm_efficiency: FitParam
    prefill_host_s: FitParam = Field(
        description="Host seconds of an engine step that runs a prompt's prefill chunk (the step takes max(GPU, "
        "this)) where fitted; not fitted: the step overhead, as a decode step."
    )
    engine_blocking_share: FitParam
    backends: dict[str, BackendCalibration]
    warnings: list[str] = Field(description="What the fit could not determine or left out (outliers, bounds).")
    residuals: list[Residual]
    decode_residuals: list[DecodeResidual] = Field(description="Decode steps per (run, arm, load point).")
    tpot_residuals: list[DecodeResidual] = Field(
        description="Mean step over sweep requests' whole decode windows (prefill chunks and intake included) "
        "per (run, arm, load point)."
    )
    power: PowerFit | None = Field(
        description="GPU power fitted on NVML runs (kvbench sim calibrate-power); None: the datasheet model "
        "(harness.sim.power: idle + (TDP - idle) x busy)."
    )

    def falling_tier_hits(self, min_tokens: int = 1000) -> list[tuple[Residual, Residual]]:
        """Pairs of adjacent lengths where an arm's measured turn 2 (a tier hit) is faster at the longer one.

        The model's tier load is ``latency + bytes / rate``, rising with the prompt, so it cannot follow such a
        pair (LMCache 0.5.3 at TP=4: 788 ms at 96k, 774 at 128k in one run), and ``validate`` may miss there.
        Cells below ``min_tokens`` (no whole chunk to load) are left out.
        """
        by_arm: dict[str, list[Residual]] = {}
        for r in self.residuals:
            if r.turn == 2 and r.backend != "none" and r.context_tokens >= min_tokens:
                by_arm.setdefault(r.arm, []).append(r)
        drops: list[tuple[Residual, Residual]] = []
        for cells in by_arm.values():
            cells.sort(key=lambda r: r.context_tokens)
            drops += [(a, b) for a, b in pairwise(cells) if b.measured_ms < a.measured_ms]
        return drops

    # -- reading and writing ---------------------------------------------------------------
    @classmethod
    def load(cls, path: Path) -> Calibration:
        data = read_yaml_mapping(path, CalibrationError, hint="kvbench sim calibrate writes one")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise CalibrationError(
                f"{path}: schema_version {version!r}; this kvbench reads {SCHEMA_VERSION}: refit it with `{REFIT}`"
            )
        try:
            calibration = cls.model_validate(data)
        except ValidationError as error:
            raise CalibrationError(f"{path}: {first_problem(error, whole='calibration')}") from None
        problem = calibration.out_of_range()
        if problem:
            raise CalibrationError(f"{path}: {problem}")
        return calibration

    def out_of_range(self) -> str:
        """The first parameter outside its allowed range (:data:`RANGES`, :data:`BACKEND_RANGES`) as
        ``field = value: allowed range``; "" when every one is inside."""
        values = [(name, getattr(self, name).value, allowed) for name, allowed in RANGES.items()]
        for backend, entry in self.backends.items():
            values += [
                (f"backends.{backend}.{name}", getattr(entry, name).value, allowed)
                for name, allowed in BACKEND_RANGES.items()
            ]
        for name, value, allowed in values:
            if not allowed.admits(value):
                return f"{name} = {value:g}: allowed {allowed}"
        return ""

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        text = yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, width=110)
        tmp.write_text("# kvbench simulator calibration (kvbench sim calibrate)\n" + text, encoding="utf-8")
        tmp.replace(path)
        return path

    # -- applying ---------------------------------------------------------------------------
    def check_deployment(self, deployment: Deployment, where: str = "calibration") -> None:
        """Raise naming both deployments when this calibration is for another one."""
        if not self.deployment.matches(deployment):
            runs = ", ".join(source.path for source in self.sources) or "no runs"
            raise CalibrationError(
                f"{where} is for {self.deployment.label} (from {runs}); it cannot be used for {deployment.label}"
            )

    def backend_for(self, profile: OffloadProfile, where: str = "calibration") -> BackendCalibration | None:
        """The entry for the profile's offload backend (None without tiers).

        ``auto`` takes the only backend when the calibration has exactly one.
        """
        if not profile.offload_enabled:
            return None
        name: str = profile.backend
        if name == "auto" and len(self.backends) == 1:
            name = next(iter(self.backends))
        if name not in self.backends:
            known = ", ".join(sorted(self.backends)) or "none"
            raise CalibrationError(
                f"{where}: offload profile {profile.name!r} has backend {profile.backend!r}; the calibration "
                f"for {self.deployment.label} has backends: {known}"
            )
        return self.backends[name]

    def efficiencies(self, deployment: Deployment, backend: BackendCalibration | None) -> Efficiencies:
        store = backend.store_s_per_gb.value * deployment.kv_bytes_per_token / 1e9 if backend else 0.0
        return Efficiencies(
            linear=self.linear_efficiency.value,
            attention=self.attention_efficiency.value,
            hbm=self.hbm_efficiency.value,
            step_overhead_s=self.step_overhead_s.value,
            store_s_per_token=store,
            store_latency_s=backend.store_latency_s.value if backend else 0.0,
            step_s_per_seq=self.step_s_per_seq.value,
            decode_s_per_ktoken=self.decode_s_per_ktoken.value,
            prefill_host_s=self.fitted_prefill_host_s,
            step_extra_s=backend.step_extra_s.value if backend else 0.0,
        )

    @property
    def fitted_prefill_host_s(self) -> float | None:
        """A prefill step's own host seconds where the fit kept one; None: the step overhead."""
        return self.prefill_host_s.value if self.prefill_host_s.fitted else None

    def request_overhead(self, prompt_tokens: int) -> float:
        """Seconds from a request's arrival until the engine may schedule it."""
        return self.request_overhead_s.value + self.request_overhead_s_per_ktoken.value * prompt_tokens / 1000.0

    def request_intake(self, prompt_tokens: int, backend: BackendCalibration | None = None, busy: bool = True) -> float:
        """Seconds of engine-loop work of an arriving request that stall the running requests: the
        engine-blocking share of its overhead, plus the backend's ``busy_intake_s`` when the engine was
        busy at the arrival (``busy``)."""
        extra = backend.busy_intake_s.value if backend is not None and busy else 0.0
        return self.engine_blocking_share.value * self.request_overhead(prompt_tokens) + extra

    def calibrated_profile(self, profile: OffloadProfile, where: str = "calibration") -> OffloadProfile:
        """The profile with the backend's effective load rate and latency on its tier."""
        backend = self.backend_for(profile, where)
        if backend is None:
            return profile
        tiers = tuple(
            tier.model_copy(
                update={"read_gbps": backend.load_gbps.value, "latency_us": backend.load_latency_s.value * 1e6}
            )
            if tier.kind == backend.tier
            else tier
            for tier in profile.tiers
        )
        return profile.model_copy(update={"tiers": tiers})


def unloaded_ttft_s(
    timing: TimeModel,
    overhead_s: float,
    prompt_tokens: int,
    hbm_tokens: int,
    loaded_tokens: int,
    load_s: float,
    chunk_tokens: int,
) -> float:
    """TTFT of one request alone on the engine, as the simulator computes it (``load_overlap: none``).

    ``overhead + load + prefill of the tokens beyond the HBM hit and the tier hit``; the prefill
    includes any blocking store (``timing``'s efficiencies) and the first token's sampling.
    """
    cached = min(prompt_tokens - 1, hbm_tokens + loaded_tokens)
    return overhead_s + load_s + timing.prefill_seconds(prompt_tokens, cached, chunk_tokens)


SHIPPED_DIR = Path(__file__).parent / "calibrations"
"""The calibrations kvbench ships, one per measured deployment (``engine.calibration: auto`` picks one)."""
AUTO = "auto"


def shipped_calibrations() -> dict[Path, Calibration]:
    """Every shipped calibration by file, in name order."""
    return {path: Calibration.load(path) for path in sorted(SHIPPED_DIR.glob("*.yaml"))}


def pick_shipped(deployment: Deployment, cuda_graphs: bool | None = None) -> tuple[Path, Calibration]:
    """The shipped calibration of this deployment (model, hardware, TP, weight and KV dtypes) and, where
    given, engine mode. Where both modes were measured and none is given, CUDA graphs (vLLM's default).
    No match is a one-line error listing the shipped ones."""
    shipped = shipped_calibrations()
    matches = [
        (path, c)
        for path, c in shipped.items()
        if c.deployment.matches(deployment) and (cuda_graphs is None or c.deployment.cuda_graphs in (None, cuda_graphs))
    ]
    matches.sort(key=lambda item: item[1].deployment.cuda_graphs is not True)
    if not matches:
        known = "; ".join(f"{path.name} ({c.deployment.label})" for path, c in shipped.items())
        mode = {None: "", True: " with CUDA graphs", False: " in eager mode"}[cuda_graphs]
        raise CalibrationError(
            f"engine.calibration: auto: no shipped calibration for {deployment.label}{mode}; shipped: {known}"
        )
    return matches[0]
