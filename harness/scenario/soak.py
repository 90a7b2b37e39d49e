"""The effective scenario of a stability window (``kvbench soak``): flags over the file, checked once."""

from __future__ import annotations

from pydantic import ValidationError

from common.errors import KvbenchError, ScenarioError
from common.schema import first_problem
from workloads.config import MultiUserQA

from .spec import Arm, Scenario, SoakSpec, SweepSpec


class SoakError(KvbenchError):
    """A soak cannot start or continue (wrong workload kind, missing section, unknown arm)."""


def soak_scenario(
    scenario: Scenario,
    *,
    window_s: float | None = None,
    interval_s: float | None = None,
    load: float | None = None,
    load_source: str | None = None,
    source: str = "scenario",
) -> Scenario:
    """The scenario with its effective soak section (flags override the file), validated for a soak."""
    if not isinstance(scenario.workload, MultiUserQA):
        raise ScenarioError(
            f"{source}: workload kind {scenario.workload.kind!r} cannot run a stability window; "
            "kvbench soak needs workload kind 'multi_user_qa' (users under load)"
        )
    if scenario.sweep is None:
        raise ScenarioError(f"{source}: sweep: required by kvbench soak (mode and load shape)")
    if scenario.soak is None and window_s is None:
        # a window is hours of engine time: never start one the user did not ask for
        raise SoakError(
            f"{source}: soak: missing; add a soak section (e.g. 'soak: {{window: 30m, interval: 60s, load: "
            f"{max(scenario.sweep.values):g}}}') or give --window (and --interval, --load)"
        )
    base = scenario.soak or SoakSpec()
    updates: dict[str, object] = {}
    if window_s is not None:
        updates["window"] = window_s
    if interval_s is not None:
        updates["interval"] = interval_s
    if load is not None:
        updates["load"] = load
        updates["load_source"] = load_source
    try:
        spec = SoakSpec.model_validate(base.model_dump() | updates)
    except ValidationError as error:  # one line naming the field (--window, --interval and --load land here)
        raise ScenarioError(f"{source}: {first_problem(error, prefix=('soak',), whole='soak')}") from None
    if spec.load is None:
        spec = spec.model_copy(update={"load": max(scenario.sweep.values)})
    if scenario.sweep.mode == "concurrency" and spec.load is not None and spec.load != int(spec.load):
        raise ScenarioError(f"{source}: soak.load: concurrency needs a whole number of users, got {spec.load:g}")
    return scenario.model_copy(update={"soak": spec})


def soak_arm(scenario: Scenario, wanted: str | None) -> Arm:
    """The arm a soak runs: ``wanted``, the only arm, or the first arm that is not the baseline."""
    names = [arm.name for arm in scenario.arms]
    if wanted is not None:
        for arm in scenario.arms:
            if arm.name == wanted:
                return arm
        raise SoakError(f"--arm {wanted!r} is not an arm of {scenario.name!r}; arms: {', '.join(names)}")
    if len(scenario.arms) == 1:
        return scenario.arms[0]
    return next(arm for arm in scenario.arms if arm.name != scenario.baseline_arm)


def describe_load(sweep: SweepSpec, load: float) -> str:
    if sweep.mode == "concurrency":
        return f"{load:g} concurrent users (closed loop)"
    return f"{load:g} requests/s ({sweep.arrival} arrivals)"
