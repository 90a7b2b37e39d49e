"""The kvbench command line: parse, call the harness, then reports. Nothing else lives here.

One module per command group: :mod:`.runs` (run, sweep, soak, report), :mod:`.gate` (compare,
playbook), :mod:`.scenarios` (validate, scenarios), :mod:`.sim`, :mod:`.model`, :mod:`.offload`.
Heavy modules (pandas, aiohttp, engines) are imported inside the commands so ``kvbench --help``
stays fast.
"""

from __future__ import annotations

from typing import Annotated

import typer

from kvbench import __version__

from . import gate, runs, scenarios
from .console import console
from .model import model_app
from .offload import offload_app
from .sim import sim_app

app = typer.Typer(
    name="kvbench",
    help="Benchmark KV-cache offloading: turn-1/turn-2 TTFT with the offload layer ON vs OFF.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback(invoke_without_command=True)
def main(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        console.print(f"kvbench {__version__}")
        raise typer.Exit(0)


for command in (runs.run, scenarios.validate, runs.report, runs.soak, gate.compare, runs.sweep, scenarios.scenarios):
    app.command()(command)
app.add_typer(sim_app, name="sim", help="The built-in engine simulator.")
app.add_typer(model_app, name="model", help="Hub-free model directories for dummy-weight runs.")
app.add_typer(offload_app, name="offload", help="Offload tiers: probe a storage path.")
app.add_typer(gate.playbook_app, name="playbook", help="The rollout playbook: where the team stands, what is next.")
