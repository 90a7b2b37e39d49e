"""The kvbench command line: parse, build the scenario, call the harness. Nothing else lives here.

Heavy modules (pandas, aiohttp, engines) are imported inside the commands so `kvbench --help`
stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from kvbench import __version__

app = typer.Typer(
    name="kvbench",
    help="Benchmark KV-cache offloading: turn-1/turn-2 TTFT with the offload layer ON vs OFF.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)
if not console.is_terminal:
    # piped or captured output (CI logs, tests) keeps whole table rows instead of wrapping at 80 columns
    console.width = 200


def _mount_subcommands() -> None:
    from kvbench.harness.sim.cli import sim_app

    app.add_typer(sim_app, name="sim", help="The built-in engine simulator.")
    try:
        from kvbench.harness.modeldir_cli import model_app
    except ImportError:  # optional until the real-engine tooling is installed
        pass
    else:
        app.add_typer(model_app, name="model", help="Hub-free model directories for dummy-weight runs.")
    try:
        from kvbench.offload.cli import offload_app
    except ImportError:
        pass
    else:
        app.add_typer(offload_app, name="offload", help="Offload tiers: probe a storage path.")


def _fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    return typer.Exit(code)


@app.callback(invoke_without_command=True)
def main(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        console.print(f"kvbench {__version__}")
        raise typer.Exit(0)


@app.command()
def run(
    scenario: Annotated[
        str | None, typer.Argument(help="Scenario YAML file or bundled scenario name (e.g. quickstart).")
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", "-o", help="Parent of the run directory (default: scenario)."),
    ] = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="Continue an interrupted run directory.")
    ] = None,
) -> None:
    """Run a scenario: every arm, the workload, then the t1/t2 TTFT table."""
    from kvbench.harness.errors import KvbenchError
    from kvbench.harness.pipeline import rebuild_reports, run_scenario
    from kvbench.harness.progress import RichProgress
    from kvbench.harness.rundir import RunDir
    from kvbench.harness.scenario import load_scenario

    try:
        if resume is not None:
            if scenario is not None:
                raise _fail("give either a scenario or --resume RUN_DIR, not both")
            run_dir = RunDir.open(resume)
            loaded, source = run_dir.scenario(), run_dir.scenario_file
        elif scenario is None:
            raise _fail("missing scenario (a YAML file or a bundled name such as 'quickstart')")
        else:
            loaded, source = load_scenario(scenario)
        with RichProgress(console) as progress:
            run_dir = run_scenario(
                loaded, source=source, output_dir=output_dir, resume=resume, progress=progress
            )
        rebuild_reports(run_dir, console)
    except KvbenchError as error:
        raise _fail(str(error)) from None
    console.print(f"Run directory: [bold]{run_dir.path}[/]  (rebuild reports: kvbench report {run_dir.path})")


@app.command()
def validate(
    files: Annotated[list[str], typer.Argument(help="Scenario files or bundled names.")],
) -> None:
    """Check scenario files without running anything."""
    from kvbench.harness.errors import ScenarioError
    from kvbench.harness.scenario import load_scenario

    failed = 0
    for ref in files:
        try:
            scenario, path = load_scenario(ref)
        except ScenarioError as error:
            err_console.print(f"[red]✗[/] {error}", highlight=False)
            failed += 1
        else:
            console.print(f"[green]✓[/] {path}: {scenario.name} ({len(scenario.arms)} arms)", highlight=False)
    if failed:
        raise typer.Exit(2)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `kvbench run`.")],
) -> None:
    """Rebuild summary.json and every report of a run from its stored files alone."""
    from kvbench.harness.errors import KvbenchError
    from kvbench.harness.pipeline import rebuild_reports
    from kvbench.harness.rundir import RunDir

    try:
        paths = rebuild_reports(RunDir.open(run_dir), console)
    except KvbenchError as error:
        raise _fail(str(error)) from None
    for path in paths:
        console.print(f"wrote {path}")


@app.command()
def scenarios() -> None:
    """List the scenarios bundled with kvbench."""
    from kvbench.harness.scenario import bundled_scenarios

    for name, path in sorted(bundled_scenarios().items()):
        console.print(f"{name:32s} {path}")


_mount_subcommands()
