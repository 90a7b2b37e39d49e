"""The ``engine:`` section of a scenario for the built-in simulator (``kind: sim``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from common.schema import StrictModel
from harness.engines.configs import Parallelism
from harness.engines.replicas import ReplicaFields
from offload.shapes import get_hardware, get_model

from .faults import Fault

NIXL_PUSH_GBPS = 49.0
"""KV push between two GPUs of one host with vLLM's NixlPushConnector, GB/s (reported in issue 44, not measured
by kvbench)."""
NIXL_PULL_TCP_GBPS = 0.5
"""KV pull over TCP on one host (NixlPullConnector's fallback), GB/s (reported in issue 44, not measured)."""
PER_TRANSFER_MS = 1.0
"""Fixed cost of one request's KV transfer (descriptor exchange, notification), ms: an assumed default until a
P/D run measures it."""


class Disaggregation(StrictModel):
    """A P/D layout: GPUs per pool and the KV link between them."""

    prefill_gpus: int = Field(default=1, ge=1, description="GPUs of the prefill pool (instances of tp GPUs each).")
    decode_gpus: int = Field(default=1, ge=1, description="GPUs of the decode pool (instances of tp GPUs each).")
    link_gbps: float = Field(
        default=NIXL_PUSH_GBPS,
        gt=0,
        description=f"KV link bandwidth per GPU, GB/s; {NIXL_PUSH_GBPS:g}: NIXL push on one host (reported), "
        f"{NIXL_PULL_TCP_GBPS:g}: pull over TCP (reported).",
    )
    per_transfer_ms: float = Field(
        default=PER_TRANSFER_MS, ge=0, description="Fixed cost of one request's KV transfer, ms (assumed)."
    )

    @property
    def label(self) -> str:
        return f"{self.prefill_gpus}P{self.decode_gpus}D"

    def instances(self, tp: int) -> tuple[int, int]:
        """(prefill, decode) instances of ``tp`` GPUs each; ValueError if a pool is not a multiple of ``tp``."""
        for pool, gpus in (("prefill_gpus", self.prefill_gpus), ("decode_gpus", self.decode_gpus)):
            if gpus % tp:
                raise ValueError(f"disaggregation.{pool} {gpus}: must be a multiple of parallelism.tp {tp}")
        return self.prefill_gpus // tp, self.decode_gpus // tp


class SimEngineConfig(ReplicaFields):
    """The built-in engine simulator (``kvbench sim serve``), started as a real subprocess."""

    kind: Literal["sim"]
    model: str = Field(description="Simulator model profile, e.g. 'llama-3.1-8b' (kvbench sim profiles).")
    hardware: str = Field(description="Simulator hardware profile, e.g. 'h100-sxm'.")
    parallelism: Parallelism = Parallelism()
    dtype: Literal["bf16", "fp16", "fp8"] | None = Field(
        default=None, description="Weight dtype (and the KV cache's unless kv_dtype); default: the model profile's."
    )
    kv_dtype: Literal["bf16", "fp16", "fp8"] | None = Field(
        default=None,
        description="KV-cache dtype; default: dtype. vLLM's --quantization fp8 is dtype fp8 with kv_dtype bf16.",
    )
    max_batch_tokens: int = Field(default=8192, ge=64, description="Per-step token budget (chunked prefill).")
    block_tokens: int = Field(default=16, ge=1, description="Tokens per KV block in the prefix cache.")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    num_gpu_blocks_override: int | None = Field(
        default=None, ge=1, description="HBM KV blocks instead of what the memory allows (vLLM's flag of that name)."
    )
    startup_timeout_s: float = Field(default=60.0, gt=0)
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535, description="Default: a free port.")
    faults: list[Fault] = Field(
        default_factory=list,
        description="Injected faults, for testing soaks and gates: latency_spike, http_error, drop_stream, "
        "slow_tier, full_tier (see docs/playbook.md).",
    )
    fault_seed: int = Field(default=0, description="Seed of the faults' probability draws.")
    calibration: Path | None = Field(
        default=None,
        strict=False,  # a path in YAML is a string
        description="Calibration file (kvbench sim calibrate) for this deployment: fitted overheads, "
        "efficiencies and offload-backend costs replace the datasheet figures. 'auto' (a reserved name, not a file): "
        "the calibration kvbench ships for this deployment; the engine's start says which.",
    )
    cuda_graphs: bool | None = Field(
        default=None,
        description="With calibration 'auto': the measured engine mode to imitate (true: CUDA graphs, false: "
        "eager); default: CUDA graphs where both were measured.",
    )
    disaggregation: Disaggregation | None = Field(
        default=None,
        description="Prefill/decode disaggregation inside the simulator process: pools of prefill_gpus and "
        "decode_gpus (instances of parallelism.tp GPUs) joined by a KV link of link_gbps per GPU and "
        "per_transfer_ms per transfer (reported and assumed figures, not fitted); the offload tiers sit on the "
        "prefill side. Default: colocated.",
    )
    client_time_s: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Seconds of a request's calibrated overhead that the client and HTTP stack of the machine "
        "running the simulator spend themselves (kvbench sim validate measures it before its run): the "
        "simulator charges the rest, so that a client there sees the measured host's TTFT. Calibrated only.",
    )

    # Checked here, not when the simulator starts: `kvbench validate` must catch a misspelt profile.
    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        get_model(value)
        return value

    @field_validator("hardware")
    @classmethod
    def _known_hardware(cls, value: str) -> str:
        get_hardware(value)
        return value

    @model_validator(mode="after")
    def _tensor_parallel_only(self) -> SimEngineConfig:
        parallel = self.parallelism
        if parallel.pp != 1 or parallel.dp != 1:
            raise ValueError(
                "the simulator models tensor parallelism only (within a replica): parallelism.pp and dp must be 1; "
                "several simulator replicas: engine.replicas"
            )
        if self.disaggregation is not None:
            self.disaggregation.instances(parallel.tp)
        return self
