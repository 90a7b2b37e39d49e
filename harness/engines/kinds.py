"""The engine kinds kvbench knows: one row per kind, read by every stage that differs per kind.

A row names, as ``"module:attribute"`` strings imported on first use (so ``kvbench --help`` and a
simulator run never import vLLM's renderers):

* ``config``: the pydantic model of the scenario's ``engine:`` section for this kind;
* ``factory``: the :class:`~harness.engines.base.Engine` that starts (or attaches to) it;
* ``check_supported``: ``f(profile, config, between_turns)`` raising ``ValueError`` when the
  kind cannot realise an arm's offload profile (None: every profile is accepted);
* ``metrics``: the family of ``/metrics`` names it exposes (:mod:`harness.client.scrape`);
* ``label`` and ``simulated``: how reports name it, and whether its figures are modelled;
* ``starts_process``: kvbench starts (and can kill, pause, restart) the engine; False for kinds it
  only attaches to, which ``soak.faults`` cannot act on (and whose hardware is what the scenario declares);
* ``fleet_shared_tier``: ``f(config, context)`` returning an async context manager that starts the
  arm's shared tier once for a fleet and yields a :class:`~harness.engines.base.SharedTierHandle`
  (or None when the profile has no shared tier); None: the kind's replicas share nothing
  (each replica realises its profile on its own);
* ``host_link``: ``f(config)`` returning the :class:`~harness.engines.host_link.HostLinkTarget` (the
  engine's python and the GPUs it will use) that the host-link probe runs with at the start of every
  run attempt, or None for a config that does not run on this machine's GPUs (vLLM on ``device: cpu``);
  None: the kind never does (the simulator, attached endpoints, kinds started without a python).

Adding an engine is adding a row here and the modules it names; no other stage branches on kind.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from harness.client.scrape import AUTO, SGLANG, TRTLLM, VLLM, EngineFamily
from offload.profiles import OffloadProfile

from .base import Engine, EngineConfigModel, LaunchContext, SharedTierHandle
from .host_link import HostLinkTarget


class EngineFactory(Protocol):
    def __call__(self, config: EngineConfigModel, context: LaunchContext) -> Engine: ...


SupportCheck = Callable[[OffloadProfile, EngineConfigModel, str | None], None]


@dataclass(frozen=True)
class EngineKind:
    kind: str
    config: str
    factory: str
    check_supported: str | None
    metrics: EngineFamily
    label: str
    """The engine's name in reports (``vLLM``, ``SGLang``...)."""
    simulated: bool = False
    """Its figures are modelled, not measured (reports say so beside every figure)."""
    starts_process: bool = True
    fleet_shared_tier: str | None = None
    """``"module:attribute"`` of the fleet shared-tier starter (see the module docstring)."""
    names_replica: bool = False
    """A fleet's replica of this kind names itself in every response (``X-Kvbench-Replica``,
    :mod:`harness.engines.kvbench_replica_header`), so requests through a router are attributed by header."""
    host_link: str | None = None
    """``"module:attribute"`` of the host-link target of a config (see the module docstring)."""


KINDS: Mapping[str, EngineKind] = MappingProxyType(
    {
        row.kind: row
        for row in (
            EngineKind("sim", "harness.sim.config:SimEngineConfig", "harness.sim.engine:SimEngine", None, VLLM,
                       "kvbench simulator", simulated=True,
                       fleet_shared_tier="harness.sim.fleet:shared_tier", names_replica=True),
            EngineKind("openai", "harness.engines.configs:OpenAIEngineConfig", "harness.engines.openai:OpenAIEngine",
                       None, AUTO, "OpenAI-compatible endpoint", starts_process=False),
            EngineKind("vllm", "harness.engines.configs:VllmEngineConfig", "harness.engines.vllm:VllmEngine",
                       "harness.engines.vllm_offload:check_supported", VLLM, "vLLM",
                       fleet_shared_tier="harness.engines.vllm_fleet:shared_tier", names_replica=True,
                       host_link="harness.engines.vllm:host_link_target"),
            EngineKind("sglang", "harness.engines.configs:SglangEngineConfig", "harness.engines.sglang:SglangEngine",
                       "harness.engines.sglang_offload:check_supported", SGLANG, "SGLang",
                       host_link="harness.engines.sglang:host_link_target"),
            EngineKind("trtllm", "harness.engines.configs:TrtllmEngineConfig", "harness.engines.trtllm:TrtllmEngine",
                       "harness.engines.trtllm_offload:check_supported", TRTLLM, "TensorRT-LLM"),
        )
    }
)  # fmt: skip


def engine_kinds() -> list[str]:
    return sorted(KINDS)


def engine_kind(kind: str) -> EngineKind:
    row = KINDS.get(kind)
    if row is None:
        raise KeyError(f"no engine registered for kind {kind!r}; known: {', '.join(engine_kinds())}")
    return row


def load_attribute(target: str) -> object:
    """Import ``"module:attribute"`` and return the attribute."""
    module_name, attribute = target.split(":")
    return getattr(importlib.import_module(module_name), attribute)


def metrics_family(kind: str) -> EngineFamily:
    """The metric family of an engine kind (``auto`` for kinds kvbench does not know)."""
    row = KINDS.get(kind)
    return row.metrics if row is not None else AUTO


def check_supported(config: EngineConfigModel, profile: OffloadProfile, between_turns: str | None) -> None:
    """Raise ValueError when ``config``'s engine kind cannot realise ``profile``."""
    target = engine_kind(config.kind).check_supported
    if target is None:
        return
    check: SupportCheck = load_attribute(target)  # type: ignore[assignment]
    check(profile, config, between_turns)


class SharedTierStarter(Protocol):
    def __call__(
        self, config: EngineConfigModel, context: LaunchContext
    ) -> contextlib.AbstractAsyncContextManager[SharedTierHandle | None]: ...


def shared_tier_starter(kind: str) -> SharedTierStarter | None:
    """The kind's fleet shared-tier starter, or None when its replicas share nothing."""
    target = engine_kind(kind).fleet_shared_tier
    return None if target is None else load_attribute(target)  # type: ignore[return-value]


class HostLinkTargetOf(Protocol):
    def __call__(self, config: EngineConfigModel) -> HostLinkTarget | None: ...


def host_link_target(config: EngineConfigModel) -> HostLinkTarget | None:
    """What the host-link probe runs with for ``config`` (None: it does not run on this machine's GPUs)."""
    row = KINDS.get(config.kind)
    if row is None or row.host_link is None:
        return None
    target: HostLinkTargetOf = load_attribute(row.host_link)  # type: ignore[assignment]
    return target(config)


def create_engine(config: EngineConfigModel, context: LaunchContext) -> Engine:
    factory: EngineFactory = load_attribute(engine_kind(config.kind).factory)  # type: ignore[assignment]
    return factory(config, context)
