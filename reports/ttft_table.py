"""The t1/t2 TTFT table in the seed format, as data rows shared by every renderer.

    | Tokens | AMG-ON t1 | AMG-ON t2 | AMG-OFF t1 | AMG-OFF t2 | % diff (t2) |

Treatment arms come first and the baseline arm last, as in the published tables; times are median
TTFT in ms; ``% diff (t2)`` = (baseline_t2 / arm_t2 − 1) × 100. Hit-rate columns show, per arm,
the share of turn-2 prompt tokens the engine served from a cache (GPU prefix cache or offload tier).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.results.run_result import RunResult

DIFF_TURN = 2


@dataclass(frozen=True)
class Column:
    title: str
    kind: str  # "tokens" | "ttft" | "diff" | "hit"
    arm: str | None = None
    turn: int | None = None


def arm_order(result: RunResult) -> list[str]:
    """Treatment arms in scenario order, then the baseline."""
    return [a for a in result.arms if a != result.baseline_arm] + [result.baseline_arm]


def columns(result: RunResult, *, with_hits: bool = True) -> list[Column]:
    cols = [Column("Tokens", "tokens")]
    shown_turns = [t for t in (1, DIFF_TURN) if t <= result.turns]
    for arm in arm_order(result):
        cols.extend(Column(f"{arm} t{turn}", "ttft", arm, turn) for turn in shown_turns)
    treatments = [a for a in result.arms if a != result.baseline_arm]
    for arm in treatments:
        title = f"% diff (t{DIFF_TURN})" if len(treatments) == 1 else f"% diff t{DIFF_TURN} ({arm})"
        cols.append(Column(title, "diff", arm, DIFF_TURN))
    if with_hits and result.cache:
        cols.extend(Column(f"{arm} t{DIFF_TURN} hit %", "hit", arm, DIFF_TURN) for arm in arm_order(result))
    return cols


def cell_value(result: RunResult, column: Column, context_tokens: int) -> float | None:
    if column.kind == "tokens":
        return float(context_tokens)
    assert column.arm is not None and column.turn is not None
    if column.kind == "ttft":
        cell = result.cell(column.arm, context_tokens, column.turn)
        return cell.ttft.median_ms if cell and cell.ttft else None
    if column.kind == "diff":
        return result.diff(column.arm, context_tokens, column.turn)
    stats = result.cache_stats(column.arm, context_tokens, column.turn)
    rate = stats.hit_rate if stats else None
    return None if rate is None else rate * 100.0


def format_value(column: Column, value: float | None) -> str:
    if value is None:
        return "—"
    if column.kind == "tokens":
        return str(int(value))
    if column.kind == "hit":
        return f"{value:.1f}"
    return f"{value:.3f}" if column.kind == "ttft" else f"{value:.2f}"


def rows(result: RunResult, *, with_hits: bool = True) -> tuple[list[Column], list[list[str]]]:
    cols = columns(result, with_hits=with_hits)
    body = [[format_value(c, cell_value(result, c, ctx)) for c in cols] for ctx in result.context_tokens]
    return cols, body
