"""Fleet fields of the engine section, and the environment every replica process gets."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.engines.configs import OpenAIEngineConfig, VllmEngineConfig
from harness.engines.process import ManagedProcess, ProcessSpec
from harness.sim.config import SimEngineConfig

MULTI_GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def test_replicas_and_gpus_per_replica() -> None:
    config = VllmEngineConfig(kind="vllm", model="/m", replicas=2, gpus=[3, 5], port=9000, env={"A": "b"})
    assert config.fleet_size == 2 and config.fleet_gpus == 2
    first, second = config.replica_config(0), config.replica_config(1)
    assert (first.port, second.port) == (9000, 9001)
    assert first.env == {"A": "b", "CUDA_VISIBLE_DEVICES": "3"}
    assert second.env["CUDA_VISIBLE_DEVICES"] == "5"
    assert second.fleet_size == 1 and second.gpus is None


def test_tp_replicas_get_disjoint_gpu_sets() -> None:
    config = VllmEngineConfig.model_validate(
        {"kind": "vllm", "model": "/m", "replicas": 2, "parallelism": {"tp": 2}, "gpus": [0, 1, 2, 3]}
    )
    assert config.replica_gpus == 2 and config.fleet_gpus == 4
    assert [config.visible_devices(i) for i in range(2)] == ["0,1", "2,3"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"replicas": 2, "gpus": [0]}, "replicas × gpus_per_replica = 2"),
        ({"replicas": 2, "gpus": [0, 0]}, "distinct"),
        ({"replicas": 2, "parallelism": {"replicas": 3}}, "disagree"),
        ({"parallelism": {"tp": 2}, "gpus_per_replica": 1}, "less than tp"),
    ],
)
def test_bad_fleet_fields(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        VllmEngineConfig.model_validate({"kind": "vllm", "model": "/m", **fields})


def test_sim_alias_counts_replicas() -> None:
    config = SimEngineConfig.model_validate(
        {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm", "parallelism": {"replicas": 4}}
    )
    assert config.fleet_size == 4
    assert config.replica_config(3).parallelism.replicas == 1


def test_openai_fleet_endpoints() -> None:
    config = OpenAIEngineConfig.model_validate(
        {
            "kind": "openai",
            "model": "m",
            "endpoints": [{"url": "http://a:1", "metrics_url": "http://a:2/metrics"}, {"url": "http://b:1"}],
        }
    )
    assert config.fleet_size == 2 and config.routed_by_kvbench
    assert config.replica_config(1).base_url == "http://b:1"
    assert config.metrics_url(0) == "http://a:2/metrics" and config.metrics_url(1) is None
    behind_router = OpenAIEngineConfig.model_validate(
        {
            "kind": "openai",
            "model": "m",
            "base_url": "http://router",
            "endpoints": [{"metrics_url": "http://a/metrics"}] * 2,
        }
    )
    assert behind_router.fleet_size == 2 and not behind_router.routed_by_kvbench
    with pytest.raises(ValidationError, match="need base_url"):
        OpenAIEngineConfig.model_validate(
            {"kind": "openai", "model": "m", "endpoints": [{"metrics_url": "http://a/metrics"}]}
        )
    with pytest.raises(ValidationError, match="endpoints"):
        OpenAIEngineConfig(kind="openai", model="m", base_url="http://x", replicas=2)


def test_multi_gpu_env_reaches_every_engine_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVLink-multicast switches set in kvbench's environment must reach the engine (never dropped)."""
    for key, value in MULTI_GPU_ENV.items():
        monkeypatch.setenv(key, value)
    config = VllmEngineConfig(kind="vllm", model="/m", replicas=2, gpus=[0, 1])
    script = (
        "import json, os, http.server, sys\n"
        "json.dump({k: os.environ.get(k) for k in sys.argv[2:]}, open(sys.argv[1], 'w'))\n"
    )
    for index in range(2):
        replica = config.replica_config(index)
        out = tmp_path / f"env-{index}.json"
        spec = ProcessSpec(
            name=f"env probe {index}",
            argv=(sys.executable, "-c", script, str(out), *MULTI_GPU_ENV, "CUDA_VISIBLE_DEVICES"),
            env=replica.env,
            log_path=tmp_path / f"log-{index}",
            health_url="http://127.0.0.1:9/never",
            startup_timeout_s=5,
            stop_grace_s=1,
        )
        process = ManagedProcess(spec)
        with pytest.raises(Exception, match="exited with code 0"):  # it exits at once: never healthy
            asyncio.run(process.__aenter__())
        import json

        seen = json.loads(out.read_text())
        assert {key: seen[key] for key in MULTI_GPU_ENV} == MULTI_GPU_ENV
        assert seen["CUDA_VISIBLE_DEVICES"] == str(index)
    assert all(os.environ[key] == value for key, value in MULTI_GPU_ENV.items())
