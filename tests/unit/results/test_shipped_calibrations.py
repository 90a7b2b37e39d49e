"""The calibrations shipped under docs/results match the runs they name, and refuse other deployments."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from common.errors import CalibrationError
from harness.calibrate.fit import run_facts
from harness.calibrate.validate import sim_engine, validate
from harness.sim.calibration import Calibration
from harness.sim.config import SimEngineConfig
from harness.sim.settings import SimSettings
from harness.store.rundir import RunDir
from offload.profiles import resolve_profile

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = sorted((ROOT / "docs" / "results").glob("calibration-*.yaml"))
FP8_70B = ROOT / "docs" / "results" / "calibration-llama70b-fp8-tp4-h200-vllm0.26.yaml"
BF16_70B_RUN = ROOT / "docs" / "results" / "gpu-seed-llama70b-tp4-fp16-h200"


def test_there_are_shipped_calibrations() -> None:
    assert FP8_70B in SHIPPED


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_calibration_is_for_the_deployment_of_its_source_runs(path: Path) -> None:
    calibration = Calibration.load(path)
    for source in calibration.sources:
        run = ROOT / source.path
        assert hashlib.sha256((run / "manifest.json").read_bytes()).hexdigest() == source.manifest_sha256
        assert run_facts(run).deployment == calibration.deployment


def test_the_fp8_70b_calibration_refuses_the_bf16_run_naming_both(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError) as error:
        validate(BF16_70B_RUN, tmp_path, FP8_70B, holdout=[2000])
    message = str(error.value)
    assert "llama-3.1-70b fp8 weights, bf16 KV on 4x h200-sxm" in message
    assert "llama-3.1-70b bf16 on 4x h200-sxm" in message and str(BF16_70B_RUN) in message
    assert not list(tmp_path.glob("*/records.jsonl"))  # refused before simulating


def test_the_simulator_takes_the_fp8_70b_calibration_for_its_run() -> None:
    run = ROOT / "docs" / "results" / "gpu-seed-llama70b-tp4-fp8-h200"
    facts = run_facts(run)
    calibration = Calibration.load(FP8_70B)
    engine = SimEngineConfig.model_validate(sim_engine(RunDir.open(run).scenario(), facts, calibration, FP8_70B))
    assert (engine.dtype, engine.kv_dtype, engine.parallelism.tp) == ("fp8", "bf16", 4)
    for arm in RunDir.open(run).scenario().arms:
        settings = SimSettings.from_engine_config(engine, resolve_profile(arm.offload), True)
        assert settings.deployment().label == "llama-3.1-70b fp8 weights, bf16 KV on 4x h200-sxm"


def test_serve_refuses_the_fp8_70b_calibration_for_an_fp8_kv_cache() -> None:
    from typer.testing import CliRunner

    from kvbench.cli.sim import sim_app

    argv = ["serve", "--model", "llama-3.1-70b", "--hardware", "h200-sxm", "--tp", "4", "--dtype", "fp8"]
    result = CliRunner().invoke(sim_app, [*argv, "--offload", "cpu", "--calibration", str(FP8_70B)])
    assert result.exit_code == 2
    assert "fp8 weights, bf16 KV on 4x h200-sxm" in result.output and "fp8 on 4x h200-sxm" in result.output


def test_a_fixed_hbm_block_count_travels_from_the_vllm_run_to_the_simulator() -> None:
    """A sweep that fixes vLLM's KV blocks (engine.num_gpu_blocks_override) is validated on a simulator
    with the same HBM prefix cache, not with what the simulator's memory model would allow."""
    from harness.scenario.spec import load_scenario
    from harness.sim.scheduler import EngineCore

    run = ROOT / "docs" / "results" / "gpu-llama8b-lmcache-h100"
    scenario, _ = load_scenario("gpu-sweep-llama8b")
    assert scenario.engine.kind == "vllm" and scenario.engine.num_gpu_blocks_override is not None
    engine = SimEngineConfig.model_validate(sim_engine(scenario, run_facts(run), None, None))
    assert engine.num_gpu_blocks_override == scenario.engine.num_gpu_blocks_override
    settings = SimSettings.from_engine_config(engine, resolve_profile("hbm"), True)
    core = EngineCore(settings)
    assert core.kv_cache_tokens == scenario.engine.num_gpu_blocks_override * settings.block_tokens
