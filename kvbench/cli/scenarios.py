"""``kvbench validate`` and ``kvbench scenarios``: check scenario files, list the bundled ones."""

from __future__ import annotations

from typing import Annotated

import typer

from common.markup import console_text

from .console import console, err_console
from .options import SetOption


def validate(
    files: Annotated[list[str], typer.Argument(help="Scenario files or bundled names.")],
    sets: SetOption = None,
) -> None:
    """Check scenario files without running anything (with ${VAR} expanded and each --set applied)."""
    from common.errors import ScenarioError
    from harness.scenario.spec import load_scenario

    failed = 0
    for ref in files:
        try:
            scenario, path = load_scenario(ref, sets or ())
        except ScenarioError as error:
            err_console.print(f"[red]✗[/] {console_text(error)}", highlight=False)
            failed += 1
        else:
            shown = console_text(f"{path}: {scenario.name} ({len(scenario.arms)} arms)")
            console.print(f"[green]✓[/] {shown}", highlight=False)
    if failed:
        raise typer.Exit(2)


def scenarios() -> None:
    """List the scenarios bundled with kvbench: name and what each measures (run one with `kvbench run NAME`)."""
    from harness.scenario.spec import bundled_scenarios, load_scenario

    bundled = sorted(bundled_scenarios().items())
    width = max((len(name) for name, _ in bundled), default=0)
    for name, path in bundled:
        scenario, _ = load_scenario(path)
        console.print(f"{name:{width}s}  {scenario.description}", highlight=False, markup=False)
