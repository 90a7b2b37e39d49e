"""The engine Protocol every engine kind implements, and the values that cross it.

An engine is an async context manager: entering starts it (or attaches to it) and waits until it
is healthy; the :class:`RunningEngine` it yields gives the endpoint, a tokenizer for exact token
counts, the prefix-cache reset used between turns, and facts for the manifest; leaving stops it and
cleans up after it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol, runtime_checkable

from harness.client.endpoint import Endpoint
from harness.client.openai import ATTACHED_STALL_TIMEOUT_S
from offload.profiles import OffloadProfile, TierScope
from workloads.tokenizer import Tokenizer


@dataclass(frozen=True)
class EngineFacts:
    """What the manifest records about an engine (command lines already redacted)."""

    kind: str
    version: str
    command: tuple[str, ...] = ()
    details: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SharedTierHandle:
    """A KV tier a fleet started once per arm and every replica uses (:mod:`harness.engines.fleet`)."""

    description: str
    path: Path | None = None
    """A directory every replica reads and writes (the simulator's shared chunk index)."""
    host: str | None = None
    port: int | None = None
    """A cache server every replica connects to (vLLM: the LMCache multi-process server)."""
    serves_all_tiers: bool = False
    """Every tier of the profile lives in it (vLLM's shared LMCache server holds the cpu tier too), so an
    engine's offload-tier hits are all shared-tier hits."""
    ready: asyncio.Future[None] | None = field(default=None, compare=False, repr=False)
    """Done once the tier's server is healthy (or failed to start, with its error), when the replicas may
    start before that (vLLM waits for its LMCache server); each replica's start waits for it too."""


@dataclass(frozen=True)
class LaunchContext:
    """Per-arm facts the runner gives an engine factory."""

    arm: str
    profile: OffloadProfile
    log_dir: Path
    prefix_caching: bool
    """False when the scenario disables the GPU prefix cache (between_turns=disable_prefix_cache)."""
    replica: int = 0
    """Which replica of the arm's fleet this engine is (0 for a single engine)."""
    fleet_size: int = 1
    """Replicas in the arm's fleet (1: a single engine, which names no replica in its responses)."""
    shared_tier: SharedTierHandle | None = None
    """The fleet's shared tier, when the arm has one and the engine kind shares it across replicas."""
    tier_session: str | None = None
    """The engine session's directory name under every disk/shared tier path
    (:func:`offload.profiles.session_dir_name`); None: tier paths are used as given."""

    @property
    def tier_scope(self) -> TierScope | None:
        """Where this engine writes its tiers' KV (:func:`offload.profiles.tier_dir`): the session's
        directory, and this replica's own one below it for per-engine tiers."""
        return None if self.tier_session is None else TierScope(self.tier_session, owner=f"replica-{self.replica}")


class PrefixCacheResetUnsupported(Exception):
    """The engine cannot drop its GPU prefix cache on request."""


class RunningEngine(Protocol):
    @property
    def endpoint(self) -> Endpoint: ...

    @property
    def facts(self) -> EngineFacts: ...

    def tokenizer(self) -> Tokenizer: ...

    async def reset_prefix_cache(self) -> None:
        """Drop the GPU prefix cache, keeping offload tiers; raise PrefixCacheResetUnsupported if it cannot."""
        ...

    def log_tail(self, lines: int = 50) -> list[str]: ...


@runtime_checkable
class Mortal(Protocol):
    """A running engine whose process kvbench started, so kvbench can tell whether it is still alive."""

    def exit_code(self) -> int | None:
        """The engine process's exit code once it has exited (None while it runs)."""
        ...


def stall_limit(configured: float | None, engine: RunningEngine) -> float | None:
    """The scenario's stall limit (``workload.stall_timeout_s``); unset, an engine kvbench did not start (not
    :class:`Mortal`: it cannot see it die) gets :data:`~harness.client.openai.ATTACHED_STALL_TIMEOUT_S`."""
    if configured is not None or isinstance(engine, Mortal):
        return configured
    return ATTACHED_STALL_TIMEOUT_S


class FaultUnsupported(Exception):
    """The running engine cannot take this fault drill (e.g. ``restart_tier`` without a tier server)."""


@runtime_checkable
class FaultTarget(Protocol):
    """A running engine kvbench started, so a soak can rehearse its failures (``soak.faults``)."""

    async def kill_engine(self) -> float:
        """SIGKILL the engine, start it again on the same port: seconds until it is healthy again."""
        ...

    async def pause_engine(self, seconds: float) -> None:
        """SIGSTOP the engine for ``seconds``, then SIGCONT."""
        ...

    async def restart_tier(self) -> float:
        """Restart the offload-tier server sidecar: seconds until healthy; FaultUnsupported without one."""
        ...

    def has_tier_server(self) -> bool:
        """Whether an offload-tier server runs beside the engine (what ``restart_tier`` restarts)."""
        ...


class EngineConfigModel(Protocol):
    """What every engine config model has (the union's members are pydantic models with these)."""

    @property
    def kind(self) -> str: ...

    @property
    def model(self) -> str: ...


@runtime_checkable
class NamesArms(Protocol):
    """An engine config with fields that name the scenario's arms (``vllm-pd``'s ``colocated_arms``): the scenario
    checks that each name is one of its arms."""

    @property
    def arms_named(self) -> dict[str, list[str]]:
        """Field name -> the arm names it lists."""
        ...


class Engine(Protocol):
    async def __aenter__(self) -> RunningEngine: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...
