"""vLLM fleets: the shared tier is one LMCache multi-process server that every replica connects to.

The ``vllm`` engine kind (:mod:`harness.engines.builtin`) names :func:`shared_tier`. For an arm whose
profile renders to the ``lmcache-mp`` backend and has a ``shared`` tier, the fleet starts ONE
``lmcache server`` for the arm (log ``lmcache-server-shared.log`` in the arm's log directory): its L1
is the profile's cpu tier (host DRAM, now seen by every replica), its filesystem L2 the shared
tier's directory for the arm's engine session (``<path>/<session>``, :func:`offload.profiles.tier_dir`;
a disk tier in the same server gets ``<path>/<session>/shared-server``), created here before the
server starts. Each replica's launch plan is then pointed at that server instead of starting a sidecar of
its own (:func:`harness.engines.vllm_offload.use_shared_server`), and creates no tier directories. The
replicas start while the server does (:attr:`SharedTierHandle.ready`): a replica is started once it and
the server are healthy, and a server that fails to start fails every replica with its error (naming its
log). What each backend shares:

* ``lmcache-mp`` + ``shared`` tier: everything in the one server (L1 DRAM and the fs L2) -- shared;
* ``lmcache-mp`` without a ``shared`` tier: one server per replica -- nothing shared;
* ``lmcache`` (in-process) + ``shared`` tier with ``remote_url``: each replica's own CPU/disk tiers,
  plus the remote server the user runs at ``remote_url`` -- shared by construction, kvbench starts nothing;
* ``native``: vLLM's CPU offload is per process -- nothing shared.

Every replica of a fleet also names itself in a response header
(:func:`harness.engines.vllm_offload.name_replica`, module
:mod:`harness.engines.kvbench_replica_header`), so that requests through a router are attributed
exactly even when they overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from .base import EngineConfigModel, LaunchContext, SharedTierHandle
from .common import make_offload_dirs
from .configs import VllmEngineConfig
from .hostmem import available_host_bytes, check_host_memory
from .lmcache_server import LmcacheServer
from .vllm import resolve_python
from .vllm_offload import render_vllm_launch, resolve_backend

SHARED_LOG = "lmcache-server-shared.log"
SERVER_OWNER = "shared-server"
"""Whose disk tier the one server's is (:attr:`offload.profiles.TierScope.owner`): no replica's."""


def shares_server(context: LaunchContext, config: VllmEngineConfig) -> bool:
    """Whether the arm's replicas share one LMCache server (lmcache-mp backend with a shared tier)."""
    has_shared = any(tier.kind == "shared" for tier in context.profile.tiers)
    return has_shared and resolve_backend(context.profile, config) == "lmcache-mp"


@contextlib.asynccontextmanager
async def shared_tier(config: EngineConfigModel, context: LaunchContext) -> AsyncIterator[SharedTierHandle | None]:
    if not isinstance(config, VllmEngineConfig) or not shares_server(context, config):
        yield None
        return
    workdir = Path(tempfile.mkdtemp(prefix="kvbench-vllm-fleet-"))
    try:
        scope = context.tier_scope
        if scope is not None:
            scope = dataclasses.replace(scope, owner=SERVER_OWNER)
        plan = render_vllm_launch(context.profile, config, context.prefix_caching, workdir, scope=scope)
        check_host_memory(
            plan.pinned_host_bytes,
            f"arm {context.arm}: the shared LMCache server of offload profile {context.profile.name!r}",
            available_host_bytes(),
        )
        spec = plan.sidecars[0]
        make_offload_dirs(plan.must_exist, plan.dirs)
        context.log_dir.mkdir(parents=True, exist_ok=True)
        server = LmcacheServer(
            spec,
            python=resolve_python(config),
            log_path=context.log_dir / SHARED_LOG,
            env={key: value for key, value in config.env.items() if key.startswith("LMCACHE_")},
            startup_timeout_s=min(config.startup_timeout_s, 300.0),
        )
        # the replicas start while the server does (each waits for it before it counts as started): they need it
        # only once loaded, a minute into their start on a small CPU machine, and it takes ~15 s of that
        ready = asyncio.ensure_future(server.process.start())
        try:
            yield SharedTierHandle(
                description=f"one LMCache server for every replica: {' '.join(server.redacted_argv)}"
                + "".join(f" | {note}" for note in plan.notes),
                host=spec.host,
                port=spec.port,
                serves_all_tiers=True,
                ready=ready,
            )
        finally:
            ready.cancel()  # a start still under way stops the server itself
            await asyncio.gather(ready, return_exceptions=True)
            await server.process.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
