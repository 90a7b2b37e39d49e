"""The t1/t2 TTFT table in the seed format, as data rows shared by every renderer.

    | Tokens | AMG-ON t1 | AMG-ON t2 | AMG-OFF t1 | AMG-OFF t2 | % diff (t2) |

Treatment arms come first and the baseline arm last, as in the published tables; times are median
TTFT in ms; ``% diff (t2)`` = (baseline_t2 / arm_t2 − 1) × 100. Hit-rate columns show, per arm,
the share of turn-2 prompt tokens the engine served from a cache (GPU prefix cache or offload tier).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TypeVar

from harness.results.run_result import SETTLE_WARN, EngineTiming, LMCacheSplit, PassMedians, RunResult

CellT = TypeVar("CellT", EngineTiming, LMCacheSplit, PassMedians)

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


TIMING_HEADER = (
    "Arm",
    "Tokens",
    "Turn",
    "Requests",
    "Client TTFT (mean)",
    "Engine TTFT",
    "Outside the engine",
    "Queue",
    "Prefill",
)
"""Where TTFT goes, per cell (ms, means per request): the client's clock, the engine's own clock, their difference,
and the engine's queue and prefill share of its clock."""


@dataclass(frozen=True)
class SplitRow:
    """One cell of a TTFT split table (:data:`TIMING_HEADER`, :data:`LMCACHE_HEADER`): its times in ms, None where
    unknown, in the header's order after Requests."""

    arm: str
    context_tokens: int
    turn: int
    requests: int
    times: tuple[float | None, ...]

    def texts(self) -> list[str]:
        head = [self.arm, str(self.context_tokens), str(self.turn), str(self.requests)]
        return head + ["—" if value is None else f"{value:.1f}" for value in self.times]


def _in_table_order(result: RunResult, cells: list[CellT]) -> list[CellT]:
    order = {arm: index for index, arm in enumerate(arm_order(result))}
    return sorted(cells, key=lambda c: (order.get(c.arm, len(order)), c.context_tokens, c.turn))


def timing_rows(result: RunResult) -> list[SplitRow]:
    """One row per cell with engine timing, in the TTFT table's arm order: client mean TTFT, engine TTFT, outside
    the engine (client − engine: HTTP, the server's parsing of the request body, the stream back), queue, prefill."""
    out = []
    for timing in _in_table_order(result, result.engine_timing):
        cell = result.cell(timing.arm, timing.context_tokens, timing.turn)
        client = cell.ttft.mean_ms if cell and cell.ttft else None
        outside = client - timing.ttft_ms if client is not None and timing.ttft_ms is not None else None
        times = (client, timing.ttft_ms, outside, timing.queue_ms, timing.prefill_ms)
        out.append(SplitRow(timing.arm, timing.context_tokens, timing.turn, timing.requests, times))
    return out


LMCACHE_HEADER = (
    "Arm",
    "Tokens",
    "Turn",
    "Requests",
    "TTFT",
    "Before the lookup",
    "Lookup to KV loaded",
    "LMCache's retrieve",
    "Ranks' spread",
    "After the load",
    "LMCache's store",
)
"""LMCache's timeline per cell (ms, medians per request; :mod:`harness.results.lmcache_log`). LMCache's store is
part of the prefill (of "After the load" in turn 2), not one more slice of the TTFT."""


def lmcache_rows(result: RunResult) -> list[SplitRow]:
    """The :data:`LMCACHE_HEADER` rows, in the TTFT table's arm order."""
    return [
        SplitRow(
            cell.arm,
            cell.context_tokens,
            cell.turn,
            cell.requests,
            (
                cell.ttft_ms,
                cell.before_lookup_ms,
                cell.lookup_to_loaded_ms,
                cell.retrieve_ms,
                cell.rank_spread_ms,
                cell.after_load_ms,
                cell.store_ms,
            ),
        )
        for cell in _in_table_order(result, result.lmcache_timeline)
    ]


RANK_HEADER = ("Arm", "Rank", "Loads", "Median GB/s", "Lowest GB/s", "Slowest in")
"""LMCache's loads per worker (TP rank), :func:`harness.results.lmcache_log.ranks`."""


def rank_rows(result: RunResult) -> list[list[str]]:
    """The :data:`RANK_HEADER` rows, in the TTFT table's arm order; "Slowest in" = of the rank's loads, those in
    which it took the longest of several ranks ("—" for an arm with one worker)."""
    order = {arm: index for index, arm in enumerate(arm_order(result))}
    workers = Counter(rank.arm for rank in result.lmcache_ranks)
    out = []
    for r in sorted(result.lmcache_ranks, key=lambda r: (order.get(r.arm, len(order)), r.worker)):
        slowest = f"{r.slowest_loads} of {r.loads}" if workers[r.arm] > 1 else "—"
        out.append([r.arm, r.worker or "—", str(r.loads), f"{r.median_gbps:.1f}", f"{r.min_gbps:.1f}", slowest])
    return out


def pass_header(result: RunResult) -> tuple[str, ...]:
    """Arm, Tokens, Turn, the median after each pass, and the last pass's move (:class:`PassMedians`)."""
    passes = max((len(cell.medians_ms) for cell in result.pass_medians), default=0)
    return ("Arm", "Tokens", "Turn", *(f"After {k}" for k in range(1, passes + 1)), "Last pass's move")


def pass_rows(result: RunResult) -> list[list[str]]:
    """The :func:`pass_header` rows (ms; "—" where a cell has fewer passes), in the TTFT table's order."""
    width = len(pass_header(result)) - 4
    out = []
    for cell in _in_table_order(result, result.pass_medians):
        medians = [f"{value:.1f}" for value in cell.medians_ms] + ["—"] * (width - len(cell.medians_ms))
        move = "—" if cell.last_move is None else f"{cell.last_move:+.1%}"
        out.append([cell.arm, str(cell.context_tokens), str(cell.turn), *medians, move])
    return out


def settle_line(result: RunResult) -> tuple[str | None, bool]:
    """One sentence on how far the last pass moved the cells' medians, and whether any moved by more than
    :data:`SETTLE_WARN` (None for a run of one pass)."""
    moved = [(abs(move), cell) for cell in result.pass_medians if (move := cell.last_move) is not None]
    if not moved:
        return None, False
    cell = max(moved, key=lambda item: item[0])[1]
    passes = max(len(each.medians_ms) for _, each in moved)
    where = f"{cell.arm} {cell.context_tokens:,} t{cell.turn}, {cell.last_move:+.1%}"
    beyond = sum(1 for move, _ in moved if move > SETTLE_WARN)
    if beyond:
        return (
            f"Passes: the last of {passes} moved the median of {beyond} of {len(moved)} cells by more than "
            f"{SETTLE_WARN:.0%} (largest: {where}); more passes would still move the table.",
            True,
        )
    return (
        f"Passes: the last of {passes} moved no cell's median by more than {SETTLE_WARN:.0%} (largest: {where}).",
        False,
    )


def endpoint_lines(result: RunResult) -> list[str]:
    """What an attached endpoint could not give: which tokenizer built the prompts (and how far the server's own
    counts were from it), and arms whose prefix cache was not reset between turns; then what made turn 2 a
    returning user in each arm (the ``between_turns`` method that ran)."""
    lines = []
    for lengths in result.prompt_lengths:
        spread = (
            f"usage.prompt_tokens / counted − 1: median {lengths.median_diff:+.1%}, largest |difference| "
            f"{lengths.max_abs_diff:.1%} over {lengths.requests} requests"
            if lengths.median_diff is not None and lengths.max_abs_diff is not None
            else "no request reported usage.prompt_tokens"
        )
        lines.append(f"Prompts of {lengths.arm} built with {lengths.built_with}; {spread}.")
    for arm, why in sorted(result.reset_unavailable.items()):
        lines.append(f"{arm}: no prefix-cache reset between turns ({why}); turn 2 may have hit the GPU prefix cache.")
    arms_by_method: dict[str, list[str]] = {}
    for method in result.between_turns:
        arms_by_method.setdefault(method.describe(), []).append(method.arm)
    if arms_by_method:
        methods = "; ".join(f"{described} ({', '.join(arms)})" for described, arms in arms_by_method.items())
        lines.append(f"Between turns: {methods}.")
    return lines
