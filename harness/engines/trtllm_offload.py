"""Render an engine-neutral :class:`OffloadProfile` into TensorRT-LLM's LLM-API options (a YAML file).

``trtllm-serve MODEL --backend pytorch --extra_llm_api_options FILE`` reads FILE as LLM-API
arguments that override its command line. :func:`render_trtllm_options` builds that mapping
(:class:`TrtllmLaunchPlan`); the engine (:mod:`harness.engines.trtllm`) writes it out.

* ``kv_cache_config.enable_block_reuse``: the GPU prefix cache (block reuse) on or off;
* ``kv_cache_config.host_cache_size``: the ``cpu`` tier, in **bytes** (TensorRT-LLM's secondary,
  host-memory block pool: evicted reusable blocks are offloaded there and onboarded on reuse).
  Each rank's KV cache manager allocates its own pool, so kvbench passes ``capacity_gb`` divided
  by ``tp * pp`` (kvbench's reading of the sources; not checked on hardware);
* ``kv_cache_config.free_gpu_memory_fraction``: always written, because a ``kv_cache_config`` in
  the YAML replaces the one trtllm-serve builds from ``--free_gpu_memory_fraction``;
* ``return_perf_metrics`` and ``enable_iter_perf_stats`` (``enable_metrics``): Prometheus text on
  ``/prometheus/metrics`` (trtllm-serve's ``/metrics`` is JSON iteration stats).

Only the cpu tier is rendered (``profile.backend`` ``auto`` or ``native``). Host offload serves
block reuse only, so an arm with a cpu tier needs prefix caching on. TensorRT-LLM has no endpoint
that drops the GPU prefix cache: ``between_turns: reset_prefix_cache`` is refused (use ``filler``).
Checked against TensorRT-LLM's ``llm_args.py`` / ``commands/serve.py`` / ``serve/openai_server.py``;
never run by kvbench (TensorRT-LLM cannot be installed on its machines).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from offload.profiles import OffloadProfile

from .configs import TrtllmEngineConfig

SUPPORTED = (
    "backend auto or native; tier cpu = kv_cache_config.host_cache_size (bytes), with prefix caching on; "
    "no disk or shared tier; between_turns modes filler, disable_prefix_cache or none "
    "(TensorRT-LLM has no prefix-cache reset endpoint)"
)
"""Listed in every 'unsupported' error."""

RESET_ADVICE = (
    "TensorRT-LLM has no endpoint that drops its GPU prefix cache; use between_turns mode 'filler' "
    "(filler traffic evicts turn 1's KV from GPU memory) or 'disable_prefix_cache'"
)


@dataclass(frozen=True)
class TrtllmLaunchPlan:
    """The LLM-API options kvbench passes to trtllm-serve (``--extra_llm_api_options``)."""

    options: Mapping[str, Any]
    notes: tuple[str, ...] = ()
    prefix_caching: bool = True
    host_cache_bytes: int | None = None

    def yaml_text(self) -> str:
        return yaml.safe_dump(_plain(self.options), sort_keys=True)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def check_supported(profile: OffloadProfile, config: TrtllmEngineConfig, between_turns: str | None = None) -> None:
    """Raise ValueError (naming what is supported) if TensorRT-LLM cannot realise ``profile``.

    ``between_turns`` is the workload's ``between_turns.mode`` when it has one.
    """
    where = f"offload profile {profile.name!r} on TensorRT-LLM"
    if between_turns == "reset_prefix_cache":
        raise ValueError(f"{where}: between_turns mode 'reset_prefix_cache' is not possible: {RESET_ADVICE}")
    if not profile.tiers:
        return
    if profile.backend not in ("auto", "native"):
        raise ValueError(
            f"{where}: backend {profile.backend!r} is vLLM's (LMCache connector); TensorRT-LLM offloads "
            f"to its own host block pool. Supported: {SUPPORTED}"
        )
    kinds = sorted(tier.kind for tier in profile.tiers)
    if kinds != ["cpu"]:
        raise ValueError(f"{where}: tiers {kinds} are not supported. Supported: {SUPPORTED}")
    if not profile.prefix_caching or between_turns == "disable_prefix_cache":
        raise ValueError(
            f"{where}: the host block pool only serves block reuse, so a cpu tier needs the GPU prefix "
            f"cache on (prefix_caching: true, between_turns mode other than 'disable_prefix_cache'). "
            f"Supported: {SUPPORTED}"
        )


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` merged into ``base`` (nested mappings merged key by key; ``extra`` wins elsewhere)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def render_trtllm_options(
    profile: OffloadProfile, config: TrtllmEngineConfig, prefix_caching: bool
) -> TrtllmLaunchPlan:
    """Render ``profile`` for ``config``. ``prefix_caching`` is the runner's word (False when the scenario
    disables the GPU prefix cache); the profile's own ``prefix_caching`` must agree for the cache to be on.

    ``config.extra_llm_api_options`` is merged first; what kvbench renders (the three
    ``kv_cache_config`` keys, ``tokens_per_block``, ``dtype``, ``load_format`` and the metrics switches
    when set) is applied on top.
    """
    check_supported(profile, config)
    caching = prefix_caching and profile.prefix_caching
    if profile.tiers and not caching:
        raise ValueError(
            f"offload profile {profile.name!r} on TensorRT-LLM: the GPU prefix cache is off for this arm, and "
            f"the host block pool only serves block reuse. Supported: {SUPPORTED}"
        )
    kv_cache: dict[str, Any] = {
        "enable_block_reuse": caching,
        "free_gpu_memory_fraction": config.free_gpu_memory_fraction,
    }
    notes: list[str] = []
    host_bytes: int | None = None
    if profile.tiers:
        cpu = profile.tiers[0]
        ranks = config.parallelism.tp * config.parallelism.pp
        host_bytes = int(cpu.capacity_gb * 1e9 // ranks)
        kv_cache["host_cache_size"] = host_bytes
        per_rank = f" per rank ({ranks} ranks)" if ranks > 1 else ""
        notes.append(f"cpu tier {cpu.capacity_gb:g} GB = host_cache_size {host_bytes} bytes{per_rank}")
        notes.append(f"chunk_tokens ({profile.chunk_tokens}) is not used: blocks are tokens_per_block tokens")
    if config.tokens_per_block is not None:
        kv_cache["tokens_per_block"] = config.tokens_per_block
    rendered: dict[str, Any] = {"kv_cache_config": kv_cache}
    if config.enable_metrics:
        rendered["return_perf_metrics"] = True
        rendered["enable_iter_perf_stats"] = True
    if config.dtype is not None:
        rendered["dtype"] = config.dtype
    if config.load_format is not None:
        rendered["load_format"] = config.load_format
    options = _merge(dict(config.extra_llm_api_options), rendered)
    return TrtllmLaunchPlan(options=options, notes=tuple(notes), prefix_caching=caching, host_cache_bytes=host_bytes)
