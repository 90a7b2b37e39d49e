"""A trace replay's reports, drawn from ``replay.json`` alone.

* ``replay.md``: the trace window and its infinite-cache ceiling, one row per arm (TTFT / TPOT / E2E
  percentiles, SLO attainment, achieved hit rate by source beside the ceiling, send lag), and each
  arm against the baseline (% diff = (baseline / arm − 1) × 100 per percentile);
* ``replay.csv``: the per-arm row with every number;
* ``replay.svg``: per arm, prompt tokens/s and hit tokens/s by source (GPU prefix
  cache, offload tier) over the replay, and TTFT p50 / p90 / p99 per arm side by side.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from common.csvfile import write_csv_rows
from common.markup import md_text
from harness.results.replay_result import ArmReplay, ReplayResult
from harness.results.sweep_result import Quantiles

from .figures import caption, color, legend_outside, log_scale, new_figure, save, styled
from .renderers import validity_lines
from .tables import csv_cell, md_rows, print_table


def _ms(q: Quantiles | None, field: str) -> str:
    return "—" if q is None else f"{getattr(q, field):.1f}"


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:+.1f}"


def _source_shares(item: ArmReplay) -> tuple[float | None, float | None]:
    if not item.prompt_tokens:
        return None, None
    return (item.gpu_hit_tokens or 0.0) / item.prompt_tokens, (item.external_hit_tokens or 0.0) / item.prompt_tokens


ARM_COLUMNS = (
    "Arm",
    "Requests",
    "Errors",
    "TTFT p50",
    "TTFT p90",
    "TTFT p99",
    "TPOT p50",
    "TPOT p99",
    "E2E p50",
    "E2E p99",
    "SLO %",
    "Hit % (GPU)",
    "Hit % (tier)",
    "Hit % (all)",
    "Ceiling %",
    "Lag p99",
    "Late",
)


def arm_rows(result: ReplayResult) -> list[list[str]]:
    ceiling = _share(result.trace.infinite_cache_hit_rate)
    out = []
    for item in result.results:
        gpu, tier = _source_shares(item)
        out.append(
            [
                item.arm + ("" if item.complete else " (incomplete)"),
                str(item.requests),
                str(item.errors),
                _ms(item.ttft, "p50_ms"),
                _ms(item.ttft, "p90_ms"),
                _ms(item.ttft, "p99_ms"),
                _ms(item.tpot, "p50_ms"),
                _ms(item.tpot, "p99_ms"),
                _ms(item.e2e, "p50_ms"),
                _ms(item.e2e, "p99_ms"),
                _share(item.slo_attainment),
                _share(gpu),
                _share(tier),
                _share(item.hit_rate),
                ceiling,
                _ms(item.lag, "p99_ms"),
                str(item.late),
            ]
        )
    return out


COMPARISON_COLUMNS = ("Arm vs baseline", "TTFT p50 % diff", "TTFT p90 % diff", "TTFT p99 % diff", "E2E p50 % diff")


def comparison_rows(result: ReplayResult) -> list[list[str]]:
    return [
        [
            f"{c.arm} vs {c.baseline}",
            _pct(c.ttft_p50_pct),
            _pct(c.ttft_p90_pct),
            _pct(c.ttft_p99_pct),
            _pct(c.e2e_p50_pct),
        ]
        for c in result.comparisons
    ]


def trace_line(result: ReplayResult) -> str:
    t = result.trace
    loop = f"open loop × {t.time_scale:g} time scale" if t.mode == "open" else f"closed loop, {t.concurrency} in flight"
    return (
        f"trace {t.path} ({t.format}, {t.block_tokens}-token blocks): {t.requests} requests from position {t.start} "
        f"over {t.duration_s:.1f} s, {loop}; input p50 {t.input_p50:.0f} / p99 {t.input_p99:.0f} tokens; "
        f"infinite-cache hit rate {_share(t.infinite_cache_hit_rate)} %"
    )


def behind_lines(result: ReplayResult) -> list[str]:
    return [
        f"{item.arm} fell behind the trace: send lag p99 {item.lag.p99_ms:.0f} ms > {result.behind_ms:g} ms "
        f"({item.late} of {item.requests} requests more than {result.late_ms:g} ms late); the client, not the "
        "engine, set those arrival times"
        for item in result.results
        if item.fell_behind and item.lag is not None
    ]


def causal_lines(result: ReplayResult) -> list[str]:
    """Per arm of an agent trace: its child calls and whether each was sent after its parent completed."""
    lines = []
    for item in result.results:
        if item.child_calls is None:
            continue
        if item.causal_violations:
            lines.append(
                f"{item.arm}: {item.causal_violations} of {item.child_calls} child calls were sent before their "
                "parent completed (not a causal replay)"
            )
        else:
            lines.append(
                f"{item.arm}: causal order kept (each of {item.child_calls} child calls sent after its parent)"
            )
    return lines


def markdown(result: ReplayResult, provenance: str = "") -> str:
    lines = [f"# Replay: {result.scenario_name}", "", trace_line(result) + ".", ""]
    if provenance:
        lines += [provenance + ".", ""]
    lines += [
        "Latencies in ms; hit % from the engine's /metrics (tokens served from the GPU prefix cache or the "
        "offload tier / prompt tokens); ceiling = the trace's infinite-cache hit rate.",
        "",
    ]
    lines += md_rows(ARM_COLUMNS, arm_rows(result))
    if result.comparisons:
        lines += ["", "% diff = (baseline / arm − 1) × 100: how much slower the baseline is.", ""]
        lines += md_rows(COMPARISON_COLUMNS, comparison_rows(result))
    for line in behind_lines(result):
        lines += ["", f"**Warning:** {line}."]
    causal = causal_lines(result)
    if causal:
        lines += ["", *(f"- {line}." for line in causal)]
    if not result.complete:
        lines += ["", "The replay is incomplete: continue it with `kvbench replay --resume RUN_DIR`."]
    verdict = validity_lines(result.validity)
    if verdict:
        lines += ["", f"**{md_text(verdict[0])}**", *(md_text(line) for line in verdict[1:])]
    return "\n".join(lines) + "\n"


CSV_FIELDS = tuple(
    """
    arm attempt complete requests ok errors wall_s ttft_p50_ms ttft_p90_ms ttft_p99_ms tpot_p50_ms tpot_p99_ms
    e2e_p50_ms e2e_p99_ms slo_attainment prompt_tokens gpu_hit_tokens external_hit_tokens hit_rate
    infinite_cache_hit_rate cached_share lag_p50_ms lag_p99_ms late fell_behind prompt_tokens_off
    child_calls causal_violations
    """.split()
)
"""replay.csv's columns: an arm's field, or ``NAME_pNN_ms`` of its quantiles NAME (:func:`reports.tables.csv_cell`);
``infinite_cache_hit_rate`` the trace's."""


def write_csv(result: ReplayResult, path: Path, provenance: str = "") -> Path:
    ceiling = "" if result.trace.infinite_cache_hit_rate is None else result.trace.infinite_cache_hit_rate

    def row(item: ArmReplay) -> list[object]:
        cells = [ceiling if name == "infinite_cache_hit_rate" else csv_cell(item, name) for name in CSV_FIELDS]
        return [*cells, provenance]

    write_csv_rows(path, [*CSV_FIELDS, "provenance"], map(row, result.results))
    return path


@styled()
def figure(result: ReplayResult, provenance: str = "") -> Figure:
    """One panel per arm (prompt and hit tokens/s by source over time) and one of TTFT percentiles per arm."""
    arms = [item.arm for item in result.results]
    fig = new_figure(9.0, 2.4 * (len(arms) + 1), dpi=110)
    axes = fig.subplots(len(arms) + 1, 1, squeeze=False)[:, 0]
    hit_tps = [(p.gpu_hit_tps or 0.0) + (p.external_hit_tps or 0.0) for p in result.timeline]
    top = max([p.prompt_tps or 0.0 for p in result.timeline] + hit_tps + [1.0])
    ceiling = _share(result.trace.infinite_cache_hit_rate)
    for ax, arm in zip(axes, arms, strict=False):
        points = sorted((p for p in result.timeline if p.arm == arm), key=lambda p: p.t_s)
        # each sample covers (t_s − duration_s, t_s]: draw it as a step from its start, closed at the last end
        xs = [p.t_s - p.duration_s for p in points] + [points[-1].t_s] if points else []

        def steps(values: list[float]) -> list[float]:
            return values + values[-1:]

        gpu = steps([p.gpu_hit_tps or 0.0 for p in points])
        tier = steps([p.external_hit_tps or 0.0 for p in points])
        sources = ("hit tokens/s: GPU prefix cache", "hit tokens/s: offload tier")
        ax.stackplot(xs, gpu, tier, colors=(color(0), color(4)), alpha=0.6, labels=sources, step="post")
        prompt = steps([p.prompt_tps or 0.0 for p in points])
        ax.step(xs, prompt, where="post", color=color(5), linewidth=1.0, label="prompt tokens/s")
        item = result.arm(arm)
        ax.set_title(f"{arm}: hit rate {'—' if item is None else _share(item.hit_rate)} % (ceiling {ceiling} %)")
        ax.set_ylim(0, top * 1.1)
        ax.set_xlim(left=0)
        ax.set_ylabel("tokens/s")
    if arms:
        legend_outside(axes[0])
        axes[len(arms) - 1].set_xlabel("seconds since the replay started")
    ax = axes[-1]
    labels = ("p50", "p90", "p99")
    width = 0.8 / max(len(arms), 1)
    for index, item in enumerate(result.results):
        if item.ttft is None:
            continue
        values = [item.ttft.p50_ms, item.ttft.p90_ms, item.ttft.p99_ms]
        ax.bar([k + index * width for k in range(len(labels))], values, width=width, color=color(index), label=item.arm)
    ax.set_xticks([k + width * (len(arms) - 1) / 2 for k in range(len(labels))], labels)
    log_scale(ax)
    ax.set_ylabel("TTFT (ms, log)")
    ax.set_title("TTFT percentiles per arm (same requests)")
    ax.grid(False, axis="x")
    legend_outside(ax)
    fig.suptitle(f"{result.scenario_name} — {result.model} on {result.hardware} ({result.engine_kind})")
    caption(fig, provenance)
    return fig


def write_replay_reports(result: ReplayResult, out: Path, provenance: str = "") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    md = out / "replay.md"
    md.write_text(markdown(result, provenance), encoding="utf-8")
    paths = [md, write_csv(result, out / "replay.csv", provenance)]
    return paths + save(figure(result, provenance), out / "replay")


def print_replay(result: ReplayResult, console: Console, provenance: str = "") -> None:
    table = Table(title=f"{result.scenario_name} — replay (ms; hit % of prompt tokens)", caption=provenance or None)
    for index, column in enumerate(ARM_COLUMNS):
        table.add_column(column, justify="left" if index == 0 else "right")
    for row in arm_rows(result):
        table.add_row(*row)
    console.print(escape(trace_line(result)), highlight=False)
    print_table(console, table)
    for row in comparison_rows(result):
        console.print(
            escape(f"{row[0]}: TTFT p50 {row[1]} %, p90 {row[2]} %, p99 {row[3]} %, E2E p50 {row[4]} %"),
            highlight=False,
        )
    for line in behind_lines(result):
        console.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)
    for line in causal_lines(result):
        console.print(escape(line), highlight=False)
    if not result.complete:
        console.print("[yellow]The replay is incomplete: continue it with `kvbench replay --resume RUN_DIR`.[/]")
