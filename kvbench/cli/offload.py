"""``kvbench offload ...`` commands.

The main CLI mounts them with ``app.add_typer(offload_app, name="offload")``.
"""

from __future__ import annotations

import json
import math
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
import yaml
from rich.markup import escape
from rich.table import Table

from offload.probe import ProbeError, ProbeResult, format_size, free_bytes, parse_size, probe_path
from reports.tables import print_table

from .console import make_console
from .options import command_group

offload_app = command_group("KV-cache offload tools: measure a storage tier for an offload profile.")


class TierKindOption(StrEnum):
    cpu = "cpu"
    disk = "disk"
    shared = "shared"


@offload_app.callback()
def _offload() -> None:
    """KV-cache offload tools."""


@offload_app.command("probe")
def probe(
    path: Annotated[Path, typer.Argument(help="Directory to probe (a temporary file is written there).")],
    size: Annotated[str, typer.Option("--size", help="Bytes per pass, e.g. 1GiB, 512MiB, 2GB.")] = "1GiB",
    block: Annotated[str, typer.Option("--block", help="Bytes per read/write call, e.g. 4MiB.")] = "4MiB",
    passes: Annotated[int, typer.Option("--passes", min=1, help="Passes; the median is reported.")] = 3,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    direct: Annotated[
        bool | None,
        typer.Option(
            "--direct/--buffered",
            help="Require O_DIRECT, or force buffered I/O. Default: O_DIRECT where it works.",
            show_default=False,
        ),
    ] = None,
    kind: Annotated[
        TierKindOption, typer.Option("--kind", help="Tier kind for the profile snippet.")
    ] = TierKindOption.disk,
    capacity_gb: Annotated[
        float | None,
        typer.Option("--capacity-gb", min=0, help="Tier capacity for the snippet [default: free space]."),
    ] = None,
) -> None:
    """Measure sequential write and read GB/s of PATH and print an offload tier to paste."""
    try:
        size_bytes = parse_size(size)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--size") from exc
    try:
        block_bytes = parse_size(block)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--block") from exc

    err = make_console(stderr=True)
    try:
        with err.status(f"Probing {escape(str(path))} ...") as status, _sigterm_as_interrupt():
            result = probe_path(
                path,
                size_bytes,
                block_bytes,
                direct,
                passes=passes,
                on_progress=lambda line: status.update(escape(line)),
            )
        capacity = capacity_gb if capacity_gb else _default_capacity_gb(Path(result.path))
        tier = result.to_tier(kind.value, capacity)
    except (ProbeError, ValueError) as exc:
        err.print(f"[bold red]error:[/bold red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from exc

    out = make_console()
    tier_data = tier.model_dump(mode="json", exclude_none=True)
    if json_output:
        payload = json.dumps(result.model_dump(mode="json") | {"tier": tier_data}, indent=2)
        out.print(payload, markup=False, highlight=False, soft_wrap=True)
        return
    print_table(out, _result_table(result))
    out.print(
        f"mode [bold]{result.mode}[/bold], {format_size(result.size)} per pass in "
        f"{format_size(result.block)} blocks, {result.passes} passes, median reported; GB = 1e9 bytes"
    )
    if result.note:
        out.print(f"[yellow]note:[/yellow] {escape(result.note)}")
    snippet = yaml.safe_dump({"tiers": [tier_data]}, sort_keys=False, default_flow_style=False)
    out.print("\nMeasured tier, for the [bold]tiers:[/bold] list of an inline offload profile:")
    out.print(snippet.rstrip(), markup=False, highlight=False, soft_wrap=True)


def _result_table(result: ProbeResult) -> Table:
    table = Table(title=f"Storage probe: {escape(result.path)}", show_header=True)
    table.add_column("direction")
    table.add_column("median GB/s", justify="right")
    table.add_column("passes (GB/s)", justify="right")
    table.add_row("write (+fsync)", f"{result.write_gbps:.3f}", _samples(result.write_samples_gbps))
    table.add_row("read", f"{result.read_gbps:.3f}", _samples(result.read_samples_gbps))
    return table


def _samples(values: tuple[float, ...]) -> str:
    return ", ".join(f"{v:.3f}" for v in values)


def _default_capacity_gb(path: Path) -> float:
    """Free space of the probed filesystem in whole GB (at least 1)."""
    return float(max(math.floor(free_bytes(path) / 1e9), 1))


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt while probing, so the probe file is still removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
