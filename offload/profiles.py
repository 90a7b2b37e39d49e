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
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kvbench.schema import StrictModel

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
        default=None, description="For shared tiers served by a cache server (lm://, redis://)."
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
