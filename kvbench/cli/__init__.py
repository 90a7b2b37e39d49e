"""The kvbench command line: parse, call the harness, then reports. Nothing else lives here.

One module per command group: :mod:`.runs` (run, sweep, soak, replay, report, merge), :mod:`.gate` (compare,
playbook), :mod:`.scenarios` (validate, scenarios), :mod:`.schema`, :mod:`.sim`, :mod:`.trace`, :mod:`.model`,
:mod:`.offload`, :mod:`.selftest`; options several commands share are defined once in :mod:`.options`.
Heavy modules (pandas, aiohttp, engines) are imported inside the commands so ``kvbench --help``
stays fast.
"""

from __future__ import annotations

from typing import Annotated

import typer

from kvbench import __version__

from . import gate, runs, scenarios, schema
from .console import console
from .model import model_app
from .offload import offload_app
from .options import command_group
from .selftest import selftest_app
from .sim import sim_app
from .trace import trace_app

app = command_group(
    "Benchmark KV-cache offloading: turn-1/turn-2 TTFT with the offload layer ON vs OFF.", name="kvbench"
)


@app.callback(invoke_without_command=True)
def main(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        console.print(f"kvbench {__version__}")
        raise typer.Exit(0)


COMMANDS = (
    runs.run, runs.sweep, runs.soak, runs.replay, runs.report, runs.merge, runs.versus, gate.compare,
    scenarios.validate, scenarios.scenarios, schema.schema,
)  # fmt: skip
for command in COMMANDS:
    app.command()(command)
app.add_typer(sim_app, name="sim", help="The built-in engine simulator.")
app.add_typer(model_app, name="model", help="Hub-free model directories for dummy-weight runs.")
app.add_typer(offload_app, name="offload", help="Offload tiers: probe a storage path.")
app.add_typer(gate.playbook_app, name="playbook", help="The rollout playbook: where the team stands, what is next.")
app.add_typer(trace_app, name="trace", help="Request traces: stats (the cache ceiling) and synth.")
app.add_typer(selftest_app, name="selftest", help="Measure kvbench itself: the latency its client adds.")
