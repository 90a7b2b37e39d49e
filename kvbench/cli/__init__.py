"""The kvbench command line: parse, build the scenario, call the harness. Nothing else lives here.

Heavy modules (pandas, aiohttp, engines) are imported inside the commands so `kvbench --help`
stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from kvbench import __version__

if TYPE_CHECKING:
    from harness.runs.kinds import SoakOverrides
    from harness.store.rundir import RunDir, RunKind

app = typer.Typer(
    name="kvbench",
    help="Benchmark KV-cache offloading: turn-1/turn-2 TTFT with the offload layer ON vs OFF.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)
for _stream in (console, err_console):
    if not _stream.is_terminal:
        # piped or captured output (CI logs, tests) keeps whole lines instead of wrapping at 80 columns
        _stream.width = 200


def _mount_subcommands() -> None:
    from .sim import sim_app

    app.add_typer(sim_app, name="sim", help="The built-in engine simulator.")
    try:
        from .model import model_app
    except ImportError:  # optional until the real-engine tooling is installed
        pass
    else:
        app.add_typer(model_app, name="model", help="Hub-free model directories for dummy-weight runs.")
    try:
        from .offload import offload_app
    except ImportError:
        pass
    else:
        app.add_typer(offload_app, name="offload", help="Offload tiers: probe a storage path.")
    from .trace import trace_app

    app.add_typer(trace_app, name="trace", help="Request traces: stats (the cache ceiling) and synth.")
    app.add_typer(playbook_app, name="playbook", help="The rollout playbook: where the team stands, what is next.")


def _fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    return typer.Exit(code)


def _launch(
    kind: RunKind, scenario: str | None, *, output_dir: Path | None, resume: Path | None,
    overrides: SoakOverrides | None = None,
) -> RunDir:
    """Start (or resume) a run of ``kind`` through the one spine, then write every report of it."""
    from harness.runs.kinds import launch
    from harness.runs.progress import RichProgress
    from harness.scenario.spec import load_scenario
    from harness.store.rundir import RunDir
    from kvbench.errors import KvbenchError
    from reports.outputs import write_outputs

    if (scenario is None) == (resume is None):
        raise _fail("give either a scenario (a YAML file or a bundled name such as 'quickstart') or --resume RUN_DIR")
    try:
        loaded, source = load_scenario(scenario) if scenario is not None else (None, None)
        with RichProgress(console) as progress:
            run_dir, _ = launch(
                kind, loaded, source=source, output_dir=output_dir, resume=resume, progress=progress,
                overrides=overrides,
            )
        write_outputs(run_dir, console)
    except KvbenchError as error:
        raise _fail(str(error)) from None
    assert isinstance(run_dir, RunDir)
    return run_dir


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
    run_dir = _launch("probe", scenario, output_dir=output_dir, resume=resume)
    console.print(f"Run directory: [bold]{run_dir.path}[/]  (rebuild reports: kvbench report {run_dir.path})")


@app.command()
def validate(
    files: Annotated[list[str], typer.Argument(help="Scenario files or bundled names.")],
) -> None:
    """Check scenario files without running anything."""
    from harness.scenario.spec import load_scenario
    from kvbench.errors import ScenarioError

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
    run_dirs: Annotated[
        list[Path] | None,
        typer.Argument(help="Run directories (kvbench run), soak directories (kvbench soak) or sweep directories."),
    ] = None,
    html: Annotated[
        bool, typer.Option("--html", help="Also write one self-contained HTML case study from the stored files.")
    ] = False,
    playbook: Annotated[
        Path | None, typer.Option("--playbook", help="With --html: take the runs attached to this playbook's stages.")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="With --html: the output file (default: beside the playbook, or in RUN_DIR/report)."
        ),
    ] = None,
) -> None:
    """Rebuild the result file (summary, sweep, soak or replay .json) and every report from stored files alone."""
    from harness.runs.kinds import summarize
    from harness.store.rundir import RunDir
    from kvbench.errors import KvbenchError
    from reports.outputs import write_outputs

    dirs = list(run_dirs or [])
    if not dirs and playbook is None:
        raise _fail("give a run directory (or --html --playbook FILE)")
    if (playbook is not None or out is not None) and not html:
        raise _fail("--playbook and --out go with --html")
    try:
        for path in dirs:
            run_dir = RunDir.open(path)
            summarize(run_dir)
            console.print(f"{run_dir.path}: a {run_dir.kind} run", highlight=False)
            for written in write_outputs(run_dir, console):
                console.print(f"wrote {written}")
        if html:
            from reports.html import report_html

            console.print(f"wrote {report_html(dirs, playbook=playbook, out=out)}")
    except KvbenchError as error:
        raise _fail(str(error)) from None


@app.command()
def soak(
    scenario: Annotated[
        str | None, typer.Argument(help="Scenario with workload kind multi_user_qa and a soak section.")
    ] = None,
    window: Annotated[str | None, typer.Option("--window", help="Window length, e.g. 4h, 90m, 24h.")] = None,
    interval: Annotated[str | None, typer.Option("--interval", help="Aggregation interval, e.g. 60s.")] = None,
    load: Annotated[
        float | None, typer.Option("--load", help="Target load in the sweep section's mode (users or req/s).")
    ] = None,
    arm: Annotated[str | None, typer.Option("--arm", help="Arm to run (default: the offload arm).")] = None,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", "-o", help="Parent of the soak directory (default: scenario).")
    ] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="Continue an interrupted window.")] = None,
) -> None:
    """Stability window: the workload at its target load; per-interval stats and a PASS/FAIL verdict."""
    from harness.runs.kinds import SoakOverrides
    from harness.scenario.spec import parse_duration

    try:
        window_s = parse_duration(window) if window is not None else None
        interval_s = parse_duration(interval) if interval is not None else None
    except ValueError as error:
        raise _fail(f"--window/--interval: {error}") from None
    overrides = SoakOverrides(window_s=window_s, interval_s=interval_s, load=load, arm=arm)
    run_dir = _launch("soak", scenario, output_dir=output_dir, resume=resume, overrides=overrides)
    console.print(f"Soak directory: [bold]{run_dir.path}[/]  (HTML: kvbench report --html {run_dir.path})")
    from harness.results.soak_result import SoakResult

    if SoakResult.read_file(run_dir.soak_file).verdict.verdict == "FAIL":
        raise typer.Exit(1)


@app.command()
def compare(
    baseline: Annotated[Path, typer.Argument(help="Baseline run directory (or a folder of run directories).")],
    current: Annotated[Path, typer.Argument(help="Current run directory (or a folder of run directories).")],
    threshold: Annotated[
        list[str] | None,
        typer.Option(
            "--threshold", "-t",
            help="Override a rule: alpha=, ttft= (max % median increase), ttft_ms=, error_rate=, hit_rate=.",
        ),
    ] = None,
    junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML here.")] = None,
    markdown: Annotated[Path | None, typer.Option("--markdown", help="Also write the Markdown summary here.")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the comparison as JSON here.")] = None,
) -> None:
    """Regression gate: exit 0 = no regression, 1 = regression, 2 = cannot compare."""
    from harness.gate.compare import compare_paths, render_markdown, write_outputs
    from kvbench.errors import KvbenchError

    try:
        result = compare_paths(baseline, current, threshold or [])
        write_outputs(result, markdown=markdown, junit=junit, json_path=json_out)
    except KvbenchError as error:
        raise _fail(str(error)) from None
    typer.echo(render_markdown(result), nl=False)
    raise typer.Exit(result.exit_code)


playbook_app = typer.Typer(
    help="The rollout playbook: baseline, POC, staging, production, case study.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@playbook_app.command("init")
def playbook_init(
    file: Annotated[Path, typer.Argument(help="Playbook file to create (YAML).")],
    name: Annotated[str, typer.Option("--name", help="The rollout's name (the case study's title).")] = "KV rollout",
    simulator: Annotated[
        bool, typer.Option("--simulator/--blank", help="Name the bundled simulator scenarios in the stages.")
    ] = True,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a new playbook file."""
    from harness.gate.playbook import save_playbook, starter_playbook

    if file.exists() and not force:
        raise _fail(f"{file} exists (use --force to overwrite)")
    save_playbook(starter_playbook(name, simulator=simulator), file)
    console.print(f"wrote {file}; next: kvbench playbook status {file}")


@playbook_app.command("attach")
def playbook_attach(
    file: Annotated[Path, typer.Argument(help="Playbook file.")],
    stage: Annotated[str, typer.Argument(help="baseline, poc, staging, production")],
    run_dir: Annotated[Path, typer.Argument(help="Run (or soak, sweep) directory to attach.")],
) -> None:
    """Attach a run directory to a stage; its gate is judged on the stage's latest run."""
    from harness.gate.playbook import attach_run
    from kvbench.errors import KvbenchError

    try:
        attach_run(file, stage, run_dir)
    except KvbenchError as error:
        raise _fail(str(error)) from None
    console.print(f"attached {run_dir} to {stage}; see kvbench playbook status {file}", highlight=False)


@playbook_app.command("status")
def playbook_status_cmd(
    file: Annotated[Path, typer.Argument(help="Playbook file.")],
) -> None:
    """Show every stage's gate, evidence and state, and what is next."""
    from rich.table import Table

    from harness.gate.playbook import playbook_status
    from kvbench.errors import KvbenchError

    try:
        status = playbook_status(file)
    except KvbenchError as error:
        raise _fail(str(error)) from None
    table = Table(title=f"Playbook: {status.name}", show_lines=True)
    for column in ("Stage", "State", "Gate", "Evidence"):
        table.add_column(column)
    colors = {"done": "green", "failed": "red", "pending": "yellow"}
    for stage in status.stages:
        state = f"[{colors[stage.state]}]{stage.state.upper()}[/]"
        table.add_row(stage.title, state, stage.gate, stage.evidence)
    console.print(table, markup=True, highlight=False)
    console.print(f"Next: {status.next_step}", highlight=False, markup=False)




@app.command()
def sweep(
    scenario: Annotated[
        str | None, typer.Argument(help="Scenario with workload kind multi_user_qa (file or bundled name).")
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", "-o", help="Parent of the run directory (default: scenario)."),
    ] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="Continue an interrupted sweep.")] = None,
    report_only: Annotated[
        Path | None, typer.Option("--report", help="Only rebuild sweep.json and the curves of a sweep run directory.")
    ] = None,
) -> None:
    """Load sweep: per arm, the multi-user workload at each load; capacity curves, SLO, GPUs saved."""
    if report_only is not None:
        if scenario is not None or resume is not None:
            raise _fail("give exactly one of: a scenario, --resume RUN_DIR, --report RUN_DIR")
        report(run_dirs=[report_only])
        return
    run_dir = _launch("sweep", scenario, output_dir=output_dir, resume=resume)
    console.print(f"Run directory: [bold]{run_dir.path}[/]  (redraw: kvbench report {run_dir.path})")


@app.command()
def replay(
    scenario: Annotated[
        str | None, typer.Argument(help="Scenario with workload kind trace (file or bundled name).")
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", "-o", help="Parent of the run directory (default: scenario)."),
    ] = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="Continue an interrupted replay (arms not finished run again).")
    ] = None,
) -> None:
    """Replay a timestamped trace on every arm: TTFT/TPOT/E2E, SLO, hit rate against the trace's ceiling."""
    run_dir = _launch("replay", scenario, output_dir=output_dir, resume=resume)
    console.print(f"Run directory: [bold]{run_dir.path}[/]  (rebuild reports: kvbench report {run_dir.path})")


@app.command()
def scenarios() -> None:
    """List the scenarios bundled with kvbench."""
    from harness.scenario.spec import bundled_scenarios

    for name, path in sorted(bundled_scenarios().items()):
        console.print(f"{name:32s} {path}")


_mount_subcommands()
