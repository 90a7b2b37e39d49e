"""GPU energy over a measurement window: a :class:`PowerSource` samples a span, any window inside it is integrated.

A run's window edges (monotonic ns) are known only once its load has run, and a soak cuts one long window
into intervals, so a source does not read at a window's edges itself: ``start()`` begins sampling before the
load, ``window(start_ns, end_ns)`` integrates any stretch of the sampled span (taking a fresh reading when
the stretch ends after the last one), ``stop()`` ends sampling. :func:`metering` is the context manager the
runners wrap a window in. Every source gives an :class:`EnergyWindow` (stored in the run directory;
:mod:`harness.results.energy` turns it into joules per token and agents per kW).

Sources:

* :class:`NvmlSource` -- measured, through NVML (the ``nvidia-ml-py`` package, module ``pynvml``, imported
  only when a source starts). For each GPU the engine uses it reads, every ``period_s`` (0.1 s) in a thread:
  the total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded; Volta and
  newer) and the power draw (``nvmlDeviceGetPowerUsage``, mW, the driver's own average over a short
  period). A window's joules are the counter, summed over the GPUs, interpolated linearly at the window's
  edges, end minus start (``method="energy_counter"``); ``cross_check_joules`` is the power readings
  integrated over the window (trapezoids, edges interpolated). Where a GPU's counter is not supported the
  power integral is the figure (``method="power_samples"``). Why the counter first: on an H200 (driver 580)
  the power reading trails a change of load by about a second, so across a 2 s window in which a GEMM load
  stopped the power integral read 552 J where the counter read 291 J; at steady load the two agreed within
  0.7 % (2756 J and 2737 J over 4 s at 694 W). GPUs are named as ``CUDA_VISIBLE_DEVICES``
  names them (an index or a ``GPU-`` UUID): NVML numbers devices by PCI bus, as CUDA does with
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so a UUID is the unambiguous way to name one.
* the simulator's power model (:mod:`harness.sim.power`, ``method="model"``), labelled simulated.
* :class:`NotSampled` -- no source could run here (no NVML library, no driver, an engine that runs on no
  GPU of this machine): every window says why in ``not_sampled``. A run never fails for want of energy.

``python3 -m harness.client.power --probe`` prints each visible GPU's power and energy counter over two
seconds: the check to run on a GPU machine before a long run.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import contextlib
import importlib
import itertools
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, cast

from pydantic import Field, model_validator

from common.schema import StrictModel, figures_or_reason

NS = 1_000_000_000
MJ_PER_J = 1000.0
MW_PER_W = 1000.0
DEFAULT_PERIOD_S = 0.1
"""NVML sampling period: 10 Hz; the driver's power reading itself averages over about this long."""
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"

EnergySourceName = Literal["nvml", "simulated"]
EnergyMethodName = Literal["energy_counter", "power_samples", "model"]


class EnergyWindow(StrictModel):
    """What a power source measured over one window: joules, or why there are none (never both)."""

    source: EnergySourceName
    method: EnergyMethodName | None = Field(default=None, description="How the joules were found (None: not sampled).")
    gpus: int = Field(ge=0, description="GPUs whose energy is counted.")
    gpu_names: list[str] = Field(default_factory=list, description="Each GPU's name as its source reports it.")
    seconds: float = Field(ge=0, description="Length of the window, s.")
    joules: float | None = Field(default=None, ge=0, description="Energy of the GPUs over the window, J.")
    cross_check_joules: float | None = Field(
        default=None, ge=0, description="The power readings integrated over the window, J (beside a counter figure)."
    )
    samples: int = Field(default=0, ge=0, description="Readings taken inside the window.")
    not_sampled: str | None = Field(default=None, description="Why there are no joules (None: sampled).")

    @model_validator(mode="after")
    def _joules_or_reason(self) -> EnergyWindow:
        figures_or_reason(
            self.joules is not None, self.not_sampled, "an energy window has joules or a not_sampled reason"
        )
        return self

    @property
    def avg_watts(self) -> float | None:
        return None if self.joules is None or self.seconds <= 0 else self.joules / self.seconds


class PowerSource(Protocol):
    """Samples a span of time; integrates the GPUs' energy over any window inside it (module docstring)."""

    source: EnergySourceName

    async def start(self) -> None: ...

    async def window(self, start_ns: int, end_ns: int) -> EnergyWindow: ...

    async def stop(self) -> None: ...


@contextlib.asynccontextmanager
async def metering(source: PowerSource) -> AsyncIterator[PowerSource]:
    """``async with metering(source) as meter: ...; energy = await meter.window(a, b)`` (sampling stops on exit,
    the readings stay, so a window that ended inside the block is integrated after it)."""
    await source.start()
    try:
        yield source
    finally:
        await source.stop()


# ---------------------------------------------------------------------------------------------
# Readings and their integrals
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """One reading of every sampled GPU, summed: cumulative joules (None: no counter) and watts (None: none)."""

    t_ns: int
    joules: float | None
    watts: float | None


MAX_READINGS = 36_000
"""Readings a timeline keeps (an hour at 10 Hz): a soak of many hours keeps flat memory, and a window that began
before the oldest kept reading is not sampled rather than guessed."""


class Timeline:
    """Readings in time order (appended by one thread, read by another) and their integrals over a window."""

    def __init__(self, max_readings: int = MAX_READINGS) -> None:
        self._lock = threading.Lock()
        self._readings: collections.deque[Reading] = collections.deque(maxlen=max_readings)

    def add(self, reading: Reading) -> None:
        with self._lock:
            if self._readings and reading.t_ns <= self._readings[-1].t_ns:
                return  # a reading must move time forward (two reads in one ns say nothing new)
            self._readings.append(reading)

    def last_ns(self) -> int | None:
        with self._lock:
            return self._readings[-1].t_ns if self._readings else None

    def snapshot(self) -> list[Reading]:
        with self._lock:
            return list(self._readings)

    def counter_joules(self, start_ns: int, end_ns: int) -> float | None:
        """Cumulative joules interpolated at ``end_ns`` minus at ``start_ns`` (None: the span does not cover it)."""
        points = [(r.t_ns, r.joules) for r in self.snapshot() if r.joules is not None]
        at_start, at_end = _interpolate(points, start_ns), _interpolate(points, end_ns)
        if at_start is None or at_end is None:
            return None
        return max(0.0, at_end - at_start)

    def power_joules(self, start_ns: int, end_ns: int) -> float | None:
        """The watts integrated from ``start_ns`` to ``end_ns`` by trapezoids (None: the span does not cover it)."""
        points = [(r.t_ns, r.watts) for r in self.snapshot() if r.watts is not None]
        at_start, at_end = _interpolate(points, start_ns), _interpolate(points, end_ns)
        if at_start is None or at_end is None:
            return None
        inside = [(t, w) for t, w in points if start_ns < t < end_ns]
        edges = [(start_ns, at_start), *inside, (end_ns, at_end)]
        return sum((t1 - t0) / NS * (w0 + w1) / 2 for (t0, w0), (t1, w1) in itertools.pairwise(edges))

    def count(self, start_ns: int, end_ns: int) -> int:
        return sum(1 for r in self.snapshot() if start_ns <= r.t_ns <= end_ns)


def _interpolate(points: Sequence[tuple[int, float]], t_ns: int) -> float | None:
    """The value at ``t_ns`` on the line through the readings either side (None: outside the readings)."""
    if not points or t_ns < points[0][0] or t_ns > points[-1][0]:
        return None
    times = [t for t, _ in points]
    i = bisect.bisect_left(times, t_ns)
    if times[i] == t_ns:
        return points[i][1]
    (t0, v0), (t1, v1) = points[i - 1], points[i]
    return v0 + (v1 - v0) * (t_ns - t0) / (t1 - t0)


class NotSampled:
    """A source that cannot sample here: every window says why."""

    def __init__(self, source: EnergySourceName, reason: str, gpus: int = 0) -> None:
        self.source: EnergySourceName = source
        self.reason = reason
        self.gpus = gpus

    async def start(self) -> None:
        return None

    async def window(self, start_ns: int, end_ns: int) -> EnergyWindow:
        seconds = max(0, end_ns - start_ns) / NS
        return EnergyWindow(source=self.source, gpus=self.gpus, seconds=seconds, not_sampled=self.reason)

    async def stop(self) -> None:
        return None


# ---------------------------------------------------------------------------------------------
# NVML
# ---------------------------------------------------------------------------------------------


class Nvml(Protocol):
    """The part of ``pynvml`` (nvidia-ml-py) this module calls."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object: ...
    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> object: ...
    def nvmlDeviceGetName(self, handle: object) -> str | bytes: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int: ...
    def nvmlDeviceGetPowerUsage(self, handle: object) -> int: ...


def load_nvml() -> Nvml | str:
    """The ``pynvml`` module, or why it cannot be imported (the package is optional: ``nvidia-ml-py``)."""
    try:
        return cast(Nvml, importlib.import_module("pynvml"))
    except ImportError as error:
        return f"NVML library not importable (pip install nvidia-ml-py): {error}"


def nvml_devices(gpus: Sequence[int] | None, visible: str | None) -> list[str] | None:
    """The NVML names (index or UUID) of the engine's GPUs ``gpus`` (indices into ``visible``,
    ``CUDA_VISIBLE_DEVICES``); None: every GPU NVML sees (no ``gpus`` and no ``visible``)."""
    listed = [part.strip() for part in visible.split(",") if part.strip()] if visible else None
    if gpus is None:
        return listed
    if listed is None:
        return [str(gpu) for gpu in gpus]
    return [listed[gpu] for gpu in gpus if gpu < len(listed)]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlSource:
    """Measured energy of some GPUs through NVML (see the module docstring); ``nvml`` replaces ``pynvml`` in tests."""

    source: EnergySourceName = "nvml"

    def __init__(
        self,
        devices: Sequence[str] | None = None,
        *,
        period_s: float = DEFAULT_PERIOD_S,
        nvml: Nvml | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s must be positive, got {period_s}")
        self.devices = None if devices is None else list(devices)
        self.period_s = period_s
        self._nvml = nvml
        self._clock = clock
        self._handles: list[object] = []
        self.names: list[str] = []
        self.counter = False
        self.not_sampled: str | None = None
        self.timeline = Timeline()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.read_errors = 0

    async def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("NvmlSource is already sampling")
        self.not_sampled = self._open()
        if self.not_sampled is not None:
            return
        self._read()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, name="kvbench-nvml", daemon=True)
        self._thread.start()

    def _open(self) -> str | None:
        """Initialise NVML and find the GPUs; the reason nothing can be sampled, or None."""
        nvml = self._nvml
        if nvml is None:
            loaded = load_nvml()
            if isinstance(loaded, str):
                return loaded
            nvml = self._nvml = loaded
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            return f"NVML did not initialise (no NVIDIA driver?): {error}"
        names: list[str] = list(self.devices or [])
        try:
            names = self.devices if self.devices is not None else [str(i) for i in range(nvml.nvmlDeviceGetCount())]
            if not names:
                return "NVML sees no GPU"
            handles = [
                nvml.nvmlDeviceGetHandleByIndex(int(name)) if name.isdigit() else nvml.nvmlDeviceGetHandleByUUID(name)
                for name in names
            ]
            self.names = [
                f"{name}: {_text(nvml.nvmlDeviceGetName(handle))}" for name, handle in zip(names, handles, strict=True)
            ]
        except (nvml.NVMLError, ValueError) as error:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
            return f"NVML cannot open GPUs {names}: {error}"
        self._handles = handles
        self.counter = True
        for handle in handles:
            try:
                nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            except nvml.NVMLError:
                self.counter = False  # pre-Volta or not supported: the power readings are the figure
        return None

    def _read(self) -> None:
        nvml = self._nvml
        assert nvml is not None
        t_ns = self._clock()
        joules = self._total(nvml, nvml.nvmlDeviceGetTotalEnergyConsumption, MJ_PER_J) if self.counter else None
        watts = self._total(nvml, nvml.nvmlDeviceGetPowerUsage, MW_PER_W)
        if joules is not None or watts is not None:
            self.timeline.add(Reading(t_ns, joules, watts))

    def _total(self, nvml: Nvml, read: Callable[[object], int], raw_per_unit: float) -> float | None:
        """``read`` summed over the GPUs, in units of ``raw_per_unit`` raw counts (mJ per J, mW per W); None when
        a GPU's read fails (an error counted; the other GPUs are not read)."""
        total = 0.0
        for handle in self._handles:
            try:
                total += read(handle) / raw_per_unit
            except nvml.NVMLError:
                self.read_errors += 1
                return None
        return total

    def _sample(self) -> None:
        while not self._stop.wait(self.period_s):
            self._read()

    async def window(self, start_ns: int, end_ns: int) -> EnergyWindow:
        seconds = max(0, end_ns - start_ns) / NS
        gpus = len(self._handles) if self._handles else len(self.devices or [])
        if self.not_sampled is not None:
            return EnergyWindow(source="nvml", gpus=gpus, seconds=seconds, not_sampled=self.not_sampled)
        last = self.timeline.last_ns()
        if self._thread is not None and (last is None or last < end_ns):
            self._read()  # the window ends after the last reading: read now rather than wait for the thread
        power = self.timeline.power_joules(start_ns, end_ns)
        counter = self.timeline.counter_joules(start_ns, end_ns) if self.counter else None
        joules, method = (counter, "energy_counter") if counter is not None else (power, "power_samples")
        names = self.names
        if joules is None:
            reason = "the window lies outside the sampled span" if last is not None else "no NVML reading"
            return EnergyWindow(source="nvml", gpus=gpus, gpu_names=names, seconds=seconds, not_sampled=reason)
        return EnergyWindow(
            source="nvml",
            method=cast(EnergyMethodName, method),
            gpus=gpus,
            gpu_names=names,
            seconds=seconds,
            joules=joules,
            cross_check_joules=power if method == "energy_counter" else None,
            samples=self.timeline.count(start_ns, end_ns),
        )

    async def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        await asyncio.to_thread(thread.join)
        self._read()  # the last reading: a window that ends now is inside the span
        nvml = self._nvml
        assert nvml is not None
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def nvml_source(gpus: Sequence[int] | None, env: dict[str, str] | None = None) -> NvmlSource:
    """An :class:`NvmlSource` for an engine's GPUs (indices into its ``CUDA_VISIBLE_DEVICES``: ``env``'s, else ours)."""
    visible = (env or {}).get(VISIBLE_DEVICES, os.environ.get(VISIBLE_DEVICES))
    return NvmlSource(nvml_devices(gpus, visible))


# ---------------------------------------------------------------------------------------------
# The probe: python3 -m harness.client.power --probe
# ---------------------------------------------------------------------------------------------


async def probe(seconds: float, devices: Sequence[str] | None, out: Callable[[str], None] = print) -> int:
    """Sample ``devices`` (None: every GPU) for ``seconds`` and print what NVML reads; 0 when it could sample."""
    source = NvmlSource(devices)
    async with metering(source):
        start = time.monotonic_ns()
        await asyncio.sleep(seconds)
        end = time.monotonic_ns()
        window = await source.window(start, end)
    if window.not_sampled is not None:
        out(f"energy not sampled: {window.not_sampled}")
        return 1
    readings = source.timeline.snapshot()
    out(f"{window.gpus} GPU(s): {', '.join(window.gpu_names)}")
    out(f"energy counter supported: {'yes' if source.counter else 'no'}; readings: {len(readings)}")
    if source.counter and readings[0].joules is not None and readings[-1].joules is not None:
        out(f"energy counter (all GPUs): {readings[0].joules:.1f} J -> {readings[-1].joules:.1f} J")
    watts = [r.watts for r in readings if r.watts is not None]
    if watts:
        out(f"power (all GPUs): min {min(watts):.1f} W, max {max(watts):.1f} W")
    cross = (
        "" if window.cross_check_joules is None else f"; power readings integrated: {window.cross_check_joules:.1f} J"
    )
    out(f"{window.seconds:.2f} s: {window.joules:.1f} J by {window.method}, {window.avg_watts:.1f} W average{cross}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m harness.client.power", description=__doc__.split("\n")[0])
    parser.add_argument("--probe", action="store_true", required=True, help="sample the GPUs and print the readings")
    parser.add_argument("--seconds", type=float, default=2.0, help="how long to sample (default 2)")
    parser.add_argument("--gpus", default=None, help="NVML indices or UUIDs, comma-separated (default: every GPU)")
    args = parser.parse_args(argv)
    devices = [part.strip() for part in args.gpus.split(",")] if args.gpus else None
    return asyncio.run(probe(args.seconds, devices))


if __name__ == "__main__":
    sys.exit(main())
