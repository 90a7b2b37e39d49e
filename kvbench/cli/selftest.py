"""``kvbench selftest client``: the latency kvbench's own client adds, against a server with a known latency.

Only typer and the CLI's console are imported at module level; the load runner and the server load inside the
command (see :mod:`harness.runs.selftest` for what is measured and each formula).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from .console import console, fail, os_error

selftest_app = typer.Typer(
    help="Measure kvbench itself: the latency its client adds.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _counts(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise fail(f"{option}: {text!r} is not a comma-separated list of whole numbers >= 1 (e.g. 200,1000)")
    return values


def _ms(value: float | None, fmt: str = ".2f") -> str:
    return "—" if value is None else format(value, fmt)


@selftest_app.command()
def client(
    streams: Annotated[
        str, typer.Option("--streams", help="Streams (requests in flight) per level, comma-separated.")
    ] = "200,1000",
    workers: Annotated[
        str,
        typer.Option("--workers", help="Client worker processes, comma-separated; every streams × workers pair runs."),
    ] = "1",
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", min=16, help="Prompt length (tokens).")] = 32000,
    output_tokens: Annotated[int, typer.Option("--output-tokens", min=2, help="Tokens per answer.")] = 16,
    ttft_ms: Annotated[float, typer.Option("--ttft-ms", min=0, help="The server's time to first token.")] = 200.0,
    itl_ms: Annotated[float, typer.Option("--itl-ms", min=0, help="The server's gap between tokens.")] = 50.0,
    warmup: Annotated[float, typer.Option("--warmup", min=0, help="Unmeasured seconds per level.")] = 3.0,
    duration: Annotated[float, typer.Option("--duration", min=0.5, help="Measured seconds per level.")] = 5.0,
    server_workers: Annotated[
        int, typer.Option("--server-workers", min=1, help="Fixed-latency server processes (one port).")
    ] = 1,
    no_uvloop: Annotated[bool, typer.Option("--no-uvloop", help="Plain asyncio loops, client and server.")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures here (JSON).")] = None,
) -> None:
    """Drive a fixed-latency server on 127.0.0.1 and report the TTFT and ITL the client adds (measured − known)."""
    from rich.table import Table

    from harness.runs.progress import progress_for
    from harness.runs.selftest import Level, LevelResult, fixed_server, measure_level
    from reports.tables import print_table

    levels = [
        Level(
            streams=s,
            workers=w,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            warmup_s=warmup,
            duration_s=duration,
            use_uvloop=not no_uvloop,
        )
        for w in _counts(workers, "--workers")
        for s in _counts(streams, "--streams")
    ]
    results: list[LevelResult] = []
    with contextlib.ExitStack() as stack, progress_for(console) as progress:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvbench-selftest-")))
        progress.start(len(levels), 0, "levels")
        progress.describe(f"starting the fixed-latency server ({server_workers} process(es))")
        try:
            server = stack.enter_context(
                fixed_server(ttft_ms, itl_ms, work, workers=server_workers, use_uvloop=not no_uvloop)
            )
        except RuntimeError as error:
            raise fail(str(error)) from error
        for level in levels:
            label = f"{level.streams} streams × {level.workers} worker(s)"
            progress.describe(f"{label}: building prompts of about {level.prompt_tokens} tokens")
            total = level.warmup_s + level.duration_s
            progress.begin_step(label, total)
            started = time.monotonic_ns()

            def on_tick(now_ns: int, started: int = started, total: float = total) -> None:
                progress.tick(min((now_ns - started) / 1e9, total), "")

            result = measure_level(server, work, level, ttft_ms, itl_ms, on_tick)
            results.append(result)
            progress.end_step()
            progress.advance(
                f"{label}: added TTFT p99 {_ms(result.added_ttft.p99)} ms, {result.requests_per_s:.0f} req/s"
            )
    table = Table(
        title=f"Latency the client adds: measured − known (TTFT {ttft_ms:g} ms, ITL {itl_ms:g} ms), ms",
        caption=f"{machine()}; server: {server_workers} process(es), client uvloop {'off' if no_uvloop else 'on'}",
    )
    columns = (
        "streams",
        "workers",
        "prompt tok",
        "req/s",
        "errors",
        "+TTFT p50",
        "+TTFT p99",
        "+TTFT max",
        "+ITL p50",
        "+ITL p99",
        "server late p99",
        "client cores",
        "streams/core",
        "req/s/core",
        "loop delay p99",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            str(r.streams),
            str(r.workers),
            str(r.prompt_tokens),
            f"{r.requests_per_s:.0f}",
            str(r.errors),
            _ms(r.added_ttft.p50),
            _ms(r.added_ttft.p99),
            _ms(r.added_ttft.max),
            _ms(r.added_itl.p50),
            _ms(r.added_itl.p99),
            _ms(r.server_late.p99),
            _ms(r.client_cores),
            _ms(r.streams_per_core, ".0f"),
            _ms(r.requests_per_s_per_core, ".0f"),
            _ms(r.loop_delay_p99_ms),
        )
    print_table(console, table)
    console.print(
        "+TTFT includes the server's own lateness (server late: first token written − due, its log); on a machine "
        "the server shares with the client, read the two together.",
        highlight=False,
        markup=False,
    )
    if json_out is not None:
        figures = {"machine": machine(), "levels": [dataclasses.asdict(r) for r in results]}
        try:
            json_out.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        except OSError as error:
            raise fail(os_error(error)) from error


def machine() -> str:
    """The machine in words: CPUs and their model (Linux's /proc/cpuinfo, else the platform's word)."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} CPUs ({model})"
