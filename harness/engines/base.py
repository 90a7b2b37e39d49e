"""The engine Protocol every engine kind implements, and the values that cross it.

An engine is an async context manager: entering starts it (or attaches to it) and waits until it
is healthy; the :class:`RunningEngine` it yields gives the endpoint, a tokenizer for exact token
counts, the prefix-cache reset used between turns, and facts for the manifest; leaving stops it and
cleans up after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol

from offload.profiles import OffloadProfile


@dataclass(frozen=True)
class Endpoint:
    """Where requests go. The API key never appears in ``repr``."""

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    metrics_path: str = "/metrics"
    """Where the engine serves Prometheus text (TensorRT-LLM: /prometheus/metrics)."""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True)
class EngineFacts:
    """What the manifest records about an engine (command lines already redacted)."""

    kind: str
    version: str
    command: tuple[str, ...] = ()
    details: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchContext:
    """Per-arm facts the runner gives an engine factory."""

    arm: str
    profile: OffloadProfile
    log_dir: Path
    prefix_caching: bool
    """False when the scenario disables the GPU prefix cache (between_turns=disable_prefix_cache)."""


class PrefixCacheResetUnsupported(Exception):
    """The engine cannot drop its GPU prefix cache on request."""


class Tokenizer(Protocol):
    """Exact token counts for the engine's own tokenizer."""

    async def encode(self, text: str) -> list[int]: ...

    async def decode(self, token_ids: Sequence[int]) -> str: ...


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


class Engine(Protocol):
    async def __aenter__(self) -> RunningEngine: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...
