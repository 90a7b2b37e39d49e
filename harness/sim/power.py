"""The simulator's GPU power model: **simulated** watts and joules from the hardware profile and the engine's busy time.

Per GPU, over a window of ``T`` seconds in which the simulated engine was busy ``B`` seconds (the modelled
durations of its steps, ``kvbench_sim:engine_busy_seconds`` on its ``/metrics``)::

    busy = B / T                                  (0..1)
    W    = idle_w + (tdp_w - idle_w) × busy       (watts per GPU)
    J    = W × T = idle_w × T + (tdp_w - idle_w) × B

A replica's step occupies its ``tp`` GPUs together, so a fleet of ``R`` replicas of ``tp`` GPUs has
``J = R × tp × idle_w × T + tp × (tdp_w − idle_w) × ΣB`` (ΣB over the replicas). The model's figures are
bounds, not a fit: a step is counted at full board power whether it is compute-bound (prefill) or
memory-bound (decode draws less on a real GPU), and whether the GPU or the host bounds it, so the model
overstates a lightly loaded decode-heavy GPU and is closest for long prefills. Idle is a GPU with a model
loaded and nothing to run. Offload traffic (host-to-device copies) between steps counts as idle.

Parameters (:data:`POWER`), per hardware profile (:mod:`offload.shapes`):

* ``tdp_w`` 700 W for H100 SXM5 and H200 SXM: NVIDIA's datasheets give "Max Thermal Design Power (TDP)
  up to 700W (configurable)" for both SXM boards;
* ``idle_w`` 90 W: *assumed* -- no datasheet figure. An empty H200 SXM (no process on it) read 77 W through
  NVML, and the same board under a sustained BF16 GEMM 694 W, near its 700 W limit; a GPU holding a model's
  weights and KV cache idles somewhat above an empty one, so 90 W (the exact figure varies by board, clocks
  and temperature).

The simulator adds a step's busy seconds when the step ends, so a window's counter delta can run one step
ahead of its clock. The source credits busy time no faster than it elapses (at most ``R × Δt`` per interval
between readings, ``R`` = replicas = GPUs / tp), carrying the rest into the next interval: totals are kept and
no window draws more than ``tdp_w`` per GPU.

**Fitted on NVML** (where the calibration in use has ``power``, :class:`~harness.sim.calibration.PowerFit`,
fitted by ``kvbench sim calibrate-power``: the shipped 8B H200 eager one; every other deployment keeps the
datasheet model above). Over the same window, with ``N_p`` prompt tokens the engine computed (``Δ
vllm:prompt_tokens_total − Δ vllm:prefix_cache_hits_total − Δ vllm:external_prefix_cache_hits_total``) and
``N_d`` tokens it generated (``Δ vllm:generation_tokens_total``)::

    J = gpus × base_w × T + j_per_prefill_token × N_p + j_per_decode_token × N_d

credited, as busy time is, no faster than ``gpus × tdp_w`` per elapsed second, the rest carried into the next
interval. Each counter is read apart (the engine counts a prompt's hits at admission and its tokens at its first
token, so their difference may fall between two readings). ``base_w`` is the fit's intercept (a GPU serving at a
vanishing token rate), not an idle board, so an engine with nothing to run reads high: the fit's range is a
loaded engine.

A run's measured figures (``kvbench`` on GPUs, NVML) replace these; the simulator's carry the label
**simulated** wherever they appear.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from common.errors import CalibrationError
from harness.client.power import NS, EnergySourceName, EnergyWindow, NotSampled, PowerSource, Reading, Timeline
from harness.client.scrape import MetricsSnapshot, parse_metrics, sum_metric
from harness.engines.base import EngineConfigModel
from offload.shapes import Deployment

from .calibration import AUTO, Calibration, PowerFit, pick_shipped
from .config import SimEngineConfig

BUSY_SECONDS = "kvbench_sim:engine_busy_seconds_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
GENERATED_TOKENS = "vllm:generation_tokens_total"
DEFAULT_PERIOD_S = 1.0
"""How often the simulated source reads the busy counter between the window's edges (a reading is also
taken when it starts, stops and when a window ends after the last one)."""


@dataclass(frozen=True)
class PowerProfile:
    """One GPU model's board power: W."""

    tdp_w: float
    idle_w: float

    def __post_init__(self) -> None:
        if not 0 <= self.idle_w <= self.tdp_w:
            raise ValueError(f"a power profile needs 0 <= idle_w <= tdp_w, got {self.idle_w} and {self.tdp_w}")

    def watts(self, busy: float) -> float:
        """W per GPU at busy fraction ``busy`` (clamped to 0..1)."""
        return self.idle_w + (self.tdp_w - self.idle_w) * min(1.0, max(0.0, busy))

    def joules(self, seconds: float, busy_seconds: float, gpus: int, tp: int) -> float:
        """J of ``gpus`` GPUs over ``seconds`` when replicas of ``tp`` GPUs were busy ``busy_seconds`` in all."""
        return gpus * self.idle_w * seconds + tp * (self.tdp_w - self.idle_w) * busy_seconds


IDLE_W = 90.0
"""Assumed idle board power of an H100/H200 SXM with a model loaded (module docstring)."""
POWER: dict[str, PowerProfile] = {
    "h100-sxm": PowerProfile(tdp_w=700.0, idle_w=IDLE_W),
    "h200-sxm": PowerProfile(tdp_w=700.0, idle_w=IDLE_W),
}


class _Cumulative:
    """A counter read across engine restarts (a restarted engine's counter begins again at 0)."""

    def __init__(self) -> None:
        self._base = 0.0
        self._last: float | None = None

    def add(self, value: float) -> float:
        if self._last is not None and value < self._last:
            self._base += self._last
        self._last = value
        return self._base + value


def _metric(samples: MetricsSnapshot, name: str) -> float:
    return sum_metric(samples, name) or 0.0


class SimulatedPower:
    """The power model over a simulated engine's ``/metrics`` (``scrape``): a :class:`PowerSource`."""

    source: EnergySourceName = "simulated"

    def __init__(
        self,
        profile: PowerProfile,
        *,
        gpus: int,
        tp: int,
        scrape: Callable[[], Awaitable[str | None]],
        period_s: float = DEFAULT_PERIOD_S,
        clock: Callable[[], int] = time.monotonic_ns,
        hardware: str = "",
        fit: PowerFit | None = None,
    ) -> None:
        self.profile = profile
        self.fit = fit
        self.gpus = gpus
        self.tp = tp
        self.hardware = hardware
        self._scrape = scrape
        self.period_s = period_s
        self._clock = clock
        self.timeline = Timeline()
        self._origin_ns: int | None = None
        self._busy = _Cumulative()
        self._tokens = {name: _Cumulative() for name in (PROMPT_TOKENS, PREFIX_HITS, EXTERNAL_HITS, GENERATED_TOKENS)}
        self._tokens_origin: tuple[float, float] = (0.0, 0.0)
        self._fitted_j = 0.0
        """Joules of the fitted model counted so far, held back to TDP over the elapsed time (the busy rule)."""
        self._credited: float | None = None
        """Busy seconds counted so far: the counter, held back to what the elapsed time can hold."""
        self._last_ns: int | None = None
        self._task: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        text = await self._scrape()
        t_ns = self._clock()
        if text is None:
            return
        try:
            samples = parse_metrics(text)
            busy = sum_metric(samples, BUSY_SECONDS)
        except ValueError:
            return
        if busy is None:
            return
        counter = self._busy.add(busy)
        # each counter apart: the engine counts a prompt's hits when it admits it and its tokens at its first
        # token, so their difference can fall between two readings without any restart
        totals = {name: cumulative.add(_metric(samples, name)) for name, cumulative in self._tokens.items()}
        computed = totals[PROMPT_TOKENS] - totals[PREFIX_HITS] - totals[EXTERNAL_HITS]
        tokens = (computed, totals[GENERATED_TOKENS])
        elapsed_s = 0.0 if self._last_ns is None else max(0, t_ns - self._last_ns) / NS
        if self._origin_ns is None or self._last_ns is None or self._credited is None:
            self._origin_ns = t_ns
            self._credited = counter
            self._tokens_origin = tokens
        else:
            replicas = max(1, self.gpus // self.tp)
            self._credited = min(counter, self._credited + replicas * elapsed_s)
        self._last_ns = t_ns
        seconds = (t_ns - self._origin_ns) / NS
        if self.fit is None:
            joules = self.profile.joules(seconds, self._credited, self.gpus, self.tp)
        else:
            computed_n, generated_n = (now - then for now, then in zip(tokens, self._tokens_origin, strict=True))
            modelled = fitted_joules(self.fit, seconds, computed_n, generated_n, self.gpus)
            room = self.gpus * self.fit.tdp_w * elapsed_s
            self._fitted_j = max(self._fitted_j, min(modelled, self._fitted_j + room))
            joules = self._fitted_j
        self.timeline.add(Reading(t_ns, joules, None))

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            await self._read()

    async def start(self) -> None:
        await self._read()
        self._task = asyncio.ensure_future(self._sample())

    async def window(self, start_ns: int, end_ns: int) -> EnergyWindow:
        seconds = max(0, end_ns - start_ns) / NS
        last = self.timeline.last_ns()
        if self._task is not None and (last is None or last < end_ns):
            await self._read()
        joules = self.timeline.counter_joules(start_ns, end_ns)
        names = [f"{self.hardware} (simulated)"] * self.gpus
        if joules is None:
            reason = "the simulator's /metrics has no busy-time counter" if last is None else "window not sampled"
            return EnergyWindow(
                source="simulated", gpus=self.gpus, gpu_names=names, seconds=seconds, not_sampled=reason
            )
        return EnergyWindow(
            source="simulated",
            method="model",
            gpus=self.gpus,
            gpu_names=names,
            seconds=seconds,
            joules=joules,
            samples=self.timeline.count(start_ns, end_ns),
        )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await self._read()


def fitted_joules(fit: PowerFit, seconds: float, computed_tokens: float, generated_tokens: float, gpus: int) -> float:
    """J of ``gpus`` GPUs over ``seconds`` that computed and generated these tokens (module docstring), before
    the source holds it to TDP."""
    modelled = (
        gpus * fit.base_w.value * seconds
        + fit.j_per_prefill_token.value * computed_tokens
        + fit.j_per_decode_token.value * generated_tokens
    )
    return max(0.0, modelled)


def power_fit(config: SimEngineConfig) -> PowerFit | None:
    """The fitted power terms of the calibration ``config`` uses (None: uncalibrated, or none fitted)."""
    if config.calibration is None:
        return None
    if config.calibration == Path(AUTO):
        deployment = Deployment.resolve(
            config.model, config.hardware, config.parallelism.tp, config.dtype, config.kv_dtype
        )
        return pick_shipped(deployment, config.cuda_graphs)[1].power
    return Calibration.load(config.calibration).power


def simulated_power(config: EngineConfigModel, scrape: Callable[[], Awaitable[str | None]]) -> PowerSource:
    """The power source of a ``kind: sim`` engine config (the registry's ``power`` column)."""
    if not isinstance(config, SimEngineConfig):
        raise TypeError(f"simulated_power needs a SimEngineConfig, got {type(config).__name__}")
    profile = POWER.get(config.hardware)
    if profile is None:
        reason = f"no power profile for simulator hardware {config.hardware!r}"
        return NotSampled("simulated", reason, config.fleet_gpus)
    try:
        fit = power_fit(config)
    except CalibrationError as error:  # the engine's start refuses the calibration too, and says why
        return NotSampled("simulated", f"calibration: {error}", config.fleet_gpus)
    return SimulatedPower(
        profile, gpus=config.fleet_gpus, tp=config.replica_gpus, scrape=scrape, hardware=config.hardware, fit=fit
    )
