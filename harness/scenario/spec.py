"""The scenario: one YAML file that says what to run, validated once, then read-only.

``load_scenario`` is the single entry point; any problem becomes a :class:`ScenarioError` whose
message names the file, the field path and the allowed values. String values may say ``${VAR}`` or
``${VAR:-default}`` (expanded at load, :func:`common.yamlfile.expand_env`); ``--set dotted.path=value``
changes a field before validation (:mod:`.overrides`).
"""

from __future__ import annotations

import math
import os
import re
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, Field, ValidationError, field_validator, model_validator

from common.errors import ScenarioError
from common.jsonfile import clipped, short_repr
from common.redact import is_secret_name, remember_secret
from common.schema import StrictModel, sorted_unique
from common.yamlfile import EnvUnset, ScenarioLoader, expand_env, read_yaml_mapping
from harness.engines import kinds
from harness.engines.base import NamesArms
from harness.engines.configs import (
    OpenAIEngineConfig,
    SglangEngineConfig,
    TrtllmEngineConfig,
    VllmEngineConfig,
    VllmPdEngineConfig,
)
from harness.engines.replicas import PrometheusSpec, RoutingSpec
from harness.sim.config import SimEngineConfig
from offload.profiles import OffloadProfile, resolve_profile
from scenarios import BUNDLED
from workloads.config import (
    AgenticSessions,
    ChoiceDist,
    ExponentialDist,
    FixedDist,
    LogNormalDist,
    MultiRoundQAProbe,
    MultiUserQA,
    NormalDist,
    TraceReplay,
    UniformDist,
    WorkloadConfig,
)

from .fleet import check_fleet
from .overrides import apply_overrides

WorkloadT = TypeVar("WorkloadT", bound=BaseModel)
"""One kind of workload (:meth:`Scenario._workload_as`)."""

VERB_OF_WORKLOAD: dict[str, str] = {
    "multi_round_qa": "run",
    "multi_user_qa": "sweep",
    "trace": "replay",
    "agentic": "sweep",
}
"""The command that runs each workload kind (for the error a scenario given to the wrong command gets)."""

EngineConfig = Annotated[
    SimEngineConfig
    | OpenAIEngineConfig
    | VllmEngineConfig
    | VllmPdEngineConfig
    | SglangEngineConfig
    | TrtllmEngineConfig,
    Field(discriminator="kind"),
]
"""The ``engine:`` section: one model per registered engine kind (:mod:`harness.engines.kinds`; a test keeps
them equal). Importing this module registers every kind: it imports ``harness.engines`` and ``harness.sim``."""


def engine_config_models() -> tuple[type[BaseModel], ...]:
    """The members of :data:`EngineConfig`, in order."""
    union = typing.get_args(EngineConfig)[0]
    return tuple(typing.get_args(union))


class Arm(StrictModel):
    """One side of the comparison, e.g. AMG-OFF (offload disabled) or AMG-ON (offload enabled)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
    offload: str | OffloadProfile = Field(
        description="A built-in profile name (off, hbm, cpu, disk, shared) or an inline profile."
    )

    routing: RoutingSpec | None = Field(
        default=None, description="Fleets: this arm's routing (default: the scenario's routing section)."
    )

    @field_validator("offload")
    @classmethod
    def _known_profile(cls, value: str | OffloadProfile) -> str | OffloadProfile:
        resolve_profile(value)
        return value

    @property
    def profile(self) -> OffloadProfile:
        return resolve_profile(self.offload)


class SLO(StrictModel):
    """Service-level objectives; used for goodput, soak verdicts and regression gates."""

    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    e2e_ms: float | None = Field(default=None, gt=0)
    percentile: float = Field(
        default=90.0, gt=0, le=100,
        description="kvbench sweep: a load point meets the SLO when this percentile of TTFT, TPOT and E2E "
        "is within the limits given.",
    )  # fmt: skip


MAX_DURATION_S = 366 * 86400.0
"""Longest duration accepted anywhere (a year): a larger one is a typo (``--window 1e400``)."""
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: object) -> float:
    """Seconds from a number of seconds or a string such as ``4h``, ``90s``, ``500ms``, ``1h30m``."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 60s, 4h or 1h30m, got {value!r}")
    seconds: float | None = None
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION_PART.findall(text)
            if parts and "".join(number + unit for number, unit in parts) == text:
                seconds = sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)
    if seconds is not None:
        if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
            raise ValueError(f"a duration must be finite and at most {MAX_DURATION_S / 86400:g} days, got {value!r}")
        return seconds
    raise ValueError(f"expected a duration such as 60s, 4h or 1h30m (units: ms, s, m, h, d), got {value!r}")


Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]
"""Seconds; YAML may say ``4h``, ``60s``, ``500ms`` or ``1h30m``."""


class GateSpec(StrictModel):
    """Rules of the regression gate (``kvbench compare``); command-line flags override them.

    A metric regresses only when the one-sided test is significant at ``alpha`` *and* the change
    exceeds its threshold, so noise alone never fails a gate and a tiny real shift does not either.
    """

    alpha: float = Field(default=0.01, gt=0, lt=0.5, description="Significance level of the one-sided tests.")
    ttft_max_increase_pct: float = Field(
        default=10.0, ge=0, description="A TTFT cell regresses when its median rose by more than this (%)."
    )
    ttft_min_increase_ms: float = Field(
        default=1.0, ge=0, description="...and by more than this many milliseconds (guards tiny TTFTs)."
    )
    error_rate_max_increase: float = Field(
        default=0.01, ge=0, le=1, description="An arm regresses when its error rate rose by more than this (0..1)."
    )
    hit_rate_max_decrease: float = Field(
        default=0.05, ge=0, le=1, description="An arm's per-request cache hit rate may fall by at most this (0..1)."
    )
    turns: list[Annotated[int, Field(ge=1)]] | None = Field(
        default=None, description="Turns whose TTFT is gated (default: every turn)."
    )


class SoakCriteria(StrictModel):
    """What a stability window must show to PASS (``kvbench soak``)."""

    slo_compliance_min: float = Field(
        default=0.99, gt=0, le=1,
        description="Share of requests that must succeed within slo.ttft_ms and slo.tpot_ms over the window.",
    )  # fmt: skip
    max_error_rate: float = Field(default=0.01, ge=0, le=1, description="Most failed requests / requests.")
    drift_metric: Literal["ttft_p99", "ttft_p50", "tpot_p99", "tpot_p50"] = Field(
        default="ttft_p99", description="Per-interval series tested for an upward trend."
    )
    drift_confidence: float = Field(
        default=0.95, gt=0.5, lt=1, description="Confidence of the one-sided Mann-Kendall trend test."
    )
    drift_min_increase_pct: float = Field(
        default=10.0, ge=0,
        description="A significant trend fails only if the Theil-Sen line rises by more than this over the window.",
    )  # fmt: skip
    hit_rate_floor: float | None = Field(
        default=None, ge=0, le=1, description="Every interval's prefix-cache hit rate (from /metrics) must reach it."
    )
    max_restarts: int = Field(default=0, ge=0, description="Engine restarts tolerated (counter resets in /metrics).")


class SoakFault(StrictModel):
    """A failure rehearsed during a stability window, on an engine kvbench starts (``soak.faults``).

    * ``kill_engine``: SIGKILL the engine's process group at ``at``; kvbench starts it again on the
      same port and records the restart and the seconds until it is healthy;
    * ``pause_engine``: SIGSTOP the group at ``at`` for ``duration``, then SIGCONT;
    * ``restart_tier``: SIGKILL and restart the offload-tier server sidecar (LMCache server).
    """

    kind: Literal["kill_engine", "pause_engine", "restart_tier"]
    at: Duration = Field(description="When, counted from the start of the window (e.g. 30m).")
    duration: Duration | None = Field(default=None, description="pause_engine: how long the engine stays stopped.")

    @model_validator(mode="after")
    def _duration_for_pause_only(self) -> SoakFault:
        if (self.kind == "pause_engine") != (self.duration is not None):
            raise ValueError(
                "pause_engine needs duration (e.g. 30s)" if self.kind == "pause_engine"
                else f"{self.kind} takes no duration (only pause_engine does)"
            )  # fmt: skip
        return self


class SoakSpec(StrictModel):
    """A stability window: the workload at its target load for ``window``, measured per ``interval``."""

    window: Duration = Field(default=3600.0, description="Length of the window (kvbench soak --window overrides).")
    interval: Duration = Field(default=60.0, description="Aggregation interval.")
    load: float | None = Field(
        default=None, gt=0,
        description="Target load in the sweep section's mode (users or requests/s); default: its highest value.",
    )  # fmt: skip
    load_source: str | None = Field(
        default=None,
        description="Where the load came from when kvbench derived it (kvbench soak --load-from SWEEP_DIR).",
    )
    warmup_intervals: int = Field(
        default=0, ge=0, description="Leading intervals kept in the time series but left out of the verdict."
    )
    min_interval_requests: int = Field(
        default=1, ge=1, description="Intervals with fewer completed requests are not judged on their own."
    )
    criteria: SoakCriteria = SoakCriteria()
    faults: list[SoakFault] = Field(
        default_factory=list,
        description="Failures to rehearse (engines kvbench starts): kill_engine, pause_engine, restart_tier.",
    )

    @model_validator(mode="after")
    def _interval_fits(self) -> SoakSpec:
        if self.interval > self.window:
            raise ValueError(f"interval ({self.interval:g} s) is longer than the window ({self.window:g} s)")
        for index, fault in enumerate(self.faults):
            if fault.at >= self.window:
                raise ValueError(f"faults[{index}].at ({fault.at:g} s) is not inside the window ({self.window:g} s)")
        return self


class SweepSpec(StrictModel):
    """The load grid of ``kvbench sweep``: one steady-state window per load point and arm.

    ``mode: concurrency`` keeps ``values[i]`` users active (closed loop: a user sends its next round
    after its answer and think time); ``mode: qps`` sends requests at ``values[i]`` per second
    (open loop, Poisson or constant gaps), each to the next user that is ready for its next round.
    """

    mode: Literal["concurrency", "qps"]
    values: list[Annotated[float, Field(gt=0, le=1_000_000)]] = Field(
        min_length=1, max_length=1000, description="Concurrencies or request rates."
    )
    arrival: Literal["poisson", "constant"] = Field(default="poisson", description="Gaps between arrivals (qps).")
    warmup: Duration = Field(default=10.0, description="Per point: load applied but not measured.")
    duration: Duration = Field(default=60.0, description="Per point: the steady-state window measured.")
    ramp_up: float = Field(
        default=5.0, ge=0, description="Seconds over which the first users start (concurrency mode)."
    )
    stagger_rounds: bool = Field(
        default=True,
        description="The first users start at a random round of their session (history pre-filled), so the mix "
        "of rounds is steady from the start; their first requests count as warm-up.",
    )
    drain_timeout: Duration = Field(
        default=120.0, description="After the window, how long requests in flight may take to finish."
    )
    reset_between_points: bool = Field(
        default=False, description="Reset the engine's GPU prefix cache before each point (arms always restart)."
    )
    max_active_users: int = Field(default=4096, ge=1, description="qps mode: most users in a session at once.")
    client_workers: int = Field(
        default=1, ge=1, le=64,
        description="Processes that send the requests, one event loop each (uvloop if installed); one loop "
        "times ~500 concurrent streams well, more need more (benchmarks/client_capacity.py).",
    )  # fmt: skip

    @field_validator("values")
    @classmethod
    def _sorted_unique(cls, values: list[float]) -> list[float]:
        return sorted_unique(values, "load values")

    @model_validator(mode="after")
    def _integer_concurrency(self) -> SweepSpec:
        if self.mode == "concurrency" and any(v != int(v) for v in self.values):
            raise ValueError(f"mode 'concurrency' needs whole numbers of users, got {self.values}")
        return self


class CostSpec(StrictModel):
    """What capacity costs: the load to provision for and the price of a GPU (for GPUs saved, $/year)."""

    target_rps: float = Field(gt=0, description="Requests per second the deployment must serve within the SLO.")
    usd_per_gpu_hour: float = Field(gt=0, description="Price of one GPU-hour in US dollars.")
    hours_per_year: float = Field(default=8760.0, gt=0, le=8784)


class ValiditySpec(StrictModel):
    """When a run cannot claim what it measured (``kvbench run`` and ``kvbench sweep``).

    Above ``max_error_rate`` the run is FAILED (exit 1); the cache gates make a probe INCONCLUSIVE
    (exit 3): see :mod:`harness.results.validity` for every gate and its formula.
    """

    max_error_rate: float = Field(
        default=0.05, ge=0, le=1,
        description="Most failed measured requests / measured requests before the run is FAILED (exit 1).",
    )  # fmt: skip
    max_reset_hit_rate: float = Field(
        default=0.5, ge=0, le=1,
        description="Most share of a later turn's prompt tokens served from the GPU prefix cache when "
        "between_turns drops it (or from any cache in an arm without offload tiers) before the run is "
        "INCONCLUSIVE (exit 3).",
    )  # fmt: skip
    max_turn1_hit_rate: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="Most share of a turn-1 cell's prompt tokens served from any cache (GPU or offload tier) in a "
        "run whose prompts are its own (workload.prompt_salt: per_run) before the run is INCONCLUSIVE (exit 3): "
        "only the shared system prompt and chat template may hit (the simulator's 50-token turn 1: about 14 %).",
    )
    max_client_loop_delay_ms: float = Field(
        default=25.0,
        gt=0,
        description="Most event-loop delay p99 (ms) of any process sending a load point's requests before the point "
        "is client-limited and the sweep INCONCLUSIVE (exit 3): a loop that wakes this late adds its backlog to "
        "the latencies it measures.",
    )
    max_client_send_lag_ms: float = Field(
        default=50.0,
        gt=0,
        description="Most send lag p99 (ms: a request sent after it was due, its scheduled arrival or its user's "
        "previous answer plus think time) of a load point before it is client-limited (INCONCLUSIVE, exit 3).",
    )
    max_client_cpu: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Most share of one core (CPU time / wall time over the window) any single-loop client process "
        "may use in a load point before it is client-limited (INCONCLUSIVE, exit 3).",
    )


class OutputSpec(StrictModel):
    dir: str = Field(default="runs", description="Parent directory of run directories.")


class Compare(StrictModel):
    """Which arm is the baseline of the % diff columns (default: the first arm)."""

    baseline: str | None = None


class Scenario(StrictModel):
    """A complete, validated benchmark scenario."""

    schema_version: Literal[1] = 1
    name: str = Field(min_length=1, max_length=200)
    description: str = Field(
        default="",
        description="One line: what the scenario measures, on what (every bundled scenario has one; "
        "`kvbench scenarios` prints it beside the name).",
    )
    engine: EngineConfig
    arms: list[Arm] = Field(min_length=1)
    workload: WorkloadConfig
    repetitions: int = Field(default=1, ge=1, le=10_000, description="Times the workload is repeated per arm.")
    arm_order: Literal["sequential", "interleaved"] = Field(
        default="sequential",
        description="kvbench run: 'sequential' runs every repetition of an arm, then the next arm; 'interleaved' "
        "runs repetitions in ABBA blocks (A B, then B A, ...), one engine start per arm and block, so slow drift "
        "of the machine cannot pass for an offload effect.",
    )  # fmt: skip
    seed: int = 0
    slo: SLO = SLO()
    output: OutputSpec = OutputSpec()
    compare: Compare = Compare()
    gate: GateSpec = GateSpec()
    validity: ValiditySpec = ValiditySpec()
    soak: SoakSpec | None = Field(default=None, description="Stability-window settings (kvbench soak).")
    sweep: SweepSpec | None = Field(default=None, description="Load grid (kvbench sweep; multi_user_qa only).")
    cost: CostSpec | None = Field(default=None, description="Target load and GPU price (kvbench sweep).")
    routing: RoutingSpec = Field(default=RoutingSpec(), description="Fleets: how requests reach replicas.")
    prometheus: PrometheusSpec | None = Field(
        default=None, description="Fleets: read per-replica counters from this Prometheus server."
    )

    @model_validator(mode="after")
    def _fleet_consistent(self) -> Scenario:
        workers = self.sweep.client_workers if self.sweep else 1
        for routing in [arm.routing or self.routing for arm in self.arms]:  # a list: routing may hold lists
            check_fleet(self.engine, routing, self.prometheus, workers)
        return self

    @model_validator(mode="after")
    def _arms_consistent(self) -> Scenario:
        names = [arm.name for arm in self.arms]
        if len(names) != len(set(names)):
            raise ValueError(f"arm names must be unique, got {names}")
        if self.compare.baseline is not None and self.compare.baseline not in names:
            raise ValueError(f"compare.baseline {self.compare.baseline!r} is not an arm; arms: {names}")
        if isinstance(self.engine, NamesArms):
            for field, named in self.engine.arms_named.items():
                if unknown := [name for name in named if name not in names]:
                    raise ValueError(f"engine.{field}: {unknown} name no arm; allowed: {names}")
        between = self.workload.between_turns.mode if isinstance(self.workload, MultiRoundQAProbe) else None
        for arm in self.arms:
            try:
                kinds.check_supported(self.engine, arm.profile, between)
            except ValueError as error:
                raise ValueError(f"arm {arm.name!r}: {error}") from None
        return self

    @model_validator(mode="after")
    def _faults_need_a_started_engine(self) -> Scenario:
        if self.soak is not None and self.soak.faults and not kinds.engine_kind(self.engine.kind).starts_process:
            started = ", ".join(k for k in kinds.engine_kinds() if kinds.engine_kind(k).starts_process)
            raise ValueError(
                f"soak.faults: engine kind {self.engine.kind!r} is not started by kvbench, so it cannot be killed, "
                f"paused or restarted; faults need one of: {started}"
            )
        return self

    @model_validator(mode="after")
    def _sweep_matches_workload(self) -> Scenario:
        if isinstance(self.workload, MultiUserQA) and self.sweep is None:
            raise ValueError("workload kind 'multi_user_qa' needs a 'sweep' section (mode, values, duration)")
        if not isinstance(self.workload, MultiUserQA) and self.sweep is not None:
            raise ValueError(
                f"'sweep' applies to workload kind 'multi_user_qa' only (this workload is {self.workload.kind!r})"
            )
        return self

    @property
    def baseline_arm(self) -> str:
        return self.compare.baseline or self.arms[0].name

    @property
    def probe_workload(self) -> MultiRoundQAProbe:
        """The workload of a probe scenario (``kvbench run``); a clear error for any other kind."""
        return self._workload_as(MultiRoundQAProbe, "a probe", " (`kvbench run` takes workload kind 'multi_round_qa')")

    @property
    def load_workload(self) -> MultiUserQA:
        """The workload of a load scenario (``kvbench sweep``); a clear error for any other kind."""
        return self._workload_as(
            MultiUserQA, "a multi-user load", " (`kvbench sweep` and `kvbench soak` run workload kind 'multi_user_qa')"
        )

    @property
    def agentic_workload(self) -> AgenticSessions:
        """The workload of an agentic sweep (``kvbench sweep``); a clear error for any other kind."""
        return self._workload_as(AgenticSessions, "agentic", "")

    @property
    def trace_workload(self) -> TraceReplay:
        """The workload of a trace replay (``kvbench replay``); a clear error for any other kind."""
        return self._workload_as(TraceReplay, "a trace", " (`kvbench replay` runs workload kind 'trace')")

    def _workload_as(self, kind: type[WorkloadT], what: str, takes: str) -> WorkloadT:
        """The workload as ``kind``, else a ScenarioError: ``what`` it is not, the command that runs it, ``takes``."""
        if not isinstance(self.workload, kind):
            raise ScenarioError(
                f"scenario {self.name!r}: workload kind {self.workload.kind!r} is not {what}; "
                f"run it with `kvbench {VERB_OF_WORKLOAD[self.workload.kind]}`{takes}"
            )
        return self.workload


def _field_names(model: type[BaseModel]) -> list[str]:
    return sorted(model.model_fields)


def _model_at(loc: tuple[int | str, ...], root: type[BaseModel]) -> type[BaseModel] | None:
    """Best-effort: the pydantic model under ``root`` that owns the mapping at ``loc`` (for listing allowed keys)."""
    model: type[BaseModel] | None = root
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            # discriminated-union members appear as their tag in the location
            model = _UNION_TAGS.get(part, None)
            continue
        model = _first_model(field.annotation)
    return model


def _first_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _union_tags() -> dict[str, type[BaseModel]]:
    tags: dict[str, type[BaseModel]] = {}
    for member in engine_config_models():
        for tag in getattr(member.model_fields["kind"].annotation, "__args__", ()):
            tags[str(tag)] = member
    tags["multi_round_qa"] = MultiRoundQAProbe
    tags["multi_user_qa"] = MultiUserQA
    tags["agentic"] = AgenticSessions
    for dist in (FixedDist, UniformDist, NormalDist, LogNormalDist, ExponentialDist, ChoiceDist):
        for tag in getattr(dist.model_fields["dist"].annotation, "__args__", ()):
            tags[str(tag)] = dist
    return tags


_UNION_TAGS = _union_tags()


def _display_loc(
    loc: tuple[int | str, ...], root: type[BaseModel], *, unknown_last: bool = False
) -> tuple[int | str, ...]:
    """``loc`` without the tags pydantic inserts for unions (workload.multi_user_qa.rounds -> workload.rounds,
    arms.1.offload.str -> arms.1.offload), so the path is the one written in the YAML file.
    ``unknown_last``: the last part is a key the user wrote that is no field (an extra_forbidden error)."""
    out: list[int | str] = []
    model: type[BaseModel] | None = root
    for index, part in enumerate(loc):
        if isinstance(part, int) or model is None or (unknown_last and index == len(loc) - 1):
            out.append(part)
            continue
        field = model.model_fields.get(part)
        if field is None and part in _UNION_TAGS:
            model = _UNION_TAGS[part]
            continue
        if field is None:
            continue  # a union member's label ("str", "function-after[...]"): pydantic's, not the user's
        out.append(part)
        model = _first_model(field.annotation)
    return tuple(out)


def format_validation_error(
    source: str, error: ValidationError, root: type[BaseModel] = Scenario, what: str = "scenario"
) -> str:
    """A header and one line per field (a union's alternatives joined with "or"), paths as written in the file;
    ``root``: the model validated (a scenario, a playbook), ``what`` the header calls the file."""
    problems: dict[str, list[str]] = {}
    for item in error.errors():
        loc = tuple(item["loc"])
        shown = _display_loc(loc, root, unknown_last=item["type"] == "extra_forbidden")
        path = ".".join(str(p) for p in shown) or "(top level)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            owner = _model_at(loc[:-1], root)
            if owner is not None:
                message += f"; allowed fields here: {', '.join(_field_names(owner))}"
        elif item["type"] == "missing":
            message = "required field is missing"
        got = item.get("input")
        suffix = (
            ""
            if item["type"] in {"missing", "extra_forbidden"} or isinstance(got, dict)
            else f" (got {short_repr(got)})"
        )
        problems.setdefault(path, []).append(f"{message}{suffix}")
    lines = [f"  - {path}: {' or '.join(dict.fromkeys(messages))}" for path, messages in problems.items()]
    return "\n".join([f"{source}: invalid {what} ({len(lines)} problem(s))", *lines])


def bundled_scenarios() -> dict[str, Path]:
    """Scenario files shipped with the package, by stem (``quickstart`` -> .../quickstart.yaml)."""
    return {path.stem: path for path in sorted(BUNDLED.glob("*.yaml"))}


def resolve_scenario_path(ref: str) -> Path:
    """A path to a YAML file, or the name of a bundled scenario."""
    path = Path(ref)
    if path.exists():
        return path
    bundled = bundled_scenarios()
    if ref in bundled:
        return bundled[ref]
    names = ", ".join(sorted(bundled)) or "(none)"
    raise ScenarioError(f"{ref}: no such file, and not a bundled scenario; bundled scenarios: {names}")


def parse_scenario(data: object, source: str) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as error:
        raise ScenarioError(format_validation_error(source, error)) from None


def override_scenario(scenario: Scenario, overrides: Sequence[str]) -> Scenario:
    """``scenario`` (built in code, e.g. from a command's flags) with ``--set`` overrides applied as to a file."""
    if not overrides:
        return scenario
    data = scenario.model_dump(mode="json", exclude_unset=True)
    source = f"the flags with --set {' --set '.join(map(clipped, overrides))}"
    return parse_scenario(apply_overrides(data, overrides, Scenario), source)


def read_scenario_data(
    path: Path, overrides: Sequence[str] = (), environ: Mapping[str, str] | None = None
) -> tuple[dict[str, object], str]:
    """The raw mapping of a scenario file with ``${VAR}``/``${VAR:-default}`` expanded from ``environ`` (default:
    this process's environment) and ``overrides`` (``dotted.path=value``, ``--set``) applied, not yet validated;
    and the source to name in its errors (the file, and the overrides when there are any).

    A variable whose name says it holds a secret (``HF_TOKEN``, ``API_KEY``: :func:`common.redact.is_secret_name`)
    is remembered as one, so its value is scrubbed from the stored scenario, the manifest and every error line,
    wherever in the scenario it was expanded into.
    """
    # YAML 1.2 booleans: `offload: off` is the profile "off", an arm named ON is named "ON"
    raw = read_yaml_mapping(path, ScenarioError, loader=ScenarioLoader)
    try:
        expanded, used = expand_env(raw, os.environ if environ is None else environ)
    except EnvUnset as error:
        raise ScenarioError(f"{path}: {error}") from None
    for name, value in used.items():
        if is_secret_name(name):
            remember_secret(value)
    assert isinstance(expanded, dict)  # expand_env keeps the mapping read_yaml_mapping checked
    data = {str(key): value for key, value in expanded.items()}
    if not overrides:
        return data, str(path)
    return apply_overrides(data, overrides, Scenario), f"{path} with --set {' --set '.join(map(clipped, overrides))}"


def load_scenario(
    ref: str | Path, overrides: Sequence[str] = (), environ: Mapping[str, str] | None = None
) -> tuple[Scenario, Path]:
    """Read and validate a scenario file (or bundled scenario name), its ``${VAR}`` references expanded and
    ``overrides`` (``--set dotted.path=value``) applied (:func:`read_scenario_data`)."""
    path = resolve_scenario_path(str(ref))
    data, source = read_scenario_data(path, overrides, environ)
    return parse_scenario(data, source), path
