"""The fit's working parameters (:class:`Params`), the simulator's predictions under them, and the solver.

:func:`predict_ttft` and :func:`predict_decode` are the simulator's own time model (:mod:`harness.sim.timemodel`)
with these parameters: an unloaded request's TTFT, and a decode step of a (time-averaged, fractional) batch.
:func:`solve` is bounded least squares over the :class:`Free` parameters of one step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from harness.sim.calibration import (
    Calibration,
    unloaded_ttft_s,
)
from harness.sim.timemodel import STEP_OVERHEAD_S, Efficiencies, TimeModel
from offload.shapes import Deployment

from .samples import DecodeSample, StepsWindow, TtftSample

# -- the model and the fit ------------------------------------------------------------------------


@dataclass
class Params:
    """The fitted quantities, in the units the simulator uses."""

    overhead_s: float = 0.0
    overhead_s_per_ktoken: float = 0.0
    linear: float = 0.65
    attention: float = 0.65
    hbm: float = 0.85
    step_overhead_s: float = STEP_OVERHEAD_S
    step_s_per_seq: float = 0.0
    decode_s_per_ktoken: float = 0.0
    blocking_share: float = 0.0
    load_s_per_gb: dict[str, float] = field(default_factory=dict)
    load_latency_s: dict[str, float] = field(default_factory=dict)
    store_s_per_gb: dict[str, float] = field(default_factory=dict)
    store_latency_s: dict[str, float] = field(default_factory=dict)
    busy_intake_s: dict[str, float] = field(default_factory=dict)
    step_extra_s: dict[str, float] = field(default_factory=dict)
    prefill_host_s: float | None = None
    """None: a prefill step's host part is the step overhead."""


def timing_of(deployment: Deployment, params: Params, backend: str | None) -> TimeModel:
    """The simulator's time model with these parameters, for an arm with ``backend`` (None: no tier)."""
    store = params.store_s_per_gb.get(backend, 0.0) * deployment.kv_bytes_per_token / 1e9 if backend else 0.0
    fixed = params.store_latency_s.get(backend, 0.0) if backend else 0.0
    eff = Efficiencies(
        linear=params.linear,
        attention=params.attention,
        hbm=params.hbm,
        step_overhead_s=params.step_overhead_s,
        store_s_per_token=store,
        store_latency_s=fixed,
        step_s_per_seq=params.step_s_per_seq,
        decode_s_per_ktoken=params.decode_s_per_ktoken,
        prefill_host_s=params.prefill_host_s,
        step_extra_s=params.step_extra_s.get(backend, 0.0) if backend else 0.0,
    )
    return TimeModel(deployment, eff)


def _timings(
    deployment: Deployment, params: Params, samples: Sequence[TtftSample] | Sequence[DecodeSample]
) -> dict[str | None, TimeModel]:
    """One time model per backend the samples use, built once (not once a sample)."""
    return {backend: timing_of(deployment, params, backend) for backend in {s.backend for s in samples}}


def predict_ttft(deployment: Deployment, params: Params, chunk: int, samples: Sequence[TtftSample]) -> np.ndarray:
    """Seconds, per sample, of the simulator's unloaded TTFT with these parameters."""
    kv_gb = deployment.kv_bytes_per_token / 1e9
    timings = _timings(deployment, params, samples)
    out = np.empty(len(samples))
    for i, s in enumerate(samples):
        timing = timings[s.backend]
        load = 0.0
        if s.backend is not None and s.loaded_tokens > 0:
            rate = params.load_s_per_gb.get(s.backend, 1 / 25.0)
            load = params.load_latency_s.get(s.backend, 0.0) + s.loaded_tokens * kv_gb * rate
        overhead = params.overhead_s + params.overhead_s_per_ktoken * s.prompt_tokens / 1000
        out[i] = unloaded_ttft_s(timing, overhead, s.prompt_tokens, s.hbm_tokens, s.loaded_tokens, load, chunk)
    return out


def predict_decode(deployment: Deployment, params: Params, samples: Sequence[DecodeSample]) -> np.ndarray:
    """Seconds, per sample, of a decode step of the sample's (time-averaged) batch at its context.

    A fractional batch b is the time-weighted mix of steps of floor(b) and ceil(b) sequences.
    """
    timings = _timings(deployment, params, samples)
    out = np.empty(len(samples))
    for i, s in enumerate(samples):
        timing = timings[s.backend]
        low = max(1, int(s.batch))
        share = max(0.0, s.batch - low)
        step = timing.decode_step_seconds(low, s.context_tokens)
        if share > 0:
            step += share * (timing.decode_step_seconds(low + 1, s.context_tokens) - step)
        out[i] = step
    return out


@dataclass(frozen=True)
class DecodeWindows:
    """Per measured request of some windows: its decode window, measured and as the model's two parts."""

    requests: list[tuple[StepsWindow, int]]
    measured_s: np.ndarray
    modelled_s: np.ndarray
    """Sum of the window's steps' modelled times, intake left out."""
    intake_s: np.ndarray
    """Sum of the per-request overheads whose intake is charged to the window's steps."""
    steps: np.ndarray
    arrivals: np.ndarray
    """Requests whose intake is charged to the window's steps (each adds its backend's ``busy_intake_s``)."""
    backends: tuple[str | None, ...]
    """The offload backend of each request's arm (None: no tier)."""

    def predicted_s(self, params: Params) -> np.ndarray:
        """Each window: its steps' modelled times, the blocking share of the charged overheads, and the
        backend's ``busy_intake_s`` per charged arrival."""
        busy = np.array([params.busy_intake_s.get(b, 0.0) if b else 0.0 for b in self.backends])
        return np.asarray(self.modelled_s + params.blocking_share * self.intake_s + busy * self.arrivals, dtype=float)


def decode_windows(deployment: Deployment, params: Params, windows: Sequence[StepsWindow]) -> DecodeWindows:
    """The decode windows (first token's step + 1 .. last token's step) of the windows' sampled requests
    with 2+ steps, each predicted as ``modelled + blocking_share x intake``."""
    requests: list[tuple[StepsWindow, int]] = []
    measured: list[float] = []
    modelled: list[float] = []
    intake: list[float] = []
    count: list[int] = []
    arrivals: list[float] = []
    for w in windows:
        steps = w.steps(params.overhead_s, params.overhead_s_per_ktoken)
        base = steps.modelled_s(timing_of(deployment, params, w.backend))
        charge = steps.intake_overhead_s(params.overhead_s, params.overhead_s_per_ktoken)
        arrived = steps.intake_arrivals()
        for i, record in enumerate(steps.records):
            if record.request_id not in w.sampled:
                continue
            first, last = int(steps.first[i]), int(steps.last[i])
            if last - first < 2:
                continue
            requests.append((w, i))
            measured.append(float(steps.ends_ns[last] - steps.ends_ns[first]) / 1e9)
            modelled.append(float(base[first + 1 : last + 1].sum()))
            intake.append(float(charge[first + 1 : last + 1].sum()))
            arrivals.append(float(arrived[first + 1 : last + 1].sum()))
            count.append(last - first)
    return DecodeWindows(
        requests,
        np.array(measured),
        np.array(modelled),
        np.array(intake),
        np.array(count),
        np.array(arrivals),
        tuple(w.backend for w, _ in requests),
    )


@dataclass(frozen=True)
class Free:
    """One free parameter: how to read it from and write it into :class:`Params`, and its bounds."""

    name: str
    get: Callable[[Params], float]
    set: Callable[[Params, float], None]
    low: float
    high: float


def solve(
    frees: Sequence[Free], params: Params, residuals: Callable[[Params], np.ndarray], robust: bool = True
) -> float:
    """Least squares on ``residuals`` over ``frees``; ``robust``: a ``soft_l1`` loss (outliers pull less).
    Returns the final cost (half the sum of the loss over the residuals)."""
    if not frees:
        return 0.0
    # a start on a bound can stay stuck there (the trust region's scaling); start just inside
    inset = [1e-3 * (f.high - f.low) for f in frees]
    start = np.array([min(max(f.get(params), f.low + d), f.high - d) for f, d in zip(frees, inset, strict=True)])

    def apply(vector: np.ndarray) -> Params:
        for f, value in zip(frees, vector, strict=True):
            f.set(params, float(value))
        return params

    def objective(vector: np.ndarray) -> np.ndarray:
        return residuals(apply(vector))

    result = least_squares(
        objective,
        start,
        bounds=([f.low for f in frees], [f.high for f in frees]),
        loss="soft_l1" if robust else "linear",
        f_scale=0.05,
        x_scale="jac",
        diff_step=[1e-4] * len(frees),
    )
    apply(result.x)
    return float(result.cost)


def prefill_host(p: Params) -> float:
    return p.step_overhead_s if p.prefill_host_s is None else p.prefill_host_s


PREFILL_HOST_NAME = "prefill_host_s"


def rms(cost: float, residuals: int) -> float:
    """Root mean square relative error from a least-squares cost (half the sum of squared residuals)."""
    return float(np.sqrt(2.0 * cost / max(1, residuals)))


def free_param(attribute: str, low: float, high: float) -> Free:
    """A free parameter that is an attribute of :class:`Params`."""
    return Free(attribute, getter(attribute), setter(attribute), low, high)


def setter(attribute: str) -> Callable[[Params, float], None]:
    return lambda p, v: setattr(p, attribute, v)


def getter(attribute: str) -> Callable[[Params], float]:
    return lambda p: float(getattr(p, attribute))


def keyed(table: str, key: str) -> tuple[Callable[[Params], float], Callable[[Params, float], None]]:
    def get(p: Params) -> float:
        value: float = getattr(p, table)[key]
        return value

    def put(p: Params, v: float) -> None:
        getattr(p, table)[key] = v

    return get, put


def params_of(calibration: Calibration) -> Params:
    """The fit's working parameters back from a calibration file."""
    return Params(
        overhead_s=calibration.request_overhead_s.value,
        overhead_s_per_ktoken=calibration.request_overhead_s_per_ktoken.value,
        linear=calibration.linear_efficiency.value,
        attention=calibration.attention_efficiency.value,
        hbm=calibration.hbm_efficiency.value,
        step_overhead_s=calibration.step_overhead_s.value,
        step_s_per_seq=calibration.step_s_per_seq.value,
        decode_s_per_ktoken=calibration.decode_s_per_ktoken.value,
        blocking_share=calibration.engine_blocking_share.value,
        load_s_per_gb={b: 1.0 / c.load_gbps.value for b, c in calibration.backends.items()},
        load_latency_s={b: c.load_latency_s.value for b, c in calibration.backends.items()},
        store_s_per_gb={b: c.store_s_per_gb.value for b, c in calibration.backends.items()},
        store_latency_s={b: c.store_latency_s.value for b, c in calibration.backends.items()},
        busy_intake_s={b: c.busy_intake_s.value for b, c in calibration.backends.items()},
        step_extra_s={b: c.step_extra_s.value for b, c in calibration.backends.items()},
        prefill_host_s=calibration.fitted_prefill_host_s,
    )
