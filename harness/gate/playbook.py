"""The rollout playbook: a YAML file that carries a team from baseline to case study.

Stages, in order:

1. ``baseline``   -- TTFT before caching (a ``kvbench run`` whose baseline arm has the offload layer off);
2. ``poc``        -- add caching and measure after: gate ``min_speedup`` of the baseline arm's TTFT over the
   offload arm's at the target context length and turn;
3. ``staging``    -- a stability window (``kvbench soak``) whose verdict must be PASS;
4. ``production`` -- measured gain vs the baseline: gate ``min_gain_pct`` of the baseline stage's TTFT
   over production's at the target context;
5. ``case_study`` -- the HTML case study (``kvbench report --html --playbook FILE``), newer than every run.

Runs are attached to stages (``kvbench playbook attach FILE STAGE RUN_DIR``); each gate is judged on
the stage's latest run, from its stored result files only. ``kvbench playbook status FILE`` shows
every stage's state and the next step.

Every stage carries the provenance of its run (measured or simulated, from the run's manifest:
:func:`harness.results.provenance.provenance`). Baseline and POC may be planned on the simulator (they show
SIMULATED); staging and production decide a rollout, so their gates close only on measured evidence of the
kind they need: staging a soak on a real engine, production a run attached to an endpoint kvbench did not
start (the production service). Simulated or started-engine evidence there leaves the gate pending, with why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError

from common.errors import KvbenchError, RunDirError
from common.packed import stored_file
from common.schema import StrictModel
from common.yamlfile import read_yaml_mapping
from harness.results.provenance import measured_on_attached_endpoint, provenance
from harness.results.run_result import Frozen, RunResult
from harness.scenario.spec import Duration, format_validation_error
from harness.store.manifest import read_manifest
from harness.store.rundir import RunDir, RunKind

PLAYBOOK_SCHEMA_VERSION = 1

StageName = Literal["baseline", "poc", "staging", "production", "case_study"]
STAGES: tuple[StageName, ...] = ("baseline", "poc", "staging", "production", "case_study")
STAGE_TITLES: dict[StageName, str] = {
    "baseline": "Baseline (TTFT before caching)",
    "poc": "POC (caching on, measured after)",
    "staging": "Staging stability window",
    "production": "Production rollout",
    "case_study": "Case study",
}
State = Literal["done", "failed", "pending"]


class PlaybookError(KvbenchError):
    """A playbook file is missing, invalid, or names a run of the wrong kind."""


# --------------------------------------------------------------------------------------------
# The file
# --------------------------------------------------------------------------------------------


class Target(StrictModel):
    """Where gains are measured: one context length and turn of the t1/t2 table."""

    context_tokens: int | None = Field(
        default=None, ge=16, description="Context length of the gates (default: the longest one measured)."
    )
    turn: int = Field(default=2, ge=1, description="Turn of the gates (2 = the returning user).")


class BaselineGate(StrictModel):
    max_error_rate: float = Field(default=0.01, ge=0, le=1, description="The baseline run must be clean.")


class PocGate(StrictModel):
    min_speedup: float = Field(default=2.0, gt=0, description="Baseline-arm TTFT / offload-arm TTFT at the target.")
    arm: str | None = Field(default=None, description="The offload arm (default: the first non-baseline arm).")


class StagingGate(StrictModel):
    min_window: Duration | None = Field(default=None, description="The soak window must be at least this long.")


class ProductionGate(StrictModel):
    min_gain_pct: float = Field(
        default=20.0, description="(baseline TTFT / production TTFT − 1) × 100 at the target must reach it."
    )
    arm: str | None = Field(default=None, description="The production run's arm (default: its offload arm).")


class CaseStudyGate(StrictModel):
    report: str = Field(default="case-study.html", description="The HTML case study, relative to the playbook.")


class _Stage(StrictModel):
    scenario: str | None = Field(default=None, description="Scenario file or bundled name this stage runs.")
    runs: list[str] = Field(default_factory=list, description="Run directories, relative to the playbook file.")
    notes: str = ""


class BaselineStage(_Stage):
    gate: BaselineGate = BaselineGate()


class PocStage(_Stage):
    gate: PocGate = PocGate()


class StagingStage(_Stage):
    gate: StagingGate = StagingGate()


class ProductionStage(_Stage):
    gate: ProductionGate = ProductionGate()


class CaseStudyStage(_Stage):
    gate: CaseStudyGate = CaseStudyGate()


class Stages(StrictModel):
    baseline: BaselineStage = BaselineStage()
    poc: PocStage = PocStage()
    staging: StagingStage = StagingStage()
    production: ProductionStage = ProductionStage()
    case_study: CaseStudyStage = CaseStudyStage()

    def stage(self, name: StageName) -> _Stage:
        stage: _Stage = getattr(self, name)
        return stage


class Playbook(StrictModel):
    schema_version: Literal[1] = 1
    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    target: Target = Target()
    stages: Stages = Stages()


def load_playbook(path: Path) -> Playbook:
    """Read and validate a playbook file."""
    data = read_yaml_mapping(path, PlaybookError)
    try:
        return Playbook.model_validate(data)
    except ValidationError as error:
        raise PlaybookError(format_validation_error(str(path), error, Playbook, "playbook")) from None


def save_playbook(playbook: Playbook, path: Path) -> None:
    data = playbook.model_dump(mode="json", exclude_defaults=False)
    header = (
        "# kvbench rollout playbook: `kvbench playbook status` shows where you stand and what is next.\n"
        "# Stages: baseline -> poc -> staging -> production -> case_study. See docs/playbook.md.\n"
    )
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
    tmp.replace(path)


def starter_playbook(name: str, *, simulator: bool = True) -> Playbook:
    """A new playbook; with ``simulator`` its stages name the bundled simulator scenarios."""
    if not simulator:
        return Playbook(name=name)
    return Playbook(
        name=name,
        description="Walk-through on the built-in simulator (Llama-3.1-8B on 1x H100).",
        target=Target(context_tokens=8000, turn=2),
        stages=Stages(
            baseline=BaselineStage(scenario="playbook-sim"),
            poc=PocStage(scenario="playbook-sim", gate=PocGate(min_speedup=2.0)),
            staging=StagingStage(scenario="soak-sim"),
            production=ProductionStage(scenario="playbook-sim", gate=ProductionGate(min_gain_pct=50.0)),
        ),
    )


def attach_run(path: Path, stage: str, run_dir: Path) -> Playbook:
    """Attach a run directory to a stage (checked to be the right kind of run) and save the file."""
    if stage not in STAGES:
        raise PlaybookError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    playbook = load_playbook(path)
    if not run_dir.is_dir():
        raise PlaybookError(f"{run_dir}: not a directory")
    kind = run_kind(run_dir)
    wanted = {"staging": "soak", "case_study": None}.get(stage, "probe")
    if wanted is None:
        raise PlaybookError("the case_study stage takes no runs: render it with `kvbench report --html --playbook`")
    if kind != wanted and not (stage in ("poc", "production") and kind == "sweep"):
        raise PlaybookError(f"{run_dir}: a {kind} directory cannot be attached to stage {stage} (it needs a {wanted})")
    base = path.resolve().parent
    resolved = run_dir.resolve()
    try:
        ref = str(resolved.relative_to(base))
    except ValueError:
        ref = str(resolved)
    stage_model = playbook.stages.stage(stage)
    runs = [r for r in stage_model.runs if r != ref] + [ref]
    updated_stage = stage_model.model_copy(update={"runs": runs})
    updated = playbook.model_copy(update={"stages": playbook.stages.model_copy(update={stage: updated_stage})})
    save_playbook(updated, path)
    return updated


def run_kind(path: Path) -> RunKind | Literal["unknown"]:
    """What a result directory holds: a probe, sweep, soak or replay (the run directory's own word), or nothing."""
    if not (path / "scenario.yaml").exists():
        return "unknown"
    return RunDir(path).kind


# --------------------------------------------------------------------------------------------
# Status
# --------------------------------------------------------------------------------------------


Provenance = Literal["measured", "simulated", "unknown", "none"]


class StageStatus(Frozen):
    stage: StageName
    title: str
    state: State
    gate: str
    evidence: str
    runs: list[str]
    next_step: str
    provenance: Provenance = Field(
        description="Of the stage's latest run: measured on a real engine, simulated, unknown, or none attached."
    )
    provenance_label: str = Field(description="The run's provenance in words (engine, version, hardware).")


class PlaybookStatus(Frozen):
    name: str
    path: str
    stages: list[StageStatus]
    current: StageName | None = Field(description="The first stage that is not done (None: all done).")
    next_step: str

    def stage(self, name: StageName) -> StageStatus:
        return next(s for s in self.stages if s.stage == name)


def _resolve(base: Path, ref: str) -> Path:
    path = Path(ref)
    return path if path.is_absolute() else base / path


def _target_context(playbook: Playbook, result: RunResult) -> int:
    if playbook.target.context_tokens is not None:
        return playbook.target.context_tokens
    return max(result.context_tokens)


def _treatment_arm(result: RunResult, wanted: str | None) -> str | None:
    if wanted is not None:
        return wanted if wanted in result.arms else None
    others = [arm for arm in result.arms if arm != result.baseline_arm]
    return others[0] if others else (result.arms[0] if result.arms else None)


def _median(result: RunResult, arm: str, context: int, turn: int) -> float | None:
    cell = result.cell(arm, context, turn)
    return cell.ttft.median_ms if cell and cell.ttft else None


def _read_probe(path: Path) -> RunResult:
    if not path.is_dir():
        raise RunDirError(f"{path}: the attached run directory is missing")
    return RunResult.read_file(path / "summary.json")


def _cmd(text: str) -> str:
    return f"`{text}`"


class _Judge:
    def __init__(self, playbook: Playbook, path: Path) -> None:
        self.playbook = playbook
        self.path = path
        self.base = path.resolve().parent

    def scenario_ref(self, stage: StageName, fallback: str) -> str:
        return self.playbook.stages.stage(stage).scenario or fallback

    def attach_hint(self, stage: StageName, what: str) -> str:
        return _cmd(f"kvbench playbook attach {self.path} {stage} {what}")

    def latest(self, stage: StageName) -> Path | None:
        runs = self.playbook.stages.stage(stage).runs
        return _resolve(self.base, runs[-1]) if runs else None

    def baseline(self) -> StageStatus:
        gate = self.playbook.stages.baseline.gate
        text = f"complete run, error rate ≤ {gate.max_error_rate:.1%}, baseline arm measured at the target"
        run = self.latest("baseline")
        if run is None:
            return self._unmeasured("baseline", text, "measure TTFT before caching: ", "kvbench run {scenario}")
        result = self._probe("baseline", text, run, "re-run the baseline or attach another run")
        if isinstance(result, StageStatus):
            return result
        context = _target_context(self.playbook, result)
        turn = self.playbook.target.turn
        median = _median(result, result.baseline_arm, context, turn)
        counts = result.requests
        rate = counts.errors / counts.measured if counts.measured else 1.0
        evidence = (
            f"{result.baseline_arm} t{turn} at {context} tokens: "
            + (f"{median:.1f} ms median" if median is not None else "not measured")
            + f"; error rate {rate:.1%}; {'complete' if result.complete else 'INCOMPLETE'}"
        )
        if median is None or not result.complete or rate > gate.max_error_rate:
            return self._failed(
                "baseline", text, evidence,
                f"fix the run (resume it with {_cmd(f'kvbench run --resume {run}')}) or attach a clean one",
            )  # fmt: skip
        return self._done("baseline", text, evidence)

    def poc(self) -> StageStatus:
        gate = self.playbook.stages.poc.gate
        text = f"speedup ≥ {gate.min_speedup:g}× (baseline arm / offload arm TTFT) at the target"
        run = self.latest("poc")
        if run is None:
            how = "add caching and measure after: "
            return self._unmeasured("poc", text, how, "kvbench run {scenario}", " (offload OFF and ON arms)")
        result = self._probe("poc", text, run, "re-run the POC or attach another run")
        if isinstance(result, StageStatus):
            return result
        context = _target_context(self.playbook, result)
        turn = self.playbook.target.turn
        arm = _treatment_arm(result, gate.arm)
        base = _median(result, result.baseline_arm, context, turn)
        treated = _median(result, arm, context, turn) if arm else None
        if arm is None or arm == result.baseline_arm or base is None or treated is None or treated <= 0:
            return self._failed(
                "poc", text,
                f"no {arm or 'offload arm'} vs {result.baseline_arm} t{turn} TTFT at {context} tokens in {run}",
                "run a scenario with a baseline arm and an offload arm that includes the target context",
            )  # fmt: skip
        speedup = base / treated
        evidence = (
            f"{result.baseline_arm} {base:.1f} ms / {arm} {treated:.1f} ms = {speedup:.2f}× at {context} tokens t{turn}"
        )
        if speedup < gate.min_speedup:
            return self._failed("poc", text, evidence, "tune the offload profile (tiers, bandwidth) and re-run the POC")
        return self._done("poc", text, evidence)

    def staging(self) -> StageStatus:
        from harness.results.soak_result import SoakResult

        gate = self.playbook.stages.staging.gate
        text = "soak verdict PASS" + (f" over ≥ {gate.min_window:g} s" if gate.min_window else "")
        run = self.latest("staging")
        if run is None:
            how = "run the stability window against staging: "
            return self._unmeasured("staging", text, how, "kvbench soak {scenario} --window 4h", attach="SOAK_DIR")
        try:
            soak = SoakResult.read_file(run / "soak.json")
        except RunDirError as error:
            return self._failed(
                "staging", text, str(error), f"rebuild it with {_cmd(f'kvbench report --rewrite {run}')}"
            )
        evidence = (
            f"verdict {soak.verdict.verdict} over {soak.completed_intervals}/{soak.planned_intervals} intervals "
            f"of {soak.interval_s:g} s"
        )
        if soak.verdict.reasons:
            evidence += ": " + "; ".join(soak.verdict.reasons)
        if soak.verdict.verdict == "INCOMPLETE":
            resume = _cmd(f"kvbench soak --resume {run}")
            return self._pending("staging", text, f"finish the window: {resume}", evidence)
        if soak.verdict.verdict != "PASS":
            return self._failed("staging", text, evidence, "fix what broke the criteria and run a new window")
        if gate.min_window is not None and soak.window_s < gate.min_window:
            return self._failed(
                "staging",
                text,
                evidence + f"; window {soak.window_s:g} s < {gate.min_window:g} s",
                f"run a window of at least {gate.min_window:g} s",
            )
        if self.run_provenance(run)[0] != "measured":
            return self._pending(
                "staging",
                text,
                "the window ran on the simulator: a rollout needs it measured against the staging engine "
                f"({_cmd('engine: {kind: vllm, ...}')} or {_cmd('{kind: openai, base_url: ...}')}), then attach it",
                f"SIMULATED, not evidence for a rollout: {evidence}",
            )
        return self._done("staging", text, evidence)

    def production(self, baseline: StageStatus) -> StageStatus:
        gate = self.playbook.stages.production.gate
        text = f"gain ≥ {gate.min_gain_pct:g}% vs the baseline stage at the target"
        run = self.latest("production")
        if run is None:
            how = "roll out, then measure production: "
            return self._unmeasured(
                "production", text, how, "kvbench run {scenario}", " against the production endpoint"
            )
        base_run = self.latest("baseline")
        if base_run is None or baseline.state != "done":
            return self._pending("production", text, "finish the baseline stage first: the gain is measured against it")
        try:
            result = _read_probe(run)
            base_result = _read_probe(base_run)
        except RunDirError as error:
            return self._failed("production", text, str(error), "re-run production or attach another run")
        context = _target_context(self.playbook, base_result)
        turn = self.playbook.target.turn
        arm = _treatment_arm(result, gate.arm)
        base = _median(base_result, base_result.baseline_arm, context, turn)
        prod = _median(result, arm, context, turn) if arm else None
        if base is None or prod is None or prod <= 0:
            return self._failed(
                "production", text, f"no {arm or 'arm'} t{turn} TTFT at {context} tokens in {run}",
                "measure production at the target context length",
            )  # fmt: skip
        gain = (base / prod - 1.0) * 100.0
        evidence = (
            f"baseline {base:.1f} ms → production ({arm}) {prod:.1f} ms: {gain:+.1f}% at {context} tokens t{turn}"
        )
        kind, _ = self.run_provenance(run)
        # a run that is not production's own measurement is no evidence either way: it can neither close nor fail
        if kind != "measured" or self._started_by_kvbench(run):
            what = "SIMULATED" if kind == "simulated" else "an engine kvbench started, not the production service"
            return self._pending(
                "production",
                text,
                f"measure the production endpoint itself ({_cmd('engine: {kind: openai, base_url: ...}')}), then "
                f"{self.attach_hint('production', 'RUN_DIR')}",
                f"{what}: {evidence}",
            )
        if gain < gate.min_gain_pct:
            return self._failed("production", text, evidence, "investigate the gap between POC and production")
        return self._done("production", text, evidence)

    def run_provenance(self, run: Path) -> tuple[Provenance, str]:
        """(kind, label) of a run directory's figures, from its manifest."""
        try:
            found = provenance(read_manifest(run / "manifest.json"))
        except (OSError, KvbenchError):
            return "unknown", "provenance unknown (no readable manifest)"
        kind: Provenance = found.origin if found.origin in ("measured", "simulated") else "unknown"
        return kind, found.label

    def _started_by_kvbench(self, run: Path) -> bool:
        try:
            return not measured_on_attached_endpoint(read_manifest(run / "manifest.json"))
        except (OSError, KvbenchError):
            return True

    def case_study(self) -> StageStatus:
        gate = self.playbook.stages.case_study.gate
        report = _resolve(self.base, gate.report)
        text = f"{gate.report} rendered after the latest run"
        command = _cmd(f"kvbench report --html --playbook {self.path} --out {report}")
        if not report.exists():
            return self._pending("case_study", text, f"render the case study: {command}", "not rendered yet")
        newest = 0.0
        for stage in STAGES[:-1]:
            for ref in self.playbook.stages.stage(stage).runs:
                run = _resolve(self.base, ref)
                for name in ("summary.json", "soak.json", "sweep.json"):
                    if (found := stored_file(run / name)) is not None:
                        newest = max(newest, found.stat().st_mtime)
        if report.stat().st_mtime < newest:
            return self._pending(
                "case_study", text, f"the report is older than a run: re-render it with {command}", f"{report} is stale"
            )
        return self._done("case_study", text, f"{report}")

    def _status(self, stage: StageName, state: State, gate: str, evidence: str, next_step: str) -> StageStatus:
        run = self.latest(stage) if stage != "case_study" else None
        kind, label = self.run_provenance(run) if run is not None else ("none", "no run attached")
        if stage == "case_study":
            kind, label = "none", "rendered from the runs of the other stages"
        return StageStatus(
            stage=stage,
            title=STAGE_TITLES[stage],
            state=state,
            gate=gate,
            evidence=evidence,
            runs=list(self.playbook.stages.stage(stage).runs),
            next_step=next_step,
            provenance=kind,
            provenance_label=label,
        )

    def _pending(self, stage: StageName, gate: str, next_step: str, evidence: str = "no run attached") -> StageStatus:
        return self._status(stage, "pending", gate, evidence, next_step)

    def _unmeasured(
        self, stage: StageName, gate: str, how: str, command: str, after: str = "", attach: str = "RUN_DIR"
    ) -> StageStatus:
        """A stage with no run attached: ``how`` + the ``command`` that measures it (``{scenario}``: the stage's
        scenario) + ``after``, then how to attach it."""
        measure = _cmd(command.format(scenario=self.scenario_ref(stage, "SCENARIO")))
        return self._pending(stage, gate, f"{how}{measure}{after}, then {self.attach_hint(stage, attach)}")

    def _probe(self, stage: StageName, gate: str, run: Path, retry: str) -> RunResult | StageStatus:
        """The probe result attached to ``stage``, or the stage failed with why it cannot be read and ``retry``."""
        try:
            return _read_probe(run)
        except RunDirError as error:
            return self._failed(stage, gate, str(error), retry)

    def _failed(self, stage: StageName, gate: str, evidence: str, next_step: str) -> StageStatus:
        return self._status(stage, "failed", gate, evidence, next_step)

    def _done(self, stage: StageName, gate: str, evidence: str) -> StageStatus:
        return self._status(stage, "done", gate, evidence, "")


def playbook_status(path: Path, playbook: Playbook | None = None) -> PlaybookStatus:
    """Judge every stage's gate on its latest attached run; the first stage not done is current."""
    playbook = playbook or load_playbook(path)
    judge = _Judge(playbook, path)
    baseline = judge.baseline()
    stages = [baseline, judge.poc(), judge.staging(), judge.production(baseline), judge.case_study()]
    current = next((s for s in stages if s.state != "done"), None)
    if current is None:
        next_step = "all stages are done: publish the case study"
    elif current.state == "failed":
        next_step = f"{current.title}: gate failed ({current.evidence}); {current.next_step}"
    else:
        next_step = f"{current.title}: {current.next_step}"
    return PlaybookStatus(
        name=playbook.name,
        path=str(path),
        stages=stages,
        current=None if current is None else current.stage,
        next_step=next_step,
    )
