"""``kvbench sim validate``: re-run a real run's scenario on the calibrated simulator and compare.

The simulator run is a real run through the spine (:func:`harness.runs.kinds.launch`): the run's
scenario with its engine replaced by ``kind: sim`` (the calibration's deployment and file), each
arm's offload profile given the backend the real run used (from its manifest), the same seed,
and -- to keep it short -- only the chosen context lengths and ``conversations`` conversations
(default 1). Per (arm, context length, turn) it compares median TTFT:
``error = simulated / measured - 1``.

Without a calibration file, one is fitted from the run itself on the lengths that are not held
out (:func:`harness.results.calibrate.calibrate`) and written next to the simulator run, so a
validation is always on lengths the fit did not see unless the user says otherwise; every cell
says whether its length was in the fit.

Verdict: ``ok`` when every cell at ``min_tokens`` (1,000) or more is within ``max_error``;
``beyond`` otherwise; cells below ``min_tokens`` are shown but not judged.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.results.calibrate import calibrate as fit_calibration
from harness.results.calibrate import run_facts
from harness.scenario.spec import Scenario, parse_scenario
from harness.sim.calibration import Calibration
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from kvbench.errors import CalibrationError
from offload.profiles import resolve_profile

from .kinds import launch

CALIBRATION_FILE = "calibration.yaml"


@dataclass(frozen=True)
class Cell:
    arm: str
    context_tokens: int
    turn: int
    measured_ms: float
    simulated_ms: float
    in_fit: bool

    @property
    def error(self) -> float:
        return self.simulated_ms / self.measured_ms - 1.0


@dataclass(frozen=True)
class Validation:
    run: Path
    sim_run: Path
    calibration: Path
    fit_lengths: list[int]
    validated_lengths: list[int]
    conversations: int
    cells: list[Cell]
    max_error: float
    min_tokens: int

    @property
    def judged(self) -> list[Cell]:
        return [c for c in self.cells if c.context_tokens >= self.min_tokens]

    @property
    def median_abs_error(self) -> float:
        return statistics.median(abs(c.error) for c in self.judged) if self.judged else float("nan")

    @property
    def worst(self) -> Cell | None:
        return max(self.judged, key=lambda c: abs(c.error), default=None)

    @property
    def passed(self) -> bool:
        return all(abs(c.error) <= self.max_error for c in self.judged)


def sim_scenario(scenario: Scenario, calibration: Calibration, calibration_file: Path, backends: dict[str, str | None],
                 lengths: Sequence[int], conversations: int) -> Scenario:  # fmt: skip
    """The run's scenario on the calibrated simulator, restricted to ``lengths`` and ``conversations``."""
    data = scenario.model_dump(mode="json")
    dep = calibration.deployment
    data["name"] = f"{scenario.name}-sim-validate"
    data["engine"] = {
        "kind": "sim",
        "model": dep.model,
        "hardware": dep.hardware,
        "parallelism": {"tp": dep.tp},
        "dtype": dep.dtype,
        "max_batch_tokens": calibration.max_batch_tokens,
        "calibration": str(calibration_file),
    }
    arms = []
    for arm, raw in zip(scenario.arms, data["arms"], strict=True):
        profile = resolve_profile(arm.offload)
        backend = backends.get(arm.name)
        if profile.offload_enabled and backend is not None:
            raw["offload"] = profile.model_copy(update={"backend": backend}).model_dump(mode="json")
        arms.append(raw)
    data["arms"] = arms
    data["workload"]["context_tokens"] = list(lengths)
    data["workload"]["conversations"] = conversations
    data["repetitions"] = 1
    return parse_scenario(data, "validate")


def _medians(records: Sequence[RequestRecord]) -> dict[tuple[str, int, int], float]:
    cells: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for r in records:
        if r.phase == "measure" and r.ok and r.ttft_ns is not None:
            cells[(r.arm, r.context_tokens, r.turn)].append(r.ttft_ns / 1e6)
    return {key: statistics.median(values) for key, values in cells.items()}


def validate(
    run: Path,
    out: Path,
    calibration_file: Path | None = None,
    holdout: Sequence[int] = (),
    conversations: int = 1,
    max_error: float = 0.15,
    min_tokens: int = 1000,
) -> Validation:
    """Simulate ``run``'s scenario at the held-out lengths (all lengths without ``holdout``) and compare.

    Raises :class:`CalibrationError` when the run and the calibration cannot be compared.
    """
    facts = run_facts(run)
    run_dir = RunDir.open(run)
    if run_dir.kind != "probe":
        raise CalibrationError(
            f"{run}: a {run_dir.kind} run; kvbench sim validate compares probe runs (t1/t2 TTFT per arm and length)"
        )
    scenario = run_dir.scenario()
    lengths_all = list(scenario.probe_workload.context_tokens)
    unknown = sorted(set(holdout) - set(lengths_all))
    if unknown:
        raise CalibrationError(f"--holdout {unknown}: not lengths of {run}; its lengths: {lengths_all}")
    out.mkdir(parents=True, exist_ok=True)
    if calibration_file is None:
        calibration = fit_calibration([run], holdout)
        calibration_file = calibration.save(out / CALIBRATION_FILE)
    else:
        calibration = Calibration.load(calibration_file)
    if calibration.deployment != facts.deployment:
        raise CalibrationError(
            f"calibration {calibration_file} is for {calibration.deployment.label}; {run} is {facts.deployment.label}"
        )
    lengths = sorted(holdout) if holdout else lengths_all
    backends = {name: arm.backend for name, arm in facts.arms.items()}
    simulated_scenario = sim_scenario(scenario, calibration, calibration_file.resolve(), backends, lengths,
                                      conversations)  # fmt: skip
    sim_dir, _ = launch("probe", simulated_scenario, source=None, output_dir=out)
    measured = _medians(run_dir.records())
    simulated = _medians(sim_dir.records())
    fit_lengths = set(calibration.fit_context_tokens)
    cells = [
        Cell(arm, context, turn, measured[(arm, context, turn)], value, context in fit_lengths)
        for (arm, context, turn), value in sorted(simulated.items())
        if (arm, context, turn) in measured and measured[(arm, context, turn)] > 0
    ]
    if not cells:
        raise CalibrationError(f"{run}: no (arm, length, turn) cell of the simulator run has a measurement to compare")
    return Validation(
        run=run,
        sim_run=sim_dir.path,
        calibration=calibration_file,
        fit_lengths=sorted(fit_lengths),
        validated_lengths=lengths,
        conversations=conversations,
        cells=cells,
        max_error=max_error,
        min_tokens=min_tokens,
    )
