"""A fleet: ``N`` replicas of one engine, started in parallel, stopped together.

``async with Fleet(config, context) as fleet:`` gives a :class:`RunningFleet` of ``N`` started
(or attached) :class:`~harness.engines.base.RunningEngine`\\ s, ``N = config.fleet_size``
(:mod:`harness.engines.replicas`). Entering

1. starts the arm's shared tier once, when the engine kind has a starter for it in the kinds table
   (:func:`~harness.engines.kinds.shared_tier_starter`) and the arm's profile has a ``shared`` tier:
   the simulator gets one directory every replica indexes its chunks in, vLLM one LMCache
   multi-process server every replica connects to;
2. starts every replica concurrently, each with its own config (port, ``CUDA_VISIBLE_DEVICES``:
   :meth:`~harness.engines.replicas.ReplicaFields.replica_config`) and log directory
   (``<arm log dir>/replica-<i>``; a fleet of one keeps the arm's log directory as before);
3. if any replica fails to start (or the start is cancelled), stops those that did, then the shared
   tier, and raises the first error.

Leaving stops every replica concurrently, then the shared tier. Each replica is its own process
group (:class:`~harness.engines.process.ManagedProcess`), so stopping one never touches another.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from .base import EngineConfigModel, LaunchContext, RunningEngine, SharedTierHandle
from .kinds import create_engine, shared_tier_starter
from .replicas import ReplicaFields


@dataclass(frozen=True)
class RunningFleet:
    """The started replicas of one arm, and the shared tier they use (if any)."""

    replicas: tuple[RunningEngine, ...]
    shared_tier: SharedTierHandle | None = None

    @property
    def size(self) -> int:
        return len(self.replicas)

    @property
    def first(self) -> RunningEngine:
        return self.replicas[0]


def fleet_size(config: EngineConfigModel) -> int:
    return config.fleet_size if isinstance(config, ReplicaFields) else 1


def replica_context(context: LaunchContext, index: int, size: int, shared: SharedTierHandle | None) -> LaunchContext:
    log_dir = context.log_dir if size == 1 else context.log_dir / f"replica-{index}"
    return dataclasses.replace(context, log_dir=log_dir, replica=index, fleet_size=size, shared_tier=shared)


def replica_config(config: EngineConfigModel, index: int) -> EngineConfigModel:
    return config.replica_config(index) if isinstance(config, ReplicaFields) else config


class Fleet:
    """``async with Fleet(config, context) as fleet``: see the module docstring."""

    def __init__(self, config: EngineConfigModel, context: LaunchContext) -> None:
        self.config = config
        self.context = context
        self._stacks: list[contextlib.AsyncExitStack] = []
        self._shared = contextlib.AsyncExitStack()

    async def __aenter__(self) -> RunningFleet:
        size = fleet_size(self.config)
        shared: SharedTierHandle | None = None
        try:
            starter = shared_tier_starter(self.config.kind) if size > 1 else None
            if starter is not None:
                shared = await self._shared.enter_async_context(starter(self.config, self.context))
            self._stacks = [contextlib.AsyncExitStack() for _ in range(size)]
            engines = [
                create_engine(replica_config(self.config, index), replica_context(self.context, index, size, shared))
                for index in range(size)
            ]
            results = await asyncio.gather(
                *(stack.enter_async_context(engine) for stack, engine in zip(self._stacks, engines, strict=True)),
                return_exceptions=True,
            )
        except BaseException:
            await self._stop()
            raise
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            await self._stop()
            raise failures[0]
        running: list[RunningEngine] = [result for result in results if not isinstance(result, BaseException)]
        return RunningFleet(tuple(running), shared)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stop()

    async def _stop(self) -> None:
        stacks, self._stacks = self._stacks, []
        try:
            await _close_all(stacks)
        finally:
            await self._shared.aclose()


async def _close_all(stacks: Sequence[contextlib.AsyncExitStack]) -> None:
    """Close every stack concurrently; every one is closed even if some fail (the first error is raised)."""
    results = await asyncio.gather(*(stack.aclose() for stack in stacks), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
