"""Analytical prefill model for KV-cache offloading (after the Pliops deck), as pure functions.

Symbols (all **per GPU**; with tensor parallelism each rank does 1/TP of the FLOPs and holds
1/TP of the KV heads, and bandwidths are those one GPU sees):

========  ===========================================================  ==========
symbol    meaning                                                      unit
========  ===========================================================  ==========
N         prompt length                                                tokens
T         compute time per prompt token (prefill, averaged over N)     s/token
|KV_tok|  KV-cache bytes per token                                     B/token
R         time to load one token's KV from the tier: |KV_tok|/BW_read  s/token
W         time to store one token's KV to the tier: |KV_tok|/BW_write  s/token
a         reuse ratio: fraction of the prompt found in the cache       1
e         compute-to-load ratio T/R                                    1
a*        crossover reuse e/(1+e)                                      1
========  ===========================================================  ==========

Prefill with offloading loads the cached ``a·N`` tokens, computes the other ``(1−a)·N`` and
stores their KV; the model assumes the three overlap perfectly, so the slowest one sets TTFT::

    TTFT_noKV = N·T
    TTFT_KV   = max(a·N·R, (1−a)·N·W, (1−a)·N·T)
    speedup   = TTFT_noKV / TTFT_KV

Below ``a*`` prefill is compute-bound (speedup ``1/(1−a)``), above it IO-bound (speedup
``e/a``); the peak, ``1+e``, is at ``a*``, and full reuse gives ``e``.

How much load and compute really overlap is the offload profile's ``load_overlap``
(:func:`ttft_overlap`), with ``C = a·N`` cached and ``M = (1−a)·N`` new tokens and ``L`` layers::

    none           TTFT = max(C·R + M·T, M·W)                                   load, then compute
    layerwise      TTFT = max(C·R/L + (L−1)/L · max(C·R, M·T) + M·T/L, M·W)     an L-stage pipeline
    bidirectional  TTFT = max(C·T·R/(T+R) + M·T, M·W)                            Cake

Bidirectional (Cake) computes the prefix's first ``h`` tokens while loading the other ``C−h``;
``max(h·T, (C−h)·R)`` is smallest at ``h* = C·R/(T+R)``. The deck's ``TTFT_KV`` is the layerwise
limit ``L → ∞``. Bandwidths are in GB/s
(1e9 B/s) and FLOP rates in FLOP/s, as in :mod:`offload.profiles`. See
``docs/analytical-model.md`` for the derivation, the assumptions and a worked example.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from common.schema import StrictModel

from .profiles import LoadOverlap, OffloadTier

GB = 1e9
"""Bytes per GB; bandwidths here are in GB/s like the offload profiles'."""

Regime = Literal["compute-bound", "io-bound", "write-bound"]


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


class ModelShape(StrictModel):
    """The parts of a transformer's shape the model needs."""

    name: str = ""
    param_count: float = Field(
        gt=0,
        description="Parameters multiplied per prompt token: the non-embedding count (exclude the "
        "input embedding, and the LM head, which prefill applies to the last token only).",
    )
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0, description="Model width d_model.")
    kv_heads: int = Field(gt=0, description="Key/value heads (GQA groups).")
    head_dim: int = Field(gt=0)
    dtype_bytes: float = Field(default=2, gt=0, description="Bytes per KV element (2 for bf16/fp16).")
    attention_dim: int | None = Field(
        default=None, gt=0, description="Query heads × head_dim, if it differs from hidden."
    )

    @property
    def effective_attention_dim(self) -> int:
        return self.attention_dim if self.attention_dim is not None else self.hidden


class Hardware(StrictModel):
    """One GPU's compute and memory, plus the tensor-parallel degree the model runs at."""

    name: str = ""
    peak_flops: float = Field(gt=0, description="Dense peak FLOP/s of one GPU at the compute dtype.")
    mfu: float = Field(default=0.5, gt=0, le=1, description="Model FLOPs utilisation reached in prefill.")
    hbm_gbps: float | None = Field(default=None, gt=0, description="HBM bandwidth of one GPU in GB/s.")
    tp: int = Field(default=1, ge=1, description="Tensor-parallel degree.")


LLAMA_3_1_8B = ModelShape(
    name="Llama-3.1-8B",
    # 32 layers × (attention 41.9M + MLP 176.2M + norms) = 6.98e9; embedding and LM head excluded.
    param_count=6.98e9,
    layers=32,
    hidden=4096,
    kv_heads=8,
    head_dim=128,
    dtype_bytes=2,
)
"""Llama-3.1-8B in bf16 (config.json of meta-llama/Llama-3.1-8B)."""

H100_SXM = Hardware(name="H100 SXM", peak_flops=989e12, mfu=0.5, hbm_gbps=3350)
"""H100 SXM5: 989 TFLOP/s dense bf16 and 3.35 TB/s HBM3 (datasheet); MFU 0.5 is an assumption."""


# --------------------------------------------------------------------------------------------
# Per-token quantities
# --------------------------------------------------------------------------------------------


def flops_per_token(param_count: float, layers: int, attention_dim: int, context_tokens: int) -> float:
    """Average prefill FLOPs per prompt token at context N (FLOP/token).

    ``F(N) = 2·P + 2·L·d_attn·N``

    ``2·P`` is the weight matmuls (a multiply and an add per parameter). Attention of a token
    at position ``i`` costs ``4·L·d_attn·i`` (``QKᵀ`` and ``A·V``, 2 FLOPs per multiply-add,
    ``d_attn`` = query heads × head_dim); causal prefill averages ``i`` over 1..N to ≈ N/2, hence
    ``2·L·d_attn·N``. Total prefill FLOPs are ``N·F(N) = 2·P·N + 2·L·d_attn·N²``.
    """
    _positive(param_count=param_count, layers=layers, attention_dim=attention_dim)
    if context_tokens < 0:
        raise ValueError(f"context_tokens must be >= 0, got {context_tokens}")
    return 2.0 * param_count + 2.0 * layers * attention_dim * context_tokens


def compute_time_per_token(flops: float, peak_flops: float, mfu: float, tp: int = 1) -> float:
    """Compute time per prompt token T on one GPU (s/token).

    ``T = F / (TP · peak · MFU)`` with F in FLOP/token (:func:`flops_per_token`), peak in
    FLOP/s per GPU, MFU in (0, 1]: each of the TP ranks does 1/TP of the work in parallel.
    """
    _positive(flops=flops, peak_flops=peak_flops, mfu=mfu, tp=tp)
    if mfu > 1:
        raise ValueError(f"mfu must be <= 1, got {mfu}")
    return flops / (tp * peak_flops * mfu)


def model_time_per_token(model: ModelShape, hardware: Hardware, context_tokens: int) -> float:
    """T (s/token) of ``model`` on ``hardware`` at context N: ``F(N) / (TP · peak · MFU)``."""
    flops = flops_per_token(model.param_count, model.layers, model.effective_attention_dim, context_tokens)
    return compute_time_per_token(flops, hardware.peak_flops, hardware.mfu, hardware.tp)


def time_per_token_from_ttft(ttft_s: float, n_tokens: int) -> float:
    """T measured rather than modelled: ``T = TTFT_noKV / N`` (s/token), from a cold prefill."""
    _positive(ttft_s=ttft_s, n_tokens=n_tokens)
    return ttft_s / n_tokens


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: float, tp: int = 1) -> float:
    """KV-cache bytes per token on one GPU (B/token).

    ``|KV_tok| = 2 · L · kv_heads · head_dim · dtype_bytes / TP``

    2 for K and V. TP ranks split the KV heads; when ``TP > kv_heads`` each rank keeps a
    replica of one head (as vLLM does), so the per-GPU head count is ``max(kv_heads/TP, 1)``.
    """
    _positive(layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype_bytes=dtype_bytes, tp=tp)
    if kv_heads % tp and tp % kv_heads:
        raise ValueError(f"kv_heads ({kv_heads}) and tp ({tp}) must divide one another")
    heads_per_gpu = max(kv_heads / tp, 1.0)
    return 2.0 * layers * heads_per_gpu * head_dim * dtype_bytes


def model_kv_bytes_per_token(model: ModelShape, tp: int = 1) -> float:
    """:func:`kv_bytes_per_token` of ``model`` at tensor-parallel degree ``tp`` (B/token)."""
    return kv_bytes_per_token(model.layers, model.kv_heads, model.head_dim, model.dtype_bytes, tp)


def read_time_per_token(kv_bytes: float, read_gbps: float) -> float:
    """Load time per cached token ``R = |KV_tok| / BW_read`` (s/token; bytes, GB/s)."""
    _positive(kv_bytes=kv_bytes, read_gbps=read_gbps)
    return kv_bytes / (read_gbps * GB)


def write_time_per_token(kv_bytes: float, write_gbps: float) -> float:
    """Store time per computed token ``W = |KV_tok| / BW_write`` (s/token; bytes, GB/s)."""
    _positive(kv_bytes=kv_bytes, write_gbps=write_gbps)
    return kv_bytes / (write_gbps * GB)


def compute_io_ratio(t_s: float, r_s: float) -> float:
    """``e = T / R`` (dimensionless): how many tokens' KV load in the time one token computes."""
    _positive(t_s=t_s, r_s=r_s)
    return t_s / r_s


def crossover_reuse(e: float) -> float:
    """Crossover reuse ratio ``a* = e / (1 + e)`` (dimensionless, in [0, 1)).

    Solves ``a·R = (1−a)·T``: below ``a*`` computing the missing tokens takes longer than
    loading the cached ones (compute-bound), above it loading does (IO-bound). Example: e = 9
    gives a* = 0.9.
    """
    if e < 0:
        raise ValueError(f"e must be >= 0, got {e}")
    return e / (1.0 + e)


# --------------------------------------------------------------------------------------------
# TTFT and speedup
# --------------------------------------------------------------------------------------------


def ttft_no_kv(n_tokens: float, t_s: float) -> float:
    """Prefill time without a KV cache: ``TTFT_noKV = N · T`` (s)."""
    _positive(n_tokens=n_tokens, t_s=t_s)
    return n_tokens * t_s


def ttft_kv(n_tokens: float, a: float, t_s: float, r_s: float, w_s: float) -> float:
    """Prefill time with a fraction ``a`` of the prompt in the cache (s).

    ``TTFT_KV = max(a·N·R, (1−a)·N·W, (1−a)·N·T)``: loading the hits, storing the misses'
    KV and computing the misses overlap, so the slowest of the three sets TTFT.
    """
    _check_reuse(a)
    _positive(n_tokens=n_tokens, t_s=t_s, r_s=r_s, w_s=w_s)
    return max(a * n_tokens * r_s, (1.0 - a) * n_tokens * w_s, (1.0 - a) * n_tokens * t_s)


def ttft_overlap(
    n_tokens: float, a: float, t_s: float, r_s: float, w_s: float, overlap: LoadOverlap, layers: int = 32
) -> float:
    """Prefill time (s) with ``a·N`` tokens cached, under a load/compute overlap mode.

    With ``C = a·N`` cached tokens loaded at R s/token and ``M = (1−a)·N`` new tokens computed at
    T s/token (their KV stored at W s/token in the background):

    * ``none``: ``max(C·R + M·T, M·W)`` -- the load finishes before the new tokens' prefill;
    * ``layerwise``: ``max(C·R/L + (L−1)/L · max(C·R, M·T) + M·T/L, M·W)`` -- layer ``i+1``
      loads while layer ``i`` computes, a pipeline of ``L = layers`` stages;
    * ``bidirectional``: ``max(C·T·R/(T+R) + M·T, M·W)`` -- Cake: the prefix's head is computed
      while its tail loads; ``max(h·T, (C−h)·R)`` is smallest at ``h = C·R/(T+R)``
      (:func:`bidirectional_split`). Setting ``h = C`` or ``h = 0`` gives compute-only and
      ``none``, so this is never slower than either.

    T is the per-token average over the prompt (:func:`model_time_per_token`); for the head of a
    long prefix, whose attention is cheaper than average, this is pessimistic, so the simulator's
    chunk-by-chunk split finds somewhat larger gains at long contexts.
    """
    _check_reuse(a)
    _positive(n_tokens=n_tokens, t_s=t_s, r_s=r_s, w_s=w_s, layers=layers)
    cached, new = a * n_tokens, (1.0 - a) * n_tokens
    load, compute, store = cached * r_s, new * t_s, new * w_s
    if overlap == "none":
        main = load + compute
    elif overlap == "layerwise":
        main = load / layers + (layers - 1) / layers * max(load, compute) + compute / layers
    elif overlap == "bidirectional":
        main = cached * t_s * r_s / (t_s + r_s) + compute
    else:
        raise ValueError(f"overlap must be one of 'none', 'layerwise', 'bidirectional', got {overlap!r}")
    return max(main, store)


def bidirectional_split(n_tokens: float, a: float, t_s: float, r_s: float) -> float:
    """Cake's meeting point ``h* = a·N·R/(T+R)`` (tokens): recompute the first h*, load the rest."""
    _check_reuse(a)
    _positive(n_tokens=n_tokens, t_s=t_s, r_s=r_s)
    return a * n_tokens * r_s / (t_s + r_s)


def bidirectional_gain(t_s: float, r_s: float) -> float:
    """Cached-prefix time of the better of compute-only and load-only over bidirectional's (1).

    ``min(C·T, C·R) / (C·T·R/(T+R)) = (T+R)/max(T, R) = 1 + min(e, 1/e)`` with ``e = T/R``: at
    most 2, reached where computing and loading a token take equally long (``e = 1``).
    """
    _positive(t_s=t_s, r_s=r_s)
    return (t_s + r_s) / max(t_s, r_s)


def speedup(a: float, t_s: float, r_s: float, w_s: float) -> float:
    """TTFT speedup from the cache: ``TTFT_noKV / TTFT_KV = T / max(a·R, (1−a)·W, (1−a)·T)``.

    Dimensionless; N cancels. With ``W ≤ T``: ``1/(1−a)`` for ``a ≤ a*``, ``e/a`` for
    ``a ≥ a*``, so 1 at a = 0, ``1+e`` at a*, ``e`` at a = 1. With ``W > T`` writes can make
    it fall below 1 (``T/W`` at a = 0).
    """
    return ttft_no_kv(1.0, t_s) / ttft_kv(1.0, a, t_s, r_s, w_s)


def regime(a: float, t_s: float, r_s: float, w_s: float) -> Regime:
    """Which term of ``TTFT_KV`` dominates at reuse ``a``.

    ``"write-bound"`` if ``(1−a)·W`` exceeds both other terms (only possible when W > T);
    otherwise ``"io-bound"`` for ``a ≥ a*`` (loading the hits dominates; ties count as
    IO-bound) and ``"compute-bound"`` for ``a < a*``.
    """
    _check_reuse(a)
    _positive(t_s=t_s, r_s=r_s, w_s=w_s)
    if (1.0 - a) * w_s > max(a * r_s, (1.0 - a) * t_s):
        return "write-bound"
    return "io-bound" if a >= crossover_reuse(compute_io_ratio(t_s, r_s)) else "compute-bound"


# --------------------------------------------------------------------------------------------
# End-to-end throughput bound
# --------------------------------------------------------------------------------------------


def decode_kv_bytes(kv_bytes_per_token: float, n_in: float, n_out: float = 0) -> float:
    """``|KV(1)|``: KV bytes one decode step of one request reads (B).

    ``|KV(1)| = |KV_tok| · (N_in + N_out/2)``, the request's KV at its mean decode context
    (``≈ |KV_tok|·N_in`` when ``N_out ≪ N_in``).
    """
    _positive(kv_bytes_per_token=kv_bytes_per_token, n_in=n_in)
    if n_out < 0:
        raise ValueError(f"n_out must be >= 0, got {n_out}")
    return kv_bytes_per_token * (n_in + n_out / 2.0)


def e2e_tps_gain_bound(ttft_one_s: float, n_out: float, kv_one_bytes: float, hbm_gbps: float) -> float:
    """Upper bound on the end-to-end output-tokens/s gain from caching: ``1 + AP/AH``.

    * ``TTFT(1)`` (s): the prefill time of **one** request run alone, without a cache
      (``N·T``, or a measured cold TTFT).
    * ``AP = TTFT(1) / N_out`` (s/output token): that prefill's GPU time spread over the
      request's output tokens.
    * ``|KV(1)|`` (B): the KV bytes of that one request (:func:`decode_kv_bytes`).
    * ``AH = |KV(1)| / BW_HBM`` (s/output token): the HBM time one decode step of that request
      spends reading its KV, i.e. its memory-bound decode cost per output token.

    Both are seconds of GPU time per output token, so ``AP/AH`` is dimensionless. Without a
    cache each output token costs ``AP + AH``; a cache that removes prefill entirely leaves
    ``AH``, so throughput can grow by at most ``(AP + AH)/AH = 1 + AP/AH``. Weight reads and
    other per-step costs are shared by both sides and only shrink the real gain; so does a
    remaining TTFT_KV (see :func:`e2e_tps_gain`).
    """
    _positive(ttft_one_s=ttft_one_s, n_out=n_out, kv_one_bytes=kv_one_bytes, hbm_gbps=hbm_gbps)
    ap = ttft_one_s / n_out
    ah = kv_one_bytes / (hbm_gbps * GB)
    return 1.0 + ap / ah


def e2e_tps_gain(ttft_no_kv_s: float, ttft_kv_s: float, n_out: float, kv_one_bytes: float, hbm_gbps: float) -> float:
    """Gain when the cache shortens prefill to ``TTFT_KV`` instead of removing it (dimensionless).

    ``(AP + AH) / (AP_KV + AH)`` with ``AP_KV = TTFT_KV / N_out`` and AP, AH as in
    :func:`e2e_tps_gain_bound`; it tends to ``1 + AP/AH`` as ``TTFT_KV → 0``.
    """
    _positive(ttft_no_kv_s=ttft_no_kv_s, n_out=n_out, kv_one_bytes=kv_one_bytes, hbm_gbps=hbm_gbps)
    if ttft_kv_s < 0:
        raise ValueError(f"ttft_kv_s must be >= 0, got {ttft_kv_s}")
    ah = kv_one_bytes / (hbm_gbps * GB)
    return (ttft_no_kv_s / n_out + ah) / (ttft_kv_s / n_out + ah)


# --------------------------------------------------------------------------------------------
# Bundled prediction
# --------------------------------------------------------------------------------------------


class Prediction(StrictModel):
    """Inputs and outputs of the prefill model for one prompt length and reuse ratio.

    Build it with :func:`predict` or :func:`predict_for`; constructing or loading one with
    outputs that do not follow from its inputs is an error.
    """

    n_tokens: int = Field(gt=0, description="Prompt length N (tokens).")
    a: float = Field(ge=0, le=1, description="Reuse ratio: fraction of the prompt in the cache.")
    t_s: float = Field(gt=0, description="T: compute time per prompt token (s/token).")
    r_s: float = Field(gt=0, description="R: load time per cached token (s/token).")
    w_s: float = Field(gt=0, description="W: store time per computed token (s/token).")
    e: float = Field(description="T/R.")
    a_star: float = Field(description="Crossover reuse e/(1+e).")
    regime: Regime
    ttft_no_kv_s: float = Field(description="N·T (s).")
    ttft_kv_s: float = Field(description="max(a·N·R, (1−a)·N·W, (1−a)·N·T) (s).")
    speedup: float = Field(description="ttft_no_kv_s / ttft_kv_s.")

    @model_validator(mode="after")
    def _outputs_follow_from_inputs(self) -> Prediction:
        expected = _outputs(self.n_tokens, self.a, self.t_s, self.r_s, self.w_s)
        for key, value in expected.items():
            got = getattr(self, key)
            same = got == value if isinstance(value, str) else math.isclose(got, value, rel_tol=1e-9)
            if not same:
                raise ValueError(f"{key}={got!r} does not follow from the inputs (expected {value!r})")
        return self


def _outputs(n_tokens: int, a: float, t_s: float, r_s: float, w_s: float) -> dict[str, float | str]:
    e = compute_io_ratio(t_s, r_s)
    no_kv = ttft_no_kv(n_tokens, t_s)
    with_kv = ttft_kv(n_tokens, a, t_s, r_s, w_s)
    return {
        "e": e,
        "a_star": crossover_reuse(e),
        "regime": regime(a, t_s, r_s, w_s),
        "ttft_no_kv_s": no_kv,
        "ttft_kv_s": with_kv,
        "speedup": no_kv / with_kv,
    }


def predict(n_tokens: int, a: float, *, t_s: float, r_s: float, w_s: float) -> Prediction:
    """The model's outputs for prompt length N, reuse ``a`` and per-token times T, R, W (s/token)."""
    return Prediction.model_validate(
        {"n_tokens": n_tokens, "a": a, "t_s": t_s, "r_s": r_s, "w_s": w_s} | _outputs(n_tokens, a, t_s, r_s, w_s)
    )


def predict_for(
    model: ModelShape,
    hardware: Hardware,
    tier: OffloadTier,
    n_tokens: int,
    a: float,
    *,
    t_s: float | None = None,
) -> Prediction:
    """:func:`predict` with T, R and W derived from a model, a GPU and an offload tier.

    T is :func:`model_time_per_token` at context ``n_tokens`` unless ``t_s`` gives it (for
    example a measured ``TTFT_noKV / N``); R and W use the per-GPU KV bytes at ``hardware.tp``
    and the tier's effective read and write bandwidths.
    """
    t = t_s if t_s is not None else model_time_per_token(model, hardware, n_tokens)
    kv = model_kv_bytes_per_token(model, hardware.tp)
    return predict(
        n_tokens,
        a,
        t_s=t,
        r_s=read_time_per_token(kv, tier.effective_read_gbps),
        w_s=write_time_per_token(kv, tier.effective_write_gbps),
    )


# --------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0 or math.isinf(value):
            raise ValueError(f"{name} must be a positive finite number, got {value}")


def _check_reuse(a: float) -> None:
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"reuse ratio a must be in [0, 1], got {a}")
