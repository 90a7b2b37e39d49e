"""Model and hardware profiles of the simulator, and the deployment they make together.

Every number here has a source, so a simulated result can be traced back to a datasheet or a
model's ``config.json`` rather than to a fitted curve.

Models (from each model's Hugging Face ``config.json``; parameter counts from the model cards,
cross-checked by :meth:`ModelProfile.counted_params`, which agrees within 1 %):

* ``llama-3.1-8b`` -- meta-llama/Llama-3.1-8B-Instruct: 32 layers, hidden 4096, 32 heads,
  8 KV heads, head_dim 128, intermediate 14336, vocab 128256, 131072 positions, 8.03 B params.
* ``llama-3.1-70b`` -- meta-llama/Llama-3.1-70B-Instruct: 80 layers, hidden 8192, 64 heads,
  8 KV heads, head_dim 128, intermediate 28672, vocab 128256, 131072 positions, 70.6 B params.
* ``qwen3-14b`` -- Qwen/Qwen3-14B: 40 layers, hidden 5120, 40 heads, 8 KV heads, head_dim 128,
  intermediate 17408, vocab 151936, 40960 positions, 14.8 B params.
* ``tiny`` -- a synthetic 4-layer, ~45 M-parameter Llama-shaped model for tests and laptop demos;
  it corresponds to no released checkpoint.

Hardware (NVIDIA H100 and H200 datasheets, SXM form factor; the datasheets quote FLOP/s "with
sparsity", the dense figures used here are half of those):

* ``h100-sxm`` -- 989.4 TFLOP/s dense BF16/FP16, 1978.9 TFLOP/s dense FP8, 80 GB HBM3 (81559 MiB
  as reported by nvidia-smi), 3.35 TB/s, NVLink 4 900 GB/s, PCIe Gen5 x16 (64 GB/s per direction).
* ``h200-sxm`` -- the same compute as H100 SXM, 141 GB HBM3e (143771 MiB), 4.8 TB/s.

The efficiency factors are what makes these peak numbers into achieved ones; see
:class:`HardwareProfile` for why each value was chosen.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Dtype = Literal["bf16", "fp16", "fp8"]

DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp8": 1}

MIB = 1024 * 1024
GIB = 1024 * MIB


@dataclass(frozen=True)
class ModelProfile:
    """The shape of a decoder-only transformer (Llama/Qwen style: GQA attention, gated MLP)."""

    name: str
    hf_id: str
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    params: float
    """Total parameter count (model card), embeddings included."""
    max_position_embeddings: int
    tied_embeddings: bool = False
    dtype: Dtype = "bf16"
    """The dtype the checkpoint ships in; a deployment may override it."""

    def counted_params(self) -> float:
        """Parameters counted from the shape (a check on :attr:`params`; norms are ignored)."""
        attention = self.hidden_size * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)
        return float(self.layers * (attention + mlp) + embeddings)

    @property
    def lm_head_params(self) -> float:
        return float(self.vocab_size * self.hidden_size)

    @property
    def streamed_params(self) -> float:
        """Parameters a forward pass reads in full: everything but the input embedding table.

        The input embedding is a table lookup (a few rows per step); an untied LM head is a full
        matrix, a tied one is the embedding table itself.
        """
        return self.params if self.tied_embeddings else self.params - self.lm_head_params

    @property
    def body_params(self) -> float:
        """Parameters every token multiplies through: the transformer layers, without the LM head.

        The LM head runs only for tokens that are sampled (the last prompt token, each decode
        token), not for every prompt token.
        """
        return self.streamed_params - self.lm_head_params


@dataclass(frozen=True)
class HardwareProfile:
    """One GPU model and the links around it.

    Efficiency factors (dimensionless, applied to the peak figures):

    * ``mfu`` 0.65 -- achieved fraction of dense peak in prefill. Large BF16 GEMMs sustain roughly
      600-750 TFLOP/s on an H100 SXM (power-limited clocks), and FlashAttention-3 reaches about
      600-750 TFLOP/s in the forward pass at head_dim 128 (Shah et al., 2024). 0.65 puts a cold
      128k-token Llama-3.1-8B prefill on one H100 at ~10 s, which is what vLLM measures.
    * ``hbm_efficiency`` 0.85 -- achieved fraction of HBM bandwidth in decode (memory-bound
      kernels typically stream at 80-90 % of the datasheet bandwidth); with the step overhead this
      gives ~6.3 ms per token for Llama-3.1-8B BF16 at batch 1 on H100, in line with vLLM.
    * ``host_link_bytes_per_s`` 50 GB/s -- achieved pinned host-to-device copy rate of a PCIe
      Gen5 x16 link (64 GB/s theoretical per direction). Each GPU has its own link.
    * ``allreduce_bus_bytes_per_s`` 360 GB/s -- NCCL all-reduce "bus bandwidth" that nccl-tests
      report on 8x H100 SXM over NVLink 4 (900 GB/s bidirectional per GPU); used with the ring
      formula time = 2(n-1)/n x bytes / busbw.
    * ``allreduce_latency_s`` 8 us -- small-message all-reduce latency on NVLink (vLLM's custom
      all-reduce kernel), which dominates tensor-parallel decode.
    """

    name: str
    description: str
    peak_bf16_flops: float
    peak_fp8_flops: float
    mfu: float
    hbm_bytes: float
    hbm_bytes_per_s: float
    hbm_efficiency: float
    host_link_bytes_per_s: float
    allreduce_bus_bytes_per_s: float
    allreduce_latency_s: float
    gpus_per_node: int = 8

    def peak_flops(self, dtype: Dtype) -> float:
        return self.peak_fp8_flops if dtype == "fp8" else self.peak_bf16_flops


MODELS: dict[str, ModelProfile] = {
    model.name: model
    for model in (
        ModelProfile(
            name="llama-3.1-8b",
            hf_id="meta-llama/Llama-3.1-8B-Instruct",
            layers=32,
            hidden_size=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            intermediate_size=14336,
            vocab_size=128256,
            params=8.03e9,
            max_position_embeddings=131072,
        ),
        ModelProfile(
            name="llama-3.1-70b",
            hf_id="meta-llama/Llama-3.1-70B-Instruct",
            layers=80,
            hidden_size=8192,
            heads=64,
            kv_heads=8,
            head_dim=128,
            intermediate_size=28672,
            vocab_size=128256,
            params=70.6e9,
            max_position_embeddings=131072,
        ),
        ModelProfile(
            name="qwen3-14b",
            hf_id="Qwen/Qwen3-14B",
            layers=40,
            hidden_size=5120,
            heads=40,
            kv_heads=8,
            head_dim=128,
            intermediate_size=17408,
            vocab_size=151936,
            params=14.8e9,
            max_position_embeddings=40960,
        ),
        ModelProfile(
            name="tiny",
            hf_id="kvbench/tiny-sim",
            layers=4,
            hidden_size=512,
            heads=8,
            kv_heads=4,
            head_dim=64,
            intermediate_size=1536,
            vocab_size=32000,
            params=4.535e7,
            max_position_embeddings=32768,
        ),
    )
}

HARDWARE: dict[str, HardwareProfile] = {
    hw.name: hw
    for hw in (
        HardwareProfile(
            name="h100-sxm",
            description="NVIDIA H100 SXM5 80GB (HBM3, NVLink 4, PCIe Gen5)",
            peak_bf16_flops=989.4e12,
            peak_fp8_flops=1978.9e12,
            mfu=0.65,
            hbm_bytes=81559 * MIB,
            hbm_bytes_per_s=3.35e12,
            hbm_efficiency=0.85,
            host_link_bytes_per_s=50e9,
            allreduce_bus_bytes_per_s=360e9,
            allreduce_latency_s=8e-6,
        ),
        HardwareProfile(
            name="h200-sxm",
            description="NVIDIA H200 SXM 141GB (HBM3e, NVLink 4, PCIe Gen5)",
            peak_bf16_flops=989.4e12,
            peak_fp8_flops=1978.9e12,
            mfu=0.65,
            hbm_bytes=143771 * MIB,
            hbm_bytes_per_s=4.8e12,
            hbm_efficiency=0.85,
            host_link_bytes_per_s=50e9,
            allreduce_bus_bytes_per_s=360e9,
            allreduce_latency_s=8e-6,
        ),
    )
}

SHIPPED_DEPLOYMENTS: tuple[tuple[str, str, int, Dtype, Dtype | None], ...] = (
    # (model, hardware, tp, weights dtype, KV dtype or None = the weights'): the combinations bundled
    # scenarios and shipped calibrations use
    ("llama-3.1-8b", "h100-sxm", 1, "bf16", None),
    ("llama-3.1-8b", "h200-sxm", 1, "bf16", None),
    ("llama-3.1-70b", "h100-sxm", 8, "fp16", None),
    ("llama-3.1-70b", "h100-sxm", 8, "fp8", None),
    ("llama-3.1-70b", "h200-sxm", 4, "bf16", None),
    ("llama-3.1-70b", "h200-sxm", 4, "fp8", "bf16"),  # vLLM --quantization fp8: FP8 weights, BF16 KV
    ("qwen3-14b", "h100-sxm", 1, "bf16", None),
    ("tiny", "h100-sxm", 1, "bf16", None),
)

# CUDA context, NCCL buffers and captured CUDA graphs: memory vLLM's profiling run finds in use
# besides weights and activations (typically 1-2 GiB per GPU).
RUNTIME_RESERVE_BYTES = 1.5 * GIB


def dtype_label(dtype: str, kv_dtype: str | None) -> str:
    """``bf16``, or ``fp8 weights, bf16 KV`` when the KV cache has its own dtype."""
    return dtype if kv_dtype is None or kv_dtype == dtype else f"{dtype} weights, {kv_dtype} KV"


def get_model(name: str) -> ModelProfile:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown simulator model {name!r}; known: {', '.join(sorted(MODELS))}") from None


def get_hardware(name: str) -> HardwareProfile:
    try:
        return HARDWARE[name]
    except KeyError:
        known = ", ".join(sorted(HARDWARE))
        raise ValueError(f"unknown simulator hardware {name!r}; known: {known}") from None


@dataclass(frozen=True)
class Deployment:
    """A model on ``tp`` GPUs of one hardware kind: all derived sizes live here.

    ``dtype`` is the weights' dtype (it sets the GEMM peak and the weight bytes); ``kv_dtype`` the
    KV cache's (it sets KV bytes per token: HBM capacity, KV reads, tier loads and stores). ``None``
    keeps the KV cache in the weights' dtype. vLLM's ``--quantization fp8`` is FP8 weights with the
    KV cache in ``--dtype`` (``dtype="fp8", kv_dtype="bf16"``); ``--kv-cache-dtype fp8`` is FP8 KV.
    """

    model: ModelProfile
    hardware: HardwareProfile
    tp: int = 1
    dtype: Dtype = "bf16"
    kv_dtype: Dtype | None = None

    @classmethod
    def resolve(
        cls, model: str, hardware: str, tp: int = 1, dtype: Dtype | None = None, kv_dtype: Dtype | None = None
    ) -> Deployment:
        profile = get_model(model)
        weights = dtype or profile.dtype
        # a KV dtype equal to the weights' is the default: one spelling per deployment
        kv = None if kv_dtype == weights else kv_dtype
        deployment = cls(get_model(model), get_hardware(hardware), tp, weights, kv)
        deployment.validate()
        return deployment

    def validate(self) -> None:
        if self.tp < 1 or self.tp > self.hardware.gpus_per_node:
            raise ValueError(f"tp={self.tp}: must be between 1 and {self.hardware.gpus_per_node}")
        if self.model.heads % self.tp:
            heads = self.model.heads
            raise ValueError(f"tp={self.tp} does not divide the {heads} attention heads of {self.model.name}")

    @property
    def dtype_bytes(self) -> int:
        """Bytes per weight."""
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_cache_dtype(self) -> Dtype:
        return self.kv_dtype or self.dtype

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes per KV-cache element."""
        return DTYPE_BYTES[self.kv_cache_dtype]

    @property
    def label(self) -> str:
        return f"{self.model.name} {dtype_label(self.dtype, self.kv_dtype)} on {self.tp}x {self.hardware.name}"

    @property
    def weight_bytes_per_gpu(self) -> float:
        """Weights resident in HBM on each GPU."""
        return self.model.params * self.dtype_bytes / self.tp

    @property
    def streamed_weight_bytes_per_gpu(self) -> float:
        """Weights each GPU reads in every forward pass."""
        return self.model.streamed_params * self.dtype_bytes / self.tp

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers and all KV heads (the whole deployment)."""
        m = self.model
        return 2 * m.layers * m.kv_heads * m.head_dim * self.kv_dtype_bytes

    @property
    def kv_heads_per_gpu(self) -> int:
        # with fewer KV heads than GPUs, vLLM replicates each KV head on several GPUs
        return math.ceil(self.model.kv_heads / self.tp)

    @property
    def kv_bytes_per_token_per_gpu(self) -> int:
        m = self.model
        return 2 * m.layers * self.kv_heads_per_gpu * m.head_dim * self.kv_dtype_bytes

    def activation_bytes_per_gpu(self, max_batch_tokens: int) -> float:
        """Peak activation memory of one forward pass over ``max_batch_tokens`` tokens.

        A rough upper bound on what vLLM's profiling run measures: the residual stream and
        attention output (4 x hidden) plus the gate and up projections of the MLP
        (2 x intermediate / tp), in 16-bit activations.
        """
        m = self.model
        per_token = 4 * m.hidden_size + 2 * m.intermediate_size / self.tp
        return max_batch_tokens * per_token * 2

    def kv_cache_bytes_per_gpu(self, gpu_memory_utilization: float, max_batch_tokens: int) -> float:
        return (
            self.hardware.hbm_bytes * gpu_memory_utilization
            - self.weight_bytes_per_gpu
            - self.activation_bytes_per_gpu(max_batch_tokens)
            - RUNTIME_RESERVE_BYTES
        )

    def kv_cache_tokens(self, gpu_memory_utilization: float, max_batch_tokens: int) -> int:
        """Tokens of KV cache that fit in HBM (like vLLM's "GPU KV cache size: N tokens")."""
        free = self.kv_cache_bytes_per_gpu(gpu_memory_utilization, max_batch_tokens)
        if free <= 0:
            need = (self.weight_bytes_per_gpu + RUNTIME_RESERVE_BYTES) / 1e9
            have = self.hardware.hbm_bytes * gpu_memory_utilization / 1e9
            raise ValueError(
                f"{self.label}: no room for a KV cache (weights and runtime need {need:.1f} GB "
                f"per GPU, gpu_memory_utilization leaves {have:.1f} GB); raise tp or use fp8"
            )
        return int(free // self.kv_bytes_per_token_per_gpu)


def _int_field(config: Mapping[str, object], key: str, where: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{where}: field {key!r} must be a positive integer, got {value!r}")
    return value


HF_DTYPES: dict[str, Dtype] = {"bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "fp8"}


def model_from_hf_config(config: Mapping[str, object], name: str, where: str = "config.json") -> ModelProfile:
    """A model profile from a Hugging Face ``config.json`` (Llama/Qwen style decoder).

    ``head_dim`` defaults to ``hidden_size / num_attention_heads``, ``num_key_value_heads`` to
    the number of heads (no GQA); the parameter count is counted from the shape.
    """
    hidden = _int_field(config, "hidden_size", where)
    heads = _int_field(config, "num_attention_heads", where)
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    if not isinstance(kv_heads, int) or not isinstance(head_dim, int):
        raise ValueError(f"{where}: num_key_value_heads and head_dim must be integers")
    dtype = HF_DTYPES.get(str(config.get("torch_dtype", "bfloat16")), "bf16")
    tied = bool(config.get("tie_word_embeddings", False))
    profile = ModelProfile(
        name=name,
        hf_id=name,
        layers=_int_field(config, "num_hidden_layers", where),
        hidden_size=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_int_field(config, "intermediate_size", where),
        vocab_size=_int_field(config, "vocab_size", where),
        params=0.0,
        max_position_embeddings=_int_field(config, "max_position_embeddings", where),
        tied_embeddings=tied,
        dtype=dtype,
    )
    return dataclasses.replace(profile, params=profile.counted_params())


def known_model(profile: ModelProfile) -> str | None:
    """The simulator profile with the same shape (layers, widths, heads, vocabulary), if any."""

    def shape(m: ModelProfile) -> tuple[int, ...]:
        return (m.layers, m.hidden_size, m.heads, m.kv_heads, m.head_dim, m.intermediate_size, m.vocab_size)

    for name, known in MODELS.items():
        if shape(known) == shape(profile):
            return name
    return None
