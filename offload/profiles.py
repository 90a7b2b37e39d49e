"""Engine-neutral offload profiles: which KV-cache tiers an arm gets, with sizes and speeds.

A profile says *what* the offload layer is (engine prefix cache on/off, CPU DRAM, local disk,
shared storage, capacities, bandwidths, paths). Each engine renders it into its own real
configuration (simulator tiers, LMCache YAML, vLLM native offload flags, ...), so the same
scenario can be pointed at another engine without rewriting the arms.

Default bandwidths are only used where an engine needs a number and the profile gives none
(the simulator). They are deliberately round, documented figures:

* ``cpu``: host DRAM behind a PCIe Gen5 x16 link, ~64 GB/s theoretical per direction; pinned
  host-to-device copies reach ~50 GB/s, and KV loads with per-chunk gathers reach less, so 25 GB/s
  read and 20 GB/s write.
* ``disk``: one local datacenter NVMe (PCIe Gen4 x4, e.g. ~7 GB/s sequential read, ~4 GB/s write
  on the datasheet): 6 GB/s read, 3 GB/s write, 100 us latency.
* ``shared``: network storage reached through the NIC (one 200 Gb/s link = 25 GB/s line rate;
  storage servers typically deliver well below it per client): 10 GB/s read, 5 GB/s write,
  500 us latency.

Measure your own tier with ``kvbench offload probe PATH`` and put the numbers in the profile.

``load_overlap`` says how loading cached KV from a tier overlaps with prefill compute (the
simulator and the analytical model use it; engines that render profiles ignore it). With ``C``
cached tokens to load and ``M`` new tokens to prefill, ``load(x)`` the seconds to load ``x``
tokens' KV, ``compute(x)`` the seconds to prefill ``x`` tokens and ``L`` model layers:

* ``none`` (default, as before): ``TTFT = load(C) + compute(M)`` -- the load finishes first;
* ``layerwise``: layer ``i+1`` loads while layer ``i`` computes, a pipeline of ``L`` stages:
  ``TTFT = load(C)/L + (L-1)/L x max(load(C), compute(M)) + compute(M)/L``;
* ``bidirectional`` (Cake, Jin et al. 2024): the cached prefix is computed chunk by chunk from its
  head while its tail is loaded chunk by chunk, until they meet:
  ``TTFT = min over s of max(compute(s), load(C - s)) + compute(M)``.

Tier directories. A ``disk`` or ``shared`` tier's ``path`` is a base directory, not the directory
engines write to: every engine session (one arm's engine start, or its fleet's, in one run attempt)
writes into a fresh subdirectory of it (:func:`tier_dir`), so turn 1 is cold in every arm whatever
an earlier arm, run or engine start left under the base:

* ``shared``: ``<path>/<session>``, one per session, the same for every replica of the fleet and
  for the fleet's one cache server;
* ``disk``: ``<path>/<session>/<owner>``, one per engine (``replica-<i>``, or the one server a fleet
  shares), so replicas on one host never read each other's disk tier.

``<session>`` is ``kvbench-<run>-<arm>-a<attempt>s<n>-<token>`` (:func:`session_dir_name`). The
runner removes ``<path>/<session>`` when the session's engines have stopped. ``fresh_per_arm:
false`` uses ``path`` as given (a tier that is meant to be warm) and nothing is removed. A
``remote_url`` tier is a cache server the user runs: kvbench cannot empty it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Literal

from pydantic import Field, model_validator

from common.schema import StrictModel

TierKind = Literal["cpu", "disk", "shared"]

TIER_DEFAULTS: dict[str, tuple[float, float, float]] = {
    # kind: (read GB/s, write GB/s, latency us) -- see the module docstring for the sources.
    "cpu": (25.0, 20.0, 10.0),
    "disk": (6.0, 3.0, 100.0),
    "shared": (10.0, 5.0, 500.0),
}


class OffloadTier(StrictModel):
    """One KV-cache tier below GPU memory."""

    kind: TierKind
    capacity_gb: float = Field(gt=0, description="Capacity of this tier in GB (1e9 bytes).")
    path: str | None = Field(
        default=None, description="Directory backing a disk or shared tier (real engines need it)."
    )
    read_gbps: float | None = Field(default=None, gt=0, description="Read bandwidth in GB/s.")
    write_gbps: float | None = Field(default=None, gt=0, description="Write bandwidth in GB/s.")
    latency_us: float | None = Field(default=None, ge=0, description="Per-request access latency.")
    remote_url: str | None = Field(
        default=None,
        description="For shared tiers served by a cache server (lm://, redis://). kvbench cannot empty a "
        "server it does not run: turn 1 may hit KV that an earlier arm or run left there.",
    )
    fresh_per_arm: bool = Field(
        default=True,
        description="With a path: each engine session (one arm's engine start in one run) writes into its "
        "own new subdirectory of path (kvbench-<run>-<arm>-..., removed when the session ends), so turn 1 "
        "is cold whatever ran before. false: use path as given, e.g. to attach to a tier that is already "
        "warm on purpose; nothing is removed.",
    )

    @property
    def effective_read_gbps(self) -> float:
        return self.read_gbps if self.read_gbps is not None else TIER_DEFAULTS[self.kind][0]

    @property
    def effective_write_gbps(self) -> float:
        return self.write_gbps if self.write_gbps is not None else TIER_DEFAULTS[self.kind][1]

    @property
    def effective_latency_us(self) -> float:
        return self.latency_us if self.latency_us is not None else TIER_DEFAULTS[self.kind][2]


SESSION_DIR_PREFIX = "kvbench-"
SESSION_NAME_PART_CHARS = 48
"""At most this many characters of the run and arm names go into a session directory's name."""
SHARED_TIER_KINDS = frozenset({"shared"})
"""Tier kinds every engine of a session shares (one directory per session); the others are per engine."""


@dataclass(frozen=True)
class TierScope:
    """Where one engine of one engine session writes its tiers' KV (see the module docstring)."""

    session: str
    """The session's directory name (:func:`session_dir_name`), the same for every engine of the session."""
    owner: str = "replica-0"
    """The engine whose per-engine (``disk``) tiers these are: ``replica-<i>``, or a fleet's one server."""

    def __post_init__(self) -> None:
        # a session or owner name is joined under a user's directory and later removed: one plain path
        # component that is kvbench's own, never '..', an absolute path or a separator
        for name in (self.session, self.owner):
            if name in ("", ".", "..") or "/" in name or "\\" in name:
                raise ValueError(f"tier scope: {name!r} is not a single directory name")
        if not self.session.startswith(SESSION_DIR_PREFIX):
            raise ValueError(f"tier scope: session directory {self.session!r} must start with {SESSION_DIR_PREFIX!r}")


def _name_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip(".-")[:SESSION_NAME_PART_CHARS] or "x"


def session_dir_name(run: str, arm: str, attempt: int, session: int, token: str) -> str:
    """``kvbench-<run>-<arm>-a<attempt>s<session>-<token>``: unique per run attempt, arm and engine
    session; ``token`` (random per invocation) keeps two runs whose directories share a name apart."""
    return f"{SESSION_DIR_PREFIX}{_name_part(run)}-{_name_part(arm)}-a{attempt}s{session}-{_name_part(token)}"


def is_scoped(tier: OffloadTier, scope: TierScope | None) -> bool:
    """Whether ``tier`` gets a fresh subdirectory under ``scope`` (it has a path and did not opt out)."""
    return scope is not None and bool(tier.path) and tier.fresh_per_arm


def tier_dir(tier: OffloadTier, scope: TierScope | None) -> str | None:
    """The directory an engine writes ``tier``'s KV to: ``None`` without a path; ``path`` as given
    without a scope or with ``fresh_per_arm: false``; else the session's (``shared``) or the engine's
    (``disk``) subdirectory of ``path``."""
    if not tier.path:
        return None
    if scope is None or not is_scoped(tier, scope):  # (scope is None) narrows the type for what follows
        return tier.path
    session = PurePath(tier.path) / scope.session
    return str(session if tier.kind in SHARED_TIER_KINDS else session / scope.owner)


def session_dirs(profile: OffloadProfile, session: str) -> tuple[PurePath, ...]:
    """What an engine session may have created under its profile's tier paths: ``<path>/<session>`` of
    every tier that :func:`tier_dir` scopes (every engine's subdirectory lies inside it)."""
    scope = TierScope(session)
    return tuple(PurePath(str(tier.path)) / session for tier in profile.tiers if is_scoped(tier, scope))


MOUNTED_TIER_KINDS = frozenset({"shared"})
"""Tier kinds whose ``path`` must already exist (a mount kvbench must not invent); the others' are created."""


@dataclass(frozen=True)
class TierDirs:
    """A tier's directory for one engine (:func:`tier_dir`) and what to do about it before the start."""

    used: str
    """The directory the engine writes the tier's KV to."""
    create: tuple[str, ...]
    """Directories to create (with their parents)."""
    must_exist: tuple[str, ...]
    """Directories that must exist already (a shared tier's base: a mount)."""
    note: str
    """What the manifest says about it."""


def tier_dirs(tier: OffloadTier, scope: TierScope | None) -> TierDirs | None:
    """:func:`tier_dir` of ``tier`` with what to create and check first; None for a tier without a path."""
    used = tier_dir(tier, scope)
    if used is None or tier.path is None:
        return None
    mounted = tier.kind in MOUNTED_TIER_KINDS
    if is_scoped(tier, scope):
        note = f"{tier.kind} tier directory {used} (new for this engine session under {tier.path}, removed at its end)"
    else:
        why = "fresh_per_arm: false" if not tier.fresh_per_arm else "no engine session given"
        note = f"{tier.kind} tier directory {used} used as given ({why}): it may hold KV from earlier arms or runs"
    return TierDirs(
        used=used,
        create=() if mounted and used == tier.path else (used,),
        must_exist=(tier.path,) if mounted else (),
        note=note,
    )


def file_tier_dirs(
    tiers: Mapping[str, OffloadTier], scope: TierScope | None
) -> Iterator[tuple[str, OffloadTier, TierDirs]]:
    """The disk then the shared tier of ``tiers`` (by kind), those with a path, each with its :func:`tier_dirs`."""
    for kind in ("disk", "shared"):
        tier = tiers.get(kind)
        placed = tier_dirs(tier, scope) if tier is not None else None
        if tier is not None and placed is not None:
            yield kind, tier, placed


OffloadBackend = Literal["auto", "lmcache", "lmcache-mp", "native"]
LoadOverlap = Literal["none", "layerwise", "bidirectional"]


class OffloadProfile(StrictModel):
    """What the offload layer is for one arm."""

    name: str = Field(min_length=1)
    prefix_caching: bool = Field(default=True, description="The engine's own GPU (HBM) prefix cache.")
    tiers: tuple[OffloadTier, ...] = Field(default=(), strict=False)  # a YAML list is a tuple here
    chunk_tokens: int = Field(default=256, ge=16, description="Offload granularity in tokens.")
    backend: OffloadBackend = Field(
        default="auto",
        description="How a real engine realises the tiers: 'lmcache' (in-process connector), "
        "'lmcache-mp' (LMCache server sidecar), 'native' (the engine's own offload); 'auto' picks.",
    )
    async_loading: bool = Field(
        default=False,
        description="LMCache's enable_async_loading (in-process lmcache backend only): tier lookups and "
        "prefetches run beside the engine step instead of inside it. Other backends refuse it.",
    )
    load_overlap: LoadOverlap = Field(
        default="none",
        description="How a tier load overlaps prefill compute: 'none' (load, then compute), 'layerwise' "
        "(layer i+1 loads while layer i computes), 'bidirectional' (Cake: compute the cached prefix from "
        "its head while loading it from its tail). Used by the simulator and the analytical model.",
    )

    @model_validator(mode="after")
    def _one_tier_per_kind(self) -> OffloadProfile:
        kinds = [t.kind for t in self.tiers]
        if len(kinds) != len(set(kinds)):
            raise ValueError(f"offload profile {self.name!r}: at most one tier of each kind, got {kinds}")
        return self

    @property
    def offload_enabled(self) -> bool:
        return bool(self.tiers)


BUILTIN_PROFILES: dict[str, OffloadProfile] = {
    "off": OffloadProfile(name="off", prefix_caching=False),
    "hbm": OffloadProfile(name="hbm", prefix_caching=True),
    "cpu": OffloadProfile(name="cpu", tiers=(OffloadTier(kind="cpu", capacity_gb=64),)),
    "disk": OffloadProfile(
        name="disk",
        tiers=(
            OffloadTier(kind="cpu", capacity_gb=16),
            OffloadTier(kind="disk", capacity_gb=256, path="/tmp/kvbench-kv-disk"),
        ),
    ),
    "shared": OffloadProfile(
        name="shared",
        tiers=(
            OffloadTier(kind="cpu", capacity_gb=16),
            OffloadTier(kind="shared", capacity_gb=1024, path="/mnt/kvbench-shared"),
        ),
    ),
}


def resolve_profile(ref: str | OffloadProfile) -> OffloadProfile:
    """Turn a profile name or inline profile into a profile (names must be built-in)."""
    if isinstance(ref, OffloadProfile):
        return ref
    try:
        return BUILTIN_PROFILES[ref]
    except KeyError:
        allowed = ", ".join(sorted(BUILTIN_PROFILES))
        raise ValueError(f"unknown offload profile {ref!r}; built-in profiles: {allowed}") from None
