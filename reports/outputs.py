"""The output registry: every report kvbench writes, keyed by (result kind, format).

``kvbench report RUN_DIR`` reads the directory's result file and calls every output registered
for its kind: files under ``RUN_DIR/report/`` and a console view. Adding an output is adding one
entry here; reports read result files (and the manifest) only, never records or engines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape

from common.schema import VersionedFile
from harness.results.fleet import FleetResult
from harness.results.fleet import markdown as fleet_markdown
from harness.results.provenance import provenance
from harness.results.replay_result import ReplayResult
from harness.results.run_result import RunResult
from harness.results.soak_result import SoakResult
from harness.results.sweep_result import SweepResult
from harness.store.manifest import read_manifest
from harness.store.rundir import RunDir, RunKind

from . import curves, gate, renderers, replay


@dataclass(frozen=True)
class Output:
    kind: RunKind | Literal["compare"]
    format: str
    write: Callable[[VersionedFile, dict[str, Any], Path, Console | None], list[Path]]


def _probe_files(result: VersionedFile, manifest: dict[str, Any], out: Path, console: Console | None) -> list[Path]:
    assert isinstance(result, RunResult)
    return renderers.write_all(result, manifest, out)


def _probe_console(result: VersionedFile, manifest: dict[str, Any], out: Path, console: Console | None) -> list[Path]:
    assert isinstance(result, RunResult)
    if console is not None:
        renderers.print_console(result, manifest, console)
    return []


def _sweep_files(result: VersionedFile, manifest: dict[str, Any], out: Path, console: Console | None) -> list[Path]:
    assert isinstance(result, SweepResult)
    return curves.write_sweep_reports(result, out, str(provenance(manifest)))


def _sweep_console(result: VersionedFile, manifest: dict[str, Any], out: Path, console: Console | None) -> list[Path]:
    assert isinstance(result, SweepResult)
    if console is not None:
        curves.print_sweep(result, console, str(provenance(manifest)))
        renderers.print_validity(result.validity, console)
    return []


def _soak_console(result: VersionedFile, manifest: dict[str, Any], out: Path, console: Console | None) -> list[Path]:
    assert isinstance(result, SoakResult)
    if console is not None:
        verdict = result.verdict
        color = {"PASS": "green", "FAIL": "red"}.get(verdict.verdict, "yellow")
        console.print(f"Soak verdict: [bold {color}]{verdict.verdict}[/] ({result.completed_intervals} intervals)")
        console.print(escape(str(provenance(manifest))), highlight=False)
        for criterion in verdict.criteria:
            line = f"  {criterion.status:>13}  {criterion.name}: {criterion.reason}"
            console.print(escape(line), highlight=False)
        for fault in result.faults:
            console.print(escape(f"  {'fault':>13}  {fault.describe()}"), highlight=False)
    return []


def _replay_files(result: VersionedFile, manifest: dict[str, Any], out: Path, console: Console | None) -> list[Path]:
    assert isinstance(result, ReplayResult)
    return replay.write_replay_reports(result, out, str(provenance(manifest)))


def _replay_console(result: VersionedFile, manifest: dict[str, Any], out: Path, console: Console | None) -> list[Path]:
    assert isinstance(result, ReplayResult)
    if console is not None:
        replay.print_replay(result, console, str(provenance(manifest)))
    return []


OUTPUTS: tuple[Output, ...] = (
    Output("probe", "files", _probe_files),
    Output("probe", "console", _probe_console),
    Output("sweep", "files", _sweep_files),
    Output("sweep", "console", _sweep_console),
    Output("soak", "console", _soak_console),
    Output("replay", "files", _replay_files),
    Output("replay", "console", _replay_console),
    Output("compare", "markdown", gate.write_markdown),
    Output("compare", "junit", gate.write_junit),
    Output("compare", "json", gate.write_json),
    Output("compare", "console", gate.print_console),
)
RESULT_FILES: dict[RunKind, type[VersionedFile]] = {
    "probe": RunResult, "sweep": SweepResult, "soak": SoakResult, "replay": ReplayResult,
}  # fmt: skip


def write_outputs(run_dir: RunDir, console: Console | None = None) -> list[Path]:
    """Every output of the run directory's kind, from its result file and manifest alone."""
    kind = run_dir.kind
    result = RESULT_FILES[kind].read_file(run_dir.path)
    manifest = read_manifest(run_dir.manifest_file) if run_dir.manifest_file.exists() else {}
    paths: list[Path] = []
    for output in OUTPUTS:
        if output.kind == kind:
            paths += output.write(result, manifest, run_dir.report_dir, console)
    if run_dir.fleet_file.exists():  # any kind run on a fleet: same vs moved, per-replica load and hits
        paths += _fleet_files(FleetResult.read_file(run_dir.fleet_file), manifest, run_dir.report_dir, console)
    return paths


def _fleet_files(result: FleetResult, manifest: dict[str, Any], out: Path, console: Console | None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "fleet.md"
    text = fleet_markdown(result)
    path.write_text(text + "\n" + str(provenance(manifest)) + "\n", encoding="utf-8")
    if console is not None:
        console.print("Fleet: same-replica vs moved turns, per-replica load and hits (report/fleet.md)")
        console.print(escape(text), highlight=False)
    return [path]


def write_compare_outputs(result: VersionedFile, files: dict[str, Path], console: Console | None = None) -> list[Path]:
    """The gate's outputs: each file asked for (format -> path, e.g. ``{"junit": gate.xml}``), then the console."""
    paths: list[Path] = []
    for output in OUTPUTS:
        if output.kind == "compare" and output.format in files:
            paths += output.write(result, {}, files[output.format], None)
    for output in OUTPUTS:
        if output.kind == "compare" and output.format == "console":
            output.write(result, {}, Path(), console)
    return paths
