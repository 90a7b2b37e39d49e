"""The engine kinds kvbench knows: a registry that each engine package fills with its own row.

A row (:class:`EngineKind`) holds, for one ``engine.kind``:

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
* ``power``: ``f(config, scrape)`` returning the :class:`~harness.client.power.PowerSource` that meters the
  engine's energy in every measurement window (``scrape`` reads its ``/metrics``); None: NVML on the GPUs of
  the kind's ``host_link`` target, or not sampled where it has none (:func:`power_source`).

A package registers its kinds when it is imported (:func:`register`): ``harness.engines`` its
built-in adapters (:mod:`.builtin`), ``harness.sim`` the simulator. This module names no adapter,
so the engines stage never imports the simulator above it; ``harness.scenario`` imports both
packages, so every kind is registered wherever a scenario can be read. Adding an engine is one
:func:`register` call beside its adapter; no other stage branches on kind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from harness.client.power import NotSampled, PowerSource, nvml_source
from harness.client.scrape import AUTO, EngineFamily
from offload.profiles import OffloadProfile

from .base import Engine, EngineConfigModel, LaunchContext, SharedTierHandle
from .host_link import HostLinkTarget


class EngineFactory(Protocol):
    def __call__(self, config: EngineConfigModel, context: LaunchContext) -> Engine: ...


SupportCheck = Callable[[OffloadProfile, EngineConfigModel, str | None], None]
ConfigT = TypeVar("ConfigT")


def support_check(
    config_type: type[ConfigT], check: Callable[[OffloadProfile, ConfigT, str | None], None]
) -> SupportCheck:
    """``check``, which takes its kind's own config model, as a :data:`SupportCheck` of any config."""

    def checked(profile: OffloadProfile, config: EngineConfigModel, between_turns: str | None) -> None:
        if not isinstance(config, config_type):
            raise TypeError(f"{check.__qualname__} needs a {config_type.__name__}, got {type(config).__name__}")
        check(profile, config, between_turns)

    return checked


class SharedTierStarter(Protocol):
    def __call__(
        self, config: EngineConfigModel, context: LaunchContext
    ) -> contextlib.AbstractAsyncContextManager[SharedTierHandle | None]: ...


class HostLinkTargetOf(Protocol):
    def __call__(self, config: EngineConfigModel) -> HostLinkTarget | None: ...


MetricsScrape = Callable[[], Awaitable[str | None]]


class PowerSourceOf(Protocol):
    def __call__(self, config: EngineConfigModel, scrape: MetricsScrape) -> PowerSource: ...


@dataclass(frozen=True)
class EngineKind:
    kind: str
    config: type[EngineConfigModel]
    factory: EngineFactory
    check_supported: SupportCheck | None
    metrics: EngineFamily
    label: str
    """The engine's name in reports (``vLLM``, ``SGLang``...)."""
    simulated: bool = False
    """Its figures are modelled, not measured (reports say so beside every figure)."""
    starts_process: bool = True
    fleet_shared_tier: SharedTierStarter | None = None
    """The fleet shared-tier starter (see the module docstring)."""
    names_replica: bool = False
    """A fleet's replica of this kind names itself in every response (``X-Kvbench-Replica``,
    :mod:`harness.engines.kvbench_replica_header`), so requests through a router are attributed by header."""
    host_link: HostLinkTargetOf | None = None
    """The host-link target of a config (see the module docstring)."""
    power: PowerSourceOf | None = None
    """The power source of a config (see the module docstring)."""


_KINDS: dict[str, EngineKind] = {}


def register(row: EngineKind) -> EngineKind:
    """Add ``row`` to the registry; a second, different row for one kind is a programming error."""
    known = _KINDS.get(row.kind)
    if known is not None and known != row:
        raise ValueError(f"engine kind {row.kind!r} is registered twice")
    _KINDS[row.kind] = row
    return row


def engine_kinds() -> list[str]:
    return sorted(_KINDS)


def engine_kind(kind: str) -> EngineKind:
    row = _KINDS.get(kind)
    if row is None:
        raise KeyError(f"no engine registered for kind {kind!r}; known: {', '.join(engine_kinds())}")
    return row


def find_engine_kind(kind: str) -> EngineKind | None:
    """The row of ``kind``, or None for a kind kvbench does not know (an old or foreign manifest)."""
    return _KINDS.get(kind)


def metrics_family(kind: str) -> EngineFamily:
    """The metric family of an engine kind (``auto`` for kinds kvbench does not know)."""
    row = _KINDS.get(kind)
    return row.metrics if row is not None else AUTO


def check_supported(config: EngineConfigModel, profile: OffloadProfile, between_turns: str | None) -> None:
    """Raise ValueError when ``config``'s engine kind cannot realise ``profile``."""
    check = engine_kind(config.kind).check_supported
    if check is not None:
        check(profile, config, between_turns)


def shared_tier_starter(kind: str) -> SharedTierStarter | None:
    """The kind's fleet shared-tier starter, or None when its replicas share nothing."""
    return engine_kind(kind).fleet_shared_tier


def host_link_target(config: EngineConfigModel) -> HostLinkTarget | None:
    """What the host-link probe runs with for ``config`` (None: it does not run on this machine's GPUs)."""
    row = _KINDS.get(config.kind)
    if row is None or row.host_link is None:
        return None
    return row.host_link(config)


def power_source(config: EngineConfigModel, scrape: MetricsScrape) -> PowerSource:
    """What meters ``config``'s energy: the kind's own ``power`` source, else NVML on the GPUs the engine uses
    (its ``host_link`` target), else a source that says why nothing is sampled."""
    row = _KINDS.get(config.kind)
    if row is not None and row.power is not None:
        return row.power(config, scrape)
    target = host_link_target(config)
    if target is None:
        return NotSampled("nvml", f"engine kind {config.kind!r} runs on no GPU of this machine that kvbench starts")
    return nvml_source(target.gpus, dict(target.env))


def create_engine(config: EngineConfigModel, context: LaunchContext) -> Engine:
    return engine_kind(config.kind).factory(config, context)
