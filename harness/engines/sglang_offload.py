"""Render an engine-neutral :class:`OffloadProfile` into a real SGLang launch (HiCache flags).

:func:`render_sglang_launch` turns (profile, :class:`SglangEngineConfig`, prefix caching) into a
:class:`SglangLaunchPlan`: extra ``sglang.launch_server`` arguments, environment, directories to
create or to find. It does no I/O; :mod:`harness.engines.sglang` carries the plan out.

SGLang's offload layer is HiCache, its hierarchical radix cache (``profile.backend`` ``auto`` or
``native``; the LMCache backends are vLLM's):

* the GPU prefix cache is the radix cache; prefix caching off is ``--disable-radix-cache``;
* the ``cpu`` tier is HiCache's host pool: ``--enable-hierarchical-cache --hicache-size <GB>``
  and ``--hicache-write-policy``. SGLang sizes the pool per GPU rank (each scheduler process owns a
  ``HostKVCache`` of ``hicache_size * 1e9`` bytes), so kvbench passes the tier's ``capacity_gb``
  divided by ``tp * pp * dp``, rounded down to whole GB (SGLang takes an integer; ``0`` would mean
  "use --hicache-ratio"). SGLang refuses to start when the host pool is not larger than the GPU KV
  pool, or when the host lacks the memory (it keeps 10 GB free);
* a ``disk`` tier, or a ``shared`` tier given as a directory, is HiCache's storage layer with the
  ``file`` backend: ``--hicache-storage-backend file``, its directory in
  ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR`` (SGLang's own variable; default ``/tmp/hicache``): the
  engine session's subdirectory of the tier's ``path`` (:func:`offload.profiles.tier_dir`).
  The file backend enforces no capacity. One storage backend per server: disk or shared, not both.

Checked against SGLang's ``server_args.py`` and ``mem_cache`` sources (0.5.x); the CPU tier ran on 1x H200
(SGLang 0.5.17, docs/gpu.md). Two consequences of SGLang's design that scenario validation enforces
(:func:`check_supported` with ``between_turns``):

* HiCache is part of the radix cache, so an arm with tiers needs prefix caching on (no
  ``disable_prefix_cache`` mode, no profile with ``prefix_caching: false``);
* ``POST /flush_cache`` resets the whole HiRadixCache, host pool included (``HiRadixCache.reset``
  clears ``token_to_kv_pool_host``), so ``between_turns: reset_prefix_cache`` would empty the cpu
  tier as well as the GPU cache: arms with tiers must use ``filler``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from offload.profiles import OffloadProfile, OffloadTier, TierScope, file_tier_dirs

from .configs import SglangEngineConfig

STORAGE_DIR_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"
"""Where SGLang's ``file`` storage backend keeps KV pages (read by ``HiCacheFile``)."""
STORAGE_BACKEND = "file"

SUPPORTED = (
    "backend auto or native (HiCache); "
    "tier cpu = HiCache host pool (--hicache-size, capacity_gb / GPU ranks in whole GB >= 1); "
    "one of disk (path) or shared (path) = HiCache file storage backend, on top of a cpu tier; "
    "prefix caching on for any arm with tiers"
)
"""Listed in every 'unsupported' error."""


@dataclass(frozen=True)
class SglangLaunchPlan:
    """What an offload profile adds to an SGLang launch."""

    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    dirs: tuple[Path, ...] = ()
    """Directories to create before start (the disk tier)."""
    must_exist: tuple[Path, ...] = ()
    """Directories that must already exist (a shared tier: a mount kvbench must not invent)."""
    notes: tuple[str, ...] = ()
    """Caveats worth recording in the manifest."""
    hierarchical: bool = False
    """HiCache is on (the profile has tiers)."""
    prefix_caching: bool = True

    @property
    def storage_dir(self) -> Path | None:
        value = self.env.get(STORAGE_DIR_ENV)
        return Path(value) if value else None


def gpu_ranks(config: SglangEngineConfig) -> int:
    """Scheduler processes of one SGLang server, each with its own HiCache host pool."""
    parallel = config.parallelism
    return parallel.tp * parallel.pp * parallel.dp


def _where(profile: OffloadProfile) -> str:
    return f"offload profile {profile.name!r} on SGLang"


def check_supported(profile: OffloadProfile, config: SglangEngineConfig, between_turns: str | None = None) -> None:
    """Raise ValueError (naming what is supported) if SGLang cannot realise ``profile``.

    ``between_turns`` is the workload's ``between_turns.mode`` when it has one: ``disable_prefix_cache``
    and ``reset_prefix_cache`` cannot measure an arm with tiers on SGLang (see the module docstring).
    """
    if not profile.tiers:
        return
    where = _where(profile)
    if profile.backend not in ("auto", "native"):
        raise ValueError(
            f"{where}: backend {profile.backend!r} is vLLM's (LMCache connector); SGLang offloads with "
            f"HiCache. Supported: {SUPPORTED}"
        )
    tiers = {tier.kind: tier for tier in profile.tiers}
    cpu = tiers.get("cpu")
    if cpu is None:
        raise ValueError(
            f"{where}: HiCache's storage layer sits below its host pool, so tiers {sorted(tiers)} need a "
            f"cpu tier. Supported: {SUPPORTED}"
        )
    ranks = gpu_ranks(config)
    if cpu.capacity_gb / ranks < 1:
        raise ValueError(
            f"{where}: --hicache-size is whole GB per GPU rank and 0 means 'use --hicache-ratio'; the cpu "
            f"tier's capacity_gb ({cpu.capacity_gb:g}) over {ranks} rank(s) must be at least 1 GB each. "
            f"Supported: {SUPPORTED}"
        )
    if "disk" in tiers and "shared" in tiers:
        raise ValueError(
            f"{where}: SGLang runs one HiCache storage backend; give a disk tier or a shared tier, not both. "
            f"Supported: {SUPPORTED}"
        )
    for kind in ("disk", "shared"):
        tier = tiers.get(kind)
        if tier is None:
            continue
        if tier.remote_url:
            raise ValueError(
                f"{where}: a {kind} tier with remote_url ({tier.remote_url}) needs a storage service kvbench "
                f"does not configure; give a directory (path) for the file backend. Supported: {SUPPORTED}"
            )
        if not tier.path:
            raise ValueError(f"{where}: the {kind} tier needs a path (the file backend's directory)")
    if not profile.prefix_caching:
        raise ValueError(
            f"{where}: HiCache is part of SGLang's radix cache, so tiers need prefix_caching: true "
            f"(--disable-radix-cache would turn the tiers off too). Supported: {SUPPORTED}"
        )
    if between_turns == "disable_prefix_cache":
        raise ValueError(
            f"{where}: between_turns mode 'disable_prefix_cache' starts SGLang with --disable-radix-cache, "
            "which also disables HiCache; use mode 'filler' to push turn 1's KV out of GPU memory instead"
        )
    if between_turns == "reset_prefix_cache":
        raise ValueError(
            f"{where}: SGLang's POST /flush_cache also empties HiCache's host pool (HiRadixCache.reset), "
            "so between_turns mode 'reset_prefix_cache' would measure an empty cpu tier; use mode 'filler' "
            "(filler traffic evicts the GPU cache and leaves the tiers alone)"
        )


def render_sglang_launch(
    profile: OffloadProfile, config: SglangEngineConfig, prefix_caching: bool, scope: TierScope | None = None
) -> SglangLaunchPlan:
    """Render ``profile`` for ``config``. ``prefix_caching`` is the runner's word (False when the scenario
    disables the GPU prefix cache); the profile's own ``prefix_caching`` must agree for the cache to be on.
    ``scope`` puts the storage directory in the engine session's own subdirectory of the tier's path
    (:func:`offload.profiles.tier_dir`)."""
    check_supported(profile, config)
    caching = prefix_caching and profile.prefix_caching
    if not profile.tiers:
        return SglangLaunchPlan(args=() if caching else ("--disable-radix-cache",), prefix_caching=caching)
    if not caching:
        raise ValueError(
            f"{_where(profile)}: the GPU prefix cache is off for this arm, and HiCache cannot run without "
            f"SGLang's radix cache. Supported: {SUPPORTED}"
        )
    tiers: dict[str, OffloadTier] = {tier.kind: tier for tier in profile.tiers}
    cpu = tiers["cpu"]
    ranks = gpu_ranks(config)
    size_gb = math.floor(cpu.capacity_gb / ranks)
    args = [
        "--enable-hierarchical-cache",
        "--hicache-size",
        str(size_gb),
        "--hicache-write-policy",
        config.hicache_write_policy,
    ]
    notes: list[str] = []
    if ranks > 1:
        notes.append(f"cpu tier {cpu.capacity_gb:g} GB over {ranks} GPU ranks: --hicache-size {size_gb} per rank")
    if size_gb * ranks != cpu.capacity_gb:
        notes.append(f"cpu tier {cpu.capacity_gb:g} GB rounded down to --hicache-size {size_gb} (whole GB per rank)")
    env: dict[str, str] = {}
    dirs: list[Path] = []
    must_exist: list[Path] = []
    for kind, tier, placed in file_tier_dirs(tiers, scope):
        args += ["--hicache-storage-backend", STORAGE_BACKEND]
        if config.hicache_storage_prefetch_policy is not None:
            args += ["--hicache-storage-prefetch-policy", config.hicache_storage_prefetch_policy]
        env[STORAGE_DIR_ENV] = placed.used
        dirs += [Path(path) for path in placed.create]
        must_exist += [Path(path) for path in placed.must_exist]
        notes.append(placed.note)
        notes.append(
            f"{kind} tier {placed.used}: SGLang's file storage backend does not enforce capacity_gb "
            f"({tier.capacity_gb:g} GB)"
        )
    notes.append(f"chunk_tokens ({profile.chunk_tokens}) is not used: HiCache moves KV in SGLang pages (--page-size)")
    return SglangLaunchPlan(
        args=tuple(args),
        env=env,
        dirs=tuple(dirs),
        must_exist=tuple(must_exist),
        notes=tuple(notes),
        hierarchical=True,
        prefix_caching=True,
    )
