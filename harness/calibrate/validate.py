"""``kvbench sim validate``: re-run a real run's scenario on the (calibrated) simulator and compare.

One path for every run kind it compares (probe runs and sweeps):

1. **The simulator run** is a real run through the spine (:func:`harness.runs.kinds.launch`) of the
   run's own scenario with its engine replaced by ``kind: sim`` (:func:`sim_scenario`): the
   calibration's deployment and file, the run's ``gpu_memory_utilization`` / block size / HBM block count / replicas
   where its engine had them (they size the HBM prefix cache), each arm's offload profile given the
   backend the real run used (from its manifest), the same seed.
2. **Cells**: one per compared quantity, ``error = simulated / measured - 1``; a cell is judged
   against its own limit or only shown; quantities that cannot be compared are listed as skipped
   with the reason.
3. **Verdict**: ``passed`` when every judged cell is within its limit and nothing is missing on one
   side only (``kvbench sim validate`` exits 0, else 1; 2 when the run cannot be compared at all).

Probe runs (:func:`validate`): per (arm, context length, turn) the median TTFT, at the held-out
lengths (all lengths without ``holdout``) and ``conversations`` conversations per length (default 1,
to keep it short). Without a calibration file, one is fitted from the run itself on the lengths that
are not held out (:func:`harness.calibrate.fit.calibrate`) and written next to the simulator
run. Cells below ``min_tokens`` (1,000) are shown but not judged. The calibrated overhead holds the measured
host's client time, and the real-time simulator's client on this machine adds its own: unless
``count_client_time``, a short run first measures it (:func:`measure_client_time`) and the validation's
simulator charges the overhead less that. A note gives what is left of this machine's time in the simulated
values (:func:`harness.calibrate.predict.simulator_lateness`: the simulator's TTFT minus its time model's for
the same requests, ms).

Below the verdict, the cells beyond the threshold are read three ways, none used in the verdict: whether the
simulated value lies inside the range of the cell's measured requests (:attr:`Cell.inside_measured_range`), whether
the measured median bends away from the straight line through the run's medians at the lengths on either side
while the simulated value stays nearer to it (:func:`neighbour_line`, :meth:`Cell.bend`: a bend between two fitted
lengths, which the fitted model does not make), and whether the run's last pass still moved it by more than 5 %.

Sweeps (:func:`validate_sweep`): the same load points, warm-up and window. Both runs are aggregated
by the sweep result's own formulas (:func:`harness.results.sweep.aggregate_sweep`,
:mod:`harness.results.sweep_metrics`, :mod:`harness.results.capacity`), and per (arm, load point)
RPS/GPU, TPS/user (mean output tokens/s per user while decoding) and TTFT p90 are compared with
``max_error``; per arm the capacity within the SLO (best RPS/GPU over the points that meet it) with
``max_capacity_error``. The GPUs saved at ``cost.target_rps`` are shown, not judged (a whole number
of GPUs moves in steps). A load point with no successful request on either side is skipped. Without
a calibration file a simulator sweep is re-run with its own engine settings, and a sweep of a real
engine with the datasheet profile of its deployment (a sweep's TTFTs include queueing, so no
calibration is fitted from it). When the calibration names the sweep among its source runs, each
cell says whether its load point was in the fit or held out (``kvbench sim calibrate
--holdout-loads``), and a context line lists both.

Both kinds print the run's host link (pinned host -> GPU copy rates from its manifest,
:mod:`harness.engines.host_link`) beside the calibration's source runs'. Informational only: no
rate is scaled by it (nothing shows yet that LMCache's load follows the raw link rate).
"""

from __future__ import annotations

import hashlib
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import CalibrationError
from harness.engines.host_link import summary_text
from harness.results.aggregate import chosen_measured, medians_by_pass
from harness.results.run_result import SETTLE_WARN, last_move
from harness.results.sweep import aggregate_sweep
from harness.results.sweep_result import PointResult, SweepResult
from harness.runs.kinds import launch
from harness.scenario.spec import Scenario, parse_scenario
from harness.sim.calibration import Calibration
from harness.store.manifest import prompt_salt_of, read_manifest
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir, RunKind
from offload.profiles import resolve_profile

from .fit import calibrate as fit_calibration
from .predict import simulator_lateness
from .samples import RunFacts, run_facts

CALIBRATION_FILE = "calibration.yaml"
CARRIED_ENGINE_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gpu_memory_utilization", ("gpu_memory_utilization",)),
    ("block_tokens", ("block_tokens", "block_size")),
    ("num_gpu_blocks_override", ("num_gpu_blocks_override",)),
    ("replicas", ("replicas",)),
)
"""Simulator engine field <- the run's engine fields it is read from: they size the HBM prefix
cache and the fleet, which decide the hits of a loaded run."""


@dataclass(frozen=True)
class NeighbourLine:
    """The straight line (ms against tokens) through a run's measured medians of one arm and turn at the nearest
    reference lengths below and above a cell's length, evaluated there."""

    below: int
    above: int
    at_cell_ms: float

    def off(self, value_ms: float) -> float:
        """How far ``value_ms`` lies from the line (value / line − 1)."""
        return value_ms / self.at_cell_ms - 1.0


def neighbour_line(
    medians: dict[tuple[str, int, int], float], key: tuple[str, int, int], references: Sequence[int]
) -> NeighbourLine | None:
    """The line through ``medians`` of ``key``'s arm and turn at the nearest ``references`` below and above its
    length, linear in tokens (a turn-2 load grows with the bytes; a prefill a little faster than linearly, so a line
    through two far-apart lengths lies a few per cent above it). None when a side has no measured median."""
    arm, tokens, turn = key
    below = [n for n in references if n < tokens and (arm, n, turn) in medians]
    above = [n for n in references if n > tokens and (arm, n, turn) in medians]
    if not below or not above:
        return None
    low, high = max(below), min(above)
    m_low, m_high = medians[(arm, low, turn)], medians[(arm, high, turn)]
    at_cell = m_low + (m_high - m_low) * (tokens - low) / (high - low)
    return NeighbourLine(low, high, at_cell) if at_cell > 0 else None


@dataclass(frozen=True)
class Cell:
    """One compared quantity: ``key`` names it (the table's leading columns)."""

    key: tuple[str, ...]
    measured: float
    simulated: float
    limit: float
    note: str = ""
    judged: bool = True
    measured_range: tuple[float, float] | None = None
    """Lowest and highest of the measured requests whose median is ``measured`` (probe cells); None: one figure."""
    last_pass_move: float | None = None
    """How far the run's last pass moved ``measured`` (median after all passes ÷ after one fewer − 1); None: one
    pass."""
    line: NeighbourLine | None = None
    """The straight line through the run's measured medians at the lengths on either side (probe cells); None: no
    length on one side."""

    @property
    def error(self) -> float:
        return self.simulated / self.measured - 1.0

    @property
    def beyond(self) -> bool:
        return self.judged and abs(self.error) > self.limit

    @property
    def inside_measured_range(self) -> bool:
        """The simulated value lies between the cell's fastest and slowest measured request.

        Shown beside a cell beyond the threshold, never used in the verdict: such an error is no larger than the
        run's own repeatability (a model miss lies outside every measured request).
        """
        return self.measured_range is not None and self.measured_range[0] <= self.simulated <= self.measured_range[1]

    def bend(self) -> str | None:
        """The cell's key and both values' distance from its :attr:`line`, when the measured median lies further
        from the line than the limit and the simulated value nearer to it; else None.

        Shown beside a cell beyond the threshold, never used in the verdict: the fitted model grows smoothly between
        the lengths it was fitted on, so it misses a measurement that bends between them; a fit length nearer the bend
        would follow it, and then nothing is held out there.
        """
        if self.line is None:
            return None
        measured_off, simulated_off = self.line.off(self.measured), self.line.off(self.simulated)
        if abs(measured_off) <= self.limit or abs(simulated_off) >= abs(measured_off):
            return None
        return (
            f"{' '.join(self.key)} ({measured_off:+.1%} off the line through {self.line.below:,} and "
            f"{self.line.above:,}; simulated {simulated_off:+.1%})"
        )


@dataclass(frozen=True)
class Validation:
    run: Path
    kind: RunKind
    sim_run: Path
    calibration: Path | None
    columns: tuple[str, ...]
    """Names of each cell's ``key`` parts."""
    cells: list[Cell]
    context: list[str] = field(default_factory=list)
    """What was simulated and from what (printed above the table)."""
    skipped: list[str] = field(default_factory=list)
    """Quantities not compared, each with the reason."""
    one_sided: list[str] = field(default_factory=list)
    """Quantities present on one side only (e.g. a capacity within the SLO only the simulator has): failures."""
    notes: list[str] = field(default_factory=list)
    """Shown, not judged (e.g. GPUs saved)."""
    threshold: str = ""

    @property
    def judged(self) -> list[Cell]:
        return [c for c in self.cells if c.judged]

    @property
    def median_abs_error(self) -> float:
        return statistics.median(abs(c.error) for c in self.judged) if self.judged else float("nan")

    @property
    def worst(self) -> Cell | None:
        return max(self.judged, key=lambda c: abs(c.error), default=None)

    @property
    def passed(self) -> bool:
        return not self.one_sided and not any(c.beyond for c in self.cells)

    def beyond_lines(self) -> list[str]:
        """The cells beyond the threshold, and which of them lie inside their own measured requests' range."""
        beyond = [c for c in self.cells if c.beyond]
        if not beyond:
            return []
        lines = ["beyond: " + "; ".join(" ".join(c.key) for c in beyond)]
        inside = [" ".join(c.key) for c in beyond if c.inside_measured_range]
        if inside:
            lines.append(
                f"{len(inside)} of the {len(beyond)} cells beyond have the simulated value inside the range of their "
                "own measured requests (the run's spread there is wider than the error; not used in the verdict): "
                + "; ".join(inside)
            )
        bend_of = {c.key: c.bend() for c in beyond}
        bends = [bend for bend in bend_of.values() if bend is not None]
        if bends:
            lines.append(
                f"{len(bends)} of the {len(beyond)} cells beyond have a measured median further than the threshold "
                "from the straight line through the run's measured medians at the lengths on either side, and the "
                "simulated value nearer to it (the measurement bends between those lengths, which the model does not; "
                "not used in the verdict): " + "; ".join(bends)
            )
        unsettled = [c for c in beyond if c.last_pass_move is not None and abs(c.last_pass_move) > SETTLE_WARN]
        if unsettled:
            lines.append(
                f"{len(unsettled)} of the {len(beyond)} cells beyond had a measured median that the run's last pass "
                f"still moved by more than {SETTLE_WARN:.0%} (more passes would move it; not used in the verdict): "
                + "; ".join(f"{' '.join(c.key)} ({c.last_pass_move:+.1%})" for c in unsettled)
            )
        left = [" ".join(c.key) for c in beyond if not c.inside_measured_range and bend_of[c.key] is None]
        if len(left) < len(beyond):
            lines.append(
                "with the cells beyond that lie inside their own requests' range or bend set aside, "
                + (
                    f"{len(left)} would be left (not the verdict): " + "; ".join(left)
                    if left
                    else "none is left (not the verdict: every cell beyond still counts)"
                )
            )
        return lines


# -- the simulator run ---------------------------------------------------------------------------------


def sim_engine(
    scenario: Scenario, facts: RunFacts, calibration: Calibration | None, calibration_file: Path | None
) -> dict[str, object]:
    """The ``engine:`` section of the simulator run: the calibration's deployment (or the run's)."""
    if calibration is None and scenario.engine.kind == "sim":
        return dict(scenario.engine.model_dump(mode="json", exclude_none=True))  # the run's own simulator
    dep = calibration.deployment if calibration is not None else facts.deployment
    engine: dict[str, object] = {
        "kind": "sim",
        "model": dep.model,
        "hardware": dep.hardware,
        "parallelism": {"tp": dep.tp},
        "dtype": dep.dtype,
        **({"kv_dtype": dep.kv_dtype} if dep.kv_dtype is not None else {}),
        "max_batch_tokens": calibration.max_batch_tokens if calibration is not None else facts.max_batch_tokens,
    }
    if calibration_file is not None:
        engine["calibration"] = str(calibration_file)
    for name, sources in CARRIED_ENGINE_FIELDS:
        # engine configs differ per kind: each of these knobs is read where the kind has it
        value = next(
            (getattr(scenario.engine, s) for s in sources if getattr(scenario.engine, s, None) is not None), None
        )
        if value is not None:
            engine[name] = value
    return engine


def sim_scenario(
    scenario: Scenario,
    engine: dict[str, object],
    backends: dict[str, str | None],
    workload: dict[str, object] | None = None,
    sweep: dict[str, object] | None = None,
) -> Scenario:
    """The run's scenario on the simulator ``engine``, each arm with its real backend, ``workload`` and ``sweep``
    changes."""
    data = scenario.model_dump(mode="json")
    data["name"] = f"{scenario.name}-sim-validate"
    data["engine"] = engine
    arms = []
    for arm, raw in zip(scenario.arms, data["arms"], strict=True):
        profile = resolve_profile(arm.offload)
        backend = backends.get(arm.name)
        if profile.offload_enabled and backend is not None:
            raw["offload"] = profile.model_copy(update={"backend": backend}).model_dump(mode="json")
        arms.append(raw)
    data["arms"] = arms
    data["workload"].update(workload or {})
    if sweep:
        data["sweep"].update(sweep)
    return parse_scenario(data, "validate")


@dataclass(frozen=True)
class _Prepared:
    run_dir: RunDir
    facts: RunFacts
    scenario: Scenario
    calibration: Calibration | None
    calibration_file: Path | None


def _open(run: Path, kind: RunKind) -> RunDir:
    run_dir = RunDir.open(run)
    if run_dir.kind != kind:
        raise CalibrationError(
            f"{run}: a {run_dir.kind} run, not a {kind}; kvbench sim validate compares probe runs and sweeps"
        )
    return run_dir


def _prepare(
    run_dir: RunDir, kind: RunKind, out: Path, calibration_file: Path | None, holdout: Sequence[int] = ()
) -> _Prepared:
    """The run's facts and scenario, and the calibration read (or, for a probe run without one, fitted)."""
    run = run_dir.path
    facts = run_facts(run)
    out.mkdir(parents=True, exist_ok=True)
    calibration: Calibration | None = None
    if calibration_file is not None:
        calibration = Calibration.load(calibration_file)
    elif kind == "probe":
        calibration = fit_calibration([run], holdout)
        calibration_file = calibration.save(out / CALIBRATION_FILE)
    if calibration is not None and not calibration.deployment.agrees(facts.deployment):
        raise CalibrationError(
            f"calibration {calibration_file} is for {calibration.deployment.label}; {run} is {facts.deployment.label}"
        )
    return _Prepared(run_dir, facts, run_dir.scenario(), calibration, calibration_file)


def _simulate(
    prepared: _Prepared,
    kind: RunKind,
    out: Path,
    workload: dict[str, object] | None = None,
    client_time_s: float = 0.0,
    sweep: dict[str, object] | None = None,
) -> RunDir:
    engine = _engine(prepared)
    if client_time_s > 0:
        engine["client_time_s"] = client_time_s
    backends = {name: arm.backend for name, arm in prepared.facts.arms.items()}
    salting, _ = prompt_salt_of(read_manifest(prepared.run_dir.manifest_file))
    if salting != "per_run":  # the run sent the same prompts as every run before it: its replica must too
        workload = {**(workload or {}), "prompt_salt": "fixed"}
    scenario = sim_scenario(prepared.scenario, engine, backends, workload, sweep)
    sim_dir, _ = launch(kind, scenario, source=None, output_dir=out)
    return sim_dir


def simulate_run(
    run_dir: RunDir,
    out: Path,
    calibration_file: Path,
    workload: dict[str, object] | None = None,
    sweep: dict[str, object] | None = None,
) -> RunDir:
    """Re-run ``run_dir``'s scenario (any run kind) on the simulator under ``calibration_file``, with ``workload``
    and ``sweep`` changes, this machine's client time measured first and taken out of the calibrated overhead."""
    prepared = _prepare(run_dir, run_dir.kind, out, calibration_file)
    client_s = client_time_to_take_out(prepared, out, count_client_time=False)
    return _simulate(prepared, run_dir.kind, out, workload, client_s, sweep)


def _engine(prepared: _Prepared) -> dict[str, object]:
    file = prepared.calibration_file.resolve() if prepared.calibration_file is not None else None
    return sim_engine(prepared.scenario, prepared.facts, prepared.calibration, file)


CLIENT_TIME_TOKENS = 1000
CLIENT_TIME_CONVERSATIONS = 3
CLIENT_TIME_REQUESTS = 2 * CLIENT_TIME_CONVERSATIONS  # two turns each


def measure_client_time(prepared: _Prepared, out: Path) -> float:
    """Seconds this machine's client and HTTP stack add to a short request on the calibrated simulator.

    A short simulator run before the validation (``CLIENT_TIME_REQUESTS`` requests of ``CLIENT_TIME_TOKENS``
    tokens, no tier): the median of its TTFT over the time model's (:func:`simulator_lateness`). The
    calibration's overhead holds the measured host's share of such time; the validation's simulator charges
    the overhead less this, so the local share is not counted twice.
    """
    assert prepared.calibration is not None
    data: dict[str, object] = {
        "name": f"{prepared.scenario.name}-client-time",
        "engine": _engine(prepared),
        "arms": [{"name": "client-time", "offload": "off"}],
        "workload": {
            "kind": "multi_round_qa",
            "context_tokens": [CLIENT_TIME_TOKENS],
            "conversations": CLIENT_TIME_CONVERSATIONS,
            "turns": 2,
            "warmup_requests": 1,
        },
        "seed": prepared.scenario.seed,
    }
    run_dir, _ = launch("probe", parse_scenario(data, "validate"), source=None, output_dir=out / "client-time")
    late_ms = simulator_lateness(run_dir.path, prepared.calibration)
    return max(0.0, statistics.median(late_ms.values()) / 1e3) if late_ms else 0.0


def client_time_to_take_out(prepared: _Prepared, out: Path, count_client_time: bool) -> float:
    """Seconds of this machine's client time the validation's simulator takes out of the calibrated overhead:
    :func:`measure_client_time` with a calibration (there is no calibrated overhead without one), unless
    ``count_client_time``."""
    if count_client_time or prepared.calibration is None:
        return 0.0
    return measure_client_time(prepared, out)


def _source(prepared: _Prepared) -> str:
    if prepared.calibration_file is not None:
        return f"Calibration {prepared.calibration_file}"
    if prepared.scenario.engine.kind == "sim":
        return "No calibration: the run's own simulator settings"
    return f"No calibration: the datasheet profile of {prepared.facts.deployment.label}"


def host_link_lines(prepared: _Prepared) -> list[str]:
    """This run's host link beside the calibration's sources' (informational: no rate is scaled by it)."""
    lines = [
        "Host link (pinned host -> GPU copies, GB/s per GPU; shown, not used to scale any rate): "
        f"this run: {summary_text(prepared.facts.source.host_link)}"
    ]
    sources = prepared.calibration.sources if prepared.calibration is not None else []
    lines += [f"  calibration source {s.run_id}: {summary_text(s.host_link)}" for s in sources]
    return lines


def _fit_line(roles: dict[float, str]) -> str:
    if not roles:
        return "This sweep is not among the calibration's source runs: every load point is out of sample"
    fitted = [f"{load:g}" for load, role in roles.items() if role == "fit"]
    held = [f"{load:g}" for load, role in roles.items() if role != "fit"]
    return (
        f"The calibration was fitted on this sweep's load points {fitted or 'none'}; held out (out of sample): "
        f"{held or 'none'}"
    )


# -- probe runs ----------------------------------------------------------------------------------------


def length_roles(calibration: Calibration, run_dir: RunDir, lengths: Sequence[int]) -> dict[int, str]:
    """Per context length: ``fit`` when the calibration was fitted on this run's requests of that length,
    ``held out`` when it names the run but left the length out, ``other run`` when the run is not one of
    its sources (every cell out of sample)."""
    if not is_source(calibration, run_dir):
        return dict.fromkeys(lengths, "other run")
    fitted = set(calibration.fit_context_tokens)
    return {n: "fit" if n in fitted else "held out" for n in lengths}


def _ttfts(records: Sequence[RequestRecord]) -> dict[tuple[str, int, int], list[float]]:
    """TTFT (ms) of the successful measured requests per (arm, length, turn)."""
    cells: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for r in records:
        if r.phase == "measure" and r.ok and r.ttft_ns is not None:
            cells[(r.arm, r.context_tokens, r.turn)].append(r.ttft_ns / 1e6)
    return cells


def _medians(ttfts: dict[tuple[str, int, int], list[float]]) -> dict[tuple[str, int, int], float]:
    return {key: statistics.median(values) for key, values in ttfts.items()}


def validate(
    run: Path,
    out: Path,
    calibration_file: Path | None = None,
    holdout: Sequence[int] = (),
    conversations: int = 1,
    max_error: float = 0.15,
    min_tokens: int = 1000,
    count_client_time: bool = False,
) -> Validation:
    """Simulate probe ``run``'s scenario at the held-out lengths (all lengths without ``holdout``) and compare.

    ``count_client_time``: charge the whole calibrated overhead, this machine's client time on top (as
    the lab's older outputs did), instead of measuring it first and taking it out.
    Raises :class:`CalibrationError` when the run and the calibration cannot be compared.
    """
    run_dir = _open(run, "probe")
    scenario = run_dir.scenario()
    lengths_all = list(scenario.probe_workload.context_tokens)
    unknown = sorted(set(holdout) - set(lengths_all))
    if unknown:
        raise CalibrationError(f"--holdout {unknown}: not lengths of {run}; its lengths: {lengths_all}")
    prepared = _prepare(run_dir, "probe", out, calibration_file, holdout)
    assert prepared.calibration is not None  # a probe validation fits one when none is given
    lengths = sorted(holdout) if holdout else lengths_all
    workload: dict[str, object] = {"context_tokens": lengths, "conversations": conversations}
    client_s = client_time_to_take_out(prepared, out, count_client_time)
    sim_dir = _simulate(prepared, "probe", out, workload, client_s)
    chosen = chosen_measured(prepared.run_dir)  # a group re-run after a failure counts its completing attempt only
    measured_ttfts = _ttfts(chosen)
    by_pass = medians_by_pass(
        ((r.arm, r.context_tokens, r.turn), r.repetition, r.ttft_ns) for r in chosen if r.ok and r.ttft_ns is not None
    )
    measured = _medians(measured_ttfts)
    simulated = _medians(_ttfts(sim_dir.records()))
    fit_lengths = sorted(prepared.calibration.fit_context_tokens)
    roles = length_roles(prepared.calibration, prepared.run_dir, lengths)
    # a held-out cell is read against the lengths that were not held out; with none held out, against the others
    references = [n for n in lengths_all if n not in holdout] if holdout else lengths_all
    cells: list[Cell] = []
    skipped: list[str] = []
    for (arm, context, turn), value in sorted(simulated.items()):
        reference = measured.get((arm, context, turn))
        if reference is None or reference <= 0:
            skipped.append(f"{arm} {context} t{turn}: no successful measured request")
            continue
        judged = context >= min_tokens
        # the measured requests' own spread, so that an error can be read against the run's repeatability
        spread = measured_ttfts[(arm, context, turn)]
        low, high = min(spread), max(spread)
        note = f"{roles[context]}; measured {low:,.1f}-{high:,.1f} ({len(spread)})"
        note += "" if judged else "  (not judged)"
        move = last_move(by_pass.get((arm, context, turn), []))
        line = neighbour_line(measured, (arm, context, turn), references)
        cells.append(
            Cell((arm, str(context), str(turn)), reference, value, max_error, note, judged, (low, high), move, line)
        )
    if not cells:
        raise CalibrationError(f"{run}: no (arm, length, turn) cell of the simulator run has a measurement to compare")
    notes = lateness_lines(simulator_lateness(sim_dir.path, prepared.calibration), measured, client_s)
    if "other run" in roles.values():  # all lengths or none: the run is a source of the calibration or not
        runs = ", ".join(source.run_id for source in prepared.calibration.sources)
        fitted_on = f"fitted on other runs ({runs}), lengths {fit_lengths}: every cell is out of sample"
        validated_on = f"Validated on lengths {lengths}"
    else:
        held = [n for n in lengths if roles[n] != "fit"]
        fitted_on = f"fitted on lengths {fit_lengths}"
        validated_on = f"Validated on lengths {lengths} (held out of the fit: {held or 'none'})"
    return Validation(
        run=run,
        kind="probe",
        sim_run=sim_dir.path,
        calibration=prepared.calibration_file,
        columns=("arm", "tokens", "turn"),
        cells=cells,
        context=[
            f"{_source(prepared)}: {fitted_on}",
            f"{validated_on}, {conversations} conversation(s) per length in the simulator",
            "Cells: median TTFT in ms per (arm, length, turn)",
            *host_link_lines(prepared),
        ],
        skipped=skipped,
        notes=notes,
        threshold=f"threshold {max_error:.0%} per cell at >= {min_tokens:,} tokens",
    )


def client_time_line(client_s: float) -> str:
    """How much of this machine's client time the validation's simulator took out of the calibrated overhead."""
    return (
        f"This machine's client time, measured first ({CLIENT_TIME_REQUESTS} requests of {CLIENT_TIME_TOKENS:,} "
        f"tokens without a tier, TTFT over the time model): {client_s * 1e3:.1f} ms, taken out of the calibrated "
        "overhead, which already holds the measured host's."
    )


def lateness_lines(
    late_ms: dict[tuple[str, int, int], float], measured_ms: dict[tuple[str, int, int], float], client_s: float = 0.0
) -> list[str]:
    """What the simulating host added to the simulated cells (shown, not used in the verdict).

    ``late_ms``: per cell, the simulator's TTFT over its time model with the whole calibrated overhead, so
    what is left of this machine's time after ``client_s`` (measured first and taken out of the overhead; 0:
    none was)."""
    client_ms = client_s * 1e3
    shares = {key: value / measured_ms[key] for key, value in late_ms.items() if measured_ms.get(key, 0) > 0}
    if not shares:
        return [client_time_line(client_s)] if client_ms > 0 else []
    largest = max(shares, key=lambda key: abs(shares[key]))
    arm, context, turn = largest
    values = sorted(late_ms.values())
    spread = (
        f"median {statistics.median(values):+.1f} ms per cell, {values[0]:+.1f} to {values[-1]:+.1f}; largest against "
        f"the measured value in {arm} {context} {turn} ({shares[largest]:+.1%})"
    )
    if client_ms > 0:
        return [f"{client_time_line(client_s)} Left in the simulated values: {spread}."]
    return [
        f"This machine's own time in the simulated values (the simulator's TTFT over its time model for the same "
        f"requests: client, HTTP server, event loop): {spread}. The calibration's overhead already holds the "
        "measured host's share of it."
    ]


# -- sweeps --------------------------------------------------------------------------------------------

SWEEP_METRICS: tuple[tuple[str, str], ...] = (
    ("RPS/GPU", "requests/s per GPU, completed in the window"),
    ("TPS/user", "mean output tokens/s per user while decoding"),
    ("TTFT p90 ms", "90th percentile TTFT of the requests sent in the window"),
)


def _point_values(point: PointResult) -> dict[str, float | None]:
    """The compared quantities of one load point, as the sweep result computed them."""
    return {
        "RPS/GPU": point.rps_per_gpu,
        "TPS/user": point.tps_user_mean,
        "TTFT p90 ms": point.ttft.p90_ms if point.ttft is not None else None,
    }


def sweep_cells(
    measured: SweepResult,
    simulated: SweepResult,
    max_error: float,
    max_capacity_error: float,
    fit_roles: dict[float, str] | None = None,
) -> tuple[list[Cell], list[str], list[str], list[str]]:
    """(cells, skipped, one-sided, notes) of two sweep results of the same scenario; ``fit_roles`` notes per
    load whether the calibration was fitted on it (:func:`load_roles`)."""
    roles = fit_roles or {}
    cells: list[Cell] = []
    skipped: list[str] = []
    one_sided: list[str] = []
    for arm in measured.arms:
        for load in measured.loads:
            where = f"{arm} at load {load:g}"
            real, sim = measured.point(arm, load), simulated.point(arm, load)
            if real is None or sim is None:
                skipped.append(f"{where}: {'not measured' if real is None else 'not simulated'} (point not finished)")
                continue
            if real.ok == 0 or sim.ok == 0:
                side = "measured" if real.ok == 0 else "simulated"
                skipped.append(f"{where}: zero successful requests ({side})")
                continue
            real_values, sim_values = _point_values(real), _point_values(sim)
            for metric, _ in SWEEP_METRICS:
                a, b = real_values[metric], sim_values[metric]
                if a is None or b is None or a <= 0:
                    skipped.append(f"{where} {metric}: {'no value' if a is None or b is None else 'measured 0'}")
                    continue
                role = f" {roles[load]}" if load in roles else ""
                cells.append(Cell((arm, f"{load:g}", metric), a, b, max_error, f"n={real.ok}/{sim.ok}{role}"))
        real_cap, sim_cap = measured.capacity_of(arm), simulated.capacity_of(arm)
        a = real_cap.max_rps_per_gpu_at_slo if real_cap is not None else None
        b = sim_cap.max_rps_per_gpu_at_slo if sim_cap is not None else None
        if a is None and b is None:
            slo = measured.slo
            unset = slo.ttft_ms is None and slo.tpot_ms is None and slo.e2e_ms is None
            why = "the scenario sets no SLO" if unset else "no load point meets the SLO in either run"
            skipped.append(f"{arm} capacity within the SLO: {why}")
        elif a is None or b is None:
            one_sided.append(
                f"{arm} capacity within the SLO: measured {_num(a)}, simulated {_num(b)} RPS/GPU "
                "(no load point meets the SLO on one side)"
            )
        else:
            at = f"load {_num(real_cap.at_load if real_cap else None)}/{_num(sim_cap.at_load if sim_cap else None)}"
            real_at = real_cap.at_load if real_cap else None
            at += f" ({roles[real_at]} at the measured knee)" if real_at in roles else ""
            cells.append(Cell((arm, "SLO", "capacity RPS/GPU"), a, b, max_capacity_error, at))
    notes = [
        f"GPUs saved by {s.arm} vs {s.baseline} at {s.target_rps:g} req/s: measured {_num(s.gpus_saved)}, "
        f"simulated {_num(o.gpus_saved)} (shown, not judged)"
        for s in measured.savings
        for o in simulated.savings
        if o.arm == s.arm
    ]
    return cells, skipped, one_sided, notes


def _num(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"


def is_source(calibration: Calibration, run_dir: RunDir) -> bool:
    """Whether the calibration was fitted on this run (a source whose manifest has the same hash)."""
    if not run_dir.manifest_file.exists():
        return False
    digest = hashlib.sha256(run_dir.manifest_file.read_bytes()).hexdigest()
    return any(source.manifest_sha256 == digest for source in calibration.sources)


def load_roles(calibration: Calibration | None, run_dir: RunDir, loads: Sequence[float]) -> dict[float, str]:
    """Per load point: ``fit`` when the calibration was fitted on this sweep's point, ``held out`` when it
    names the sweep but left the load out; empty when the sweep is not one of its sources."""
    if calibration is None or not is_source(calibration, run_dir):
        return {}
    held = set(calibration.holdout_loads)
    return {load: "held out" if load in held else "fit" for load in loads}


def validate_sweep(
    run: Path,
    out: Path,
    calibration_file: Path | None = None,
    max_error: float = 0.15,
    max_capacity_error: float = 0.15,
    count_client_time: bool = False,
) -> Validation:
    """Re-run sweep ``run``'s scenario on the simulator (same load points and seed) and compare.

    With a calibration, this machine's client time is measured first and taken out of the calibrated
    overhead, as for probe runs, unless ``count_client_time``. Raises :class:`CalibrationError` when the
    run and the calibration cannot be compared.
    """
    prepared = _prepare(_open(run, "sweep"), "sweep", out, calibration_file)
    measured = aggregate_sweep(
        prepared.scenario, prepared.run_dir.run_id, prepared.run_dir.records(), prepared.run_dir.points()
    )
    if not measured.points:
        raise CalibrationError(f"{run}: no finished load point to compare (points.jsonl is empty)")
    client_s = client_time_to_take_out(prepared, out, count_client_time)
    sim_dir = _simulate(prepared, "sweep", out, client_time_s=client_s)
    simulated = aggregate_sweep(sim_dir.scenario(), sim_dir.run_id, sim_dir.records(), sim_dir.points())
    roles = load_roles(prepared.calibration, prepared.run_dir, measured.loads)
    cells, skipped, one_sided, notes = sweep_cells(measured, simulated, max_error, max_capacity_error, roles)
    if client_s > 0:
        notes = [*notes, client_time_line(client_s)]
    if not cells:
        raise CalibrationError(f"{run}: no load point with successful requests on both sides to compare")
    spec = prepared.scenario.sweep
    assert spec is not None  # a sweep run's scenario has its sweep section
    return Validation(
        run=run,
        kind="sweep",
        sim_run=sim_dir.path,
        calibration=prepared.calibration_file,
        columns=("arm", "load", "metric"),
        cells=cells,
        context=[
            _source(prepared),
            f"Load points ({spec.mode}): {[f'{v:g}' for v in spec.values]}, seed {prepared.scenario.seed}, "
            "the run's warm-up and window",
            "Cells: "
            + "; ".join(f"{name} = {what}" for name, what in SWEEP_METRICS)
            + "; capacity = best RPS/GPU within the SLO. n = successful requests measured/simulated",
            _fit_line(roles),
            *host_link_lines(prepared),
        ],
        skipped=skipped,
        one_sided=one_sided,
        notes=notes,
        threshold=f"threshold {max_error:.0%} per point metric, {max_capacity_error:.0%} per capacity",
    )


def validate_run(
    run: Path,
    out: Path,
    calibration_file: Path | None = None,
    holdout: Sequence[int] = (),
    conversations: int = 1,
    max_error: float = 0.15,
    max_capacity_error: float = 0.15,
    count_client_time: bool = False,
) -> Validation:
    """:func:`validate` or :func:`validate_sweep`, by the run directory's kind."""
    kind = RunDir.open(run).kind
    if kind == "sweep":
        if holdout:
            raise CalibrationError(f"--holdout {list(holdout)}: a sweep has no context lengths to hold out ({run})")
        return validate_sweep(run, out, calibration_file, max_error, max_capacity_error, count_client_time)
    if kind != "probe":
        raise CalibrationError(f"{run}: a {kind} run; kvbench sim validate compares probe runs and sweeps")
    return validate(run, out, calibration_file, holdout, conversations, max_error, count_client_time=count_client_time)
