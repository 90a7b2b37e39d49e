"""Render an engine-neutral :class:`OffloadProfile` into a real vLLM launch.

:func:`render_vllm_launch` turns (profile, :class:`VllmEngineConfig`, prefix caching) into a
:class:`VllmLaunchPlan`: extra vLLM arguments, environment, files kvbench writes (LMCache's YAML),
directories to create, and LMCache server sidecars to start before vLLM. It does no I/O; the
engine (:mod:`harness.engines.vllm`) carries the plan out.

Backends (``profile.backend``; ``auto`` picks ``lmcache-mp`` on device ``cpu`` and ``lmcache`` on
``cuda``):

* ``lmcache``: LMCache inside the vLLM process, ``--kv-transfer-config`` with
  ``LMCacheConnectorV1`` and an LMCache YAML (``LMCACHE_CONFIG_FILE``): ``chunk_size``,
  ``local_cpu``/``max_local_cpu_size`` (cpu tier; each of the tp x pp ranks gets capacity / ranks,
  since every rank keeps its own buffer of its KV shard), ``local_disk``/``max_local_disk_size`` (disk
  tier, in the engine's own subdirectory of its path), ``remote_url`` (shared tier served by a cache
  server the user runs, which kvbench cannot empty between arms), ``save_unfull_chunk``, and
  ``enable_async_loading`` where the profile sets ``async_loading``.
  ``PROMETHEUS_MULTIPROC_DIR`` points at a fresh directory so LMCache's metrics reach vLLM's
  ``/metrics``. CUDA only (the in-process connector does not run on vLLM-CPU).
* ``lmcache-mp``: an LMCache server (``lmcache server``) started by kvbench beside vLLM, L1 = the
  cpu tier, disk/shared tiers with a ``path`` as filesystem L2 adapters (``base_path``: the engine
  session's subdirectory of the path, :func:`offload.profiles.tier_dir`); vLLM connects with
  ``LMCacheMPConnector``. Works on CPU (``--supported-transfer-mode engine_driven``) and CUDA
  (``auto``: vLLM's CUDA connector registers its KV caches for server-driven transfer and hangs
  for 300 s against an engine_driven-only server). The filesystem L2 adapter does not enforce a
  capacity: the disk tier's ``capacity_gb`` is not applied.
* ``native``: vLLM's own CPU offload, ``--kv-offloading-size <GiB> --kv-offloading-backend
  native`` (vLLM >= 0.26). CUDA only, one cpu tier only; ``chunk_tokens`` is not used.

A profile without tiers renders to the prefix-caching flag alone. Every LMCache backend needs a
cpu tier (LMCache's L1 buffer). :func:`check_supported` raises the same errors as rendering, for
scenario validation.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from offload.profiles import OffloadProfile, OffloadTier, TierScope, file_tier_dirs, tier_dirs

from . import kvbench_replica_header
from .base import SharedTierHandle
from .configs import VllmEngineConfig
from .hostmem import NATIVE_PIN_FACTOR

RenderedBackend = Literal["none", "lmcache", "lmcache-mp", "native"]

GIB = 1 << 30
LMCACHE_CONNECTOR = "LMCacheConnectorV1"
LMCACHE_MP_CONNECTOR = "LMCacheMPConnector"

SUPPORTED: dict[tuple[str, str], tuple[str, ...]] = {
    # (device, backend) -> tier kinds it can realise
    ("cuda", "lmcache"): ("cpu", "disk", "shared (remote_url)"),
    ("cuda", "lmcache-mp"): ("cpu", "disk (path)", "shared (path)"),
    ("cpu", "lmcache-mp"): ("cpu", "disk (path)", "shared (path)"),
    ("cuda", "native"): ("cpu",),
}
"""What each (device, backend) pair supports; listed in every 'unsupported' error."""


def supported_summary() -> str:
    return "; ".join(
        f"{backend} on {device}: tiers {', '.join(tiers)}" for (device, backend), tiers in SUPPORTED.items()
    )


@dataclass(frozen=True)
class LaunchFile:
    """A file kvbench writes before starting the engine."""

    path: Path
    text: str


@dataclass(frozen=True)
class LmcacheServerSpec:
    """One LMCache multi-process server (``lmcache server``) to run beside vLLM."""

    host: str
    port: int
    http_port: int
    prometheus_port: int
    l1_size_gb: float
    chunk_size: int
    eviction_policy: str = "LRU"
    transfer_mode: str = "engine_driven"
    l2_adapters: tuple[str, ...] = ()
    """JSON adapter specs for ``--l2-adapter``."""

    def args(self) -> list[str]:
        """Arguments after ``lmcache server`` (checked against lmcache 0.5.6's CLI)."""
        argv = [
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--chunk-size",
            str(self.chunk_size),
            "--l1-size-gb",
            _number(self.l1_size_gb),
            "--eviction-policy",
            self.eviction_policy,
            "--supported-transfer-mode",
            self.transfer_mode,
            "--http-host",
            self.host,
            "--http-port",
            str(self.http_port),
            "--prometheus-port",
            str(self.prometheus_port),
        ]
        for adapter in self.l2_adapters:
            argv += ["--l2-adapter", adapter]
        return argv

    @property
    def health_url(self) -> str:
        return f"http://{self.host}:{self.http_port}/healthcheck"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.prometheus_port}/metrics"


@dataclass(frozen=True)
class VllmLaunchPlan:
    """What an offload profile adds to a vLLM launch."""

    backend: RenderedBackend
    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    files: tuple[LaunchFile, ...] = ()
    dirs: tuple[Path, ...] = ()
    """Directories to create before start (disk tiers, the Prometheus multiprocess dir)."""
    must_exist: tuple[Path, ...] = ()
    """Directories that must already exist (shared tiers: a mount kvbench must not invent)."""
    sidecars: tuple[LmcacheServerSpec, ...] = ()
    notes: tuple[str, ...] = ()
    """Caveats worth recording in the manifest (e.g. a capacity the backend does not enforce)."""
    pinned_host_bytes: int = 0
    """Host DRAM the offload tier pins, at least (:mod:`harness.engines.hostmem`); 0 for none."""

    @property
    def uses_lmcache(self) -> bool:
        return self.backend in ("lmcache", "lmcache-mp")


def resolve_backend(profile: OffloadProfile, config: VllmEngineConfig) -> RenderedBackend:
    """The backend that realises ``profile`` (``none`` for a profile without tiers)."""
    if not profile.tiers:
        return "none"
    if profile.backend == "auto":
        return "lmcache-mp" if config.device == "cpu" else "lmcache"
    return profile.backend


def check_supported(profile: OffloadProfile, config: VllmEngineConfig, between_turns: str | None = None) -> None:
    """Raise ValueError (naming what is supported) if vLLM cannot realise ``profile`` on ``config``."""
    backend = resolve_backend(profile, config)
    if backend == "none":
        return
    where = f"offload profile {profile.name!r} (backend {profile.backend}"
    where += f" -> {backend})" if profile.backend == "auto" else ")"
    if (config.device, backend) not in SUPPORTED:
        raise ValueError(
            f"{where}: backend {backend!r} does not run on vLLM device {config.device!r}; "
            f"supported: {supported_summary()}"
        )
    if profile.async_loading and backend != "lmcache":
        raise ValueError(
            f"{where}: async_loading is LMCache's in-process option; set backend: lmcache or drop async_loading"
        )
    tiers = {tier.kind: tier for tier in profile.tiers}
    if backend == "native":
        if set(tiers) != {"cpu"}:
            raise ValueError(
                f"{where}: vLLM native offload has a CPU tier only, got tiers {sorted(tiers)}; "
                f"supported: {supported_summary()}"
            )
        return
    if "cpu" not in tiers:
        raise ValueError(
            f"{where}: LMCache needs a cpu tier (its L1 buffer), got tiers {sorted(tiers)}; "
            f"supported: {supported_summary()}"
        )
    if config.block_size is not None and profile.chunk_tokens % config.block_size != 0:
        raise ValueError(
            f"{where}: chunk_tokens {profile.chunk_tokens} must be a multiple of vLLM's block_size {config.block_size}"
        )
    disk = tiers.get("disk")
    if disk is not None and not disk.path:
        raise ValueError(f"{where}: the disk tier needs a path")
    shared = tiers.get("shared")
    if shared is not None:
        if backend == "lmcache" and not shared.remote_url:
            raise ValueError(
                f"{where}: with the in-process lmcache backend a shared tier needs remote_url "
                "(an LMCache remote URL such as lm://host:port or redis://host:port); "
                f"supported: {supported_summary()}"
            )
        if backend == "lmcache-mp" and (shared.remote_url or not shared.path):
            raise ValueError(
                f"{where}: with the lmcache-mp backend a shared tier is a filesystem path "
                "(set path, not remote_url); "
                f"supported: {supported_summary()}"
            )
        if backend == "lmcache-mp" and disk is not None and disk.path == shared.path:
            raise ValueError(f"{where}: the disk and shared tiers must use different paths")


def render_vllm_launch(
    profile: OffloadProfile,
    config: VllmEngineConfig,
    prefix_caching: bool,
    workdir: Path,
    *,
    port_factory: Callable[[], int] | None = None,
    scope: TierScope | None = None,
) -> VllmLaunchPlan:
    """Render ``profile`` for ``config``. ``prefix_caching`` is the runner's word (False when the
    scenario disables the GPU prefix cache); the profile's own ``prefix_caching`` must agree for
    the cache to be on. ``workdir`` holds the files kvbench writes (a fresh temporary directory);
    ``port_factory`` gives free ports for sidecars (default: ask the OS); ``scope`` puts disk and
    shared tiers' KV in the engine session's own subdirectories (:func:`offload.profiles.tier_dir`)."""
    check_supported(profile, config)
    backend = resolve_backend(profile, config)
    caching = prefix_caching and profile.prefix_caching
    args: list[str] = ["--enable-prefix-caching" if caching else "--no-enable-prefix-caching"]
    if backend == "none":
        return VllmLaunchPlan(backend="none", args=tuple(args))
    tiers: dict[str, OffloadTier] = {tier.kind: tier for tier in profile.tiers}
    if backend == "native":
        return _render_native(args, tiers["cpu"])
    if backend == "lmcache":
        ranks = config.parallelism.tp * config.parallelism.pp
        return _render_lmcache(args, profile, tiers, workdir, ranks=ranks, scope=scope)
    if port_factory is None:
        from .process import free_port

        port_factory = free_port
    return _render_lmcache_mp(args, profile, tiers, config.device, port_factory, scope)


def _render_native(args: list[str], cpu: OffloadTier) -> VllmLaunchPlan:
    size_gib = cpu.capacity_gb * 1e9 / GIB
    args += ["--kv-offloading-size", _number(round(size_gib, 3)), "--kv-offloading-backend", "native"]
    return VllmLaunchPlan(
        backend="native",
        args=tuple(args),
        notes=(f"cpu tier {cpu.capacity_gb:g} GB = {size_gib:.3f} GiB (--kv-offloading-size is in GiB)",),
        pinned_host_bytes=int(cpu.capacity_gb * 1e9 * NATIVE_PIN_FACTOR),
    )


def _render_lmcache(
    args: list[str],
    profile: OffloadProfile,
    tiers: Mapping[str, OffloadTier],
    workdir: Path,
    *,
    ranks: int,
    scope: TierScope | None,
) -> VllmLaunchPlan:
    # every TP/PP rank runs its own LMCache engine with its own CPU buffer of max_local_cpu_size GB,
    # holding its shard of each chunk: split the profile's tier (the whole deployment's) between them
    cpu_gb = tiers["cpu"].capacity_gb
    config: dict[str, object] = {
        "chunk_size": profile.chunk_tokens,
        "local_cpu": True,
        "max_local_cpu_size": cpu_gb / ranks if ranks > 1 else cpu_gb,
        "save_unfull_chunk": True,
    }
    if profile.async_loading:
        config["enable_async_loading"] = True
    dirs: list[Path] = []
    notes: list[str] = []
    disk = tiers.get("disk")
    placed = tier_dirs(disk, scope) if disk is not None else None
    if disk is not None and placed is not None:
        config["local_disk"] = "file://" + placed.used.rstrip("/") + "/"
        config["max_local_disk_size"] = disk.capacity_gb
        dirs += [Path(path) for path in placed.create]
        notes.append(placed.note)
    shared = tiers.get("shared")
    if shared is not None and shared.remote_url:
        config["remote_url"] = shared.remote_url
        config["remote_serde"] = "naive"
    config_path = workdir / "lmcache.yaml"
    prometheus_dir = workdir / "prometheus"
    dirs.append(prometheus_dir)
    transfer = {"kv_connector": LMCACHE_CONNECTOR, "kv_role": "kv_both"}
    args += ["--kv-transfer-config", json.dumps(transfer, separators=(",", ":"))]
    if ranks > 1:
        notes.append(f"cpu tier {cpu_gb:g} GB over {ranks} ranks: max_local_cpu_size {cpu_gb / ranks:g} GB per rank")
    if shared is not None:
        notes.append(
            f"shared tier served by {shared.remote_url}; its capacity_gb is the server's to enforce, and kvbench "
            "cannot empty it between arms or runs (turn 1 may hit KV left there)"
        )
    return VllmLaunchPlan(
        backend="lmcache",
        args=tuple(args),
        env={"LMCACHE_CONFIG_FILE": str(config_path), "PROMETHEUS_MULTIPROC_DIR": str(prometheus_dir)},
        files=(LaunchFile(config_path, yaml.safe_dump(config, sort_keys=True)),),
        dirs=tuple(dirs),
        notes=tuple(notes),
        pinned_host_bytes=int(cpu_gb * 1e9),
    )


def _render_lmcache_mp(
    args: list[str],
    profile: OffloadProfile,
    tiers: Mapping[str, OffloadTier],
    device: str,
    port_factory: Callable[[], int],
    scope: TierScope | None,
) -> VllmLaunchPlan:
    host = "127.0.0.1"
    adapters: list[str] = []
    dirs: list[Path] = []
    must_exist: list[Path] = []
    notes: list[str] = []
    for kind, tier, placed in file_tier_dirs(tiers, scope):
        adapters.append(json.dumps({"type": "fs", "base_path": placed.used}, separators=(",", ":")))
        dirs += [Path(path) for path in placed.create]
        must_exist += [Path(path) for path in placed.must_exist]
        notes.append(placed.note)
        notes.append(
            f"{kind} tier {placed.used}: LMCache's fs L2 adapter does not enforce capacity_gb ({tier.capacity_gb:g} GB)"
        )
    port, http_port, prometheus_port = _distinct_ports(port_factory, 3)
    server = LmcacheServerSpec(
        host=host,
        port=port,
        http_port=http_port,
        prometheus_port=prometheus_port,
        l1_size_gb=tiers["cpu"].capacity_gb,
        chunk_size=profile.chunk_tokens,
        # CPU: the engine copies KV itself (PREPARE/COMMIT). CUDA: vLLM's connector registers its KV
        # caches for server-driven transfer (CUDA IPC), which an engine_driven-only server refuses.
        transfer_mode="engine_driven" if device == "cpu" else "auto",
        l2_adapters=tuple(adapters),
    )
    transfer = {
        "kv_connector": LMCACHE_MP_CONNECTOR,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"lmcache.mp.host": f"tcp://{host}", "lmcache.mp.port": server.port},
    }
    args += ["--kv-transfer-config", json.dumps(transfer, separators=(",", ":"))]
    return VllmLaunchPlan(
        backend="lmcache-mp",
        args=tuple(args),
        dirs=tuple(dirs),
        must_exist=tuple(must_exist),
        sidecars=(server,),
        notes=tuple(notes),
        pinned_host_bytes=int(server.l1_size_gb * 1e9),
    )


def _distinct_ports(port_factory: Callable[[], int], count: int) -> list[int]:
    ports: list[int] = []
    for _ in range(count * 20):
        port = port_factory()
        if port not in ports:
            ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"port factory gave fewer than {count} distinct ports: {ports}")


def _number(value: float) -> str:
    """A CLI number: ``2`` for 2.0, ``1.5`` for 1.5."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def name_replica(
    plan: VllmLaunchPlan, workdir: Path, replica: int, fleet_size: int, inherited_pythonpath: str | None
) -> VllmLaunchPlan:
    """``plan`` whose server adds ``X-Kvbench-Replica: <replica>`` to every response.

    vLLM's ``--middleware`` imports a module by name in the engine's own Python, which has no
    kvbench: the middleware's file (standard library only) is written into the replica's working
    directory, put first on its ``PYTHONPATH`` (after it the inherited one, which vLLM may need).
    """
    source = Path(kvbench_replica_header.__file__).read_text(encoding="utf-8")
    module = kvbench_replica_header.MIDDLEWARE.rsplit(".", 1)[0]
    path = str(workdir) if not inherited_pythonpath else f"{workdir}{os.pathsep}{inherited_pythonpath}"
    return dataclasses.replace(
        plan,
        args=(*plan.args, "--middleware", kvbench_replica_header.MIDDLEWARE),
        env={**plan.env, "PYTHONPATH": path, **kvbench_replica_header.replica_env(replica, fleet_size)},
        files=(*plan.files, LaunchFile(workdir / f"{module}.py", source)),
    )


def use_shared_server(plan: VllmLaunchPlan, shared: SharedTierHandle) -> VllmLaunchPlan:
    """``plan`` connecting to the fleet's LMCache server instead of starting its own sidecar."""
    if plan.backend != "lmcache-mp" or shared.host is None or shared.port is None:
        return plan
    args = list(plan.args)
    index = args.index("--kv-transfer-config") + 1
    transfer = json.loads(args[index])
    if transfer.get("kv_connector") != LMCACHE_MP_CONNECTOR:
        return plan
    transfer["kv_connector_extra_config"] = {"lmcache.mp.host": f"tcp://{shared.host}", "lmcache.mp.port": shared.port}
    args[index] = json.dumps(transfer, separators=(",", ":"))
    # the arm's one server pins the tiers and owns their directories, made and checked once (shared_tier), not
    # per replica; the replica's own notes were about its dropped sidecar's tiers, the server's say where they are
    return dataclasses.replace(
        plan,
        args=tuple(args),
        sidecars=(),
        notes=(f"shared tier: {shared.description}",),
        pinned_host_bytes=0,
        dirs=(),
        must_exist=(),
    )
