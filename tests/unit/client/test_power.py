"""GPU energy: the NVML source against a fake ``pynvml``, the simulator's power model, the per-token figures,
and which source the engine kinds registry picks.

The fake NVML module (:class:`FakeNvml`) is injected in ``sys.modules`` as ``pynvml``: its energy counter and
power readings follow a known wattage on the real monotonic clock, so a window's joules have an exact answer.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
import types
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.client.power import (
    NS,
    EnergyWindow,
    NotSampled,
    NvmlSource,
    Reading,
    Timeline,
    metering,
    nvml_devices,
    probe,
)
from harness.engines.configs import VllmEngineConfig
from harness.engines.kinds import power_source
from harness.results.energy import EnergySample, energy_sample
from harness.sim.config import SimEngineConfig
from harness.sim.power import BUSY_SECONDS, POWER, PowerProfile, SimulatedPower

WATTS = 300.0


class NvmlError(Exception):
    """The fake's NVMLError."""


def fake_nvml(*, gpus: int = 2, counter: bool = True, init_fails: bool = False) -> types.ModuleType:
    """A ``pynvml`` stand-in: each GPU draws ``WATTS`` (its handle is its index), counter in mJ, power in mW."""
    module = types.ModuleType("pynvml")
    origin = time.monotonic_ns()
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if init_fails:
            raise NvmlError("Driver Not Loaded")

    def energy(handle: object) -> int:
        if not counter:
            raise NvmlError("Not Supported")
        return int(WATTS * (time.monotonic_ns() - origin) / NS * 1000) + 5_000_000  # mJ, from an arbitrary start

    def by_index(index: int) -> object:
        if index >= gpus:
            raise NvmlError("Invalid Argument")
        return index

    functions: dict[str, object] = {
        "NVMLError": NvmlError,
        "nvmlInit": init,
        "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlDeviceGetCount": lambda: gpus,
        "nvmlDeviceGetHandleByIndex": by_index,
        "nvmlDeviceGetHandleByUUID": lambda uuid: 0,
        "nvmlDeviceGetName": lambda handle: b"NVIDIA H200",
        "nvmlDeviceGetTotalEnergyConsumption": energy,
        "nvmlDeviceGetPowerUsage": lambda handle: int(WATTS * 1000),
        "calls": calls,
    }
    for name, value in functions.items():
        setattr(module, name, value)
    return module


async def _window(source: NvmlSource, seconds: float = 0.4) -> tuple[float, EnergyWindow]:
    async with metering(source):
        await asyncio.sleep(0.05)
        start = time.monotonic_ns()
        await asyncio.sleep(seconds)
        end = time.monotonic_ns()
        window = await source.window(start, end)
    return (end - start) / NS, window


def test_nvml_counter_gives_the_windows_joules_with_the_power_readings_beside(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_nvml(gpus=2)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    source = NvmlSource(["0", "1"], period_s=0.02)
    seconds, window = asyncio.run(_window(source))
    assert window.not_sampled is None and window.method == "energy_counter" and window.gpus == 2
    expected = 2 * WATTS * seconds
    assert window.joules == pytest.approx(expected, rel=0.03)
    assert window.cross_check_joules == pytest.approx(expected, rel=0.01)
    assert window.avg_watts == pytest.approx(2 * WATTS, rel=0.03)
    assert window.samples >= 10
    assert window.gpu_names == ["0: NVIDIA H200", "1: NVIDIA H200"]
    assert getattr(nvml, "calls") == ["init", "shutdown"]  # noqa: B009 - the fake's own record


def test_nvml_without_the_counter_integrates_the_power_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(gpus=1, counter=False))
    seconds, window = asyncio.run(_window(NvmlSource(None, period_s=0.02)))
    assert window.method == "power_samples" and window.cross_check_joules is None
    assert window.joules == pytest.approx(WATTS * seconds, rel=0.01)


def test_nvml_missing_or_broken_is_not_sampled_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    _, window = asyncio.run(_window(NvmlSource(None), seconds=0.01))
    assert window.joules is None and "nvidia-ml-py" in (window.not_sampled or "")
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_fails=True))
    _, window = asyncio.run(_window(NvmlSource(None), seconds=0.01))
    assert "Driver Not Loaded" in (window.not_sampled or "")
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(gpus=1))
    _, window = asyncio.run(_window(NvmlSource(["3"]), seconds=0.01))
    assert "cannot open GPUs ['3']" in (window.not_sampled or "")


def test_the_probe_prints_watts_and_the_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(gpus=2))
    lines: list[str] = []
    assert asyncio.run(probe(0.3, None, lines.append)) == 0
    text = "\n".join(lines)
    assert "2 GPU(s)" in text and "energy counter supported: yes" in text and "600.0 W" in text
    monkeypatch.setitem(sys.modules, "pynvml", None)
    lines.clear()
    assert asyncio.run(probe(0.01, None, lines.append)) == 1 and "not sampled" in lines[0]


def test_nvml_devices_follow_cuda_visible_devices() -> None:
    assert nvml_devices([0, 1], None) == ["0", "1"]
    assert nvml_devices([0, 1], "4,6") == ["4", "6"]
    assert nvml_devices([0], "GPU-abc, GPU-def") == ["GPU-abc"]
    assert nvml_devices(None, "2,3") == ["2", "3"] and nvml_devices(None, None) is None


def test_timeline_interpolates_the_counter_and_integrates_power() -> None:
    line = Timeline()
    for t, joules, watts in ((0, 0.0, 100.0), (NS, 100.0, 100.0), (3 * NS, 500.0, 300.0)):
        line.add(Reading(t, joules, watts))
    assert line.counter_joules(NS // 2, 2 * NS) == pytest.approx(300.0 - 50.0)
    # power: 100 W to 1 s, then a ramp 100 -> 300 W over 2 s; from 0.5 s to 2 s: 50 + (100 + 200) / 2
    assert line.power_joules(NS // 2, 2 * NS) == pytest.approx(50.0 + 150.0)
    assert line.counter_joules(0, 4 * NS) is None  # past the last reading: no extrapolation
    short = Timeline(max_readings=2)  # a long soak keeps the latest readings only
    for t in range(4):
        short.add(Reading(t * NS, 10.0 * t, None))
    assert short.counter_joules(2 * NS, 3 * NS) == 10.0 and short.counter_joules(NS, 3 * NS) is None


def test_the_sim_power_model_is_bounded_and_grows_with_busy() -> None:
    profile = POWER["h100-sxm"]
    assert profile.watts(0.0) == profile.idle_w and profile.watts(1.0) == profile.tdp_w == 700.0
    assert profile.watts(-1.0) == profile.idle_w and profile.watts(2.0) == profile.tdp_w
    watts = [profile.watts(b / 10) for b in range(11)]
    assert all(a < b for a, b in itertools.pairwise(watts))
    assert profile.joules(10.0, 5.0, gpus=2, tp=2) == pytest.approx(2 * profile.watts(0.5) * 10.0)
    with pytest.raises(ValueError, match="idle_w <= tdp_w"):
        PowerProfile(tdp_w=100.0, idle_w=200.0)


async def read_each_second(
    source: SimulatedPower,
    clock: list[int],
    counters: list[float],
    increments: Sequence[Sequence[float]],
    spans: Sequence[tuple[int, int]],
) -> list[EnergyWindow]:
    """``source`` started and driven by hand: for each of ``increments``, ``clock`` moves on one second, the
    engine's ``counters`` grow by that second's increments, and ``source`` reads them; then its windows over
    ``spans`` (start, end ns), and it stops."""
    await source.start()
    for increment in increments:
        clock[0] += NS
        for index, amount in enumerate(increment):
            counters[index] += amount
        await source._read()
    windows = [await source.window(start, end) for start, end in spans]
    await source.stop()
    return windows


def test_the_simulated_source_reads_busy_seconds_from_metrics() -> None:
    """Busy 0.25 s per second on a TP=2 replica: every GPU at idle + (TDP − idle) / 4."""
    clock = [0]
    busy = [0.0]

    async def scrape() -> str:
        return f'# TYPE {BUSY_SECONDS[:-6]} counter\n{BUSY_SECONDS}{{engine="0"}} {busy[0]}\n'

    source = SimulatedPower(POWER["h200-sxm"], gpus=2, tp=2, scrape=scrape, period_s=3600, clock=lambda: clock[0])
    (window,) = asyncio.run(read_each_second(source, clock, busy, [[0.25]] * 4, [(NS, 3 * NS)]))
    profile = POWER["h200-sxm"]
    assert window.source == "simulated" and window.method == "model"
    assert window.avg_watts == pytest.approx(2 * profile.watts(0.25))


def test_energy_per_token_and_per_kw() -> None:
    window = NotSampled("nvml", "x")
    sample = energy_sample(asyncio.run(window.window(0, NS)), prompt_tokens=10, generated_tokens=5)
    assert sample is not None and sample.not_sampled == "x" and sample.joules_per_token is None
    measured = types.SimpleNamespace(
        source="nvml", method="energy_counter", gpus=2, seconds=10.0, joules=5000.0, not_sampled=None
    )
    sample = energy_sample(measured, prompt_tokens=9000, generated_tokens=1000, agents=4)
    assert sample is not None and sample.avg_watts == 500.0 and sample.label == "measured (NVML)"
    assert sample.joules_per_generated_token == 5.0 and sample.joules_per_prompt_token == pytest.approx(5000 / 9000)
    assert sample.joules_per_token == 0.5 and sample.agents_per_kw == 8.0
    assert energy_sample(measured, prompt_tokens=None, generated_tokens=0).joules_per_token is None  # type: ignore[union-attr]
    assert energy_sample(None, prompt_tokens=1, generated_tokens=1) is None
    with pytest.raises(ValueError, match="exactly one"):
        EnergySample(source="nvml", gpus=1, seconds=1.0)


def test_the_registry_picks_the_source(tmp_path: Path) -> None:
    async def scrape() -> None:
        return None

    sim = SimEngineConfig(kind="sim", model="llama-3.1-8b", hardware="h200-sxm", replicas=2)
    source = power_source(sim, scrape)
    assert isinstance(source, SimulatedPower) and source.gpus == 2 and source.tp == 1
    vllm = VllmEngineConfig(kind="vllm", model="m", python=str(tmp_path / "python"), replicas=2, gpus=[4, 6])
    nvml = power_source(vllm, scrape)
    assert isinstance(nvml, NvmlSource) and nvml.devices == ["4", "6"]
    cpu = power_source(VllmEngineConfig(kind="vllm", model="m", device="cpu"), scrape)
    assert isinstance(cpu, NotSampled) and "runs on no GPU" in cpu.reason


def test_a_busy_counter_that_runs_ahead_of_the_clock_never_draws_more_than_tdp() -> None:
    """The simulator adds a step's seconds when it ends: 1.5 s of busy time can land in a 1 s interval. The
    source credits it no faster than time passes, and keeps the total."""
    clock = [0]
    busy = [0.0]

    async def scrape() -> str:
        return f'# TYPE {BUSY_SECONDS[:-6]} counter\n{BUSY_SECONDS}{{engine="0"}} {busy[0]}\n'

    source = SimulatedPower(POWER["h100-sxm"], gpus=1, tp=1, scrape=scrape, period_s=3600, clock=lambda: clock[0])
    steps = [[1.5], [0.5], [0.0], [0.0]]  # a 1.5 s step ends in the first second, then 0.5 s, then idle
    first, whole = asyncio.run(read_each_second(source, clock, busy, steps, [(0, NS), (0, 4 * NS)]))
    profile = POWER["h100-sxm"]
    assert first.avg_watts == pytest.approx(profile.tdp_w)  # busy 1.5 s in 1 s: held at the board's limit
    assert whole.joules == pytest.approx(profile.joules(4.0, 2.0, gpus=1, tp=1))  # every busy second counted


def test_nvml_a_failing_power_reading_loses_the_watts_not_the_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_nvml(gpus=2)

    def power(handle: object) -> int:
        if handle == 1:
            raise NvmlError("Unknown Error")
        return int(WATTS * 1000)

    setattr(nvml, "nvmlDeviceGetPowerUsage", power)  # noqa: B010 - replacing the fake's function
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    source = NvmlSource(["0", "1"], period_s=0.02)
    seconds, window = asyncio.run(_window(source))
    assert window.method == "energy_counter" and window.cross_check_joules is None
    assert window.joules == pytest.approx(2 * WATTS * seconds, rel=0.03)
    assert source.read_errors >= window.samples >= 10  # one error a reading: GPU 1's watts, never the counter


def test_an_energy_window_has_joules_or_a_reason_never_both_nor_neither() -> None:
    assert EnergyWindow(source="nvml", gpus=1, seconds=1.0, joules=2.0).avg_watts == 2.0
    assert EnergyWindow(source="nvml", gpus=1, seconds=1.0, not_sampled="no GPU").joules is None
    for joules, reason in ((None, None), (2.0, "no GPU")):
        with pytest.raises(ValueError, match="has joules or a not_sampled reason, exactly one of them"):
            EnergyWindow(source="nvml", gpus=1, seconds=1.0, joules=joules, not_sampled=reason)
