"""``kvbench model ...`` commands: hub-free model directories for ``--load-format dummy`` engines.

The main CLI mounts them with ``app.add_typer(model_app, name="model")``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from harness.engines.modeldir import shape_config, shape_names, synthesize_model_dir

from .options import command_group

model_app = command_group(
    "Model directories without downloads: config.json of a known shape plus a locally built tokenizer."
)


@model_app.callback()
def _model() -> None:
    """Model directories for engines started with --load-format dummy."""


@model_app.command("synth")
def synth(
    directory: Annotated[Path, typer.Argument(help="Directory to write (created; must be empty).")],
    shape: Annotated[str, typer.Option("--shape", help=f"Model shape: {', '.join(shape_names())}.")] = "tiny",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the files of an existing model.")] = False,
) -> None:
    """Write config.json, generation_config.json, tokenizer.json and tokenizer_config.json for SHAPE."""
    console = Console(soft_wrap=True)
    if shape not in shape_names():
        console.print(f"[red]unknown shape {escape(shape)!r}[/red]; known shapes: {', '.join(shape_names())}")
        raise typer.Exit(2)
    try:
        out = synthesize_model_dir(shape, directory, overwrite=overwrite)
    except (FileExistsError, OSError) as error:
        console.print(f"[red]{escape(str(error))}[/red]")
        raise typer.Exit(1) from None
    info = json.loads((out / "kvbench-model.json").read_text(encoding="utf-8"))
    config = shape_config(shape)
    console.print(
        f"wrote {escape(str(out))}: {shape} ({config['num_hidden_layers']} layers, hidden {config['hidden_size']}, "
        f"vocab {config['vocab_size']}; tokenizer vocab {info['tokenizer_vocab_size']}); "
        "start the engine with --load-format dummy"
    )


@model_app.command("shapes")
def shapes() -> None:
    """List the known model shapes."""
    console = Console(soft_wrap=True)
    for name in shape_names():
        config = shape_config(name)
        console.print(
            f"{name}: {config['architectures'][0]}, {config['num_hidden_layers']} layers, "
            f"hidden {config['hidden_size']}, heads {config['num_attention_heads']}/{config['num_key_value_heads']}, "
            f"max positions {config['max_position_embeddings']}"
        )
