"""A simulator calibration: fitted parameters for one deployment, and how the simulator applies them.

A calibration file (``kvbench sim calibrate`` writes it, see :mod:`harness.results.calibrate`)
replaces the datasheet efficiency factors of one deployment -- model profile, hardware profile,
tensor-parallel degree, weight dtype (FP8 with vLLM's ``--quantization fp8``), KV-cache dtype, and
the real engine and version it was measured on -- with values
fitted to real runs. Every parameter is physical and says where it came from (:class:`FitParam`):

* ``request_overhead_s`` + ``request_overhead_s_per_ktoken`` x prompt/1000: time a real server
  spends on a request before its first engine step can start (HTTP, JSON, tokenisation,
  scheduling, prefix-block hashing). The simulator holds the request back until that long after it
  arrived; its own HTTP and tokenisation time counts towards it.
* ``engine_blocking_share``: the fraction of that overhead that is CPU work inside the engine's own
  loop (hashing the prompt's blocks for the prefix cache, a connector's chunk lookups) and so
  stalls every running request. The simulator charges ``share x overhead`` as engine-busy time to
  the first step that starts after the request arrived (less any time the engine sat idle since,
  when the work ran in the idle time): the request's own TTFT is unchanged (the work overlaps its
  overhead), the others' next token is that much later. 0 (files written before it was fitted):
  the overhead blocks nobody.
* ``linear_efficiency`` / ``attention_efficiency``: achieved fraction of the dense peak of the
  GEMM term (``2 x params x tokens``) and of the attention term (``4 x L x heads x head_dim x
  pairs``) of prefill; together they get both 1k (linear-dominated) and 128k (attention-dominated)
  prompts right.
* ``step_overhead_s``, ``step_s_per_seq`` and ``hbm_efficiency``: a decode step is ``max(overhead +
  per_seq x batch, (weights + batch x context x KV bytes) / (HBM bandwidth x efficiency))`` when
  ``host_overlaps_gpu`` (files fitted since 2026-11-27: the host launches while the GPU runs; the
  HBM efficiency is reported as not fitted when every measured step was host-bound), their sum in
  older files (from
  inter-token latencies of probe runs and sweeps; ``decode_residuals`` shows the fit per run, arm and
  load point; ``tpot_residuals`` the decode windows of sweep requests, every step included).
  ``step_s_per_seq`` is 0 in files written before it was fitted.
* ``prefill_host_s``: the host's part of a step that runs a prompt's prefill chunk, where the fit found one
  that binds (``max(GPU, prefill_host_s)``): without CUDA graphs a short prompt's prefill takes about as
  long whatever its length (vLLM 0.26.0 --enforce-eager, 8B on one H200: 42-43 ms from 250 to 1,500
  tokens by the engine's own prefill histogram, against 17-21 ms per decode step), and the GPU's work
  hides it from about 2,000 tokens. Not fitted (no fitted request's prefill is host-bound) or absent
  (files written before it was fitted): the step overhead, as for a decode step.
* per offload backend (``lmcache``, ``native``, ...): ``load_gbps`` and ``load_latency_s``, the
  effective rate and fixed cost of loading a turn-2 hit from the tier (these replace the tier's
  read bandwidth, latency and the host-link cap), and ``store_s_per_gb``, the seconds per GB of
  new KV that storing it to the tier adds to the prefill (0: stored in the background), and
  ``store_latency_s``, the fixed time the backend's save path adds to every request's prefill;
  and ``busy_intake_s``, seconds of engine-loop work the backend adds per request that arrives while
  the engine is busy (its lookups and store scheduling beside running requests). The simulator
  charges it to the first step after the arrival, like the blocking share (that step may also hold
  the request's own first prefill chunk, when its overhead is shorter than it); a request that arrives
  at an idle engine pays nothing (its fixed cost on an idle engine is ``store_latency_s``, fitted
  from probe runs). Fitted per backend from a sweep's decode windows of that backend's arm; 0 in
  files written before it was fitted (then the backend blocks as the deployment's share says).
  And ``step_extra_s``, seconds the backend adds to every engine step of its deployment (its
  connector's per-step bookkeeping in the engine loop and in each TP worker), fitted from a probe
  run's decode steps of the backend's arm against the arm without a tier; 0 in files written before
  it was fitted. Measured: LMCache 0.5.3 at TP=4 slowed 70B steps by 17 % and 74 % on two hosts,
  the 8B's by 17 % on one H200 and not at all on the H100.

Each source run keeps its host link (:class:`harness.engines.host_link.HostLinkSummary`, from the
run's manifest): shown beside the fitted load rates, never used to scale them.

Using a calibration for another deployment is an error naming both (:func:`check_deployment`); the
deployment includes whether the engine ran with CUDA graphs (``cuda_graphs``: eager steps cost the
host several times more), where the runs recorded it.
The file is YAML (JSON is YAML too) with ``schema_version``.
"""

from __future__ import annotations

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

SCHEMA_VERSION = 1


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
        default=None,
        description="Pinned host -> GPU copy rates of the run's attempts (GB/s per GPU, median and minimum, alone "
        "and all GPUs at once); None: the run has none (no GPU, an older run, or files written before the field).",
    )


class CalibratedDeployment(StrictModel):
    """What a calibration applies to: the simulator's deployment and the engine it imitates.

    ``dtype`` is the weights' dtype (vLLM's ``--quantization fp8`` makes it ``fp8``), ``kv_dtype``
    the KV cache's when it differs (``None``: the same; files written before the field read so).
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
        default=None,
        description="Whether the engine ran with CUDA graphs (vLLM without --enforce-eager); None: not recorded "
        "(files written before, engines kvbench does not configure). Eager steps cost the host several times more.",
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
    store_latency_s: FitParam = FitParam(
        value=0.0, unit="s", fitted=False, source="not in this calibration file (written before it was fitted)"
    )
    busy_intake_s: FitParam = FitParam(
        value=0.0, unit="s per request arriving at a busy engine", fitted=False,
        source="not in this calibration file (written before it was fitted)",
    )  # fmt: skip
    step_extra_s: FitParam = FitParam(
        value=0.0, unit="s per engine step", fitted=False,
        source="not in this calibration file (written before it was fitted)",
    )  # fmt: skip


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


_OLD_FILE = "not in this calibration file (written before it was fitted)"


class Calibration(StrictModel):
    """The calibration file (``kvbench sim calibrate -o FILE``)."""

    schema_version: Literal[1] = 1
    deployment: CalibratedDeployment
    sources: list[SourceRun]
    fit_context_tokens: list[int] = Field(description="Context lengths whose requests the fit used.")
    holdout_context_tokens: list[int] = Field(description="Context lengths left out of the fit (for validation).")
    holdout_loads: list[float] = Field(
        default_factory=list, description="Sweep load points left out of the fit (for validation); absent: none."
    )
    max_batch_tokens: int = Field(description="Prefill chunk (tokens per step) the fit assumed.")
    request_overhead_s: FitParam
    request_overhead_s_per_ktoken: FitParam
    linear_efficiency: FitParam
    attention_efficiency: FitParam
    step_overhead_s: FitParam
    step_s_per_seq: FitParam = FitParam(value=0.0, unit="s per sequence", fitted=False, source=_OLD_FILE)
    hbm_efficiency: FitParam
    prefill_host_s: FitParam | None = Field(
        default=None,
        description="Host seconds of an engine step that runs a prompt's prefill chunk, where fitted (the step "
        "takes max(GPU, this)); not fitted or absent (files written before): the step overhead, as a decode step.",
    )
    engine_blocking_share: FitParam = FitParam(
        value=0.0, unit="fraction of the request overhead", fitted=False, source=f"{_OLD_FILE}: it blocks nobody"
    )
    host_overlaps_gpu: bool = Field(
        default=False,
        description="True: a step takes max(GPU, host), the host launching while the GPU runs; False (files "
        "written before): their sum. The parameters were fitted under this model.",
    )
    backends: dict[str, BackendCalibration] = Field(default_factory=dict)
    residuals: list[Residual] = Field(default_factory=list)
    decode_residuals: list[DecodeResidual] = Field(
        default_factory=list, description="Decode steps per (run, arm, load point); absent in older files."
    )
    tpot_residuals: list[DecodeResidual] = Field(
        default_factory=list,
        description="Mean step over sweep requests' whole decode windows (prefill chunks and intake included) "
        "per (run, arm, load point); absent in older files.",
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
            raise CalibrationError(f"{path}: schema_version {version!r}; this kvbench reads {SCHEMA_VERSION}")
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise CalibrationError(f"{path}: {first_problem(error, whole='calibration')}") from None

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
            host_overlaps_gpu=self.host_overlaps_gpu,
            prefill_host_s=self.fitted_prefill_host_s,
            step_extra_s=backend.step_extra_s.value if backend else 0.0,
        )

    @property
    def fitted_prefill_host_s(self) -> float | None:
        """A prefill step's own host seconds where the fit kept one; None: the step overhead."""
        return self.prefill_host_s.value if self.prefill_host_s is not None and self.prefill_host_s.fitted else None

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
