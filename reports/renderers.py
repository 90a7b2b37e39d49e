"""A probe's reports (``summary.json`` and the manifest alone): the console view and the files of its ``files`` output.

The output registry (:mod:`reports.outputs`) writes every file of :data:`PROBE_FILES` as the probe's
``files`` output: ``ttft_table.md``, ``ttft.csv`` and, when the run has them, the engine's timing,
LMCache's timeline and ranks, and the medians per pass. A new probe file is one more writer there.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from common.csvfile import write_csv_rows
from common.markup import console_text, md_text
from harness.results.lmcache_log import RANK_MIN_TOKENS
from harness.results.provenance import provenance
from harness.results.run_result import SETTLE_WARN, RunResult
from harness.results.verdict import Validity
from harness.store.manifest import prompt_salt_of

from .tables import print_table, text_table
from .ttft_table import (
    LMCACHE_HEADER,
    RANK_HEADER,
    TIMING_HEADER,
    SplitRow,
    endpoint_lines,
    lmcache_rows,
    pass_header,
    pass_rows,
    rank_rows,
    rows,
    settle_line,
    timing_rows,
)

Renderer = Callable[[RunResult, dict[str, Any], Path], Path | None]
"""Writes one output file and returns its path; None when the result holds nothing for it."""


def _setup_line(result: RunResult, manifest: dict[str, Any]) -> str:
    engine = manifest.get("scenario", {}).get("engine", {})
    bits = [str(provenance(manifest)), f"engine={engine.get('kind', '?')}"]
    for key in ("model", "hardware"):
        if engine.get(key):
            bits.append(f"{key}={engine[key]}")
    gpus = manifest.get("host", {}).get("gpus") or []
    if gpus:
        bits.append(f"gpu={gpus[0].get('name')}")
    bits.append(f"repetitions={result.repetitions}")
    return ", ".join(bits)


def fixed_prompts_line(manifest: dict[str, Any]) -> str | None:
    """The line a run with fixed prompts gets (a warm start measured on purpose); None for a salted or older run."""
    salting, _ = prompt_salt_of(manifest)
    if salting != "fixed":
        return None
    return (
        "Prompts fixed (workload.prompt_salt: fixed): the same on every run, so turn 1 may be served from KV an "
        "earlier run left (a warm start); the turn-1 hit check does not apply."
    )


def stream_lines(result: RunResult) -> tuple[str | None, list[str]]:
    """The streaming check: one summary line (None for summaries without it) and its warnings."""
    check = result.stream
    if check is None or check.ratio is None:
        return None, []
    line = (
        f"Streaming check: {check.text_chunks} text-bearing chunks for {check.completion_tokens} generated tokens "
        f"({check.ratio:.3f} per token) over {check.requests} measured requests"
    )
    if check.late_text is not None:
        line += f"; {check.late_text} requests with an empty token chunk before their first text"
    return line + ".", list(check.warnings)


def console_table(result: RunResult, manifest: dict[str, Any]) -> Table:
    cols, body = rows(result)
    table = Table(
        title=f"{console_text(result.scenario_name)} — median TTFT (ms)",
        caption=console_text(
            f"{_setup_line(result, manifest)}; % diff = (baseline / arm − 1) × 100, baseline = {result.baseline_arm}"
        ),
    )
    for index, column in enumerate(cols):
        table.add_column(console_text(column.title), justify="right", style="bold" if index == 0 else None)
    for line in body:
        table.add_row(*line)
    return table


VERDICT_TITLES = {"valid": "VALID", "failed": "FAILED", "inconclusive": "INCONCLUSIVE"}


def validity_lines(validity: Validity | None) -> list[str]:
    """The verdict and why, as plain text lines (empty for a valid run or one judged before the gates)."""
    if validity is None or validity.verdict == "valid":
        return []
    client_only = bool(validity.findings) and all(f.gate == "client_limited" for f in validity.findings)
    what = {
        "failed": "the run did not measure: too many requests failed",
        "inconclusive": "the client fell behind its own schedule, so the latencies include its backlog"
        if client_only
        else "the engine's counters show turn 2 did not measure what the scenario claims",
    }[validity.verdict]
    lines = [f"Verdict: {VERDICT_TITLES[validity.verdict]} (exit {validity.exit_code}) -- {what}"]
    return lines + [f"- {finding.message}" for finding in validity.findings]


def print_validity(validity: Validity | None, out: Console) -> None:
    lines = validity_lines(validity)
    if lines:
        color = "red" if validity is not None and validity.verdict == "failed" else "yellow"
        out.print(f"[bold {color}]{escape(lines[0])}[/]", highlight=False)
        for line in lines[1:]:
            out.print(f"  {escape(line)}", highlight=False)


def print_console(result: RunResult, manifest: dict[str, Any], console: Console | None = None) -> None:
    out = console or Console()
    print_table(out, console_table(result, manifest))
    counts = result.requests
    if counts.errors:
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(counts.errors_by_kind.items()))
        out.print(escape(f"{counts.errors} of {counts.measured} measured requests failed ({kinds})"), style="yellow")
    line, warnings = stream_lines(result)
    if line is not None:
        out.print(line, markup=False)
    for warning in warnings:
        out.print(escape(f"warning: {warning}"), style="yellow")
    settle, unsettled = settle_line(result)
    if settle is not None:
        out.print(escape(settle), style="yellow" if unsettled else None, highlight=False)
    for note in endpoint_lines(result):
        out.print(escape(note), style="yellow", highlight=False)
    fixed = fixed_prompts_line(manifest)
    if fixed is not None:
        out.print(escape(fixed), style="yellow", highlight=False)
    sections = (
        (
            "Where TTFT goes (ms, mean per request; engine /metrics)",
            TIMING_HEADER,
            [r.texts() for r in timing_rows(result)],
            1,
        ),
        (
            "LMCache's timeline (ms, median per request; its log)",
            LMCACHE_HEADER,
            [r.texts() for r in lmcache_rows(result)],
            1,
        ),
        (f"LMCache's ranks (loads of {RANK_MIN_TOKENS:,} tokens or more; its log)", RANK_HEADER, rank_rows(result), 2),
    )
    for title, header, body, text_columns in sections:
        if body:
            print_table(out, text_table(Table(title=title), header, body, text_columns=text_columns))
    print_validity(result.validity, out)
    if not result.complete:
        out.print("[yellow]The run is incomplete: resume it with `kvbench run --resume RUN_DIR`.[/]")


def markdown_table(result: RunResult) -> str:
    cols, body = rows(result)
    header = "| " + " | ".join(md_text(c.title) for c in cols) + " |"
    rule = "|" + "|".join("---:" for _ in cols) + "|"
    lines = [header, rule] + ["| " + " | ".join(line) + " |" for line in body]
    return "\n".join(lines) + "\n"


def write_markdown(result: RunResult, manifest: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / "ttft_table.md"
    text = [
        f"# {md_text(result.scenario_name)}",
        "",
        f"Median TTFT in ms over {result.repetitions} repetition(s) × the conversations per length; "
        f"{md_text(_setup_line(result, manifest))}.",
        f"`% diff` = (baseline / arm − 1) × 100 with baseline {md_text(result.baseline_arm)}; "
        "hit % = share of turn-2 prompt tokens served from a cache (engine /metrics).",
        "",
        markdown_table(result),
    ]
    verdict = validity_lines(result.validity)
    if verdict:
        text += [f"**{verdict[0]}**", "", *verdict[1:], ""]
    line, warnings = stream_lines(result)
    if line is not None:
        text.append(line)
        text.extend(f"\n**Warning:** {warning}." for warning in warnings)
        text.append("")
    text.extend(f"{md_text(note)}\n" for note in endpoint_lines(result))
    fixed = fixed_prompts_line(manifest)
    if fixed is not None:
        text.append(f"{md_text(fixed)}\n")
    sections = (
        answer_markdown(result),
        timing_markdown(result),
        lmcache_markdown(result),
        ranks_markdown(result),
        passes_markdown(result),
    )
    for section in sections:
        if section:
            text += [section, ""]
    path.write_text("\n".join(text), encoding="utf-8")
    return path


TIMING_NOTE = (
    "Means per request in ms. Engine TTFT, queue and prefill are the engine's own per-request histograms "
    "(/metrics, Δ sum ÷ Δ count over each cell's groups; vLLM 0.26 starts its clock when its renderer takes a chat "
    "request, before the chat template and tokenizing); outside the engine = client mean TTFT − engine TTFT (HTTP, "
    "the server's parsing of the request body, the stream back); engine TTFT − queue − prefill = the request's way "
    "into the engine core (template, tokenizing, hand-over, block hashing) and the first token's way back."
)


LMCACHE_NOTE = (
    "From LMCache's own log lines beside the client's records (medians per request, ms): before the lookup = sent "
    "→ the scheduler's LMCache lookup logged (HTTP, rendering, tokenizing, the engine's intake, the lookup), relative "
    "to the arm's fastest request; lookup to KV loaded = → the last worker's \"Retrieved\" line (with tensor "
    "parallelism the forward waits for every rank's load), of which LMCache's retrieve is that slowest rank's own "
    "timing and ranks' spread how long after the first rank it finished; after the load = the rest (the new tokens' "
    "prefill, the first token back). LMCache's store = its own time storing the request's new KV to the tier (its "
    "\"Stored\" lines, the slowest rank's sum over the prefill's chunks): part of the prefill, not one more slice; a "
    "turn 2 stores only the tokens past its hit's last whole chunk."
)


RANK_NOTE = (
    f"Each worker (TP rank) logs its own load of its share of the KV; over the arm's loads of {RANK_MIN_TOKENS:,} "
    "tokens or more: its rate (LMCache's logged size over its logged cost, GB/s as LMCache counts them, per rank) "
    "and in how many loads with several ranks it took the longest (the forward after a load waits for that rank)."
)


def _markdown_section(title: str, note: str, header: tuple[str, ...], body: list[list[str]]) -> str:
    if not body:
        return ""
    lines = [f"## {title}", "", note, "", "| " + " | ".join(md_text(h) for h in header) + " |"]
    lines.append("|---|" + "|".join("---:" for _ in header[1:]) + "|")
    lines += ["| " + " | ".join(md_text(text) for text in row) + " |" for row in body]
    return "\n".join(lines)


ANSWER_NOTE = (
    "A reasoning model streamed reasoning before its answer. TTFT above is the first token of any kind (the "
    "engine's first token, what prefill and the offload tier decide); here is the time to the first answer "
    "token (content), median ms, where a cell had reasoning first."
)


def answer_markdown(result: RunResult) -> str:
    """The "Time to first answer token" section ("" unless a reasoning model streamed reasoning first)."""
    rows = [
        [
            cell.arm,
            f"{cell.context_tokens}",
            f"{cell.turn}",
            f"{cell.ttft.median_ms:.3f}",
            f"{cell.answer.median_ms:.3f}",
        ]
        for cell in result.cells
        if cell.answer is not None and cell.ttft is not None
    ]
    header = ("Arm", "Tokens", "Turn", "TTFT (first token)", "first answer token")
    return _markdown_section("Time to first answer token", ANSWER_NOTE, header, rows)


def timing_markdown(result: RunResult) -> str:
    """The "Where TTFT goes" section ("" when the engine exposed no per-request histograms)."""
    return _markdown_section("Where TTFT goes", TIMING_NOTE, TIMING_HEADER, [r.texts() for r in timing_rows(result)])


def lmcache_markdown(result: RunResult) -> str:
    """The LMCache timeline section ("" when no arm's log had LMCache's lookup lines)."""
    body = [r.texts() for r in lmcache_rows(result)]
    return _markdown_section("LMCache's timeline (its log)", LMCACHE_NOTE, LMCACHE_HEADER, body)


def ranks_markdown(result: RunResult) -> str:
    """The LMCache ranks section ("" when no arm's log had loads that large)."""
    return _markdown_section("LMCache's ranks (its log)", RANK_NOTE, RANK_HEADER, rank_rows(result))


PASS_NOTE = (
    "Median TTFT in ms of each cell's successful requests over its first k passes (repetitions), k = 1 … the passes "
    "run; the last pass's move = the median after all passes ÷ the median after one pass fewer − 1. A cell the last "
    "pass still moved by more than {warn:.0%} has not settled: more passes would move it."
)


def passes_markdown(result: RunResult) -> str:
    """The "Do the medians settle?" section ("" for a run of one pass)."""
    line, _ = settle_line(result)
    note = PASS_NOTE.format(warn=SETTLE_WARN) + (f" {line}" if line else "")
    return _markdown_section("Do the medians settle? (passes)", note, pass_header(result), pass_rows(result))


def write_csv(result: RunResult, manifest: dict[str, Any], out_dir: Path) -> Path:
    """Long format: one line per (arm, context length, turn) with the full distribution."""
    path = out_dir / "ttft.csv"
    fields = [
        "arm",
        "context_tokens",
        "turn",
        "n",
        "errors",
        "ttft_median_ms",
        "ttft_p90_ms",
        "ttft_mean_ms",
        "ttft_min_ms",
        "ttft_max_ms",
        "prompt_tokens_median",
        "cached_tokens_median",
        "pct_diff_vs_baseline",
        "baseline",
        "gpu_hit_rate",
        "external_hit_rate",
        "hit_rate",
        "provenance",
    ]
    origin = str(provenance(manifest))
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for cell in result.cells:
            stats = result.cache_stats(cell.arm, cell.context_tokens, cell.turn)
            ttft = cell.ttft
            writer.writerow(
                {
                    "arm": cell.arm,
                    "context_tokens": cell.context_tokens,
                    "turn": cell.turn,
                    "n": ttft.n if ttft else 0,
                    "errors": cell.errors,
                    "ttft_median_ms": ttft.median_ms if ttft else "",
                    "ttft_p90_ms": ttft.p90_ms if ttft else "",
                    "ttft_mean_ms": ttft.mean_ms if ttft else "",
                    "ttft_min_ms": ttft.min_ms if ttft else "",
                    "ttft_max_ms": ttft.max_ms if ttft else "",
                    "prompt_tokens_median": _blank(cell.prompt_tokens_median),
                    "cached_tokens_median": _blank(cell.cached_tokens_median),
                    "pct_diff_vs_baseline": _blank(result.diff(cell.arm, cell.context_tokens, cell.turn)),
                    "baseline": result.baseline_arm,
                    "gpu_hit_rate": _blank(stats.gpu_hit_rate if stats else None),
                    "external_hit_rate": _blank(stats.external_hit_rate if stats else None),
                    "hit_rate": _blank(stats.hit_rate if stats else None),
                    "provenance": origin,
                }
            )
    return path


def _write_rows(path: Path, header: list[str], body: Iterable[Sequence[object]], manifest: dict[str, Any]) -> Path:
    """A CSV file of ``header`` and ``body`` with the run's provenance as the last column of every line."""
    origin = str(provenance(manifest))
    write_csv_rows(path, [*header, "provenance"], ([*row, origin] for row in body))
    return path


def _write_split_csv(path: Path, time_fields: list[str], body: list[SplitRow], manifest: dict[str, Any]) -> Path:
    rows = ([row.arm, row.context_tokens, row.turn, row.requests, *map(_blank, row.times)] for row in body)
    return _write_rows(path, ["arm", "context_tokens", "turn", "requests", *time_fields], rows, manifest)


def write_timing_csv(result: RunResult, manifest: dict[str, Any], out_dir: Path) -> Path | None:
    """One line per cell with the engine's own timing (no file when the engine exposed none)."""
    body = timing_rows(result)
    fields = ["client_ttft_mean_ms", "engine_ttft_mean_ms", "outside_engine_ms", "queue_mean_ms", "prefill_mean_ms"]
    return _write_split_csv(out_dir / "engine_timing.csv", fields, body, manifest) if body else None


def write_lmcache_csv(result: RunResult, manifest: dict[str, Any], out_dir: Path) -> Path | None:
    """One line per cell with LMCache's log timeline (no file when no arm's log had it)."""
    body = lmcache_rows(result)
    fields = [
        "ttft_median_ms",
        "before_lookup_ms",
        "lookup_to_loaded_ms",
        "lmcache_retrieve_ms",
        "rank_spread_ms",
        "after_load_ms",
        "lmcache_store_ms",
    ]
    return _write_split_csv(out_dir / "lmcache_timeline.csv", fields, body, manifest) if body else None


def write_ranks_csv(result: RunResult, manifest: dict[str, Any], out_dir: Path) -> Path | None:
    """One line per arm and worker with LMCache's load rates (no file when no arm's log had them)."""
    if not result.lmcache_ranks:
        return None
    header = ["arm", "worker", "loads", "median_gbps", "min_gbps", "slowest_loads"]
    rows = ([r.arm, r.worker, r.loads, r.median_gbps, r.min_gbps, r.slowest_loads] for r in result.lmcache_ranks)
    return _write_rows(out_dir / "lmcache_ranks.csv", header, rows, manifest)


def write_passes_csv(result: RunResult, manifest: dict[str, Any], out_dir: Path) -> Path | None:
    """Long format, one line per cell and pass count k: the median over its first k passes (no file with one
    pass)."""
    if not result.pass_medians:
        return None
    header = ["arm", "context_tokens", "turn", "passes", "ttft_median_ms"]
    rows = (
        [cell.arm, cell.context_tokens, cell.turn, passes, median]
        for cell in result.pass_medians
        for passes, median in enumerate(cell.medians_ms, start=1)
    )
    return _write_rows(out_dir / "pass_medians.csv", header, rows, manifest)


def _blank(value: float | None) -> float | str:
    return "" if value is None else value


PROBE_FILES: tuple[Renderer, ...] = (
    write_markdown,
    write_csv,
    write_timing_csv,
    write_lmcache_csv,
    write_ranks_csv,
    write_passes_csv,
)


def write_all(result: RunResult, manifest: dict[str, Any], out_dir: Path) -> list[Path]:
    """Every file of :data:`PROBE_FILES` that the result holds something for."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = (render(result, manifest, out_dir) for render in PROBE_FILES)
    return [path for path in written if path is not None]
