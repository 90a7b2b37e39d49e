"""Applying a calibration: the engine core follows it, and another deployment is refused, naming both."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from common.errors import CalibrationError
from harness.calibrate.whatif import _run
from harness.engines.configs import Parallelism
from harness.sim.calibration import Calibration, FitParam, unloaded_ttft_s
from harness.sim.config import SimEngineConfig
from harness.sim.scheduler import EngineCore, Event, SimRequest, TokenEvent, ignore_event
from harness.sim.settings import SimSettings
from harness.sim.timemodel import TimeModel
from kvbench.cli.sim import sim_app
from offload.profiles import OffloadProfile, OffloadTier
from offload.shapes import Deployment
from tests.unit.results.test_calibrate import chosen

CPU = OffloadProfile(name="lmc", tiers=(OffloadTier(kind="cpu", capacity_gb=60),), backend="lmcache")


def test_core_ttft_is_overhead_plus_load_plus_prefill_with_store() -> None:
    truth = chosen()
    settings = SimSettings(model="llama-3.1-8b", hardware="h100-sxm", offload=CPU, calibration=truth)
    core = EngineCore(settings)
    prompt = list(range(100, 100 + 20_000))
    first = SimRequest("t1", prompt, 2, ignore_event)
    now = _run(core, first, 0.0)
    core.reset_prefix_cache()
    second = SimRequest("t2", [*prompt, *range(5, 69)], 2, ignore_event)
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
    config = SimEngineConfig(
        kind="sim", model="llama-3.1-8b", hardware="h100-sxm", parallelism=Parallelism(tp=2), calibration=path
    )
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
    request = SimRequest("r", prompt, 2, ignore_event)
    request.received_at = 10.0
    calibrated.add_request(request, 10.5)  # the server's own Python took 0.5 s before submitting
    due = 10.0 + chosen().request_overhead(len(prompt))
    assert request.schedulable_at == pytest.approx(due)
    assert calibrated.overdue_since(10.5) == pytest.approx(due)
    assert calibrated.overdue_since(due - 0.001) is None  # not yet due: nothing to backdate
    plain = EngineCore(SimSettings(model="llama-3.1-8b", hardware="h100-sxm", offload=CPU))
    other = SimRequest("r", prompt, 2, ignore_event)
    other.received_at = 10.0
    plain.add_request(other, 10.5)
    assert plain.overdue_since(10.5) is None


def test_the_local_client_time_comes_out_of_the_calibrated_overhead_only() -> None:
    fitted = chosen().request_overhead(1000)
    assert fitted > 0.004
    local = SimSettings(
        model="llama-3.1-8b", hardware="h100-sxm", offload=CPU, calibration=chosen(), client_time_s=0.004
    )
    assert local.request_overhead_s(1000) == pytest.approx(fitted - 0.004)
    more = SimSettings(model="llama-3.1-8b", hardware="h100-sxm", offload=CPU, calibration=chosen(), client_time_s=1.0)
    assert more.request_overhead_s(1000) == 0.0  # never below nothing
    plain = SimSettings(model="llama-3.1-8b", hardware="h100-sxm", offload=CPU, client_time_s=0.004)
    assert plain.request_overhead_s(1000) == 0.0  # the datasheet model has no overhead to take it from
    config = SimEngineConfig(kind="sim", model="llama-3.1-8b", hardware="h100-sxm", client_time_s=0.004)
    assert SimSettings.from_engine_config(config, CPU, True).client_time_s == 0.004


def _blocking(share: float) -> Calibration:
    truth = chosen()
    return truth.model_copy(
        update={
            "engine_blocking_share": FitParam(value=share, unit="", fitted=True, source="chosen"),
            "request_overhead_s_per_ktoken": FitParam(value=0.002, unit="s", fitted=True, source="chosen"),
        }
    )


def _token_times(
    core: EngineCore, arrivals: list[tuple[float, SimRequest]], until: float = 60.0
) -> dict[str, list[float]]:
    """Drive ``core`` on a virtual clock; requests are submitted at their arrival times (also mid-step)."""
    clock = [0.0]
    times: dict[str, list[float]] = {}

    def recorder(mine: list[float]) -> Callable[[Event], None]:
        def sink(event: Event) -> None:
            if isinstance(event, TokenEvent):
                mine.append(clock[0])

        return sink

    for _, request in arrivals:
        times[request.request_id] = []
        request.sink = recorder(times[request.request_id])
    pending = sorted(arrivals, key=lambda a: a[0])
    now = 0.0
    while (pending or core.has_work) and now < until:
        while pending and pending[0][0] <= now:
            at, request = pending.pop(0)
            core.add_request(request, at)
        plan = core.plan(now)
        if plan is None:
            wakeups = [t for t in (core.next_wakeup(), pending[0][0] if pending else None) if t is not None]
            now = max(now, min(wakeups))
            continue
        end = now + plan.seconds
        while pending and pending[0][0] <= end:  # arrivals during the step: they are charged to the next one
            at, request = pending.pop(0)
            core.add_request(request, at)
        clock[0] = end
        core.complete(plan, end)
        now = end
    return times


def test_the_blocking_share_stalls_running_requests_by_share_x_overhead() -> None:
    prompt_b = list(range(50_000, 50_000 + 9000))
    runs: dict[float, dict[str, list[float]]] = {}
    for share in (0.0, 0.5):
        core = EngineCore(SimSettings(model="llama-3.1-8b", hardware="h100-sxm", calibration=_blocking(share)))
        a = SimRequest("a", list(range(100, 2100)), 40, ignore_event)
        b = SimRequest("b", prompt_b, 4, ignore_event)
        runs[share] = _token_times(core, [(0.0, a), (0.2503, b)])
    plain, blocked = runs[0.0]["a"], runs[0.5]["a"]
    assert plain[:5] == blocked[:5]  # before B arrives, A's steps are the same
    # the first step of A that starts after B arrived (0.2503 s) is longer by 0.5 x B's overhead
    k = next(i for i, t in enumerate(plain) if i and plain[i - 1] >= 0.2503)
    assert k > 1
    charged = 0.5 * _blocking(0.5).request_overhead(len(prompt_b))
    assert (blocked[k] - blocked[k - 1]) - (plain[k] - plain[k - 1]) == pytest.approx(charged, rel=1e-9)
    assert blocked[k - 1] == pytest.approx(plain[k - 1])


def test_an_unloaded_request_is_not_slowed_by_its_own_intake() -> None:
    prompt = list(range(100, 100 + 9000))
    ttfts = []
    for share in (0.0, 1.0):  # all of the overhead in the engine: it ran while the engine was idle
        core = EngineCore(SimSettings(model="llama-3.1-8b", hardware="h100-sxm", calibration=_blocking(share)))
        request = SimRequest("r", prompt, 2, ignore_event)
        _run(core, request, 1.0)
        assert request.first_token_at is not None
        ttfts.append(request.first_token_at - request.arrival)
    assert ttfts[1] == pytest.approx(ttfts[0], rel=1e-12)
    truth = _blocking(1.0)
    deployment = Deployment.resolve("llama-3.1-8b", "h100-sxm")
    timing = TimeModel(deployment, truth.efficiencies(deployment, None))
    assert ttfts[1] == pytest.approx(unloaded_ttft_s(timing, truth.request_overhead(9000), 9000, 0, 0, 0.0, 8192))


def test_intake_is_charged_less_the_time_the_engine_sat_idle_since() -> None:
    truth = _blocking(1.0)
    core = EngineCore(SimSettings(model="llama-3.1-8b", hardware="h100-sxm", calibration=truth))
    first = SimRequest("first", list(range(100, 1100)), 1, ignore_event)
    end = _run(core, first, 0.0)  # the engine is idle from `end`
    late = SimRequest("late", list(range(5000, 14000)), 1, ignore_event)
    intake = truth.request_intake(9000)
    core.add_request(late, end - 0.004)  # arrived 4 ms before the engine went idle
    # a step starting 10 ms after it went idle: 10 ms of the intake ran in the idle time
    assert core._charge_intake(end + 0.010) == pytest.approx(intake - 0.010)
    assert core._charge_intake(end + 0.011) == 0.0  # charged once
