"""A prefill/decode run's TTFT breakdown and KV-transfer physics (``pd-breakdown.json``): Markdown and console.

Two tables, one row per (arm, cell or load point): where the mean TTFT went, part by part (ms; the parts sum to
the client's mean TTFT; :mod:`harness.results.pd_breakdown` has the formulas and the tolerance), and the group's
KV transfers with both throughput figures (vLLM's bytes ÷ Σ durations, biased low when transfers overlap; bytes ÷
|∪ decode legs|) beside the link's limit. A flagged row's reasons follow the tables.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from common.markup import md_text
from harness.results.pd_breakdown import PdBreakdownResult

from .tables import print_table, text_table

TTFT_HEADER = (
    "Arm",
    "Group",
    "Joined",
    "Client TTFT",
    "To proxy",
    "Proxy",
    "Prefill queue",
    "Prefill",
    "Prefill other",
    "Decode admission",
    "KV transfer",
    "First token",
    "Decode other",
    "Back to client",
    "Flagged",
)
TRANSFER_HEADER = (
    "Arm",
    "Group",
    "MB",
    "Transfers",
    "Descriptors",
    "Tokens",
    "Expected MB",
    "GB/s (vLLM: ÷ Σ durations)",
    "GB/s (÷ |∪ decode legs|)",
    "Link GB/s",
    "Failed",
)


def note(result: PdBreakdownResult) -> str:
    return (
        "Means per request in ms over the requests joined to a proxy phase line (joined / successful). The parts "
        "sum to the client's mean TTFT; a row is flagged where 'Back to client' exceeds "
        f"±max({result.tolerance_ms:g} ms, {result.tolerance_fraction:.0%} of the TTFT), or where an engine's "
        "histograms hold more than the leg the proxy timed (a negative 'other' or 'First token' beyond it), or "
        "where the transfer breaks physics (bytes ≠ tokens × KV bytes per token, a rate above the link's or not "
        "positive). vLLM's own GB/s divides by the sum of transfer durations and is biased low when transfers "
        "overlap; the union figure divides by the wall time during which a decode leg was open."
    )


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _number(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "—" if value is None else f"{value / scale:,.{digits}f}"


def ttft_rows(result: PdBreakdownResult) -> list[list[str]]:
    out = []
    for row in result.rows:
        parts = row.parts
        times = (
            row.client_ttft_ms,
            parts.to_proxy_ms,
            parts.proxy_ms,
            parts.prefill_queue_ms,
            parts.prefill_ms,
            parts.prefill_other_ms,
            parts.decode_admission_ms,
            parts.kv_transfer_ms,
            parts.first_token_ms,
            parts.decode_other_ms,
            parts.back_to_client_ms,
        )
        head = [row.arm, row.group, f"{row.matched}/{row.requests}"]
        out.append(head + [_ms(value) for value in times] + ["yes" if row.flags else "no"])
    return out


def transfer_rows(result: PdBreakdownResult) -> list[list[str]]:
    out = []
    for row in result.rows:
        kv = row.transfer
        if kv is None:
            continue
        out.append(
            [
                row.arm,
                row.group,
                _number(kv.bytes, 1e6),
                _number(kv.transfers, digits=0),
                _number(kv.descriptors, digits=0),
                _number(kv.tokens, digits=0),
                _number(kv.expected_bytes, 1e6),
                _number(kv.gbps_vllm, digits=2),
                _number(kv.gbps_union, digits=2),
                _number(kv.link_gbps, digits=0),
                _number(kv.failures, digits=0),
            ]
        )
    return out


def flag_lines(result: PdBreakdownResult) -> list[str]:
    return [f"{row.arm}, {row.group}: {flag}" for row in result.flagged for flag in row.flags]


def _table(header: tuple[str, ...], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(md_text(text) for text in header) + " |"]
    lines.append("|---|---|" + "|".join("---:" for _ in header[2:]) + "|")
    lines += ["| " + " | ".join(md_text(text) for text in row) + " |" for row in body]
    return lines


def render_markdown(result: PdBreakdownResult) -> str:
    lines = [f"# P/D TTFT breakdown: {md_text(result.scenario)}", "", md_text(note(result)), ""]
    lines += ["## Where TTFT goes (ms)", "", *_table(TTFT_HEADER, ttft_rows(result)), ""]
    if transfers := transfer_rows(result):
        lines += ["## KV transfers (NIXL)", "", *_table(TRANSFER_HEADER, transfers), ""]
    if flags := flag_lines(result):
        lines += ["## Flagged", "", *[f"- {md_text(flag)}" for flag in flags], ""]
    return "\n".join(lines)


def print_console(result: PdBreakdownResult, out: Console) -> None:
    for title, header, body in (
        ("P/D: where TTFT goes (ms, means per request)", TTFT_HEADER, ttft_rows(result)),
        ("P/D: KV transfers (NIXL)", TRANSFER_HEADER, transfer_rows(result)),
    ):
        if not body:
            continue
        print_table(out, text_table(Table(title=title), header, body, text_columns=2))
    for line in flag_lines(result):
        out.print(escape(f"flagged: {line}"), style="yellow", highlight=False)
