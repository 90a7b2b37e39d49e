"""Applying a calibration: the engine core follows it, and another deployment is refused, naming both."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from harness.engines.configs import Parallelism
from harness.sim.calibration import unloaded_ttft_s
from harness.sim.config import SimEngineConfig
from harness.sim.scheduler import EngineCore, SimRequest
from harness.sim.settings import SimSettings
from harness.sim.timemodel import TimeModel
from harness.sim.whatif import _ignore, _run
from kvbench.cli.sim import sim_app
from kvbench.errors import CalibrationError
from offload.profiles import OffloadProfile, OffloadTier
from tests.unit.results.test_calibrate import chosen

CPU = OffloadProfile(name="lmc", tiers=(OffloadTier(kind="cpu", capacity_gb=60),), backend="lmcache")


def test_core_ttft_is_overhead_plus_load_plus_prefill_with_store() -> None:
    truth = chosen()
    settings = SimSettings(model="llama-3.1-8b", hardware="h100-sxm", offload=CPU, calibration=truth)
    core = EngineCore(settings)
    prompt = list(range(100, 100 + 20_000))
    first = SimRequest("t1", prompt, 2, _ignore)
    now = _run(core, first, 0.0)
    core.reset_prefix_cache()
    second = SimRequest("t2", [*prompt, *range(5, 69)], 2, _ignore)
    _run(core, second, now + 1.0)
    deployment = settings.deployment()
    backend = truth.backends["lmcache"]
    timing = TimeModel(deployment, truth.efficiencies(deployment, backend))
    assert first.first_token_at is not None and second.first_token_at is not None
    expected_t1 = unloaded_ttft_s(timing, truth.request_overhead(20_000), 20_000, 0, 0, 0.0, 8192)
    assert first.first_token_at - first.arrival == pytest.approx(expected_t1, rel=1e-9)
    loaded = second.external_tokens
    assert loaded == 20_000 // 256 * 256
    load_s = backend.load_latency_s.value + loaded * deployment.kv_bytes_per_token / (backend.load_gbps.value * 1e9)
    expected_t2 = unloaded_ttft_s(timing, truth.request_overhead(20_064), 20_064, 0, loaded, load_s, 8192)
    assert second.first_token_at - second.arrival == pytest.approx(expected_t2, rel=1e-9)
    # the store makes turn 1 slower than the same engine without a tier
    bare = TimeModel(deployment, truth.efficiencies(deployment, None))
    assert expected_t1 > unloaded_ttft_s(bare, truth.request_overhead(20_000), 20_000, 0, 0, 0.0, 8192)


def test_another_deployment_is_refused_naming_both(tmp_path: Path) -> None:
    truth = chosen()  # llama-3.1-8b bf16 on 1x h100-sxm
    with pytest.raises(ValidationError) as error:
        SimSettings(model="llama-3.1-8b", hardware="h200-sxm", offload=CPU, calibration=truth)
    assert "h100-sxm" in str(error.value) and "h200-sxm" in str(error.value)
    path = truth.save(tmp_path / "cal.yaml")
    config = SimEngineConfig(kind="sim", model="llama-3.1-8b", hardware="h100-sxm", parallelism=Parallelism(tp=2),
                             calibration=path)  # fmt: skip
    with pytest.raises(CalibrationError) as refused:
        SimSettings.from_engine_config(config, CPU, True)
    message = str(refused.value)
    assert str(path) in message and "1x h100-sxm" in message and "2x h100-sxm" in message
    result = CliRunner().invoke(sim_app, ["serve", "--hardware", "h200-sxm", "--calibration", str(path)])
    assert result.exit_code == 2
    assert "h100-sxm" in result.output and "h200-sxm" in result.output and "cal.yaml" in result.output


def test_a_backend_the_calibration_lacks_is_refused() -> None:
    native = CPU.model_copy(update={"backend": "native"})
    with pytest.raises(ValidationError, match="backends: lmcache"):
        SimSettings(model="llama-3.1-8b", hardware="h100-sxm", offload=native, calibration=chosen())


def test_an_overdue_request_is_backdated_only_when_calibrated() -> None:
    prompt = list(range(100, 1100))
    calibrated = EngineCore(SimSettings(model="llama-3.1-8b", hardware="h100-sxm", offload=CPU, calibration=chosen()))
    request = SimRequest("r", prompt, 2, _ignore)
    request.received_at = 10.0
    calibrated.add_request(request, 10.5)  # the server's own Python took 0.5 s before submitting
    due = 10.0 + chosen().request_overhead(len(prompt))
    assert request.schedulable_at == pytest.approx(due)
    assert calibrated.overdue_since(10.5) == pytest.approx(due)
    assert calibrated.overdue_since(due - 0.001) is None  # not yet due: nothing to backdate
    plain = EngineCore(SimSettings(model="llama-3.1-8b", hardware="h100-sxm", offload=CPU))
    other = SimRequest("r", prompt, 2, _ignore)
    other.received_at = 10.0
    plain.add_request(other, 10.5)
    assert plain.overdue_since(10.5) is None
