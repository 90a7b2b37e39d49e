"""kind -> engine factory. Modules are imported only when their kind is used, so the CLI stays light."""

from __future__ import annotations

import importlib
from typing import Protocol

from .base import Engine, LaunchContext
from .configs import EngineConfig


class EngineFactory(Protocol):
    def __call__(self, config: EngineConfig, context: LaunchContext) -> Engine: ...


_FACTORIES: dict[str, str] = {
    "sim": "harness.sim.engine:SimEngine",
    "openai": "harness.engines.openai:OpenAIEngine",
    "vllm": "harness.engines.vllm:VllmEngine",
    "sglang": "harness.engines.sglang:SglangEngine",
    "trtllm": "harness.engines.trtllm:TrtllmEngine",
}


def engine_kinds() -> list[str]:
    return sorted(_FACTORIES)


def create_engine(config: EngineConfig, context: LaunchContext) -> Engine:
    target = _FACTORIES.get(config.kind)
    if target is None:
        raise KeyError(f"no engine registered for kind {config.kind!r}; known: {', '.join(engine_kinds())}")
    module_name, attribute = target.split(":")
    factory: EngineFactory = getattr(importlib.import_module(module_name), attribute)
    return factory(config, context)
