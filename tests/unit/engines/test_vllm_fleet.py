"""vLLM fleets: replicas of an arm with a shared tier connect to one LMCache server, others keep their own."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from common.errors import EngineStartError
from harness.engines.base import LaunchContext, SharedTierHandle
from harness.engines.configs import VllmEngineConfig
from harness.engines.vllm_fleet import shared_tier, shares_server
from harness.engines.vllm_offload import render_vllm_launch, use_shared_server
from offload.profiles import OffloadProfile, OffloadTier

CONFIG = VllmEngineConfig(kind="vllm", model="/m", device="cuda", replicas=2, gpus=[0, 1])


def _profile(shared: Path | None) -> OffloadProfile:
    tiers = [OffloadTier(kind="cpu", capacity_gb=40)]
    if shared is not None:
        tiers.append(OffloadTier(kind="shared", capacity_gb=200, path=str(shared)))
    return OffloadProfile(name="p", backend="lmcache-mp", tiers=tuple(tiers))


def _connector(args: tuple[str, ...]) -> dict[str, object]:
    value: dict[str, object] = json.loads(args[args.index("--kv-transfer-config") + 1])
    return value


def test_replica_plan_points_at_the_shared_server(tmp_path: Path) -> None:
    plan = render_vllm_launch(_profile(tmp_path), CONFIG.replica_config(1), True, tmp_path)
    assert len(plan.sidecars) == 1  # alone, a replica would start its own server
    shared = SharedTierHandle(description="one server", host="127.0.0.1", port=45678)
    joined = use_shared_server(plan, shared)
    assert joined.sidecars == ()
    extra = _connector(joined.args)["kv_connector_extra_config"]
    assert extra == {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": 45678}
    assert _connector(joined.args)["kv_connector"] == _connector(plan.args)["kv_connector"]
    assert [a for a in joined.args if a != joined.args[joined.args.index("--kv-transfer-config") + 1]] == [
        a for a in plan.args if a != plan.args[plan.args.index("--kv-transfer-config") + 1]
    ]


def test_only_lmcache_mp_with_a_shared_tier_is_shared(tmp_path: Path) -> None:
    def context(profile: OffloadProfile) -> LaunchContext:
        return LaunchContext(arm="a", profile=profile, log_dir=tmp_path, prefix_caching=True)

    assert shares_server(context(_profile(tmp_path)), CONFIG)
    assert not shares_server(context(_profile(None)), CONFIG)  # per-replica servers

    async def starter_yields() -> SharedTierHandle | None:
        async with shared_tier(CONFIG, context(_profile(None))) as handle:
            return handle

    assert asyncio.run(starter_yields()) is None  # nothing started for per-replica tiers


def test_the_shared_server_starts_in_the_background_and_its_failure_names_its_log(tmp_path: Path) -> None:
    # kvbench's own python has no lmcache: the server dies at once. The replicas start while it does
    # (the handle comes before it is healthy), and its start's error names the server and its log.
    config = CONFIG.model_copy(update={"python": sys.executable})
    profile = OffloadProfile(
        name="p",
        backend="lmcache-mp",
        tiers=(OffloadTier(kind="cpu", capacity_gb=1), OffloadTier(kind="shared", capacity_gb=1, path=str(tmp_path))),
    )
    context = LaunchContext(arm="a", profile=profile, log_dir=tmp_path / "logs", prefix_caching=True)

    async def failed_start() -> str:
        async with shared_tier(config, context) as handle:
            assert handle is not None and handle.ready is not None and handle.port is not None
            with pytest.raises(EngineStartError) as caught:
                await handle.ready
            return str(caught.value)

    message = asyncio.run(failed_start())
    assert message.startswith("LMCache server (port ") and "exited with code 1 before becoming healthy" in message
    assert str(tmp_path / "logs" / "lmcache-server-shared.log") in message and "lmcache" in message
