"""The simulator's fleet shared tier: one directory per arm that every replica indexes chunks in.

The ``sim`` engine kind (registered in ``harness/sim/__init__.py``) names :func:`shared_tier`. When the arm's profile
has a ``shared`` tier, it creates ``<arm log dir>/shared-tier`` empty (so arms never share
cached KV) and hands it to every replica (:mod:`harness.sim.shared_tier`); the directory is
emptied again when the arm ends. A profile without a shared tier shares nothing: every replica
keeps its own tiers, as one simulator does.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator

from harness.engines.base import EngineConfigModel, LaunchContext, SharedTierHandle

SHARED_DIR = "shared-tier"


@contextlib.asynccontextmanager
async def shared_tier(config: EngineConfigModel, context: LaunchContext) -> AsyncIterator[SharedTierHandle | None]:
    del config  # the simulator's shared tier depends on the profile alone
    tier = next((tier for tier in context.profile.tiers if tier.kind == "shared"), None)
    if tier is None:
        yield None
        return
    root = context.log_dir / SHARED_DIR
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    try:
        yield SharedTierHandle(
            description=f"simulated shared tier ({tier.capacity_gb:g} GB, {tier.effective_read_gbps:g} GB/s read, "
            f"{tier.effective_latency_us:g} us) indexed in {root}",
            path=root,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
