"""The engine kinds this stage ships: vLLM (and its prefill/decode deployment), SGLang, TensorRT-LLM and any
OpenAI-compatible endpoint.

Imported by the package (``harness/engines/__init__.py``), so they are registered wherever an engine
module is. The simulator registers its own kind in ``harness.sim``.
"""

from __future__ import annotations

from harness.client.scrape import AUTO, SGLANG, TRTLLM, VLLM

from . import sglang, sglang_offload, trtllm, trtllm_offload, vllm, vllm_fleet, vllm_offload, vllm_pd
from .configs import (
    OpenAIEngineConfig,
    SglangEngineConfig,
    TrtllmEngineConfig,
    VllmEngineConfig,
    VllmPdEngineConfig,
)
from .kinds import EngineKind, register, support_check
from .openai import OpenAIEngine

register(
    EngineKind(
        "openai", OpenAIEngineConfig, OpenAIEngine, None, AUTO, "OpenAI-compatible endpoint", starts_process=False
    )
)
register(
    EngineKind(
        "vllm",
        VllmEngineConfig,
        vllm.VllmEngine,
        support_check(VllmEngineConfig, vllm_offload.check_supported),
        VLLM,
        "vLLM",
        fleet_shared_tier=vllm_fleet.shared_tier,
        names_replica=True,
        host_link=vllm.host_link_target,
    )
)
register(
    EngineKind(
        "sglang",
        SglangEngineConfig,
        sglang.SglangEngine,
        support_check(SglangEngineConfig, sglang_offload.check_supported),
        SGLANG,
        "SGLang",
        host_link=sglang.host_link_target,
    )
)
register(
    EngineKind(
        "trtllm",
        TrtllmEngineConfig,
        trtllm.TrtllmEngine,
        support_check(TrtllmEngineConfig, trtllm_offload.check_supported),
        TRTLLM,
        "TensorRT-LLM",
    )
)
register(
    EngineKind(
        "vllm-pd",
        VllmPdEngineConfig,
        vllm_pd.VllmPdEngine,
        support_check(VllmPdEngineConfig, vllm_pd.check_pd_supported),
        VLLM,
        "vLLM P/D",
        host_link=vllm_pd.host_link_target,
    )
)
