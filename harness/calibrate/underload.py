"""The under-load held-out table: capacity at the SLO per arm and the ON/OFF ratio, predicted against measured.

For every kept load run (a sweep or an agentic sweep of a real engine under ``docs/results`` or ``lab/runs``; a soak
holds one load, so it is listed as not predicted):

1. **The calibration** is the shipped one of the run's deployment and engine mode
   (:func:`harness.sim.calibration.pick_shipped`). When the run is one of its sources, the calibration is refitted
   from its other sources with this checkout's code, the run left out (leave one run out); a calibration whose only
   source is the run cannot predict it, and the run is listed as skipped with that reason.
2. **The prediction** re-runs the run's own scenario, loads and seed on the calibrated simulator
   (:func:`harness.calibrate.validate.simulate_run`: real time, real HTTP, this machine's client time taken out of
   the calibrated overhead), each load point's warm-up and window times ``window_scale``.
3. **The cells**, both sides aggregated by the results' own code (:func:`harness.results.sweep.aggregate_sweep`,
   :func:`harness.results.agentic.agentic_result_of`): a sweep's capacity within the SLO per arm
   (``max_rps_per_gpu_at_slo``, RPS/GPU) and per treatment arm the ON/OFF ratio ``capacity(arm) /
   capacity(baseline)``; an agentic sweep's agents at SLO per (arm, tier) and its ratio to the baseline arm.
   ``error = predicted / measured - 1``. A value that is a bound (every load point met the SLO: ``above-grid``)
   or missing on one side is shown, never put in a band.
4. **Decode**, a sweep's TPOT p50 per (arm, load point), measured against predicted (:func:`tpot_cells`): what a
   decode-step term changes first. Shown beside the table (stdout, ``--json``), never put in a band.

The band of a calibration (:func:`bands`) is the lowest and highest capacity error of the exact cells it (or its
leave-one-out refit) predicted, with how many runs; simulated reports print it (:mod:`harness.sim.heldout`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import CalibrationError, KvbenchError
from harness.results.agentic import agentic_result_of
from harness.results.agentic_result import AgenticResult
from harness.results.capacity import arm_capacity
from harness.results.sweep import aggregate_sweep
from harness.results.sweep_result import SweepResult
from harness.sim.calibration import Calibration, pick_shipped
from harness.sim.heldout import AGENTS, CAPACITY, Band
from harness.store.rundir import RunDir

from .fit import calibrate
from .samples import run_facts
from .validate import is_source, simulate_run

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: kept runs and a calibration's source paths are relative to it."""
KEPT_ROOTS = ("docs/results", "lab/runs")
LOAD_KINDS = ("sweep", "agentic", "soak")
RATIO = "ON/OFF"
TPOT = "TPOT p50 ms"


@dataclass(frozen=True)
class Cell:
    """One predicted quantity of one arm: ``quantity`` is :data:`CAPACITY` (RPS/GPU within the SLO), ``agents at
    SLO TIER``, or either with :data:`RATIO` in front (the arm's over the baseline arm's)."""

    arm: str
    quantity: str
    measured: float | None
    predicted: float | None
    exact: bool = True
    """Both values are placed capacities (not a bound such as "every load point met the SLO")."""
    note: str = ""

    @property
    def error(self) -> float | None:
        if self.measured is None or self.predicted is None or self.measured <= 0:
            return None
        return self.predicted / self.measured - 1.0


@dataclass(frozen=True)
class Value:
    """A capacity as a result states it: the number, and whether it is placed (not a lower bound or missing)."""

    value: float | None
    exact: bool = True
    words: str = ""
    at_load: float | None = None
    """The load point that gave it (a sweep's best point within the SLO)."""


def capacity_cells(
    measured: Mapping[str, Value], predicted: Mapping[str, Value], baseline: str, quantity: str
) -> list[Cell]:
    """Per arm the ``quantity`` measured against predicted, then per other arm its ratio to ``baseline``'s."""
    cells: list[Cell] = []
    for arm, real in measured.items():
        sim = predicted.get(arm, Value(None, False, "not simulated"))
        sides = (("measured", real), ("predicted", sim))
        note = "; ".join(f"{side} {v.words}" for side, v in sides if v.words)
        if real.at_load is not None and sim.at_load is not None:
            note = f"at load {real.at_load:g} / {sim.at_load:g}" + (f"; {note}" if note else "")
        cells.append(Cell(arm, quantity, real.value, sim.value, real.exact and sim.exact, note))
    base_real, base_sim = measured.get(baseline), predicted.get(baseline)
    if base_real is None or base_sim is None:
        return cells
    for arm, real in measured.items():
        ratio_sim = predicted.get(arm)
        if arm == baseline or ratio_sim is None:
            continue
        cells.append(
            Cell(
                arm,
                f"{RATIO} {quantity}",
                _ratio(real, base_real),
                _ratio(ratio_sim, base_sim),
                real.exact and ratio_sim.exact and base_real.exact and base_sim.exact,
            )
        )
    return cells


def _ratio(arm: Value, baseline: Value) -> float | None:
    if arm.value is None or baseline.value is None or baseline.value <= 0:
        return None
    return arm.value / baseline.value


def sweep_values(result: SweepResult, loads: Sequence[float]) -> dict[str, Value]:
    """Each arm's capacity within the SLO over the sweep's points at ``loads``, by the results' capacity code."""
    points = [p for p in result.points if p.load in loads]
    out: dict[str, Value] = {}
    for arm in result.arms:
        capacity = arm_capacity(arm, points, None, result.gpus, result.slo.percentile)
        value = capacity.max_rps_per_gpu_at_slo if capacity is not None else None
        ran = any(p.arm == arm for p in points)
        words = "" if value is not None else "no load point met the SLO" if ran else "not run"
        out[arm] = Value(value, value is not None, words, capacity.at_load if capacity is not None else None)
    return out


def tpot_cells(measured: SweepResult, predicted: SweepResult, loads: Sequence[float]) -> list[Cell]:
    """Per (arm, load point) of ``loads`` that both sides ran, the TPOT p50 (ms) measured against predicted."""

    def p50s(result: SweepResult) -> dict[tuple[str, float], float]:
        return {(p.arm, p.load): p.tpot.p50_ms for p in result.points if p.load in loads and p.tpot is not None}

    real, sim = p50s(measured), p50s(predicted)
    return [
        Cell(arm, f"{TPOT} at load {load:g}", real[arm, load], sim[arm, load])
        for arm, load in real
        if (arm, load) in sim
    ]


def agentic_values(result: AgenticResult, tier: str) -> dict[str, Value]:
    """Each arm's agents at SLO of ``tier`` as the agentic result states it (``above-grid``: a lower bound)."""
    out: dict[str, Value] = {}
    for arm in result.arms:
        capacity = result.capacity_of(arm, tier)
        if capacity is None:
            out[arm] = Value(None, False, "no such tier")
            continue
        exact = capacity.status == "met"
        out[arm] = Value(capacity.agents_at_slo, exact, "" if exact else capacity.describe())
    return out


@dataclass(frozen=True)
class RunTable:
    """The cells of one kept load run, and what predicted them."""

    run: str
    """The run directory, relative to the checkout."""
    kind: str
    calibration: str
    """The shipped calibration's file name."""
    how: str
    """``left out``: refitted without the run; ``never seen``: the shipped file, which the run is no source of."""
    cells: list[Cell] = field(default_factory=list)
    tpot: list[Cell] = field(default_factory=list)
    """A sweep's TPOT p50 per (arm, load point) in ms (:func:`tpot_cells`); empty for an agentic run."""
    skipped: str = ""
    """Why the run was not predicted (no cells then)."""


def kept_load_runs(roots: Sequence[Path] | None = None) -> list[Path]:
    """Run directories of load runs (sweeps, agentic sweeps) of real engines under ``roots``, in name order."""
    found: list[Path] = []
    for root in roots if roots is not None else [ROOT / r for r in KEPT_ROOTS]:
        for path in sorted(p for p in root.iterdir() if (p / "manifest.json").is_file()):
            try:
                run_dir = RunDir.open(path)
                is_load = run_dir.kind in LOAD_KINDS
            except KvbenchError:
                continue  # not a run directory this checkout reads: nothing to hold out
            if is_load and run_dir.scenario().engine.kind != "sim":
                found.append(path)
    return found


def held_out_calibration(run_dir: RunDir, out: Path) -> tuple[Path, str, str]:
    """(calibration file, shipped name, how) for predicting ``run_dir`` without having seen it.

    Raises :class:`CalibrationError` when no shipped calibration fits the deployment, or its only source is the run.
    """
    facts = run_facts(run_dir.path)
    cuda_graphs = facts.deployment.cuda_graphs
    path, shipped = pick_shipped(facts.deployment.resolve(), cuda_graphs)
    if not is_source(shipped, run_dir):
        return path, path.name, "never seen"
    others = [ROOT / s.path for s in shipped.sources if (ROOT / s.path).resolve() != run_dir.path.resolve()]
    if not others:
        raise CalibrationError(f"{path.name} was fitted on this run alone: nothing is left to predict it with")
    refit: Calibration = calibrate(
        others, shipped.holdout_context_tokens, decode_read=shipped.decode_s_per_ktoken.fitted
    )
    out.mkdir(parents=True, exist_ok=True)
    return refit.save(out / f"{path.stem}-without-{run_dir.path.name}.yaml"), path.name, "left out"


def predict_run(
    run: Path,
    out: Path,
    window_scale: float = 1.0,
    calibration: Path | None = None,
    loads: Sequence[float] = (),
) -> RunTable:
    """The held-out cells of one kept load run (module docstring); a run that cannot be predicted is skipped.

    ``calibration``: predict with this file instead (``how`` = ``given``), e.g. to compare a model change.
    ``loads``: a sweep's capacity over these of its load points only, on both sides (a shorter check)."""
    run_dir = RunDir.open(run)
    name = str(run.resolve().relative_to(ROOT)) if run.resolve().is_relative_to(ROOT) else str(run)
    work = out / run.name
    if run_dir.kind not in ("sweep", "agentic"):
        return RunTable(
            name, run_dir.kind, "", "", skipped=f"a {run_dir.kind} run holds one load: no capacity to compare"
        )
    scenario = run_dir.scenario()
    spec = scenario.sweep
    chosen = list(loads) or (list(spec.values) if spec is not None else [])
    if loads and (run_dir.kind != "sweep" or spec is None):
        raise CalibrationError(f"--loads: {name} is a {run_dir.kind} run; --loads picks a sweep's load points")
    unknown = sorted(set(chosen) - set(spec.values if spec is not None else ()))
    if unknown:
        raise CalibrationError(f"--loads {unknown}: not load points of {name}; its loads: {spec and spec.values}")
    try:
        if calibration is not None:
            calibration_file, shipped, how = calibration, calibration.name, "given"
        else:
            calibration_file, shipped, how = held_out_calibration(run_dir, work)
    except CalibrationError as error:
        return RunTable(name, run_dir.kind, "", "", skipped=str(error))
    if run_dir.kind == "sweep":
        assert spec is not None  # a sweep run's scenario has its sweep section
        window: dict[str, object] = {
            "warmup": spec.warmup * window_scale,
            "duration": spec.duration * window_scale,
            "values": chosen,
        }
        sim_dir = simulate_run(run_dir, work, calibration_file, sweep=window)
        measured = aggregate_sweep(scenario, run_dir.run_id, run_dir.records(), run_dir.points())
        predicted = aggregate_sweep(sim_dir.scenario(), sim_dir.run_id, sim_dir.records(), sim_dir.points())
        cells = capacity_cells(
            sweep_values(measured, chosen), sweep_values(predicted, chosen), measured.baseline_arm, CAPACITY
        )
        tpot = tpot_cells(measured, predicted, chosen)
    else:
        agentic = scenario.agentic_workload
        window = {"warmup_s": agentic.warmup_s * window_scale, "window_s": agentic.window_s * window_scale}
        sim_dir = simulate_run(run_dir, work, calibration_file, workload=window)
        real, sim = agentic_result_of(run_dir), agentic_result_of(sim_dir)
        tpot = []
        cells = [
            cell
            for tier in agentic.tiers
            for cell in capacity_cells(
                agentic_values(real, tier.name),
                agentic_values(sim, tier.name),
                real.baseline_arm,
                f"{AGENTS} {tier.name}",
            )
        ]
    return RunTable(name, run_dir.kind, shipped, how, cells, tpot)


def bands(tables: Sequence[RunTable]) -> dict[str, dict[str, Band]]:
    """Per shipped calibration, per quantity kind (:data:`CAPACITY`, :data:`AGENTS`): the lowest and highest
    error of its exact per-arm cells (ratios left out: they follow from the arms) and how many runs gave them."""
    errors: dict[str, dict[str, list[tuple[str, float]]]] = {}
    for table in tables:
        for cell in table.cells:
            error = cell.error
            if not cell.exact or error is None or cell.quantity.startswith(RATIO):
                continue
            kind = CAPACITY if cell.quantity == CAPACITY else AGENTS
            errors.setdefault(table.calibration, {}).setdefault(kind, []).append((table.run, error))
    return {
        name: {
            kind: Band(low=min(e for _, e in found), high=max(e for _, e in found), runs=len({r for r, _ in found}))
            for kind, found in by_kind.items()
        }
        for name, by_kind in errors.items()
    }


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


def tpot_lines(tables: Sequence[RunTable]) -> list[str]:
    """The sweeps' TPOT p50 cells, one line each, and their median |error|."""
    lines = [
        f"{Path(t.run).name} {c.arm} {c.quantity}: measured {_num(c.measured)}, predicted {_num(c.predicted)}, {e:+.1%}"
        for t in tables
        for c in t.tpot
        if (e := c.error) is not None
    ]
    errors = [abs(e) for t in tables for c in t.tpot if (e := c.error) is not None]
    return [*lines, f"TPOT p50: {len(errors)} cells, median |error| {statistics.median(errors):.1%}"] if errors else []


def markdown(tables: Sequence[RunTable]) -> str:
    """The table for docs/simulator.md: one row per cell, skipped runs below it."""
    lines = [
        "| run | calibration (how) | arm | quantity | measured | predicted | error |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for table in tables:
        for cell in table.cells:
            error = cell.error
            shown = "—" if error is None else f"{error:+.1%}" + ("" if cell.exact else " (bound)")
            note = f" ({cell.note})" if cell.note else ""
            source = f"`{table.calibration}` ({table.how})"
            lines.append(
                f"| `{Path(table.run).name}` | {source} | {cell.arm} | {cell.quantity}{note} "
                f"| {_num(cell.measured)} | {_num(cell.predicted)} | {shown} |"
            )
    skipped = [f"* `{Path(t.run).name}`: {t.skipped}" for t in tables if t.skipped]
    exact = [abs(e) for t in tables for c in t.cells if c.exact and (e := c.error) is not None]
    summary = (
        f"{len(exact)} exact cells: median |error| {statistics.median(exact):.1%}, worst {max(exact):.1%}"
        if exact
        else "no exact cells"
    )
    return "\n".join([*lines, "", summary, *(["", "Not predicted:", *skipped] if skipped else [])])
