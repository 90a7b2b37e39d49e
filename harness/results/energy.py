"""Energy of a measurement window, per token and per kW: what a result file keeps (:class:`EnergySample`).

A window's energy comes from a power source (:mod:`harness.client.power`): on GPUs NVML's total-energy
counter of each GPU the engine uses (mJ, read at the window's edges), or, where the counter is not
supported, NVML's power readings (mW, about 10 Hz) integrated over the window (trapezoids); on the
simulator a power model of its hardware profile (:mod:`harness.sim.power`), labelled **simulated**.
Units: joules (J), watts (W), seconds (s); kW = 1000 W.

Per window of ``seconds`` s on ``gpus`` GPUs that used ``joules`` J in all:

* ``avg_watts`` = joules / seconds, summed over the GPUs (not per GPU);
* ``joules_per_generated_token`` = joules / generated tokens, ``joules_per_prompt_token`` = joules / prompt
  tokens, ``joules_per_token`` = joules / (prompt + generated tokens). The tokens are those of the requests
  the window's throughput counts (in a sweep: successful requests whose last byte arrived inside the window;
  prompt tokens as the server counts them, cached ones included). Prompt and generated tokens share the same
  joules: each figure divides *all* the window's energy by one kind of token, so they are not an attribution
  of energy to prefill or decode, and they do not add up;
* ``agents_per_kw`` = agents / (avg_watts / 1000), where the load is a number of concurrent agents
  (sessions: users of a concurrency sweep, agents of an agentic sweep); None for a rate (req/s) load.

Only the GPUs are counted: not the host's CPUs, memory, NICs or the offload tier's storage, so a CPU tier's
own power is outside these figures.

When a window could not be sampled (no NVML library, no GPU, an engine kind that runs on no GPU of this
machine) the sample says why in ``not_sampled`` and has no figures; the run goes on.
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import Field, model_validator

from common.schema import StrictModel, figures_or_reason

EnergySource = Literal["nvml", "simulated"]
EnergyMethod = Literal["energy_counter", "power_samples", "model"]
"""How the joules were found: NVML's cumulative energy counter, NVML power readings integrated over time,
or the simulator's power model."""
W_PER_KW = 1000.0


class EnergyWindowLike(Protocol):
    """What a power source measured over one window (:class:`harness.client.power.EnergyWindow`)."""

    @property
    def source(self) -> EnergySource: ...
    @property
    def method(self) -> EnergyMethod | None: ...
    @property
    def gpus(self) -> int: ...
    @property
    def seconds(self) -> float: ...
    @property
    def joules(self) -> float | None: ...
    @property
    def not_sampled(self) -> str | None: ...


class EnergySample(StrictModel):
    """The energy of one window and its per-token and per-kW figures (see the module docstring)."""

    source: EnergySource = Field(description="nvml: measured on the GPUs; simulated: the simulator's power model.")
    method: EnergyMethod | None = Field(default=None, description="How the joules were found (None: not sampled).")
    gpus: int = Field(ge=0, description="GPUs whose energy is counted.")
    seconds: float = Field(ge=0, description="Length of the window, s.")
    joules: float | None = Field(default=None, ge=0, description="Energy of the GPUs over the window, J.")
    avg_watts: float | None = Field(default=None, ge=0, description="joules / seconds, all GPUs together, W.")
    prompt_tokens: int | None = Field(default=None, ge=0, description="Prompt tokens of the window's requests.")
    generated_tokens: int | None = Field(default=None, ge=0, description="Generated tokens of the window's requests.")
    joules_per_prompt_token: float | None = Field(default=None, ge=0, description="joules / prompt tokens, J.")
    joules_per_generated_token: float | None = Field(default=None, ge=0, description="joules / generated tokens, J.")
    joules_per_token: float | None = Field(default=None, ge=0, description="joules / (prompt + generated tokens), J.")
    agents: float | None = Field(default=None, ge=0, description="Concurrent agents (sessions) of the load.")
    agents_per_kw: float | None = Field(default=None, ge=0, description="agents / (avg_watts / 1000).")
    not_sampled: str | None = Field(default=None, description="Why there are no figures (None: sampled).")

    @model_validator(mode="after")
    def _figures_or_reason(self) -> EnergySample:
        figures_or_reason(
            self.joules is not None, self.not_sampled, "an energy sample has joules or a not_sampled reason"
        )
        return self

    @property
    def simulated(self) -> bool:
        return self.source == "simulated"

    @property
    def label(self) -> str:
        """``simulated`` or ``measured (NVML)``: said beside every energy figure."""
        return "simulated" if self.simulated else "measured (NVML)"


def _per(joules: float, count: int | None) -> float | None:
    return joules / count if count is not None and count > 0 else None


def energy_sample(
    window: EnergyWindowLike | None,
    *,
    prompt_tokens: int | None,
    generated_tokens: int | None,
    agents: float | None = None,
) -> EnergySample | None:
    """The :class:`EnergySample` of ``window`` for these tokens and agents (None: no power source ran)."""
    if window is None:
        return None
    if window.joules is None:
        reason = window.not_sampled or "no energy reading"
        return EnergySample(source=window.source, gpus=window.gpus, seconds=window.seconds, not_sampled=reason)
    joules = window.joules
    watts = joules / window.seconds if window.seconds > 0 else None
    total = None if prompt_tokens is None or generated_tokens is None else prompt_tokens + generated_tokens
    return EnergySample(
        source=window.source,
        method=window.method,
        gpus=window.gpus,
        seconds=window.seconds,
        joules=joules,
        avg_watts=watts,
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
        joules_per_prompt_token=_per(joules, prompt_tokens),
        joules_per_generated_token=_per(joules, generated_tokens),
        joules_per_token=_per(joules, total),
        agents=agents,
        agents_per_kw=agents / (watts / W_PER_KW) if agents is not None and watts is not None and watts > 0 else None,
    )
