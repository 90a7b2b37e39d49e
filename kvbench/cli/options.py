"""Options several commands share, defined once: ``--set`` (scenario overrides), ``--json`` (result on stdout)."""

from __future__ import annotations

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
