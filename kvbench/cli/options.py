"""Options several commands share, defined once: ``--set`` (scenario overrides), ``--json`` (result on stdout),
``--output-dir`` (where a run directory goes), ``--shard`` and ``--start-at`` (one shard of a run:
:mod:`harness.runs.shard`), ``--ray`` and ``--workers`` (a sweep's shards on Ray); and how every command group
(``kvbench``, ``kvbench sim`` ...) is made (:func:`command_group`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="PATH=VALUE",
        help="Change one scenario field before validation (repeatable), the value read as YAML: "
        "--set workload.conversations=4 --set arms.1.name=ON --set engine.extra_args='[--enforce-eager]'.",
    ),
]
"""``--set dotted.path=value`` (:mod:`harness.scenario.overrides`)."""

JsonFlag = Annotated[
    bool,
    typer.Option("--json", help="Print the result file (JSON) to stdout; progress, tables and notes go to stderr."),
]
"""``--json``: the command's result file on stdout, nothing else (:func:`kvbench.cli.console.json_stdout`)."""


OutputDirOption = Annotated[
    Path | None,
    typer.Option("--output-dir", "-o", help="Parent of the run directory (default: scenario)."),
]
"""``--output-dir``: the folder a new run directory is made in (without it: the scenario's ``output.dir``)."""


def command_group(help: str, *, name: str | None = None) -> typer.Typer:
    """A command group: its help without arguments, no shell-completion commands, and errors as kvbench's own
    one-line messages rather than typer's boxed tracebacks."""
    return typer.Typer(
        name=name,
        help=help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )


ShardOption = Annotated[
    str | None,
    typer.Option(
        "--shard",
        metavar="I/N",
        help="Run shard I of N (0-based: 0/2 and 1/2): its part of the users, sessions or trace conversations; "
        "kvbench merge unites the shards' run directories.",
    ),
]
"""``--shard I/N`` (:class:`harness.runs.shard.Shard`)."""

StartAtOption = Annotated[
    str | None,
    typer.Option(
        "--start-at",
        metavar="TIME",
        help="Start the first load point at this wall-clock time (ISO 8601 UTC such as 2026-12-02T06:00:00Z, or "
        "Unix seconds), each later point on the scenario's fixed schedule, so shards start together.",
    ),
]
"""``--start-at TIME`` (:func:`harness.runs.shard.parse_start_at`)."""

RayOption = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="ADDRESS",
        help="Run the sweep's shards as Ray actors and merge them into one run directory: 'local' (a Ray cluster "
        "started and stopped here), 'auto' (the cluster this node belongs to) or a Ray address (pip install "
        "'kvbench[ray]').",
    ),
]
"""``--ray ADDRESS`` (:mod:`harness.runs.ray_shards`)."""

WorkersOption = Annotated[
    int | None,
    typer.Option("--workers", metavar="N", help="With --ray: the number of shards, one Ray actor (one CPU) each."),
]
"""``--workers N`` with ``--ray``."""
