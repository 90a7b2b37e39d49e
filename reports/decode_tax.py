"""The decode tax section of every A/B report with load points (sweep, agentic): Markdown, console and HTML.

Per non-baseline arm and load the baseline measured too: TPOT p50 and p90 of each and the decode tax
(:func:`harness.results.sweep_metrics.decode_tax`: ``(TPOT p50 arm / TPOT p50 baseline − 1) × 100``, and the
same of the p90: the slowest tenth of the users),
so a faster TTFT that costs every user decode speed shows beside it. The decode batch is matched by the
load point (the same users, agents or req/s): the points do not record the engine's mean running requests.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from common.markup import console_text, md_table, md_text
from harness.results.sweep_metrics import VERSUS_METRICS, decode_taxes
from harness.results.sweep_result import PointResult

from .tables import print_table

TITLE = "Decode tax (TPOT vs the baseline at the same load)"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def tax_text(value: float | None) -> str:
    """``+12.3 %``: slower than the baseline; ``—``: too few requests to judge."""
    return "—" if value is None else f"{value:+.1f} %"


def decode_tax_rows(points: Sequence[PointResult], baseline: str, load_unit: str) -> tuple[list[str], list[list[str]]]:
    """Header and one row per (arm, load) of :func:`decode_taxes` (no rows: one arm, or no shared load)."""
    header = [
        "arm",
        f"load ({load_unit})",
        "TPOT p50 ms",
        f"{baseline} p50 ms",
        "decode tax p50",
        "TPOT p90 ms",
        f"{baseline} p90 ms",
        "decode tax p90",
    ]
    rows = [
        [
            t.arm,
            f"{t.load:g}",
            _ms(t.tpot_p50_ms),
            _ms(t.baseline_tpot_p50_ms),
            tax_text(t.tax_pct),
            _ms(t.tpot_p90_ms),
            _ms(t.baseline_tpot_p90_ms),
            tax_text(t.tax_p90_pct),
        ]
        for t in decode_taxes(points, baseline)
    ]
    return header, rows


def _span(taxes: Sequence[float | None]) -> str:
    values = [v for v in taxes if v is not None]
    if not values:
        return "not judged (too few requests with 2+ tokens)"
    low, high = min(values), max(values)
    return tax_text(low) if low == high else f"{tax_text(low)} to {tax_text(high)}"


def decode_tax_lines(points: Sequence[PointResult], baseline: str) -> list[str]:
    """What the tax is, then per arm its range over the loads (none: nothing to compare)."""
    taxes = decode_taxes(points, baseline)
    if not taxes:
        return []
    lines = [
        f"Decode tax p50 = {VERSUS_METRICS['decode_tax'].formula}",
        f"Decode tax p90 = {VERSUS_METRICS['decode_tax_p90'].formula}",
        "The decode batch is matched by the load point, not measured: the points do not record the engine's mean "
        "running requests, and at a load where the baseline recomputes evicted prompts its decode steps carry "
        "prefill chunks too, which slows its TPOT (a negative tax there is the baseline's prefill, not a faster "
        "arm). The lowest load is the closest match.",
    ]
    for arm in dict.fromkeys(t.arm for t in taxes):
        mine = [t for t in taxes if t.arm == arm]
        lines.append(
            f"{arm} vs {baseline}: p50 {_span([t.tax_pct for t in mine])}, p90 {_span([t.tax_p90_pct for t in mine])}"
        )
    return lines


def decode_tax_markdown(points: Sequence[PointResult], baseline: str, load_unit: str) -> list[str]:
    """The Markdown section (empty when there is nothing to compare)."""
    header, rows = decode_tax_rows(points, baseline, load_unit)
    if not rows:
        return []
    body = [[md_text(row[0]), *row[1:]] for row in rows]
    lines = (f"- {md_text(line)}" for line in decode_tax_lines(points, baseline))
    return [f"## {TITLE}", "", *md_table(header, body), "", *lines, ""]


def print_decode_tax(points: Sequence[PointResult], baseline: str, load_unit: str, console: Console) -> None:
    """The console table and its lines (nothing when there is nothing to compare)."""
    header, rows = decode_tax_rows(points, baseline, load_unit)
    if not rows:
        return
    table = Table(title=TITLE)
    for index, column in enumerate(header):
        table.add_column(console_text(column), justify="left" if index == 0 else "right")
    for row in rows:
        table.add_row(*(console_text(cell) for cell in row))
    print_table(console, table)
    for line in decode_tax_lines(points, baseline):
        console.print(line, highlight=False, markup=False)
