"""``kvbench schema [NAME]``: the JSON Schema of a file kvbench stores, or the list of them."""

from __future__ import annotations

from typing import Annotated

import typer

from .console import console, fail


def schema(
    name: Annotated[
        str | None,
        typer.Argument(help="A stored file's schema name (records, manifest, summary, ...); none: list them."),
    ] = None,
) -> None:
    """Print the JSON Schema of a stored file (records, manifest, summary, sweep, soak, replay, fleet, calibration,
    ...), generated from the models kvbench reads it with; without NAME, list the names."""
    from harness.results.file_schemas import STORED_FILES, shipped

    if name is None:
        width = max(len(row) for row in STORED_FILES)
        for row in STORED_FILES.values():
            lines = " (a line)" if row.lines else ""
            console.print(f"{row.name:{width}s}  {row.file}{lines}: {row.what}", highlight=False, markup=False)
        return
    if name not in STORED_FILES:
        raise fail(f"schema {name!r}: no such stored file; allowed: {', '.join(STORED_FILES)}")
    # the shipped text, byte for byte: a test keeps it equal to what the models generate
    typer.echo(shipped(name), nl=False)
