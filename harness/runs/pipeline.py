"""What the CLI calls: run a scenario end to end, or rebuild reports from a run directory."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from harness.results.run_result import RunResult
from harness.scenario.spec import Scenario
from harness.store.manifest import read_manifest
from harness.store.rundir import RunDir
from kvbench.errors import RunInterrupted
from reports.renderers import print_console, write_all

from .interrupt import Interrupted, run_interruptible
from .probe import ProbeRunner, ProgressSink, summarize_run_dir


def run_scenario(
    scenario: Scenario,
    *,
    source: Path | None,
    output_dir: Path | None = None,
    resume: Path | None = None,
    progress: ProgressSink | None = None,
) -> RunDir:
    """Run (or resume) a scenario; returns the run directory with summary and reports written."""
    run_dir = RunDir.open(resume) if resume else RunDir.create(output_dir or Path(scenario.output.dir), scenario)
    runner = ProbeRunner(scenario, run_dir, source=source, progress=progress)
    try:
        run_interruptible(runner.run)
    except Interrupted:
        raise RunInterrupted(
            f"run interrupted; engines were stopped and the records kept. Continue with: "
            f"kvbench run --resume {run_dir.path}"
        ) from None
    return run_dir


def rebuild_reports(run_dir: RunDir, console: Console | None = None) -> list[Path]:
    """Re-aggregate stored records into summary.json, then render every report from it."""
    summarize_run_dir(run_dir)
    result = RunResult.read_file(run_dir.summary_file)
    manifest = read_manifest(run_dir.manifest_file)
    paths = write_all(result, manifest, run_dir.report_dir)
    if console is not None:
        print_console(result, manifest, console)
    return paths
