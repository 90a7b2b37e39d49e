"""The output registry: every report kvbench writes, keyed by (result kind, format).

Each :class:`Output` row names the result kinds it renders, its format, whether a plain ``kvbench
report`` writes it (``default``), which result it renders (``loads``: the kind's own result file unless it
says otherwise; a row whose result the run lacks, such as the fleet report without a ``fleet.json``, does
not apply), the file it writes (``file``, for a one-file output) and the function that writes it.
Reports read result files (and the manifest) only, never records or engines. Two ways in:

* :func:`write_outputs` -- a run directory (``kvbench run``/``sweep``/``soak``/``replay``/``report``):
  every row of its kind that applies (the default rows, or the formats asked for), from its stored result
  files or the results the caller aggregated, into ``RUN_DIR/report/`` (or the folder the caller names: a
  plain ``kvbench report`` leaves the run directory as it is) and onto the console;
* :func:`write_output` -- one format of a result the caller holds, into the file the caller names:
  the HTML case study of several run directories (kind ``case-study``, :func:`report_html`) and the
  gate's comparison (kind ``compare``: ``markdown``, ``junit``, ``json``).

Adding an output is adding one row to ``OUTPUTS``. A one-file output is a function from the result
(and the :class:`Job`: manifest, run directory, console) to its text, wrapped by :func:`_text`::

    def _compare_markdown(result: CompareResult, job: Job) -> str:
        return gate.render_markdown(result)

    Output(("compare",), "markdown", _text(CompareResult, _compare_markdown), "compare.md")

A caller then writes it with ``write_output("compare", "markdown", result, Path("gate.md"))``, and
``kvbench report --format FORMAT`` can ask for a run kind's format by name. A row without ``file``
writes several files into the directory it is given (:func:`_reads`) and returns their paths; a
console view prints and writes none (:func:`_console`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from rich.console import Console
from rich.markup import escape

from common.errors import KvbenchError, RunDirError
from common.packed import packed_file, stored_file
from common.schema import VersionedFile
from harness.gate.compare import CompareResult
from harness.gate.playbook import load_playbook
from harness.results.agentic_result import AgenticResult
from harness.results.fleet import FleetResult
from harness.results.pd_breakdown import PdBreakdownResult
from harness.results.provenance import provenance
from harness.results.replay_result import ReplayResult
from harness.results.run_result import RunResult
from harness.results.run_results import RunResults
from harness.results.soak_result import SoakResult
from harness.results.sweep_result import SweepResult
from harness.store.manifest import read_manifest
from harness.store.rundir import RunDir, RunKind

from . import agentic, curves, fleet, gate, html, pd, renderers, replay

ResultKind = RunKind | Literal["case-study", "compare"]
RUN_KINDS: tuple[RunKind, ...] = get_args(RunKind)
RESULT_FILES: dict[RunKind, type[VersionedFile]] = {
    "probe": RunResult,
    "sweep": SweepResult,
    "soak": SoakResult,
    "replay": ReplayResult,
    "agentic": AgenticResult,
}
Result = TypeVar("Result")


@dataclass(frozen=True)
class Job:
    """What an output is given."""

    result: object
    """What it renders: the run's result file (or the row's ``loads``), a CompareResult, ReportSources."""
    out: Path
    """The file a one-file output writes; the directory a several-file output writes into."""
    manifest: dict[str, Any] = field(default_factory=dict)
    run_dir: RunDir | None = None
    console: Console | None = None

    @property
    def origin(self) -> str:
        """The provenance line of the run (measured on what, or simulated)."""
        return str(provenance(self.manifest))


def _reads(kind: type[Result], write: Callable[[Result, Job], list[Path]]) -> Callable[[Job], list[Path]]:
    """``write`` for a row whose result is a ``kind``: a row called with anything else is a programming error."""

    def checked(job: Job) -> list[Path]:
        if not isinstance(job.result, kind):
            raise TypeError(f"this output renders a {kind.__name__}, not a {type(job.result).__name__}")
        return write(job.result, job)

    return checked


def _text(kind: type[Result], render: Callable[[Result, Job], str]) -> Callable[[Job], list[Path]]:
    """A one-file output: ``render``'s text written to the job's file."""

    def write(result: Result, job: Job) -> list[Path]:
        job.out.parent.mkdir(parents=True, exist_ok=True)
        job.out.write_text(render(result, job), encoding="utf-8")
        return [job.out]

    return _reads(kind, write)


def _console(kind: type[Result], show: Callable[[Result, Job, Console], None]) -> Callable[[Job], list[Path]]:
    """A console view: prints when the job has a console, writes no file."""

    def write(result: Result, job: Job) -> list[Path]:
        if job.console is not None:
            show(result, job, job.console)
        return []

    return _reads(kind, write)


def _kind_result(results: RunResults) -> object:
    return results.result


def _fleet(results: RunResults) -> object | None:
    return results.fleet


def _pd(results: RunResults) -> object | None:
    return results.pd


@dataclass(frozen=True)
class Output:
    kinds: tuple[ResultKind, ...]
    format: str
    write: Callable[[Job], list[Path]]
    file: str | None = None
    """The file a one-file output writes in the report directory; None: it writes several (or none)."""
    default: bool = True
    """Written by every report of its kinds; False: only when asked for by format."""
    loads: Callable[[RunResults], object | None] = _kind_result
    """The result it renders; None: the run has none (the row does not apply)."""


def _probe_files(result: RunResult, job: Job) -> list[Path]:
    return renderers.write_all(result, job.manifest, job.out)


def _probe_console(result: RunResult, job: Job, console: Console) -> None:
    renderers.print_console(result, job.manifest, console)


def _sweep_files(result: SweepResult, job: Job) -> list[Path]:
    return curves.write_sweep_reports(result, job.out, job.origin)


def _sweep_console(result: SweepResult, job: Job, console: Console) -> None:
    curves.print_sweep(result, console, job.origin)
    renderers.print_validity(result.validity, console)


def _soak_console(result: SoakResult, job: Job, console: Console) -> None:
    verdict = result.verdict
    color = {"PASS": "green", "FAIL": "red"}.get(verdict.verdict, "yellow")
    console.print(f"Soak verdict: [bold {color}]{verdict.verdict}[/] ({result.completed_intervals} intervals)")
    console.print(escape(job.origin), highlight=False)
    for criterion in verdict.criteria:
        console.print(escape(f"  {criterion.status:>13}  {criterion.name}: {criterion.reason}"), highlight=False)
    for fault in result.faults:
        console.print(escape(f"  {'fault':>13}  {fault.describe()}"), highlight=False)


def _replay_files(result: ReplayResult, job: Job) -> list[Path]:
    return replay.write_replay_reports(result, job.out, job.origin)


def _replay_console(result: ReplayResult, job: Job, console: Console) -> None:
    replay.print_replay(result, console, job.origin)
    renderers.print_validity(result.validity, console)


def _agentic_files(result: AgenticResult, job: Job) -> list[Path]:
    return agentic.write_agentic_reports(result, job.out, job.origin)


def _agentic_console(result: AgenticResult, job: Job, console: Console) -> None:
    agentic.print_agentic(result, console, job.origin)
    renderers.print_validity(result.validity, console)


def _pd_markdown(result: PdBreakdownResult, job: Job) -> str:
    return pd.render_markdown(result)


def _pd_console(result: PdBreakdownResult, job: Job, console: Console) -> None:
    pd.print_console(result, console)


def _fleet_markdown(result: FleetResult, job: Job) -> str:
    return fleet.markdown(result) + "\n" + job.origin + "\n"


def _fleet_console(result: FleetResult, job: Job, console: Console) -> None:
    console.print("Fleet: same-replica vs moved turns, per-replica load and hits (report/fleet.md)")
    console.print(escape(fleet.markdown(result)), highlight=False)


def _case_study(sources: html.ReportSources, job: Job) -> list[Path]:
    return [html.write_html(sources, job.out)]


def _compare_markdown(result: CompareResult, job: Job) -> str:
    return gate.render_markdown(result)


def _compare_junit(result: CompareResult, job: Job) -> str:
    return gate.render_junit(result)


def _compare_json(result: CompareResult, job: Job) -> str:
    return gate.render_json(result)


def _compare_console(result: CompareResult, job: Job, console: Console) -> None:
    console.out(gate.render_markdown(result), end="", highlight=False)  # no wrapping: each table row stays one line


OUTPUTS: tuple[Output, ...] = (
    Output(("probe",), "files", _reads(RunResult, _probe_files)),
    Output(("probe",), "console", _console(RunResult, _probe_console)),
    Output(("sweep",), "files", _reads(SweepResult, _sweep_files)),
    Output(("sweep",), "console", _console(SweepResult, _sweep_console)),
    Output(("soak",), "console", _console(SoakResult, _soak_console)),
    Output(("replay",), "files", _reads(ReplayResult, _replay_files)),
    Output(("replay",), "console", _console(ReplayResult, _replay_console)),
    Output(("agentic",), "files", _reads(AgenticResult, _agentic_files)),
    Output(("agentic",), "console", _console(AgenticResult, _agentic_console)),
    # any kind run on a fleet (it has a fleet.json): same vs moved, per-replica load and hits
    Output(RUN_KINDS, "fleet", _text(FleetResult, _fleet_markdown), "fleet.md", loads=_fleet),
    Output(RUN_KINDS, "console", _console(FleetResult, _fleet_console), loads=_fleet),
    Output(("probe", "sweep"), "pd", _text(PdBreakdownResult, _pd_markdown), "pd-breakdown.md", loads=_pd),
    Output(("probe", "sweep"), "console", _console(PdBreakdownResult, _pd_console), loads=_pd),
    Output(("case-study",), "html", _reads(html.ReportSources, _case_study), html.HTML_FILE, default=False),
    Output(("compare",), "markdown", _text(CompareResult, _compare_markdown), "compare.md"),
    Output(("compare",), "junit", _text(CompareResult, _compare_junit), "compare.xml"),
    Output(("compare",), "json", _text(CompareResult, _compare_json), "compare.json"),
    Output(("compare",), "console", _console(CompareResult, _compare_console)),
)


def formats(kinds: Collection[ResultKind]) -> list[str]:
    """The formats registered for any of ``kinds``, in registry order."""
    return list(dict.fromkeys(output.format for output in OUTPUTS if set(output.kinds) & set(kinds)))


def _wanted(output: Output, wanted: Collection[str] | None) -> bool:
    return output.default if wanted is None else output.format in wanted


def read_results(run_dir: RunDir) -> RunResults:
    """The run directory's stored result files: its kind's and, run on a fleet, ``fleet.json`` (P/D arms:
    ``pd-breakdown.json``)."""
    fleet = FleetResult.read_file(run_dir.fleet_file) if stored_file(run_dir.fleet_file) else None
    pd_file = run_dir.path / PdBreakdownResult.FILE_NAME
    pd_result = PdBreakdownResult.read_file(pd_file) if stored_file(pd_file) else None
    return RunResults(RESULT_FILES[run_dir.kind].read_file(run_dir.path), fleet, pd_result)


def write_outputs(
    run_dir: RunDir,
    console: Console | None = None,
    formats: Collection[str] | None = None,
    *,
    results: RunResults | None = None,
    into: Path | None = None,
) -> list[Path]:
    """Every output of the run directory's kind that applies to it (of ``formats``; None: the default ones) into
    ``into`` (None: the run's ``report/``), from ``results`` (None: its stored result files) and its manifest."""
    kind = run_dir.kind
    manifest = read_manifest(run_dir.manifest_file) if run_dir.manifest_file.exists() else {}
    results = results or read_results(run_dir)
    into = into or run_dir.report_dir
    paths: list[Path] = []
    for output in OUTPUTS:
        result = output.loads(results)
        if kind not in output.kinds or not _wanted(output, formats) or result is None:
            continue
        out = into / output.file if output.file else into
        paths += output.write(Job(result, out, manifest, run_dir, console))
    for path in paths:
        # a kept run's packed table is stale once the plain one is written again
        packed_file(path).unlink(missing_ok=True)
    return paths


def write_output(kind: ResultKind, format: str, result: object, file: Path) -> Path:
    """One registered one-file output of ``result`` into ``file``; the file written."""
    for output in OUTPUTS:
        if kind in output.kinds and output.format == format and output.file is not None:
            [written] = output.write(Job(result, file))
            return written
    raise KvbenchError(f"no {format!r} output for a {kind} result; registered: {', '.join(formats([kind])) or 'none'}")


def report_html(paths: Sequence[Path], *, playbook: Path | None = None, out: Path | None = None) -> Path:
    """The HTML case study of run, soak and sweep directories (and a playbook's runs); the file written.

    ``out`` defaults to the playbook's ``case_study`` report, else ``RUN_DIR/report/case-study.html`` for one
    directory, else ``case-study.html`` here."""
    try:
        sources = html.collect_sources(paths, playbook)
    except RunDirError as error:
        raise html.HtmlReportError(str(error)) from None
    if out is None:
        if playbook is not None:
            out = playbook.resolve().parent / load_playbook(playbook).stages.case_study.gate.report
        elif len(paths) == 1:
            out = paths[0] / "report" / html.HTML_FILE
        else:
            out = Path(html.HTML_FILE)
    return write_output("case-study", "html", sources, out)


def write_compare_outputs(result: CompareResult, files: dict[str, Path], console: Console | None = None) -> list[Path]:
    """The gate's outputs: each file asked for (format -> path, e.g. ``{"junit": gate.xml}``), then the console."""
    paths = [write_output("compare", format, result, path) for format, path in files.items()]
    for output in OUTPUTS:
        if "compare" in output.kinds and output.format == "console":
            output.write(Job(result, Path(), console=console))
    return paths
