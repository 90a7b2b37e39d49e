"""The settings one simulator server runs with (the JSON file ``kvbench sim serve --config`` reads).

:class:`~harness.sim.engine.SimEngine` writes this file from the scenario's engine
section, the arm's offload profile and the runner's prefix-caching decision; ``kvbench sim serve``
can also build it from command-line options.

Fault injection (latency spikes, 5xx bursts, dropped streams, slow or full tiers) is the optional
field ``faults`` (see :mod:`harness.sim.faults`), read by the server's request path and by
the offload tiers; ``kvbench sim serve --faults FILE`` sets it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from common.schema import StrictModel
from offload.profiles import BUILTIN_PROFILES, OffloadProfile
from offload.shapes import Deployment

from .calibration import AUTO, Calibration, pick_shipped
from .config import Disaggregation, SimEngineConfig
from .faults import Fault
from .heldout import file_sha256
from .timemodel import Efficiencies


class SimSettings(StrictModel):
    """Everything a simulator server needs: the deployment, engine knobs and the offload tiers."""

    model: str = Field(description="Simulator model profile (kvbench sim profiles).")
    hardware: str = Field(description="Simulator hardware profile.")
    tp: int = Field(default=1, ge=1, le=8, description="Tensor parallel degree.")
    dtype: Literal["bf16", "fp16", "fp8"] | None = Field(
        default=None, description="Weight dtype (and the KV cache's unless kv_dtype); default: the model profile's."
    )
    kv_dtype: Literal["bf16", "fp16", "fp8"] | None = Field(
        default=None,
        description="KV-cache dtype; default: dtype. vLLM's --quantization fp8 is dtype fp8 with kv_dtype bf16.",
    )
    served_model_name: str | None = Field(default=None, description="Model name in the API; default: model.")
    max_batch_tokens: int = Field(default=8192, ge=64, description="Per-step token budget (chunked prefill).")
    max_num_seqs: int = Field(default=256, ge=1, description="Most sequences in one step (vLLM max_num_seqs).")
    block_tokens: int = Field(default=16, ge=1, description="Tokens per KV block.")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    num_gpu_blocks_override: int | None = Field(
        default=None, ge=1, description="HBM KV blocks instead of what the memory allows (vLLM's flag of that name)."
    )
    max_model_len: int | None = Field(
        default=None, ge=16, description="Longest prompt + output; default: what the model and KV cache allow."
    )
    default_max_tokens: int = Field(
        default=128, ge=1, description="Output tokens when a request gives no max_tokens (the sim never stops early)."
    )
    offload: OffloadProfile = Field(default=BUILTIN_PROFILES["hbm"], description="Offload tiers.")
    prefix_caching: bool = Field(
        default=True, description="False forces the HBM prefix cache off even if the profile enables it."
    )
    faults: list[Fault] = Field(
        default_factory=list,
        description="Injected faults (testing): latency spikes, 5xx bursts, dropped streams, slow or full tiers.",
    )
    fault_seed: int = Field(default=0, description="Seed of the faults' probability draws.")
    calibration: Calibration | None = Field(
        default=None, description="Fitted parameters (kvbench sim calibrate) for this deployment, inline."
    )
    calibration_file: str | None = Field(
        default=None, description="Where the calibration came from: its path, or 'auto: NAME' for a shipped one."
    )
    calibration_sha256: str | None = Field(
        default=None, description="SHA-256 of the calibration file's bytes: which version of it the run used."
    )
    shared_tier_dir: str | None = Field(
        default=None,
        description="A fleet's shared tier: the directory every replica keeps the shared tier's chunk index in.",
    )
    client_time_s: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Seconds of the calibrated overhead the local client spends itself."
    )
    disaggregation: Disaggregation | None = Field(
        default=None, description="Prefill/decode pools and their KV link (harness.sim.disagg); None: colocated."
    )

    @model_validator(mode="after")
    def _deployment_valid(self) -> SimSettings:
        deployment = self.deployment()
        deployment.kv_cache_tokens(self.gpu_memory_utilization, self.max_batch_tokens)
        if self.calibration is not None:
            self.calibration.check_deployment(deployment)
            self.calibration.backend_for(self.offload)
        return self

    def deployment(self) -> Deployment:
        return Deployment.resolve(self.model, self.hardware, self.tp, self.dtype, self.kv_dtype)

    @property
    def name(self) -> str:
        return self.served_model_name or self.model

    @property
    def hbm_prefix_caching(self) -> bool:
        """Whether the HBM prefix cache is on: the profile asks for it and the runner allows it."""
        return self.offload.prefix_caching and self.prefix_caching

    def efficiencies(self) -> Efficiencies | None:
        """The calibrated step-time factors (None: the datasheet model)."""
        if self.calibration is None:
            return None
        return self.calibration.efficiencies(self.deployment(), self.calibration.backend_for(self.offload))

    def tier_profile(self) -> OffloadProfile:
        """The offload profile with calibrated load rates and latencies on its tier."""
        return self.offload if self.calibration is None else self.calibration.calibrated_profile(self.offload)

    def request_overhead_s(self, prompt_tokens: int) -> float:
        """Calibrated time from a request's arrival to its first schedulable moment (0 uncalibrated).

        The fitted overhead holds the measured host's client and HTTP time; the local client's own
        (``client_time_s``) is spent before the request arrives and after its tokens leave, so it is
        taken out here rather than counted twice.
        """
        if self.calibration is None:
            return 0.0
        return max(0.0, self.calibration.request_overhead(prompt_tokens) - self.client_time_s)

    def request_intake_s(self, prompt_tokens: int, busy: bool = True) -> float:
        """Calibrated engine-blocking work of an arriving request (0 uncalibrated): stalls the running requests.

        ``busy``: the engine was running requests when it arrived (the offload backend's per-request
        intake counts only then).
        """
        if self.calibration is None:
            return 0.0
        return self.calibration.request_intake(prompt_tokens, self.calibration.backend_for(self.offload), busy)

    @classmethod
    def from_engine_config(cls, config: SimEngineConfig, profile: OffloadProfile, prefix_caching: bool) -> SimSettings:
        # SimEngineConfig already refused pp, dp and replicas other than 1 at validation
        parallel = config.parallelism
        calibration = None
        calibration_file = None if config.calibration is None else str(config.calibration)
        calibration_sha256 = None
        if config.calibration == Path(AUTO):
            deployment = Deployment.resolve(config.model, config.hardware, parallel.tp, config.dtype, config.kv_dtype)
            path, calibration = pick_shipped(deployment, config.cuda_graphs)
            calibration_file = f"auto: {path.name}"
            calibration_sha256 = file_sha256(path)
            # said once per engine start, so that a run's log shows which measured deployment it imitates
            print(f"calibration auto: {path.name} ({calibration.deployment.label})", file=sys.stderr)
            calibration.backend_for(profile, f"calibration {path.name}")
        elif config.calibration is not None:
            where = f"calibration {config.calibration}"
            calibration = Calibration.load(config.calibration)
            calibration_sha256 = file_sha256(config.calibration)
            deployment = Deployment.resolve(config.model, config.hardware, parallel.tp, config.dtype, config.kv_dtype)
            calibration.check_deployment(deployment, where)
            calibration.backend_for(profile, where)
        return cls(
            model=config.model,
            hardware=config.hardware,
            tp=config.parallelism.tp,
            dtype=config.dtype,
            kv_dtype=config.kv_dtype,
            max_batch_tokens=config.max_batch_tokens,
            block_tokens=config.block_tokens,
            gpu_memory_utilization=config.gpu_memory_utilization,
            num_gpu_blocks_override=config.num_gpu_blocks_override,
            offload=profile,
            prefix_caching=prefix_caching,
            faults=list(config.faults),
            fault_seed=config.fault_seed,
            calibration=calibration,
            calibration_file=calibration_file,
            calibration_sha256=calibration_sha256,
            client_time_s=config.client_time_s,
            disaggregation=config.disaggregation,
        )

    @classmethod
    def load(cls, path: Path) -> SimSettings:
        return cls.model_validate_json(path.read_text(encoding="utf-8"))

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.model_dump(mode="json")
        if data["disaggregation"] is None:
            del data["disaggregation"]  # a colocated engine's file stays as it was before P/D existed
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
