"""Hit rates: the share of prompt tokens an engine served from a cache (GPU prefix cache or offload tier)
instead of computing them. One definition for probe runs, sweeps, soaks and replays.

Two sources, in order of trust:

* **usage** (per request): ``Σ cached_tokens / Σ prompt_tokens`` over the requests' own ``usage``
  (vLLM's ``prompt_tokens_details.cached_tokens`` counts GPU prefix-cache and connector hits once per
  request, when the request is admitted);
* **/metrics counters** (per engine): ``(Δ gpu_prefix_hits + Δ external_prefix_hits) / Δ prompt_tokens``.
  vLLM counts a prefix-cache lookup each time it tries to schedule a request, and a request waiting for
  an asynchronous load from an offload tier (LMCache) is looked up again on every step, so GPU queries
  and GPU hits run ahead of the prompt tokens: on 1× H100 with LMCache, one 60 s interval counted 6.1 M
  GPU queries and 0.89 M GPU hits + 1.73 M connector hits for 2.38 M prompt tokens
  (docs/results/gpu-soak-llama8b-lmcache-h100). A counter ratio above 1 therefore means the counters
  overlap; it is reported as unknown, never capped at 100 %.
"""

from __future__ import annotations

OVERLAP_TOLERANCE = 1e-9
"""A counter ratio this far above 1 is still rounding, not overlapping counters."""


def usage_hit_rate(prompt_tokens: float, cached_tokens: float) -> float | None:
    """``Σ cached / Σ prompt``, both summed over the requests reporting both; None without prompt tokens."""
    return cached_tokens / prompt_tokens if prompt_tokens > 0 else None


def counter_hit_rate(prompt_tokens: float | None, gpu_hits: float | None, external_hits: float | None) -> float | None:
    """``(gpu_hits + external_hits) / prompt_tokens`` from counter deltas; None when there were no prompt
    tokens or when the hits exceed them (the counters overlap: see the module docstring)."""
    if not prompt_tokens or prompt_tokens <= 0:
        return None
    rate = ((gpu_hits or 0.0) + (external_hits or 0.0)) / prompt_tokens
    return rate if rate <= 1.0 + OVERLAP_TOLERANCE else None
