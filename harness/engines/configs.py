"""Scenario-side configuration of each engine kind (the ``engine:`` section of a scenario).

One model per kind, joined into a discriminated union on ``kind``; a new engine adds its
model here and its lifecycle module to :mod:`kvbench.harness.engines.registry`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kvbench.harness.model import StrictModel


class Parallelism(StrictModel):
    """How many GPUs one deployment of the engine uses."""

    tp: int = Field(default=1, ge=1, description="Tensor parallel degree.")
    pp: int = Field(default=1, ge=1, description="Pipeline parallel degree.")
    dp: int = Field(default=1, ge=1, description="Data parallel degree.")
    replicas: int = Field(default=1, ge=1, description="Independent engine replicas.")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.replicas


class SimEngineConfig(StrictModel):
    """The built-in engine simulator (``kvbench sim serve``), started as a real subprocess."""

    kind: Literal["sim"]
    model: str = Field(description="Simulator model profile, e.g. 'llama-3.1-8b' (kvbench sim profiles).")
    hardware: str = Field(description="Simulator hardware profile, e.g. 'h100-sxm'.")
    parallelism: Parallelism = Parallelism()
    dtype: Literal["bf16", "fp16", "fp8"] | None = Field(
        default=None, description="Weight/KV dtype; default: the model profile's."
    )
    max_batch_tokens: int = Field(default=8192, ge=64, description="Per-step token budget (chunked prefill).")
    block_tokens: int = Field(default=16, ge=1, description="Tokens per KV block in the prefix cache.")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    startup_timeout_s: float = Field(default=60.0, gt=0)
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535, description="Default: a free port.")


class OpenAIEngineConfig(StrictModel):
    """An endpoint kvbench does not start or stop (staging, production, a server you run)."""

    kind: Literal["openai"]
    model: str = Field(description="Model name sent in requests (as the server lists it in /v1/models).")
    base_url: str | None = Field(
        default=None, description="Endpoint for every arm, e.g. http://127.0.0.1:8000."
    )
    arm_urls: dict[str, str] = Field(
        default_factory=dict, description="Per-arm endpoints (arm name -> URL); overrides base_url."
    )
    api_key_env: str | None = Field(
        default=None, description="Name of the environment variable holding the API key (never the key)."
    )
    hardware: str = Field(default="unknown", description="Free-text hardware label for reports.")
    parallelism: Parallelism = Parallelism()
    startup_timeout_s: float = Field(default=30.0, gt=0, description="How long to wait for /health.")


EngineConfig = Annotated[SimEngineConfig | OpenAIEngineConfig, Field(discriminator="kind")]
