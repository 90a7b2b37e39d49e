"""The HTML case study: one self-contained file, built only from stored result files.

``kvbench report --html RUN_DIR...`` (or ``--format html``, or ``--playbook FILE``) writes it through the
output registry (:func:`reports.outputs.report_html`, kind ``case-study``): it reads run directories
(``summary.json``, ``manifest.json``, ``scenario.yaml``), soak directories (``soak.json``,
``intervals.jsonl``) and sweep directories, and renders ``reports/templates/case_study.html.j2`` with
Jinja2 (autoescape on).

The page needs no network: CSS is inline, charts are matplotlib's inline SVG in the shared style
(:mod:`reports.charts`, :mod:`reports.figures`), a Content-Security-Policy forbids scripts and
remote loads, and the raw-data appendix links to the stored files by relative path. Every string
that came from a scenario, an engine or a model is escaped (by Jinja2, or in a chart by matplotlib's
SVG writer and :func:`reports.figures.inline_svg`); command lines are redacted again before they
are shown.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from common import __version__
from common.errors import KvbenchError, RunDirError
from common.redact import redact_text
from harness.gate.playbook import PlaybookStatus, load_playbook, playbook_status, run_kind
from harness.results.calibrated import CalibratedTtft
from harness.results.pd_breakdown import PdBreakdownResult
from harness.results.provenance import Provenance, provenance
from harness.results.run_result import RunResult
from harness.results.soak_result import SoakResult
from harness.results.sweep_result import PointResult
from harness.scenario.spec import Scenario
from harness.store.events import IntervalStats
from harness.store.jsonl import stored_file
from harness.store.manifest import read_manifest
from harness.store.rundir import RunDir
from offload import analytical
from offload.profiles import OffloadProfile
from workloads.config import MultiRoundQAProbe

from . import pd
from .charts import PALETTE, BarSeries, Chart, Highlight, Limit, LineSeries, bar_chart, figure_chart, line_chart
from .decision import (
    COARSE_CONTEXTS,
    COARSE_LOADS,
    DecisionInputs,
    Evidence,
    Saving,
    decide,
    fmt_times,
    fmt_tokens,
    gpus,
    speedup_ranges,
)
from .decode_tax import decode_tax_lines, decode_tax_rows
from .figures import color

TEMPLATES = Path(__file__).resolve().parent / "templates"
HTML_FILE = "case-study.html"
RAW_FILES = (
    "scenario.yaml",
    "manifest.json",
    "summary.json",
    "records.jsonl",
    "progress.jsonl",
    "engine_metrics.jsonl",
    "intervals.jsonl",
    "soak.json",
    "sweep.json",
    "report/ttft_table.md",
    "report/ttft.csv",
    "report/engine_timing.csv",
    "report/lmcache_timeline.csv",
    "report/lmcache_ranks.csv",
    "report/pass_medians.csv",
)


class HtmlReportError(KvbenchError):
    """The inputs of an HTML report are missing or of an unknown kind."""


# --------------------------------------------------------------------------------------------
# Sources (stored files only)
# --------------------------------------------------------------------------------------------


class _Measured:
    """What a stored run says about where its figures came from (its manifest's provenance)."""

    manifest: dict[str, Any]

    @property
    def provenance(self) -> Provenance:
        return provenance(self.manifest)

    @property
    def origin(self) -> str:
        return self.provenance.label


@dataclass(frozen=True)
class ProbeSource(_Measured):
    path: Path
    result: RunResult
    manifest: dict[str, Any]
    scenario: Scenario | None


@dataclass(frozen=True)
class SoakSource(_Measured):
    path: Path
    result: SoakResult
    intervals: list[IntervalStats]
    manifest: dict[str, Any]
    scenario: Scenario | None


@dataclass
class ReportSources:
    title: str
    baseline: ProbeSource | None = None
    poc: ProbeSource | None = None
    production: ProbeSource | None = None
    soak: SoakSource | None = None
    sweeps: list[Path] = field(default_factory=list)
    agentic: list[Path] = field(default_factory=list)
    playbook: PlaybookStatus | None = None
    target_context: int | None = None
    target_turn: int = 2

    @property
    def all_dirs(self) -> list[tuple[str, Path]]:
        out: list[tuple[str, Path]] = []
        for label, source in (("baseline", self.baseline), ("POC", self.poc), ("production", self.production)):
            if source is not None and all(source.path != p for _, p in out):
                out.append((label, source.path))
        if self.soak is not None:
            out.append(("stability window", self.soak.path))
        out.extend(("sweep", path) for path in self.sweeps)
        out.extend(("agentic sweep", path) for path in self.agentic)
        return out


def _scenario_of(path: Path) -> Scenario | None:
    try:
        return RunDir.open(path).scenario()
    except KvbenchError:
        return None


def load_probe(path: Path) -> ProbeSource:
    if not path.is_dir():
        raise HtmlReportError(f"{path}: not a directory")
    result = RunResult.read_file(path / "summary.json")
    return ProbeSource(path, result, read_manifest(path / "manifest.json"), _scenario_of(path))


def load_soak(path: Path) -> SoakSource:
    result = SoakResult.read_file(path / "soak.json")
    intervals = RunDir(path).intervals()
    return SoakSource(path, result, intervals, read_manifest(path / "manifest.json"), _scenario_of(path))


def collect_sources(paths: Sequence[Path], playbook_path: Path | None = None) -> ReportSources:
    """Classify the given result directories (and a playbook's attached runs) into report sources."""
    sources = ReportSources(title="")
    probes: list[ProbeSource] = []
    if playbook_path is not None:
        playbook = load_playbook(playbook_path)
        base = playbook_path.resolve().parent
        sources.playbook = playbook_status(playbook_path, playbook)
        sources.title = playbook.name
        sources.target_context = playbook.target.context_tokens
        sources.target_turn = playbook.target.turn

        def latest(refs: list[str]) -> Path | None:
            return (base / refs[-1]) if refs else None

        stages = playbook.stages
        for attr, refs in (
            ("baseline", stages.baseline.runs),
            ("poc", stages.poc.runs),
            ("production", stages.production.runs),
        ):
            probe_refs = [r for r in refs if run_kind(base / r) == "probe"]
            sources.sweeps += [base / r for r in refs if run_kind(base / r) == "sweep"]
            path = latest(probe_refs)
            if path is not None:
                setattr(sources, attr, load_probe(path))
        soak_path = latest(stages.staging.runs)
        if soak_path is not None:
            sources.soak = load_soak(soak_path)
    for path in paths:
        kind = run_kind(path)
        if kind == "probe":
            probes.append(load_probe(path))
        elif kind == "soak":
            sources.soak = load_soak(path)
        elif kind == "sweep":
            sources.sweeps.append(path)
        elif kind == "agentic":
            sources.agentic.append(path)
        elif kind == "replay":
            raise HtmlReportError(
                f"{path}: a {kind} run has no HTML card yet; its reports are in {path / 'report'} "
                "(kvbench report RUN_DIR)"
            )
        else:
            raise HtmlReportError(
                f"{path}: not a kvbench result directory (expected summary.json, soak.json or sweep.json)"
            )
    for probe in probes:
        if sources.poc is None and len(probe.result.arms) > 1:
            sources.poc = probe
        elif sources.baseline is None:
            sources.baseline = probe
        elif sources.production is None:
            sources.production = probe
    if sources.poc is None and sources.baseline is not None and len(sources.baseline.result.arms) > 1:
        sources.poc = sources.baseline
    if not sources.title:
        named = sources.poc or sources.baseline or sources.production
        if named is not None:
            sources.title = named.result.scenario_name
        elif sources.soak is not None:
            sources.title = sources.soak.result.scenario_name
        else:
            sources.title = "kvbench case study"
    if not (sources.poc or sources.baseline or sources.production or sources.soak or sources.sweeps or sources.agentic):
        raise HtmlReportError(
            "nothing to report: give run, soak, sweep or agentic sweep directories, or a playbook with runs"
        )
    return sources


# --------------------------------------------------------------------------------------------
# Formatting helpers (used as Jinja2 filters)
# --------------------------------------------------------------------------------------------


def fmt_ms(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    if value >= 1000:
        return f"{value:,.0f} ms"
    return f"{value:.1f} ms" if value >= 10 else f"{value:.2f} ms"


def fmt_pct(value: float | None, digits: int = 1) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value * 100:.{digits}f}%"


def fmt_x(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:.2f}×"


def fmt_num(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:.{digits}g}"


def fmt_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


# --------------------------------------------------------------------------------------------
# View model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Headline:
    label: str
    value: str
    detail: str
    tone: str = "neutral"  # good | bad | neutral
    origin: str = ""
    """Provenance of the figure: measured on what, or simulated (shown on the card)."""
    simulated: bool = False


@dataclass(frozen=True)
class TableView:
    columns: list[str]
    rows: list[list[str]]
    numeric: list[bool]
    caption: str = ""


@dataclass(frozen=True)
class RawFile:
    label: str
    href: str
    name: str
    size: str
    sha256: str


def _median(result: RunResult, arm: str, context: int, turn: int) -> float | None:
    cell = result.cell(arm, context, turn)
    return cell.ttft.median_ms if cell and cell.ttft else None


def _treatment(result: RunResult) -> str | None:
    others = [arm for arm in result.arms if arm != result.baseline_arm]
    return others[0] if others else None


def _target_context(sources: ReportSources, result: RunResult) -> int:
    if sources.target_context is not None and sources.target_context in result.context_tokens:
        return sources.target_context
    return max(result.context_tokens)


def setup_differences(sources: ReportSources) -> list[str]:
    """One line per source when the combined runs differ in model, dtype, hardware or engine; else none."""
    origins: list[tuple[str, Provenance]] = []
    for label, source in (("baseline", sources.baseline), ("POC", sources.poc), ("production", sources.production)):
        if source is not None:
            origins.append((label, source.provenance))
    if sources.soak is not None:
        origins.append(("stability window", sources.soak.provenance))
    for path in sources.sweeps:
        manifest = path / "manifest.json"
        if manifest.exists():
            origins.append((f"sweep {path.name}", provenance(read_manifest(manifest))))
    if len({origin.setup for _, origin in origins}) <= 1:
        return []
    return [f"{label}: {origin.label}" for label, origin in origins]


def speedups(result: RunResult, arm: str, turn: int) -> tuple[tuple[int, float], ...]:
    """(context tokens, baseline / arm median TTFT at ``turn``) for every length with both medians."""
    out = []
    for context in result.context_tokens:
        base = _median(result, result.baseline_arm, context, turn)
        treated = _median(result, arm, context, turn)
        if base is not None and treated is not None and treated > 0:
            out.append((context, base / treated))
    return tuple(out)


def decision_inputs(sources: ReportSources) -> DecisionInputs:
    """The facts the decision card is derived from, read from the stored files."""
    from harness.results.sweep_result import SweepResult

    poc = sources.poc
    turn = sources.target_turn
    arm = _treatment(poc.result) if poc is not None else None
    coarse: list[str] = []
    poc_evidence = None
    if poc is not None:
        validity = poc.result.validity
        poc_evidence = Evidence("POC", validity.verdict if validity else "", poc.provenance.origin, poc.origin)
        if len(poc.result.context_tokens) < COARSE_CONTEXTS:
            coarse.append(
                f"the POC measured {len(poc.result.context_tokens)} context length(s): too few to say where the "
                "speed-up starts"
            )
    soak_evidence = None
    if sources.soak is not None:
        soak = sources.soak
        soak_evidence = Evidence("stability window", soak.result.verdict.verdict, soak.provenance.origin, soak.origin)
    sweeps: list[Evidence] = []
    savings: list[Saving] = []
    for path in sources.sweeps:
        result = SweepResult.read_file(path / "sweep.json")
        origin = provenance(read_manifest(path / "manifest.json"))
        sweeps.append(Evidence(f"capacity sweep {path.name}", "", origin.origin, origin.label))
        savings += [
            Saving(s.arm, s.baseline, s.gpus_saved, s.target_rps, origin.origin)
            for s in result.savings
            if s.gpus_saved is not None
        ]
        loads = min((len(result.arm_points(a)) for a in result.arms), default=0)
        if loads < COARSE_LOADS:
            coarse.append(f"sweep {path.name} has {loads} load point(s) per arm: GPUs saved are read at grid points")
    for path in sources.agentic:
        origin = provenance(read_manifest(path / "manifest.json"))
        sweeps.append(Evidence(f"agentic sweep {path.name}", "", origin.origin, origin.label))
    failed = tuple(s.stage for s in sources.playbook.stages if s.state == "failed") if sources.playbook else ()
    return DecisionInputs(
        arm=arm,
        baseline=poc.result.baseline_arm if poc is not None else None,
        turn=turn,
        speedups=speedups(poc.result, arm, turn) if poc is not None and arm is not None else (),
        poc=poc_evidence,
        soak=soak_evidence,
        sweeps=tuple(sweeps),
        savings=tuple(savings),
        failed_stages=failed,
        coarse=tuple(coarse),
    )


def executive_summary(sources: ReportSources) -> list[Headline]:
    cards: list[Headline] = []
    poc = sources.poc
    turn = sources.target_turn
    if poc is not None:
        result = poc.result
        arm = _treatment(result)
        context = _target_context(sources, result)
        base = _median(result, result.baseline_arm, context, turn)
        treated = _median(result, arm, context, turn) if arm else None
        matter, rest = speedup_ranges(speedups(result, arm, turn)) if arm else (None, None)
        shown = matter or rest
        if base is not None and treated is not None and treated > 0 and shown is not None:
            speedup = base / treated
            # the range over the lengths that matter leads; one cell (the target length) with its % diff follows
            value = (
                f"{fmt_times(shown.low)}–{fmt_times(shown.high)}× faster"
                if shown.low != shown.high
                else (f"{fmt_times(shown.low)}× faster")
            )
            where = f"{fmt_tokens(shown.first_context)}–{fmt_tokens(shown.last_context)}"
            detail = (
                f"at {where} tokens ({arm} vs {result.baseline_arm}); at {context:,}: {fmt_ms(base)} → "
                f"{fmt_ms(treated)}, {fmt_x(speedup)} faster (% diff {(speedup - 1) * 100:+.1f}%)"
            )
            if matter is not None and rest is not None:
                detail += f"; shorter lengths: {rest.text()}"
            cards.append(
                Headline(
                    f"Turn-{turn} TTFT at the lengths that matter",
                    value,
                    detail,
                    "good" if shown.high > 1 else "bad",
                    poc.origin,
                    poc.provenance.origin == "simulated",
                )
            )
    if sources.production is not None and sources.baseline is not None:
        prod = sources.production.result
        base_result = sources.baseline.result
        context = _target_context(sources, base_result)
        arm = _treatment(prod) or prod.arms[0]
        base = _median(base_result, base_result.baseline_arm, context, turn)
        measured = _median(prod, arm, context, turn)
        if base is not None and measured is not None and measured > 0:
            gain = (base / measured - 1) * 100
            cards.append(
                Headline(
                    "Production gain vs baseline",
                    f"{gain:+.1f}%",
                    f"TTFT {fmt_ms(base)} → {fmt_ms(measured)} at {context:,} tokens, turn {turn}",
                    "good" if gain > 0 else "bad",
                    f"production: {sources.production.origin}; baseline: {sources.baseline.origin}",
                    "simulated" in (sources.production.provenance.origin, sources.baseline.provenance.origin),
                )
            )
    if sources.soak is not None:
        soak = sources.soak.result
        verdict = soak.verdict.verdict
        cards.append(
            Headline(
                "Stability window",
                verdict,
                f"{soak.completed_intervals} × {soak.interval_s:g} s intervals, {soak.totals.requests:,} requests"
                + (f"; {soak.verdict.reasons[0]}" if soak.verdict.reasons else ""),
                {"PASS": "good", "FAIL": "bad"}.get(verdict, "neutral"),
                sources.soak.origin,
                sources.soak.provenance.origin == "simulated",
            )
        )
    if sources.playbook is not None:
        stages = sources.playbook.stages
        done = sum(1 for s in stages if s.state == "done")
        open_stages = [s.stage for s in stages if s.state != "done"]
        simulated = [s.stage for s in stages if s.provenance == "simulated"]
        origin = "; ".join(f"{s.stage}: {s.provenance_label}" for s in stages if s.provenance not in ("none",))
        if open_stages in ([], ["case_study"]):
            card = Headline(
                "Rollout playbook",
                "all gates passed",
                "baseline, POC, staging and production gates passed; this report is the case study",
                "good",
                origin,
                bool(simulated),
            )
        else:
            progress = f"{done}/{len(stages)} stages done"
            card = Headline(
                "Rollout playbook", progress, sources.playbook.next_step, "neutral", origin, bool(simulated)
            )
        cards.append(card)
    return cards


def _profile_rows(profiles: dict[str, OffloadProfile]) -> list[list[str]]:
    rows = []
    for arm, profile in profiles.items():
        tiers = "; ".join(
            f"{t.kind} {t.capacity_gb:g} GB, read {t.effective_read_gbps:g} GB/s, "
            f"write {t.effective_write_gbps:g} GB/s, {t.effective_latency_us:g} µs"
            for t in profile.tiers
        )
        rows.append([arm, profile.name, "on" if profile.prefix_caching else "off", tiers or "none"])
    return rows


HIT_SOURCE_WORDS = {"usage": "requests' usage", "metrics": "/metrics counters"}
"""How the soak chart names where an interval's hit rate came from (IntervalStats.hit_rate_source)."""


def setup_tables(sources: ReportSources) -> list[tuple[str, TableView]]:
    out: list[tuple[str, TableView]] = []
    seen: set[Path] = set()
    # (label, run directory, manifest, scenario, the arms it ran: None for all of the scenario's)
    entries: list[tuple[str, Path, dict[str, Any], Scenario | None, set[str] | None]] = []
    for label, probe in (("POC", sources.poc), ("Baseline", sources.baseline), ("Production", sources.production)):
        if probe is not None and probe.path not in seen:
            seen.add(probe.path)
            entries.append((label, probe.path, probe.manifest, probe.scenario, None))
    for index, path in enumerate(sources.sweeps):
        label = "Capacity" if len(sources.sweeps) == 1 else f"Capacity {index + 1}"
        entries.append((label, path, read_manifest(path / "manifest.json"), _scenario_of(path), None))
    if sources.soak is not None:
        soak = sources.soak
        entries.append(("Stability window", soak.path, soak.manifest, soak.scenario, {soak.result.arm}))
    for label, path, manifest, scenario, arms_run in entries:
        host = manifest.get("host", {})
        engines = manifest.get("engines", {})
        if scenario is not None:
            engine_cfg: dict[str, Any] = scenario.engine.model_dump(mode="json")
        else:
            engine_cfg = manifest.get("scenario", {}).get("engine") or {}
        sha = str(manifest.get("kvbench_git_sha") or "—")[:12]
        gpus = ", ".join(str(g.get("name")) for g in host.get("gpus") or []) or "none visible to kvbench"
        versions = sorted({f"{e.get('kind')} {e.get('version')}" for e in engines.values()}) or ["—"]
        commands = [redact_text(" ".join(str(a) for a in e.get("command", []))) for e in engines.values()]
        rows = [
            ["Scenario", manifest.get("scenario_name") or (scenario.name if scenario else "—")],
            ["Engine", f"{engine_cfg.get('kind', '—')} (model {engine_cfg.get('model', '—')})"],
            ["Engine versions", ", ".join(versions)],
            ["Precision", _precision(engine_cfg)],
            ["Hardware", f"{engine_cfg.get('hardware', '—')}; GPUs on the host: {gpus}"],
            ["Parallelism", ", ".join(f"{k}={v}" for k, v in (engine_cfg.get("parallelism") or {}).items()) or "—"],
            ["kvbench", f"{manifest.get('kvbench_version', '—')} (git {sha})"],
            [
                "Host",
                f"{host.get('platform', '—')}, Python {host.get('python', '—')}, {host.get('cpu_count', '—')} CPUs",
            ],
            ["Run directory", str(path)],
        ]
        if commands:
            rows.append(["Engine command (redacted)", commands[0]])
        out.append((label, TableView(["", ""], rows, [False, False])))
        if scenario is not None:
            profiles = {arm.name: arm.profile for arm in scenario.arms if arms_run is None or arm.name in arms_run}
            columns = ["Arm", "Profile", "GPU prefix cache", "Tiers"]
            table = TableView(columns, _profile_rows(profiles), [False] * len(columns))
            out.append((f"{label}: offload profiles", table))
    return out


def poc_table(probe: ProbeSource) -> TableView:
    from .renderers import validity_lines
    from .ttft_table import rows as ttft_rows

    cols, body = ttft_rows(probe.result)
    titles = [c.title for c in cols]
    # the seed's "% diff" columns keep their figure and gain the speed-up it stands for: × = 1 + % diff / 100
    diffs = [i for i, title in enumerate(titles) if title.startswith("% diff")]
    for i in diffs:
        titles[i] = titles[i].replace("% diff", "speed-up × (% diff)", 1)
    body = [[_with_times(v) if i in diffs else v for i, v in enumerate(row)] for row in body]
    # a FAILED or INCONCLUSIVE run says so under its table, with every reason (escaped by the template)
    verdict = validity_lines(probe.result.validity)
    caption = f"median TTFT in ms; {probe.origin}" + (". " + " ".join(verdict) if verdict else "")
    return TableView(titles, body, [True for _ in cols], caption=caption)


def _with_times(pct_diff: str) -> str:
    """'59.40' -> '1.59× (+59.40%)'; a cell without a number stays as it is."""
    try:
        value = float(pct_diff)
    except ValueError:
        return pct_diff
    return f"{fmt_x(1 + value / 100)} ({value:+.2f}%)" if math.isfinite(value) else pct_diff


def spread_table(probe: ProbeSource) -> TableView:
    from .ttft_table import settle_line

    rows = []
    for cell in probe.result.cells:
        ttft = cell.ttft
        rows.append(
            [
                cell.arm,
                f"{cell.context_tokens:,}",
                f"t{cell.turn}",
                str(ttft.n if ttft else 0),
                str(cell.errors),
                fmt_ms(ttft.min_ms if ttft else None),
                fmt_ms(ttft.median_ms if ttft else None),
                fmt_ms(ttft.p90_ms if ttft else None),
                fmt_ms(ttft.max_ms if ttft else None),
                fmt_pct((ttft.p90_ms / ttft.median_ms - 1) if ttft and ttft.median_ms > 0 else None),
            ]
        )
    settle, _ = settle_line(probe.result)  # whether more passes would still move the medians
    return TableView(
        ["Arm", "Tokens", "Turn", "n", "Errors", "min", "median", "p90", "max", "p90 over median"],
        rows,
        [False, True, False, True, True, True, True, True, True, True],
        caption=settle or "",
    )


def poc_chart(probe: ProbeSource) -> Chart:
    result = probe.result
    groups = [f"{c:,}" for c in result.context_tokens]
    order = [a for a in result.arms if a != result.baseline_arm] + [result.baseline_arm]
    cells = [(arm, turn) for arm in order for turn in (1, 2) if turn <= result.turns]
    series = [
        BarSeries(f"{arm} t{turn}", [_median(result, arm, ctx, turn) for ctx in result.context_tokens], color(i), " ms")
        for i, (arm, turn) in enumerate(cells)
    ]
    description = f"Grouped bars of median TTFT per arm and turn for {len(groups)} context lengths; {probe.origin}."
    title = "Median TTFT by context length, turn 1 and turn 2"
    x_label, y_label = "context length (tokens)", "median TTFT (ms)"
    return bar_chart("chart-poc", title, description, groups, series, x_label=x_label, y_label=y_label, log=True)


@dataclass(frozen=True)
class SplitView:
    """A TTFT split table with the note that says how its columns were measured."""

    note: str
    table: TableView


def split_views(probe: ProbeSource) -> list[SplitView]:
    """The engine's own clock ("Where TTFT goes"), LMCache's log timeline and its ranks, and prefill/decode arms'
    TTFT parts, each when the run has it."""
    from .renderers import LMCACHE_NOTE, RANK_NOTE, TIMING_NOTE
    from .ttft_table import LMCACHE_HEADER, RANK_HEADER, TIMING_HEADER, SplitRow, lmcache_rows, rank_rows, timing_rows

    def view(note: str, header: tuple[str, ...], body: list[SplitRow]) -> SplitView:
        numeric = [False, True, False] + [True] * (len(header) - 3)
        caption = f"ms; {probe.origin}"
        # the tokens and turn as the spread table writes them
        texts = [[row.arm, f"{row.context_tokens:,}", f"t{row.turn}", *row.texts()[3:]] for row in body]
        return SplitView(note, TableView(list(header), texts, numeric, caption=caption))

    out = []
    if timing := timing_rows(probe.result):
        out.append(view(TIMING_NOTE, TIMING_HEADER, timing))
    if timeline := lmcache_rows(probe.result):
        out.append(view(LMCACHE_NOTE, LMCACHE_HEADER, timeline))
    if by_rank := rank_rows(probe.result):
        numeric = [False, False] + [True] * (len(RANK_HEADER) - 2)
        out.append(SplitView(RANK_NOTE, TableView(list(RANK_HEADER), by_rank, numeric, caption=probe.origin)))
    breakdown_file = probe.path / PdBreakdownResult.FILE_NAME
    if stored_file(breakdown_file):  # prefill/decode arms: their TTFT parts (pd-breakdown.json)
        breakdown = PdBreakdownResult.read_file(breakdown_file)
        numeric = [False, False, False] + [True] * (len(pd.TTFT_HEADER) - 4) + [False]
        table = TableView(list(pd.TTFT_HEADER), pd.ttft_rows(breakdown), numeric, caption=f"ms; {probe.origin}")
        out.append(SplitView(pd.note(breakdown), table))
    return out


def turn2_timeline_chart(probe: ProbeSource) -> Chart | None:
    """LMCache's turn 2 per context length, stacked: before the lookup, the load, after it (medians of each part,
    so a bar's height is near, not equal to, the cell's median TTFT). None when no turn 2 loaded anything."""
    cells = [c for c in probe.result.lmcache_timeline if c.turn == 2 and c.lookup_to_loaded_ms is not None]
    if not cells:
        return None
    arm = cells[0].arm
    cells = sorted((c for c in cells if c.arm == arm), key=lambda c: c.context_tokens)
    parts: tuple[tuple[str, list[float | None]], ...] = (
        ("before the lookup (HTTP, tokenizing, intake)", [c.before_lookup_ms for c in cells]),
        ("lookup to KV loaded (slowest rank)", [c.lookup_to_loaded_ms for c in cells]),
        ("after the load (new tokens' prefill, first token)", [c.after_load_ms for c in cells]),
    )
    series = [BarSeries(name, values, color(i), " ms") for i, (name, values) in enumerate(parts)]
    groups = [f"{c.context_tokens:,}" for c in cells]
    description = (
        f"Stacked bars per context length of the medians of each part of {arm}'s turn-2 TTFT: before LMCache's "
        f"lookup, the lookup to the KV loaded, and after the load; {probe.origin}."
    )
    title = f"Where {arm}'s turn 2 goes (LMCache's log)"
    x_label, y_label = "context length (tokens)", "ms (median of each part)"
    chart_id = "chart-lmcache-turn2"
    return bar_chart(chart_id, title, description, groups, series, x_label=x_label, y_label=y_label, stacked=True)


def soak_charts(soak: SoakSource) -> list[Chart]:
    intervals = soak.intervals
    if not intervals:
        return []
    window_s = max(soak.result.window_s, 1e-9)
    scale, unit = (1.0, "seconds") if window_s < 300 else (60.0, "minutes") if window_s < 18000 else (3600.0, "hours")
    xs = [(i.elapsed_start_s + i.duration_ns / 2e9) / scale for i in intervals]
    verdict = soak.result.verdict
    broken: dict[int, list[str]] = {}
    for criterion in verdict.criteria:
        if criterion.status == "fail":
            for index in criterion.intervals:
                broken.setdefault(index, []).append(criterion.name)
    by_index = {i.index: (x, i) for x, i in zip(xs, intervals, strict=True)}
    warm = soak.result.warmup_intervals
    bands = []
    if warm:
        end = min(warm, len(intervals))
        bands.append((0.0, end * soak.result.interval_s / scale, "warm-up (not judged)"))
    span = (0.0, max(window_s / scale, xs[-1]))
    slo = soak.result.slo
    ttft_highlights = [
        Highlight(x, item.ttft_p99_ms, f"interval {index}: {', '.join(names)}")
        for index, names in broken.items()
        if index in by_index and (item := by_index[index][1]).ttft_p99_ms is not None
        for x in (by_index[index][0],)
    ]
    elapsed = f"elapsed ({unit})"
    ms = [("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms)]
    latency = line_chart(
        "chart-soak-latency",
        "TTFT and TPOT per interval",
        "Per-interval TTFT p50 and p99 and TPOT p99 over the stability window; red markers are intervals that "
        "broke a criterion.",
        [
            LineSeries("TTFT p99", xs, [i.ttft_p99_ms for i in intervals], color(1)),
            LineSeries("TTFT p50", xs, [i.ttft_p50_ms for i in intervals], color(0)),
            LineSeries("TPOT p99", xs, [i.tpot_p99_ms for i in intervals], color(3), dashed=True),
        ],
        x_label=elapsed,
        y_label="ms",
        highlights=ttft_highlights,
        bands=bands,
        x_range=span,
        # the soak's SLO holds per request (its compliance criterion counts requests within it), not at a percentile
        limits=[Limit(v, f"SLO {name} ≤ {v:g} ms per request") for name, v in ms if v is not None],
    )
    health_highlights = [
        Highlight(x, 100.0 * (item.error_rate or 0.0), f"interval {index}: {', '.join(names)}")
        for index, names in broken.items()
        if index in by_index
        for x, item in (by_index[index],)
    ]
    floor = soak.result.criteria_spec.hit_rate_floor
    # say where the hit rate came from: /metrics counters can overlap where the requests' usage cannot
    hit_sources = sorted({i.hit_rate_source for i in intervals if i.hit_rate is not None and i.hit_rate_source})
    hit_label = f"hit rate ({', '.join(HIT_SOURCE_WORDS[s] for s in hit_sources)})" if hit_sources else "hit rate"
    health = line_chart(
        "chart-soak-health",
        "Errors, cache hit rate and KV usage per interval",
        "Per-interval error rate, prefix-cache hit rate and KV-cache usage in percent.",
        [
            LineSeries("error rate", xs, [_pct_or_none(i.error_rate) for i in intervals], color(1)),
            LineSeries(hit_label, xs, [_pct_or_none(i.hit_rate) for i in intervals], color(0)),
            LineSeries("KV usage", xs, [_pct_or_none(i.kv_usage) for i in intervals], color(5), dashed=True),
        ],
        x_label=elapsed,
        y_label="percent",
        highlights=health_highlights,
        bands=bands,
        x_range=span,
        limits=[Limit(floor * 100.0, f"hit-rate floor {floor:.0%}", "above")] if floor is not None else [],
    )
    rps = line_chart(
        "chart-soak-rps",
        "Completed requests per second",
        "Per-interval throughput of the stability window.",
        [LineSeries("RPS", xs, [i.rps for i in intervals], color(0))],
        x_label=elapsed,
        y_label="requests / s",
        bands=bands,
        x_range=span,
    )
    return [latency, health, rps]


def _pct_or_none(value: float | None) -> float | None:
    return None if value is None else value * 100.0


def soak_criteria_table(soak: SoakSource) -> TableView:
    rows = []
    for c in soak.result.verdict.criteria:
        intervals = ", ".join(str(i) for i in c.intervals[:20]) + (" …" if len(c.intervals) > 20 else "")
        rows.append([c.name, c.status.upper().replace("_", " "), c.reason, intervals or "—"])
    return TableView(["Criterion", "Status", "Observed", "Intervals that broke it"], rows, [False] * 4)


@dataclass(frozen=True)
class PredictionView:
    table: TableView | None
    chart: Chart | None
    note: str
    observed: str = "measured"
    """What the POC's side is: ``measured``, or ``simulated run`` when the POC ran on the simulator."""


def _kv_bytes_per_token(probe: ProbeSource) -> tuple[float | None, str]:
    """KV bytes per token per GPU: the simulator's profile, or the model directory's config.json."""
    from harness.results.capacity import engine_shapes

    scenario = probe.scenario
    if scenario is None:
        return None, "the run's scenario.yaml could not be read"
    shapes = engine_shapes(scenario.engine)
    if shapes.model is None:
        return None, "; ".join(shapes.notes) or "the model shape is unknown"
    m = shapes.model
    try:
        kv = analytical.model_kv_bytes_per_token(m, shapes.tp)
    except ValueError as error:
        return None, str(error)
    where = next((note for note in shapes.notes if note.startswith("model shape from")), "simulator profile")
    label = (
        f"{m.name}: {m.layers} layers, {m.kv_heads} KV heads × {m.head_dim}, {m.dtype_bytes:g} B per value, "
        f"TP {shapes.tp} ({where})"
    )
    return kv, label


def predictions(probe: ProbeSource, turn: int) -> PredictionView:
    """The analytical model (offload/analytical.py) against the POC's measured turn-``turn`` speedups."""
    result = probe.result
    arm = _treatment(result)
    if arm is None or probe.scenario is None:
        return PredictionView(None, None, "needs a POC run with a baseline arm and an offload arm")
    profile = next((a.profile for a in probe.scenario.arms if a.name == arm), None)
    if profile is None or not profile.tiers:
        return PredictionView(None, None, f"arm {arm} has no offload tier: nothing to predict")
    kv_bytes, label = _kv_bytes_per_token(probe)
    if kv_bytes is None:
        return PredictionView(None, None, f"not available: {label}")
    tier = profile.tiers[0]
    # a POC on the simulator is no measurement: every label says which it is
    observed = {"measured": "measured", "simulated": "simulated run"}.get(probe.provenance.origin, "observed")
    calibrated: dict[tuple[str, int, int], float] = {}
    calibration_note = ""
    if (probe.path / CalibratedTtft.FILE_NAME).exists():
        try:
            stored = CalibratedTtft.read_file(probe.path)
            calibrated, calibration_note = stored.by_cell(), stored.note
        except RunDirError as error:
            calibration_note = str(error)
    rows = []
    contexts: list[str] = []
    predicted: list[float | None] = []
    measured: list[float | None] = []
    for context in result.context_tokens:
        base = _median(result, result.baseline_arm, context, turn)
        treated = _median(result, arm, context, turn)
        cell = result.cell(arm, context, turn)
        if base is None or treated is None or treated <= 0 or cell is None:
            continue
        prompt = cell.prompt_tokens_median or float(context)
        cached = cell.cached_tokens_median
        stats = result.cache_stats(arm, context, turn)
        if cached is not None and prompt > 0:
            reuse = min(max(cached / prompt, 0.0), 1.0)
        elif stats is not None and stats.hit_rate is not None:
            # engines whose usage block has no cached_tokens (vLLM): the /metrics hit share
            reuse = min(max(stats.hit_rate, 0.0), 1.0)
        else:
            continue
        t_s = analytical.time_per_token_from_ttft(base / 1000.0, int(prompt))
        r_s = analytical.read_time_per_token(kv_bytes, tier.effective_read_gbps)
        w_s = analytical.write_time_per_token(kv_bytes, tier.effective_write_gbps)
        prediction = analytical.predict(int(prompt), reuse, t_s=t_s, r_s=r_s, w_s=w_s)
        got = base / treated
        rows.append(
            [
                f"{context:,}",
                f"{reuse:.3f}",
                f"{t_s * 1e6:.2f}",
                f"{r_s * 1e6:.3f}",
                prediction.regime,
                fmt_ms(prediction.ttft_kv_s * 1000.0),
                fmt_ms(treated),
                fmt_x(prediction.speedup),
                fmt_x(got),
                f"{(got / prediction.speedup - 1) * 100:+.0f}%",
            ]
        )
        if calibrated:
            simulated = calibrated.get((arm, context, turn))
            rows[-1].append(fmt_ms(simulated) if simulated is not None else "—")
            rows[-1].append(f"{(simulated / treated - 1) * 100:+.0f}%" if simulated is not None else "—")
        contexts.append(f"{context:,}")
        predicted.append(prediction.speedup)
        measured.append(got)
    if not rows:
        return PredictionView(
            None, None, "no context length has both arms measured with cached-token counts or /metrics hit counters"
        )
    headers = [
        "Tokens",
        "reuse a",
        "T (µs/tok)",
        "R (µs/tok)",
        "regime",
        "predicted TTFT",
        f"{observed} TTFT",
        "predicted speedup",
        f"{observed} speedup",
        f"{observed} vs predicted",
    ]
    if calibrated:
        headers += ["calibrated sim TTFT", f"sim vs {observed}"]
    caption = (
        f"{label}; tier {tier.kind} read {tier.effective_read_gbps:g} GB/s, "
        f"{kv_bytes / 1024:.0f} KiB of KV per token per GPU"
    )
    if calibration_note:
        caption += f"; {calibration_note}" if calibrated else f"; no calibrated prediction: {calibration_note}"
    table = TableView(headers, rows, [header != "regime" for header in headers], caption=caption)
    chart = bar_chart(
        "chart-predicted",
        f"Predicted vs {observed} turn-{turn} speedup",
        f"Bars of the analytical model's predicted speedup next to the {observed} speedup per context length.",
        contexts,
        [
            BarSeries("predicted (analytical)", predicted, PALETTE[6], "×"),
            BarSeries(observed, measured, PALETTE[0], "×"),
        ],
        x_label="context length (tokens)",
        y_label="speedup (×)",
        log=True,
    )
    return PredictionView(table, chart, "", observed)


def _precision(engine: dict[str, Any]) -> str:
    """Weights and KV-cache dtypes as the scenario set them: FP8 weights and BF16 weights are different setups."""
    text = str(engine.get("dtype") or "the model's dtype")
    if engine.get("quantization"):
        text += f", weights quantized to {engine['quantization']}"
    if engine.get("kv_dtype"):
        text += f", KV cache {engine['kv_dtype']}"
    return text


def methodology(sources: ReportSources) -> list[str]:
    notes = [
        "TTFT is the time from just before a streaming request is handed to the HTTP client to the arrival of "
        "the first network read that carries generated text (role-only, empty and usage-only chunks do not count), "
        "timed with a monotonic nanosecond clock; milliseconds appear only in reports.",
        "Every number on this page was computed from the stored per-request records (records.jsonl) and the files "
        "listed in the appendix; nothing was typed in by hand.",
    ]
    probe = sources.poc or sources.baseline
    if probe is not None and probe.scenario is not None and isinstance(probe.scenario.workload, MultiRoundQAProbe):
        w = probe.scenario.workload
        between = w.between_turns.mode.replace("_", " ")
        if w.between_turns.mode == "auto" and probe.result.between_turns:  # auto: what each arm's engine allowed
            between = "auto: " + "; ".join(f"{m.arm} {m.describe()}" for m in probe.result.between_turns)
        notes.append(
            f"POC workload: multi-round QA, {w.conversations} conversation(s) per context length, {w.turns} turns, "
            f"{w.question_tokens}-token questions, {w.answer_tokens}-token answers, {probe.result.repetitions} "
            f"repetition(s); {w.warmup_requests} unmeasured warm-up request(s) per engine start. Between turns: "
            f"{between}, so turn 2 measures a returning user whose KV left GPU "
            "memory."
        )
        notes.append(
            "Spread: every cell lists n, min, median, p90 and max over its requests (table above); the headline "
            "uses medians. % diff = (baseline / arm − 1) × 100."
        )
    if sources.soak is not None:
        spec = sources.soak.result.criteria_spec
        notes.append(
            f"Stability window: {sources.soak.result.window_s:g} s in {sources.soak.result.interval_s:g} s intervals; "
            "per interval TTFT/TPOT p50 and p99, RPS, errors by kind, KV usage from /metrics, and the cache hit "
            "rate: the requests' usage (cached / prompt tokens), or /metrics counters where responses carry no "
            "usage (the counters can overlap under asynchronous tier loads, see offload/hits.py). "
            f"Drift of {spec.drift_metric.replace('_', ' ')}: one-sided Mann-Kendall test at "
            f"{spec.drift_confidence:.0%} confidence and a Theil-Sen slope (both robust to outliers); the window "
            f"fails only when the trend is significant and rises by more than {spec.drift_min_increase_pct:g}%."
        )
    notes.append(
        "Predicted vs the POC run: T = baseline TTFT / prompt tokens (from the run), R and W = KV bytes per token / "
        "tier read and write bandwidth, a = cached / prompt tokens (from the run); "
        "TTFT_KV = max(a·N·R, (1−a)·N·W, (1−a)·N·T). The model leaves out fixed per-request costs (scheduling, "
        "the first decode step, HTTP), so short prompts measure below the predicted speedup. KV bytes per token "
        "come from the simulator's model profile or, for real engines, the model directory's config.json (layers, "
        "KV heads, head size, dtype); a calibrated_ttft.json in the run directory (kvbench sim predict RUN_DIR "
        "--calibration FILE) adds the calibrated simulator's TTFT, which does include those fixed costs."
    )
    return notes


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def raw_files(sources: ReportSources, out_dir: Path) -> list[RawFile]:
    files = []
    for label, directory in sources.all_dirs:
        for name in RAW_FILES:
            path = stored_file(directory / name)  # a kept run's packed records.jsonl.xz links as it is
            if path is None or not path.is_file():
                continue
            rel = os.path.relpath(path.resolve(), out_dir.resolve())
            href = "/".join(quote(part) for part in Path(rel).parts)
            files.append(
                RawFile(label, href, str(Path(directory.name) / name), fmt_bytes(path.stat().st_size), _sha256(path))
            )
    return files


def _add_decode_tax(
    tables: list[TableView], notes: list[str], points: Sequence[PointResult], baseline: str, unit: str, caption: str
) -> None:
    """The decode tax table and its lines (:mod:`reports.decode_tax`), where two arms share a load."""
    header, body = decode_tax_rows(points, baseline, unit)
    if body:
        tables.append(TableView(header, body, [False] + [True] * (len(header) - 1), caption=caption))
        notes.extend(decode_tax_lines(points, baseline))


@dataclass(frozen=True)
class CapacityView:
    charts: list[Chart]
    tables: list[TableView]
    notes: list[str]


def capacity_view(paths: Sequence[Path]) -> tuple[CapacityView | None, list[Headline]]:
    """Capacity curves, tables and GPU savings of the sweeps (sweep.json, drawn by reports/curves.py)."""
    from harness.results.sweep_result import SweepResult

    from . import curves

    charts: list[Chart] = []
    tables: list[TableView] = []
    notes: list[str] = []
    cards: list[Headline] = []
    for index, path in enumerate(paths):
        result = SweepResult.read_file(path / "sweep.json")
        origin = provenance(read_manifest(path / "manifest.json"))
        name = result.scenario_name
        charts.append(
            figure_chart(
                curves.ttft_figure(result, str(origin)),
                f"chart-capacity-{index}-ttft",
                f"TTFT p{curves.slo_quantile(result):g} against load ({name})",
                f"TTFT p{curves.slo_quantile(result):g} of each arm at each load point of the sweep, the SLO's TTFT "
                f"limit at its percentile (p{result.slo.percentile:g}) shaded; {origin}.",
            )
        )
        charts.append(
            figure_chart(
                curves.capacity_figure(result, str(origin)),
                f"chart-capacity-{index}-rps",
                f"Capacity: RPS/GPU against TPS/user ({name})",
                "Capacity curves of each arm: requests per second per GPU against tokens per second per user, "
                f"each arm's Pareto frontier dashed, points meeting the SLO filled; {origin}.",
            )
        )
        header, body = curves.points_rows(result)
        tables.append(TableView(header, body, [False] + [True] * (len(header) - 1), caption=f"{path}; {origin}"))
        notes.extend(curves.energy_lines(result))
        notes.extend(curves.client_lines(result))
        notes.extend(curves.capacity_lines(result))
        unit = "users" if result.mode == "concurrency" else "req/s"
        _add_decode_tax(tables, notes, result.points, result.baseline_arm, unit, f"{path}; {origin}")
        for saving in result.savings:
            if saving.gpus_saved is None or saving.gpus_baseline is None or saving.gpus_arm is None:
                continue
            dollars = f", ${saving.usd_per_year_saved:,.0f}/year" if saving.usd_per_year_saved is not None else ""
            cards.append(
                Headline(
                    f"GPUs at {saving.target_rps:g} req/s within the SLO",
                    f"{gpus(saving.gpus_saved)} saved",
                    f"{saving.baseline} {gpus(saving.gpus_baseline)} → {saving.arm} {gpus(saving.gpus_arm)}{dollars} "
                    f"at ${saving.usd_per_gpu_hour:g}/GPU-hour",
                    "good" if saving.gpus_saved > 0 else "bad",
                    origin.label,
                    origin.origin == "simulated",
                )
            )
    if not (charts or tables):
        return None, cards
    return CapacityView(charts, tables, notes), cards


def agents_view(paths: Sequence[Path]) -> CapacityView | None:
    """Agents at SLO of the agentic sweeps (agentic.json, drawn by reports/agentic.py): per tier and arm, the
    points, TTFT against agents, and what the figures mean."""
    from harness.results.agentic_result import AgenticResult

    from . import agentic

    view = CapacityView([], [], [])
    for index, path in enumerate(paths):
        result = AgenticResult.read_file(path / AgenticResult.FILE_NAME)
        origin = provenance(read_manifest(path / "manifest.json"))
        view.charts.append(
            figure_chart(
                agentic.ttft_figure(result, str(origin)),
                f"chart-agents-{index}-ttft",
                f"TTFT against concurrent agents ({result.scenario_name})",
                f"TTFT of each arm's calls at each agents count, every tier's TTFT limit dashed; {origin}.",
            )
        )
        for rows in (agentic.capacity_rows(result), agentic.point_rows(result)):
            header, body = rows
            view.tables.append(
                TableView(header, body, [False] * 2 + [True] * (len(header) - 2), caption=f"{path}; {origin}")
            )
        view.notes.extend(agentic.notes(result))
        points = [p.point for p in result.points]
        _add_decode_tax(view.tables, view.notes, points, result.baseline_arm, "agents", f"{path}; {origin}")
    return view if paths else None


def playbook_table(status: PlaybookStatus) -> TableView:
    """Every stage with the provenance of its evidence; the case study stage is this very report."""
    rows = []
    for s in status.stages:
        if s.stage == "case_study" and s.state != "failed":
            rows.append([s.title, "THIS REPORT", s.gate, "rendered now from the other stages' runs", "—", "—"])
            continue
        origin = {"measured": "MEASURED", "simulated": "SIMULATED"}.get(s.provenance, "—")
        rows.append([s.title, s.state.upper(), origin, s.gate, s.evidence, s.next_step or "—"])
    return TableView(["Stage", "State", "Evidence is", "Gate", "Evidence", "Next step"], rows, [False] * 6)


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=select_autoescape(enabled_extensions=("html", "j2"), default_for_string=True, default=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(ms=fmt_ms, pct=fmt_pct, x=fmt_x, num=fmt_num)
    return env


def build_context(sources: ReportSources, out_dir: Path) -> dict[str, Any]:
    poc = sources.poc
    soak = sources.soak
    turn = sources.target_turn
    prediction = predictions(poc, turn) if poc is not None else None
    capacity, capacity_cards = capacity_view(sources.sweeps)
    return {
        "title": sources.title,
        "generated_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "kvbench_version": __version__,
        "decision": decide(decision_inputs(sources)),
        "headlines": executive_summary(sources) + capacity_cards,
        "setup_differences": setup_differences(sources),
        "playbook": playbook_table(sources.playbook) if sources.playbook else None,
        "setup": setup_tables(sources),
        "poc": poc,
        "poc_table": poc_table(poc) if poc else None,
        "poc_spread": spread_table(poc) if poc else None,
        "poc_chart": poc_chart(poc) if poc else None,
        "poc_splits": split_views(poc) if poc else [],
        "poc_split_chart": turn2_timeline_chart(poc) if poc else None,
        "soak": soak.result if soak else None,
        "soak_path": str(soak.path) if soak else "",
        "soak_charts": soak_charts(soak) if soak else [],
        "soak_criteria": soak_criteria_table(soak) if soak else None,
        "sweeps": [str(p) for p in sources.sweeps],
        "capacity": capacity,
        "agents": agents_view(sources.agentic),
        "prediction": prediction,
        "methodology": methodology(sources),
        "raw_files": raw_files(sources, out_dir),
    }


def render_html(sources: ReportSources, out_dir: Path) -> str:
    template = environment().get_template("case_study.html.j2")
    return template.render(**build_context(sources, out_dir))


def write_html(sources: ReportSources, out: Path) -> Path:
    """Render the case study into ``out`` (written atomically)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    text = render_html(sources, out.parent)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return out
