"""The ready-to-run SGLang GPU scenarios and wheelhouse list (issue 43), checked without a GPU.

The probe and the sweep render the HiCache launch their comments state (radix cache only vs
``--enable-hierarchical-cache`` with a host pool, write-through), both run without CUDA graphs as the vLLM runs
they are compared with ran eager, their fixed GPU KV pool (``--max-total-tokens``) fits the probe's longest prompt
and is overwritten by its filler, and the sweep keeps ``gpu-decode-tax-llama8b-h200``'s loads, workload and HBM KV
size (vLLM blocks x 16 tokens) so the two engines compare on one H200.
``scripts/gpu/sglang-wheels.txt`` pins every wheel exactly and lists none of what the GPU image provides.
"""

from __future__ import annotations

import re

from harness.engines.configs import SglangEngineConfig, VllmEngineConfig
from harness.engines.sglang import build_sglang_argv
from harness.engines.sglang_offload import render_sglang_launch
from harness.scenario.spec import Scenario, load_scenario
from tests.support import REPO
from workloads.config import MultiRoundQAProbe

PROBE = REPO / "scenarios" / "gpu-sglang-llama8b-hicache.yaml"
SWEEP = REPO / "scenarios" / "gpu-sweep-sglang-llama8b-h200.yaml"
VLLM_SWEEP = REPO / "scenarios" / "gpu-decode-tax-llama8b-h200.yaml"
WHEELS = REPO / "scripts" / "gpu" / "sglang-wheels.txt"
VLLM_BLOCK_TOKENS = 16
"""vLLM's block size on CUDA where the scenario leaves it unset."""
KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2
"""Llama-3.1-8B shape: 32 layers x 8 KV heads x head_dim 128 x (K, V) x 2 bytes (bf16)."""


def _argv_by_arm(scenario: Scenario) -> dict[str, tuple[str, ...]]:
    engine = scenario.engine
    assert isinstance(engine, SglangEngineConfig)
    return {
        arm.name: build_sglang_argv(engine, "python3", 30000, render_sglang_launch(arm.profile, engine, True))
        for arm in scenario.arms
    }


def _flag_value(argv: tuple[str, ...], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


def test_sglang_scenarios_render_radix_only_against_hicache_write_through() -> None:
    for path in (PROBE, SWEEP):
        scenario, _ = load_scenario(path)
        argv = _argv_by_arm(scenario)
        assert set(argv) == {"AMG-OFF", "AMG-ON-HiCache"}, path.name
        off, on = argv["AMG-OFF"], argv["AMG-ON-HiCache"]
        assert "--enable-hierarchical-cache" not in off and "--disable-radix-cache" not in off, path.name
        assert "--enable-hierarchical-cache" in on, path.name
        assert _flag_value(on, "--hicache-write-policy") == "write_through", path.name
        assert _flag_value(off, "--max-total-tokens") == _flag_value(on, "--max-total-tokens"), path.name
        assert "--disable-cuda-graph" in off and "--disable-cuda-graph" in on, path.name


def test_probe_pool_holds_the_longest_prompt_and_its_filler_overwrites_the_pool() -> None:
    scenario, _ = load_scenario(PROBE)
    pool = int(_flag_value(_argv_by_arm(scenario)["AMG-OFF"], "--max-total-tokens"))
    workload = scenario.workload
    assert isinstance(workload, MultiRoundQAProbe)
    longest = max(workload.context_tokens) + workload.question_tokens + workload.answer_tokens
    assert longest <= pool < 2 * longest
    assert workload.between_turns.mode == "filler"
    assert workload.between_turns.filler_tokens >= 1.25 * pool
    # the filler passes through the host pool too: it must still hold every turn 1 of the longest group
    host_tokens = (
        int(_flag_value(_argv_by_arm(scenario)["AMG-ON-HiCache"], "--hicache-size")) * 1e9 / KV_BYTES_PER_TOKEN
    )
    turn1_tokens = workload.conversations * longest
    assert host_tokens >= 1.25 * (turn1_tokens + workload.between_turns.filler_tokens)


def test_sglang_sweep_keeps_the_h200_vllm_sweeps_loads_workload_and_hbm_kv() -> None:
    sglang, _ = load_scenario(SWEEP)
    vllm, _ = load_scenario(VLLM_SWEEP)
    assert isinstance(vllm.engine, VllmEngineConfig) and vllm.engine.num_gpu_blocks_override is not None
    assert vllm.engine.enforce_eager
    assert sglang.workload == vllm.workload
    assert sglang.sweep == vllm.sweep
    assert (sglang.slo, sglang.seed) == (vllm.slo, vllm.seed)
    native = next(arm for arm in vllm.arms if arm.name == "AMG-ON-native")
    assert (
        _flag_value(_argv_by_arm(sglang)["AMG-ON-HiCache"], "--hicache-size")
        == f"{native.profile.tiers[0].capacity_gb:g}"
    )
    pool = int(_flag_value(_argv_by_arm(sglang)["AMG-OFF"], "--max-total-tokens"))
    assert pool == vllm.engine.num_gpu_blocks_override * VLLM_BLOCK_TOKENS


def test_sglang_wheel_list_pins_every_wheel_and_leaves_the_image_alone() -> None:
    lines = WHEELS.read_text(encoding="utf-8").splitlines()
    provided_line = [line for line in lines if line.startswith("# provided: ")]
    assert len(provided_line) == 1
    provided = dict(pin.split("==") for pin in provided_line[0].removeprefix("# provided: ").split())
    assert provided["torch"] == "2.11.0"
    pins = [line for line in lines if line.strip() and not line.startswith("#")]
    names = []
    for pin in pins:
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+]*)", pin)
        assert match, f"{WHEELS.name}: '{pin}' is not NAME==VERSION"
        names.append(re.sub(r"[-_.]+", "-", match.group(1)).lower())
    assert len(names) == len(set(names)), "a wheel is listed twice"
    assert not set(names) & {re.sub(r"[-_.]+", "-", name).lower() for name in provided}
    versions = dict(pin.lower().split("==") for pin in pins)
    assert versions["sglang"] == "0.5.17" and "sglang-kernel" in versions
