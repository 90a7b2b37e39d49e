"""The ready-to-run 2-GPU fleet scenario renders as intended, without GPUs: one GPU per replica,
an LMCache server per replica for the own-tier arms, one shared server for the shared arms."""

from __future__ import annotations

from pathlib import Path

from harness.engines.base import LaunchContext
from harness.engines.configs import VllmEngineConfig
from harness.engines.vllm import build_vllm_env
from harness.engines.vllm_fleet import shares_server
from harness.engines.vllm_offload import render_vllm_launch
from harness.scenario.spec import load_scenario

SCENARIO = Path(__file__).resolve().parents[3] / "scenarios" / "gpu-fleet-llama8b-2x.yaml"


def test_gpu_fleet_scenario_renders_per_replica(tmp_path: Path) -> None:
    scenario, _ = load_scenario(SCENARIO)
    engine = scenario.engine
    assert isinstance(engine, VllmEngineConfig)
    assert engine.fleet_size == 2 and engine.fleet_gpus == 2
    backends: dict[str, set[str]] = {}
    for arm in scenario.arms:
        context = LaunchContext(arm=arm.name, profile=arm.profile, log_dir=tmp_path, prefix_caching=True)
        for index in range(2):
            replica = engine.replica_config(index)
            plan = render_vllm_launch(arm.profile, replica, True, tmp_path / arm.name / str(index))
            assert build_vllm_env(replica, plan)["CUDA_VISIBLE_DEVICES"] == str(index)
            backends.setdefault(arm.name, set()).add(plan.backend)
        expected_shared = arm.name.startswith("shared")
        assert shares_server(context, engine) is expected_shared, arm.name
    assert backends["OFF-rr"] == {"none"} and backends["own-rr"] == {"lmcache-mp"}
    policies = {arm.name: (arm.routing or scenario.routing).policy for arm in scenario.arms}
    assert policies == {
        "OFF-rr": "round_robin",
        "own-rr": "round_robin",
        "shared-rr": "round_robin",
        "OFF-sa": "session_affinity",
        "own-sa": "session_affinity",
        "shared-sa": "session_affinity",
        "VR-cache-own": "external",
    }
    router_arm = next(arm for arm in scenario.arms if arm.name == "VR-cache-own")
    assert router_arm.routing is not None and router_arm.routing.router is not None
    assert (router_arm.routing.router.kind, router_arm.routing.router.policy) == ("vllm-router", "cache_aware")
    assert backends["VR-cache-own"] == {"lmcache-mp"}
