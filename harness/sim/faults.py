"""Fault injection for the simulator (the ``faults`` setting), for testing soaks and gates.

Each fault has a kind and a window; while the window is open, matching requests (or tiers) are
disturbed:

* ``latency_spike`` -- the request waits ``extra_ms`` before the engine sees it (TTFT grows);
* ``http_error``    -- the request is answered with HTTP ``status`` (a 5xx burst);
* ``drop_stream``   -- the connection is closed after ``after_tokens`` streamed tokens, without
  ``data: [DONE]``;
* ``slow_tier``     -- an offload tier's reads and writes take ``factor`` times longer;
* ``full_tier``     -- an offload tier is full of other data: its contents are gone when the
  window opens and it refuses writes while it stays open.

A window is given either in seconds after the first generation request (``start_s`` and
``duration_s``) or in generation requests (``from_request`` and ``requests``, 0-based), and each
request is hit with ``probability`` (seeded, so runs repeat). Requests are counted as the server
receives them; tier faults are re-evaluated on every request.

A fault file is YAML or JSON: a list of faults, or ``{faults: [...]}``; ``kvbench sim serve
--faults FILE`` reads it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Protocol

import yaml
from pydantic import Field, TypeAdapter, ValidationError, model_validator

from common.jsonfile import parse_json
from common.schema import StrictModel
from offload.profiles import TierKind

FaultKind = Literal["latency_spike", "http_error", "drop_stream", "slow_tier", "full_tier"]


class _FaultBase(StrictModel):
    start_s: float | None = Field(
        default=None, ge=0, description="Window start, seconds after the first generation request."
    )
    duration_s: float | None = Field(default=None, gt=0, description="Window length in seconds (default: no end).")
    from_request: int | None = Field(
        default=None, ge=0, description="Window start, as the 0-based number of a generation request."
    )
    requests: int | None = Field(default=None, ge=1, description="Window length in requests (default: no end).")
    probability: float = Field(default=1.0, gt=0, le=1, description="Share of requests in the window hit.")

    @model_validator(mode="after")
    def _one_window(self) -> _FaultBase:
        timed = self.start_s is not None or self.duration_s is not None
        counted = self.from_request is not None or self.requests is not None
        if timed and counted:
            raise ValueError("give the window in seconds (start_s, duration_s) or in requests (from_request, requests)")
        return self

    def open_at(self, elapsed_s: float | None, request_index: int) -> bool:
        """Whether the window is open ``elapsed_s`` after the first request / at request ``request_index``."""
        if self.from_request is not None or self.requests is not None:
            first = self.from_request or 0
            return request_index >= first and (self.requests is None or request_index < first + self.requests)
        if elapsed_s is None:
            return False
        start = self.start_s or 0.0
        return elapsed_s >= start and (self.duration_s is None or elapsed_s < start + self.duration_s)


class LatencySpike(_FaultBase):
    kind: Literal["latency_spike"]
    extra_ms: float = Field(gt=0, description="Added before the engine sees the request.")


class HttpError(_FaultBase):
    kind: Literal["http_error"]
    status: int = Field(default=500, ge=400, le=599, description="HTTP status of the answer.")


class DropStream(_FaultBase):
    kind: Literal["drop_stream"]
    after_tokens: int = Field(default=1, ge=0, description="Streamed tokens before the connection is closed.")


class SlowTier(_FaultBase):
    kind: Literal["slow_tier"]
    factor: float = Field(default=10.0, gt=1, description="Tier reads and writes take this many times longer.")
    tier: TierKind | None = Field(default=None, description="Which tier (default: every tier).")


class FullTier(_FaultBase):
    kind: Literal["full_tier"]
    tier: TierKind | None = Field(default=None, description="Which tier (default: every tier).")


Fault = Annotated[LatencySpike | HttpError | DropStream | SlowTier | FullTier, Field(discriminator="kind")]
_FAULTS = TypeAdapter(list[Fault])


def parse_faults(data: object, source: str) -> list[Fault]:
    """Validate a list of faults (or ``{faults: [...]}``); errors name the source, index and field."""
    if isinstance(data, dict) and set(data) == {"faults"}:
        data = data["faults"]
    if data is None:
        return []
    try:
        return _FAULTS.validate_python(data)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(p) for p in item['loc'])}: {item['msg']}" for item in error.errors())
        kinds = "latency_spike, http_error, drop_stream, slow_tier, full_tier"
        raise ValueError(f"{source}: invalid faults ({problems}); fault kinds: {kinds}") from None


def load_faults(path: Path) -> list[Fault]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"{path}: cannot read: {error.strerror}") from None
    try:
        data = parse_json(text) if path.suffix == ".json" else yaml.safe_load(text)
    except RecursionError:
        raise ValueError(f"{path}: not valid YAML: nested too deeply") from None
    except (ValueError, yaml.YAMLError) as error:
        raise ValueError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {error}") from None
    return parse_faults(data, str(path))


@dataclass(frozen=True)
class RequestFaults:
    """What happens to one generation request."""

    delay_s: float = 0.0
    http_status: int | None = None
    drop_after_tokens: int | None = None
    labels: tuple[str, ...] = ()


class TierLike(Protocol):
    """What the injector needs of an offload tier (``kvcache.TierState``)."""

    slow_factor: float
    refuse_writes: bool

    @property
    def kind(self) -> str: ...

    def drop_all(self) -> int: ...


class FaultInjector:
    """Decides, per request and per tier, which faults apply; counts what it injected."""

    def __init__(self, faults: Sequence[Fault], *, seed: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.faults = list(faults)
        self._rng = random.Random(f"kvbench-sim-faults:{seed}")
        self._clock = clock
        self.first_request_at: float | None = None
        self.requests = 0
        self.injected: dict[str, int] = {}
        self._full: set[int] = set()

    @property
    def enabled(self) -> bool:
        return bool(self.faults)

    def _elapsed(self) -> float | None:
        return None if self.first_request_at is None else self._clock() - self.first_request_at

    def _count(self, kind: str) -> None:
        self.injected[kind] = self.injected.get(kind, 0) + 1

    def on_request(self, tiers: Sequence[TierLike] = ()) -> RequestFaults:
        """Called once per generation request as it arrives: its faults, and the tiers' state now."""
        if not self.faults:
            return RequestFaults()
        if self.first_request_at is None:
            self.first_request_at = self._clock()
        index = self.requests
        self.requests += 1
        elapsed = self._elapsed()
        self.update_tiers(tiers, index)
        delay = 0.0
        status: int | None = None
        drop: int | None = None
        labels: list[str] = []
        for fault in self.faults:
            if isinstance(fault, SlowTier | FullTier) or not fault.open_at(elapsed, index):
                continue
            if fault.probability < 1.0 and self._rng.random() >= fault.probability:
                continue
            if isinstance(fault, LatencySpike):
                delay += fault.extra_ms / 1000.0
            elif isinstance(fault, HttpError):
                status = status or fault.status
            else:
                drop = fault.after_tokens if drop is None else min(drop, fault.after_tokens)
            labels.append(fault.kind)
            self._count(fault.kind)
        return RequestFaults(delay, status, drop, tuple(labels))

    def update_tiers(self, tiers: Sequence[TierLike], index: int | None = None) -> None:
        """Apply the tier faults whose windows are open now to ``tiers``."""
        if not tiers:
            return
        elapsed = self._elapsed()
        index = self.requests - 1 if index is None else index
        for position, tier in enumerate(tiers):
            factor = 1.0
            full = False
            for fault in self.faults:
                if not isinstance(fault, SlowTier | FullTier) or fault.tier not in (None, tier.kind):
                    continue
                if not fault.open_at(elapsed, index):
                    continue
                if isinstance(fault, SlowTier):
                    factor *= fault.factor
                else:
                    full = True
            if factor != tier.slow_factor:
                tier.slow_factor = factor
                if factor > 1.0:
                    self._count("slow_tier")
            if full and position not in self._full:
                self._full.add(position)
                tier.drop_all()
                self._count("full_tier")
            elif not full:
                self._full.discard(position)
            tier.refuse_writes = full
