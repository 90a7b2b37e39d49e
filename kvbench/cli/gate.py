"""``kvbench compare`` (the regression gate) and ``kvbench playbook`` (the rollout's stages)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from common.markup import console_text

from .console import console, emit_json, fail, json_stdout, os_error
from .options import command_group


def compare(
    baseline: Annotated[Path, typer.Argument(help="Baseline run directory (or a folder of run directories).")],
    current: Annotated[Path, typer.Argument(help="Current run directory (or a folder of run directories).")],
    threshold: Annotated[
        list[str] | None,
        typer.Option(
            "--threshold",
            "-t",
            help="Override a rule: alpha=, ttft= (max % median increase), ttft_ms=, error_rate=, hit_rate=.",
        ),
    ] = None,
    junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML here.")] = None,
    markdown: Annotated[Path | None, typer.Option("--markdown", help="Also write the Markdown summary here.")] = None,
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json", help="Write the comparison as JSON here; '--json -' prints it to stdout (the rest to stderr)."
        ),
    ] = None,
) -> None:
    """Regression gate: exit 0 = no regression, 1 = regression, 2 = cannot compare, 3 = INCONCLUSIVE."""
    from common.errors import KvbenchError
    from harness.gate.compare import compare_paths
    from reports.gate import render_json
    from reports.outputs import write_compare_outputs

    to_stdout = json_out == Path("-")
    files = {
        name: path
        for name, path in (("markdown", markdown), ("junit", junit), ("json", None if to_stdout else json_out))
        if path
    }
    with json_stdout(to_stdout):
        try:
            result = compare_paths(baseline, current, threshold or [])
            write_compare_outputs(result, files, console)
            emit_json(render_json(result))
        except KvbenchError as error:  # exit 2: cannot compare, whatever could not be read
            raise fail(str(error)) from None
        except OSError as error:
            raise fail(os_error(error)) from None
        raise typer.Exit(result.exit_code)


playbook_app = command_group("The rollout playbook: baseline, POC, staging, production, case study.")


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
        raise fail(f"{file} exists (use --force to overwrite)")
    save_playbook(starter_playbook(name, simulator=simulator), file)
    console.print(f"wrote {file}; next: kvbench playbook status {file}", highlight=False, markup=False)


@playbook_app.command("attach")
def playbook_attach(
    file: Annotated[Path, typer.Argument(help="Playbook file.")],
    stage: Annotated[str, typer.Argument(help="baseline, poc, staging, production")],
    run_dir: Annotated[Path, typer.Argument(help="Run (or soak, sweep) directory to attach.")],
) -> None:
    """Attach a run directory to a stage; its gate is judged on the stage's latest run."""
    from common.errors import KvbenchError
    from harness.gate.playbook import attach_run

    try:
        attach_run(file, stage, run_dir)
    except KvbenchError as error:
        raise fail(str(error)) from None
    console.print(f"attached {run_dir} to {stage}; see kvbench playbook status {file}", highlight=False, markup=False)


@playbook_app.command("status")
def playbook_status_cmd(
    file: Annotated[Path, typer.Argument(help="Playbook file.")],
) -> None:
    """Show every stage's gate, evidence and state, and what is next."""
    from rich.table import Table

    from common.errors import KvbenchError
    from harness.gate.playbook import playbook_status
    from reports.tables import print_table

    try:
        status = playbook_status(file)
    except KvbenchError as error:
        raise fail(str(error)) from None
    table = Table(title=f"Playbook: {console_text(status.name)}", show_lines=True)
    for column in ("Stage", "State", "Gate", "Evidence"):
        table.add_column(column)
    colors = {"done": "green", "failed": "red", "pending": "yellow"}
    for stage in status.stages:
        state = f"[{colors[stage.state]}]{stage.state.upper()}[/]"
        if stage.provenance in ("measured", "simulated"):  # a simulated gate is never rollout evidence
            state += f"\n[dim]{stage.provenance.upper()}[/]"
        table.add_row(console_text(stage.title), state, console_text(stage.gate), console_text(stage.evidence))
    print_table(console, table)
    console.print(f"Next: {status.next_step}", highlight=False, markup=False)
