"""``kvbench trace``: a trace's statistics and ceiling (``stats``), or a synthetic trace (``synth``).

Only typer and the CLI's console are imported at module level; the trace modules load inside the commands.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .console import fail
from .options import SetOption, command_group

if TYPE_CHECKING:
    from workloads.trace import TraceStats

trace_app = command_group(
    "Request traces: statistics and the infinite-cache ceiling; synthetic traces from a multi-user workload."
)


@trace_app.command()
def stats(
    file: Annotated[Path, typer.Argument(help="Trace file (JSON Lines).")],
    format: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="auto (from the first line), mooncake, kvbench, bailian, claude-code, tokens or text.",
        ),
    ] = "auto",
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (key infinite_cache_hit_rate, ...).")] = False,
    cache_tokens: Annotated[
        list[int] | None,
        typer.Option("--cache-tokens", help="Also the hit rate of an LRU prefix cache of N tokens (repeatable)."),
    ] = None,
    block_tokens: Annotated[
        int | None, typer.Option("--block-tokens", help="Tokens per hash id (default 512, or the kvbench header's).")
    ] = None,
    allow_gaps: Annotated[
        bool, typer.Option("--allow-gaps", help="Accept consecutive requests more than an hour apart.")
    ] = False,
    max_context: Annotated[
        int | None,
        typer.Option(
            "--max-context",
            help="Ceilings leave out calls longer than N tokens (an engine with max-model-len N refuses them).",
        ),
    ] = None,
    tier_tokens: Annotated[
        int | None, typer.Option("--tier-tokens", help="Also the LRU hit rate of a tier of N tokens (own block size).")
    ] = None,
) -> None:
    """Requests, duration, arrival rate, length percentiles, and the hit rate an infinite (or LRU) cache would get."""
    from rich.table import Table

    from reports.tables import print_table
    from workloads.trace import FORMAT_CHOICES, TraceError, load_trace, resolve_trace_path, trace_stats

    chosen = next((choice for choice in FORMAT_CHOICES if choice == format), None)
    if chosen is None:
        raise fail(f"--format {format!r}: allowed values are {', '.join(FORMAT_CHOICES)}")
    sizes = list(cache_tokens or [])
    if any(size < 1 for size in sizes):
        raise fail("--cache-tokens must be positive token counts")
    for flag, count in (("--max-context", max_context), ("--tier-tokens", tier_tokens)):
        if count is not None and count < 1:
            raise fail(f"{flag} {count}: must be a positive token count")
    try:
        trace = load_trace(resolve_trace_path(str(file)), chosen, block_tokens=block_tokens, allow_gaps=allow_gaps)
    except TraceError as error:
        raise fail(str(error)) from None
    result = trace_stats(trace, sizes, max_context=max_context, tier_tokens=tier_tokens)
    if json_out:
        data = dataclasses.asdict(result)
        data["lru_hit_rates"] = [{"cache_tokens": size, "hit_rate": rate} for size, rate in result.lru_hit_rates]
        own = result.ceilings.by_block[0] if result.ceilings and result.ceilings.by_block else None
        data["infinite_cache_block_hit_rate"] = None if own is None else own.block_hit_rate
        typer.echo(json.dumps(data, indent=2))
        return
    from .console import console

    def share(value: float | None) -> str:
        return "—" if value is None else f"{value * 100:.1f} %"

    table = Table(title=f"{file} ({result.format}, {result.block_tokens}-token blocks)", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    rate = "—" if result.mean_rate_rps is None else f"{result.mean_rate_rps:.2f} req/s"
    rows = [
        ("requests", str(result.requests)),
        ("sessions", "—" if result.sessions is None else str(result.sessions)),
        ("duration", f"{result.duration_s:.1f} s"),
        ("mean arrival rate", rate),
        ("input tokens p50 / p90 / p99 / max",
         f"{result.input_tokens.p50:.0f} / {result.input_tokens.p90:.0f} / {result.input_tokens.p99:.0f} / "
         f"{result.input_tokens.max:.0f}"),
        ("output tokens p50 / p90 / p99 / max",
         f"{result.output_tokens.p50:.0f} / {result.output_tokens.p90:.0f} / {result.output_tokens.p99:.0f} / "
         f"{result.output_tokens.max:.0f}"),
        ("prompt tokens in all", f"{result.prompt_tokens_total:,}"),
        ("distinct blocks", "—" if result.unique_blocks is None else f"{result.unique_blocks:,}"),
        ("infinite-cache hit rate", share(result.infinite_cache_hit_rate)),
        *((f"LRU cache of {size:,} tokens", share(hit)) for size, hit in result.lru_hit_rates),
        *_ceiling_rows(result, share),
    ]  # fmt: skip
    for name, value in rows:
        table.add_row(name, value)
    print_table(console, table)
    per_bucket = ", ".join(f"{value:.2f}" for value in result.rate_over_time)
    console.print(f"arrival rate per {result.rate_bucket_s:.0f} s bucket (req/s): {per_bucket}", highlight=False)


def _ceiling_rows(result: TraceStats, share: Callable[[float | None], str]) -> list[tuple[str, str]]:
    """The table's rows for the ceilings (with their assumptions) and the trace's shape."""
    rows: list[tuple[str, str]] = []
    ceilings, shape = result.ceilings, result.shape
    if ceilings is not None:
        cap = (
            "no context cap"
            if ceilings.max_context is None
            else (f"calls over {ceilings.max_context:,} tokens excluded ({ceilings.excluded_calls})")
        )
        rows.append(("ceiling from", f"{ceilings.basis}, {cap}"))
        for entry in ceilings.by_block:
            rows.append(
                (
                    f"infinite cache, {entry.block_tokens}-{ceilings.unit[:-1]} blocks: {ceilings.unit} / blocks",
                    f"{share(entry.token_hit_rate)} / {share(entry.block_hit_rate)}",
                )
            )
        if ceilings.tier_tokens is not None:
            rows.append((f"LRU tier of {ceilings.tier_tokens:,} {ceilings.unit}", share(ceilings.tier_hit_rate)))
    if shape is not None and shape.roots < shape.calls:
        rows.append(("roots / depth max / depth mean", f"{shape.roots} / {shape.depth_max} / {shape.depth_mean:.2f}"))
        rows.append(
            (
                "children per call mean / max; calls with 2+",
                f"{shape.children_mean:.2f} / {shape.children_max}; {shape.branching_calls}",
            )
        )
        rows.append(("subagent / side calls", f"{share(shape.subagent_share)} / {share(shape.side_share)}"))
        if shape.reuse_distance_s is not None and shape.reuse_distance_tokens is not None:
            rows.append(
                ("reuse distance p50 / p90 (s)", f"{shape.reuse_distance_s.p50:.1f} / {shape.reuse_distance_s.p90:.1f}")
            )
            rows.append(
                (
                    "reuse distance p50 / p90 (tokens between)",
                    f"{shape.reuse_distance_tokens.p50:,.0f} / {shape.reuse_distance_tokens.p90:,.0f}",
                )
            )
    return rows


@trace_app.command()
def synth(
    source: Annotated[
        str,
        typer.Argument(
            help="A scenario with workload kind multi_user_qa (file or bundled name), or a YAML "
            "file holding only such a workload mapping."
        ),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="The trace file to write (kvbench format).")],
    sessions: Annotated[int | None, typer.Option(help="Sessions to write (default: the workload's users).")] = None,
    session_rate: Annotated[float, typer.Option(help="Sessions started per second (Poisson).")] = 1.0,
    response_s: Annotated[
        float, typer.Option(help="Assumed seconds an answer takes, before the think time starts.")
    ] = 2.0,
    block_tokens: Annotated[int, typer.Option(help="Tokens per hash id.")] = 512,
    seed: Annotated[int | None, typer.Option(help="Seed (default: the scenario's, else 0).")] = None,
    sets: SetOption = None,
) -> None:
    """Write a multi-user QA workload as a kvbench trace, to inspect, share and replay exactly."""
    import yaml
    from pydantic import ValidationError

    from common.errors import KvbenchError
    from harness.scenario.spec import format_validation_error, load_scenario
    from workloads.config import MultiUserQA
    from workloads.trace_synth import SynthSpec, synthesize

    if output.is_dir():
        raise fail(f"--output {output}: is a directory; give the trace file to write")
    asked = SynthSpec(
        sessions=sessions or 1, session_rate=session_rate, response_s=response_s, block_tokens=block_tokens
    )
    if asked.problem() is not None:
        raise fail(str(asked.problem()))
    try:
        path = Path(source)
        data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
        if isinstance(data, dict) and data.get("kind") == "multi_user_qa":
            if sets:
                raise fail(f"{source}: a workload mapping, not a scenario; --set changes a scenario's fields")
            config = MultiUserQA.model_validate(data)
            chosen_seed = 0 if seed is None else seed
        else:
            scenario, _ = load_scenario(source, sets or ())
            config = scenario.load_workload
            chosen_seed = scenario.seed if seed is None else seed
    except ValidationError as error:
        raise fail(format_validation_error(source, error)) from None
    except (KvbenchError, OSError, yaml.YAMLError) as error:
        raise fail(str(error)) from None
    spec = SynthSpec(
        sessions=sessions or config.users, session_rate=session_rate, response_s=response_s, block_tokens=block_tokens
    )
    count = 0
    try:
        with output.open("w", encoding="utf-8") as handle:
            for line in synthesize(config, spec, seed=chosen_seed):
                handle.write(line + "\n")
                count += 1
    except OSError as error:
        raise fail(f"--output {output}: cannot write: {error.strerror or error}") from None
    typer.echo(f"wrote {output}: {count - 1} requests of {spec.sessions} sessions; "
               f"see kvbench trace stats {output} --format kvbench")  # fmt: skip
