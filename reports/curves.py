"""Capacity curves and tables of a sweep, drawn from ``sweep.json`` alone.

* ``capacity.svg``: RPS/GPU (y) against TPS/user (x), one line per arm through its
  load points; each arm's Pareto frontier (no other point of the arm has both more RPS/GPU and
  more TPS/user) is drawn as a dashed step line with large markers; points meeting the SLO are
  filled, the others hollow; the region the TPOT limit allows (TPS/user ≥ 1000 / tpot_ms) is shaded.
* ``ttft_p99.svg``: TTFT at the SLO's percentile against load per arm, the TTFT limit
  (labelled with its percentile) shaded below.
* ``sweep.csv``: one row per (arm, point) with every metric and the frontier flag.
* ``capacity.md``: the points table, capacity at the SLO, GPUs saved and $/year, and the
  analytical model beside the measurement.

Where the sweep metered energy (``PointResult.energy``, :mod:`harness.results.energy`) the points table
gains the GPUs' average watts, joules per generated token and per token (prompt + generated), and, for a
concurrency sweep, users (agents) per kW, each header labelled ``simulated`` or ``NVML``
(:func:`energy_columns`); :func:`energy_lines` says what the figures count and why a window has none.
:func:`client_lines` prints, per point, how far behind its schedule the client fell (``PointResult.client``).

The figures use matplotlib's object API (no pyplot global state) in the shared style of
:mod:`reports.figures`; the HTML case study embeds the same two figures.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from common.csvfile import write_csv_rows
from common.markup import console_text, md_table, md_text
from harness.results.capacity import COARSE_GRID
from harness.results.energy import EnergySample
from harness.results.sweep_metrics import requests_to_judge
from harness.results.sweep_result import PointResult, Quantiles, SloLimits, SweepResult

from .decision import gpus
from .decode_tax import decode_tax_markdown, print_decode_tax
from .figures import caption, color, legend_outside, log_scale, new_figure, save, slo_band, styled
from .tables import csv_cell, print_table, text_table


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both x and y (higher is better on both).

    A point is dominated when another has x ≥ and y ≥ with at least one strictly greater. The
    result is sorted by x ascending (so y descends along it).
    """
    keep = []
    for i, (x, y) in enumerate(points):
        dominated = any((ox >= x and oy >= y) and (ox > x or oy > y) for j, (ox, oy) in enumerate(points) if j != i)
        if not dominated:
            keep.append(i)
    return sorted(keep, key=lambda i: (points[i][0], -points[i][1]))


def _curve_points(result: SweepResult, arm: str) -> list[PointResult]:
    return [p for p in result.arm_points(arm) if p.tps_user_mean is not None]


def frontier_flags(result: SweepResult) -> dict[tuple[str, int], bool]:
    """(arm, point) -> whether the point is on its arm's Pareto frontier of (TPS/user, RPS/GPU)."""
    flags: dict[tuple[str, int], bool] = {}
    for arm in result.arms:
        pts = _curve_points(result, arm)
        on = set(pareto_frontier([(p.tps_user_mean or 0.0, p.rps_per_gpu) for p in pts]))
        for i, p in enumerate(pts):
            flags[(arm, p.point)] = i in on
    return flags


def _load_label(result: SweepResult) -> str:
    return "concurrency (active users)" if result.mode == "concurrency" else "offered load (requests/s)"


GPU_COUNT_PREFIX = re.compile(r"^\s*\d+\s*[x×]\s", re.IGNORECASE)
"""A hardware text that already counts its GPUs ("1x NVIDIA H100 (see manifest)")."""


def _title(result: SweepResult) -> str:
    counted = GPU_COUNT_PREFIX.match(result.hardware) is not None
    hardware = result.hardware if counted else f"{result.gpus}× {result.hardware}"
    return f"{result.scenario_name} — {result.model} on {hardware} ({result.engine_kind})"


def _slo_text(result: SweepResult) -> str:
    s = result.slo
    parts = []
    if s.ttft_ms is not None:
        parts.append(f"TTFT ≤ {s.ttft_ms:g} ms")
    if s.tpot_ms is not None:
        parts.append(f"TPOT ≤ {s.tpot_ms:g} ms")
    if s.e2e_ms is not None:
        parts.append(f"E2E ≤ {s.e2e_ms:g} ms")
    return f"SLO p{s.percentile:g}: " + ", ".join(parts) if parts else "no SLO"


@styled()
def capacity_figure(result: SweepResult, provenance: str = "") -> Figure:
    """RPS/GPU vs TPS/user per arm, frontier marked, SLO-allowed region shaded."""
    fig = new_figure(8.0, 5.0)
    ax = fig.add_subplot()
    flags = frontier_flags(result)
    for index, arm in enumerate(result.arms):
        pts = _curve_points(result, arm)
        if not pts:
            continue
        xs = [p.tps_user_mean or 0.0 for p in pts]
        ys = [p.rps_per_gpu for p in pts]
        ax.plot(xs, ys, "-", color=color(index), linewidth=1.2, alpha=0.6, label=f"{arm}")
        for p, x, y in zip(pts, xs, ys, strict=True):
            face = color(index) if p.meets_slo or not result.slo.has_limits else "white"
            ax.plot([x], [y], "o", markersize=6, color=color(index), markerfacecolor=face, markeredgewidth=1.2)
            ax.annotate(
                f"{p.load:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=color(index)
            )
        frontier = [(x, y) for p, x, y in zip(pts, xs, ys, strict=True) if flags.get((arm, p.point))]
        if frontier:
            fx, fy = zip(*sorted(frontier), strict=True)
            ax.step(fx, fy, "--", where="post", color=color(index), linewidth=1.0, label=f"{arm} Pareto frontier")
            ax.plot(fx, fy, "D", markersize=9, markerfacecolor="none", markeredgecolor=color(index))
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    if result.slo.tpot_ms is not None:
        # the x axis is the mean decode rate, so the band (TPS/user ≥ 1000 / L) is a guide to a TPOT limit of L ms
        # that holds at the SLO's percentile; a point's fill says whether it met the SLO at that percentile (TTFT
        # has no axis here: its band is on the TTFT chart)
        limit = result.slo.tpot_ms
        label = f"TPOT p{result.slo.percentile:g} ≤ {limit:g} ms (band: mean TPS/user ≥ {1000.0 / limit:.3g})"
        slo_band(ax, 1000.0 / limit, label, "right")
    ax.set_xlabel("TPS/user: output tokens/s per user while decoding (mean)")
    ax.set_ylabel("RPS/GPU: completed requests/s per GPU")
    fig.suptitle(_title(result))
    legend_outside(ax, f"{_slo_text(result)}; filled = meets SLO")
    caption(fig, provenance)
    return fig


def slo_quantile(result: SweepResult) -> float:
    """The stored percentile the SLO's percentile reads: 50, 90 or 99, the nearest stored one at or above it."""
    return next((p for p in (50.0, 90.0, 99.0) if result.slo.percentile <= p), 99.0)


def _at(q: Quantiles, percentile: float) -> float:
    return {50.0: q.p50_ms, 90.0: q.p90_ms}.get(percentile, q.p99_ms)


@styled()
def ttft_figure(result: SweepResult, provenance: str = "") -> Figure:
    """TTFT at the SLO's percentile (all rounds, and later rounds dashed) vs load per arm, the TTFT limit shaded."""
    percentile = slo_quantile(result)
    tag = f"p{percentile:g}"
    fig = new_figure(8.0, 4.5)
    ax = fig.add_subplot()
    for index, arm in enumerate(result.arms):
        pts = [p for p in result.arm_points(arm) if p.ttft is not None]
        if not pts:
            continue
        values = [_at(p.ttft, percentile) for p in pts if p.ttft is not None]
        ax.plot([p.load for p in pts], values, "o-", color=color(index), label=f"{arm} TTFT {tag}")
        later = [(p.load, _at(p.ttft_later, percentile)) for p in pts if p.ttft_later is not None]
        if later:
            loads, shown = zip(*later, strict=True)
            label = f"{arm} TTFT {tag}, rounds ≥ 2"
            ax.plot(loads, shown, "s--", color=color(index), alpha=0.6, markersize=4, label=label)
    log_scale(ax)
    if result.slo.ttft_ms is not None:
        slo_band(ax, result.slo.ttft_ms, f"TTFT p{result.slo.percentile:g} ≤ {result.slo.ttft_ms:g} ms", "below")
    ax.set_xlabel(_load_label(result))
    ax.set_ylabel(f"TTFT {tag} (ms, log scale)")
    fig.suptitle(_title(result))
    legend_outside(ax)
    caption(fig, provenance)
    return fig


CSV_FIELDS = tuple(
    """
    arm point load mode gpus window_s sent measured ok errors rps rps_per_gpu output_tps output_tps_per_gpu
    tps_user_mean tps_user_p50 ttft_p50_ms ttft_p90_ms ttft_p99_ms ttft_round1_p50_ms ttft_round1_p99_ms
    ttft_later_p50_ms ttft_later_p99_ms tpot_p50_ms tpot_p99_ms itl_p50_ms itl_p99_ms e2e_p50_ms e2e_p99_ms
    goodput_rps goodput_rps_per_gpu slo_attainment meets_slo pareto gpu_hit_rate external_hit_rate hit_rate
    cached_share cached_share_later prompt_tokens_mean lag_p99_ms
    """.split()
)
"""sweep.csv's columns: a point's field, or ``NAME_pNN_ms`` of its quantiles NAME (:func:`reports.tables.csv_cell`);
``pareto`` whether the point is on its arm's frontier."""


def write_csv(result: SweepResult, path: Path, provenance: str = "") -> Path:
    flags = frontier_flags(result)

    def row(p: PointResult) -> list[object]:
        on_frontier = flags.get((p.arm, p.point), False)
        cells = [on_frontier if name == "pareto" else csv_cell(p, name) for name in CSV_FIELDS]
        return [*cells, provenance]

    points = sorted(result.points, key=lambda p: (result.arms.index(p.arm), p.load))
    write_csv_rows(path, [*CSV_FIELDS, "provenance"], map(row, points))
    return path


# ---------------------------------------------------------------------------------------------
# Text: capacity, GPUs saved, analytical (shared by Markdown and the console)
# ---------------------------------------------------------------------------------------------


def _f(value: float | None, fmt: str = ".3g") -> str:
    return "—" if value is None else format(value, fmt)


def _ms(q: Quantiles | None, field: str = "p50_ms") -> str:
    return "—" if q is None else f"{getattr(q, field):.1f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}"


def _energy_label(result: SweepResult) -> str | None:
    """``simulated``, ``NVML`` or ``simulated/NVML`` over the points whose energy has figures (None: none has)."""
    sources = {p.energy.label for p in result.points if p.energy is not None and p.energy.joules is not None}
    if not sources:
        return None
    return "/".join(sorted("simulated" if label == "simulated" else "NVML" for label in sources))


def energy_columns(result: SweepResult) -> tuple[list[str], list[Callable[[EnergySample | None], str]]]:
    """The energy columns' headers and cell formatters (none when no point has energy figures)."""
    label = _energy_label(result)
    if label is None:
        return [], []
    columns: list[tuple[str, Callable[[EnergySample | None], str]]] = [
        (f"GPU W ({label})", lambda e: _f(e.avg_watts if e else None, ".0f")),
        (f"J/gen tok ({label})", lambda e: _f(e.joules_per_generated_token if e else None)),
        (f"J/tok ({label})", lambda e: _f(e.joules_per_token if e else None)),
    ]
    if result.mode == "concurrency":
        columns.append((f"users/kW ({label})", lambda e: _f(e.agents_per_kw if e else None)))
    return [header for header, _ in columns], [cell for _, cell in columns]


def energy_lines(result: SweepResult) -> list[str]:
    """What the energy columns count, and why a point has no energy figure."""
    label = _energy_label(result)
    lines = []
    if label is not None:
        what = (
            "the simulator's power model (terms fitted on NVML where its calibration has them, else idle W + "
            "(TDP − idle) × busy share of the window), not a measurement"
            if label == "simulated"
            else "measured through NVML (energy counter, else power readings) on the engine's GPUs"
        )
        lines.append(
            f"Energy ({label}): {what}; GPUs only (not host CPUs, memory or storage). J/gen tok = window joules / "
            "generated tokens, J/tok = window joules / (prompt + generated tokens) of the requests completed in "
            "the window: both divide the same joules, so they are not an attribution to prefill or decode."
        )
    for p in result.points:
        if p.energy is not None and p.energy.not_sampled is not None:
            lines.append(f"{p.arm} @ {p.load:g}: energy not sampled ({p.energy.source}): {p.energy.not_sampled}")
    return lines


def _load_unit(result: SweepResult) -> str:
    return "users" if result.mode == "concurrency" else "req/s"


def client_lines(result: SweepResult) -> list[str]:
    """Per point, how far behind its schedule the client fell (``PointResult.client``; none for points stored
    before the client measured it)."""
    unit = _load_unit(result)
    lines = []
    for arm in result.arms:
        for p in result.arm_points(arm):
            client = p.client
            if client is None:
                continue
            slots = f"; {client.slot_waits} waited for a free session" if client.slot_waits else ""
            lines.append(
                f"Client @ {arm} {p.load:g} {unit}: send lag p50 {_f(client.send_lag_p50_ms)} / p99 "
                f"{_f(client.send_lag_p99_ms)} / max {_f(client.send_lag_max_ms)} ms{slots}; event-loop delay p99 "
                f"{_f(client.loop_delay_p99_ms)} ms; CPU {_f(client.cpu_fraction)} of a core (busiest of "
                f"{len(client.processes)} process{'es' if len(client.processes) != 1 else ''})"
            )
    return lines


def points_rows(result: SweepResult) -> tuple[list[str], list[list[str]]]:
    unit = _load_unit(result)
    header = [
        "arm",
        f"load ({unit})",
        "RPS/GPU",
        "TPS/user",
        "TTFT p50",
        "TTFT p99",
        "TTFT r1 p50",
        "TTFT r≥2 p50",
        "TPOT p50",
        "TPOT p99",
        "E2E p50",
        "goodput/GPU",
        "SLO %",
        "meets",
        "hit %",
        "errors",
    ]
    energy_header, energy_cells = energy_columns(result)
    header += energy_header
    body = []
    for arm in result.arms:
        for p in result.arm_points(arm):
            body.append(
                [
                    arm,
                    f"{p.load:g}",
                    _f(p.rps_per_gpu),
                    _f(p.tps_user_mean),
                    _ms(p.ttft),
                    _ms(p.ttft, "p99_ms"),
                    _ms(p.ttft_round1),
                    _ms(p.ttft_later),
                    _ms(p.tpot),
                    _ms(p.tpot, "p99_ms"),
                    _ms(p.e2e),
                    _f(p.goodput_rps_per_gpu),
                    _pct(p.slo_attainment),
                    _meets_cell(p.meets_slo, result.slo),
                    _pct(p.hit_rate if p.hit_rate is not None else p.cached_share),
                    str(p.errors),
                    *(cell(p.energy) for cell in energy_cells),
                ]
            )
    return header, body


def _meets_cell(meets: bool | None, slo: SloLimits) -> str:
    if meets is None:
        return "too few" if slo.has_limits else "—"
    return "yes" if meets else "no"


def capacity_lines(result: SweepResult) -> list[str]:
    lines = []
    if result.slo.has_limits:
        needed = requests_to_judge(result.slo.percentile)
        for arm in result.arms:
            unjudged = [p for p in result.points if p.arm == arm and p.meets_slo is None]
            if unjudged:
                loads = ", ".join(f"{p.load:g}" for p in unjudged)
                lines.append(
                    f"{arm}: the SLO is not judged at load {loads}: fewer than {needed} measured requests, the fewest "
                    f"that resolve a p{result.slo.percentile:g} (lengthen sweep.duration)"
                )
    for c in result.capacity:
        if c.max_rps_per_gpu_at_slo is None:
            lines.append(f"{c.arm}: no load point meets the SLO ({_slo_text(result)})")
            continue
        line = (
            f"{c.arm}: max {c.max_rps_per_gpu_at_slo:.3g} RPS/GPU within the SLO (at load {c.at_load:g}, "
            f"{_f(c.tps_user_at_max)} tokens/s/user)"
        )
        if c.gpus_needed is not None:
            line += f"; {gpus(c.gpus_needed)} for the target load, ${_f(c.usd_per_year, ',.0f')}/year"
        lines.append(line)
        if c.between is not None:
            b = c.between
            lines.append(
                f"{c.arm}: the SLO is crossed between loads {b.load_pass:g} and {b.load_fail:g} "
                f"({b.rps_per_gpu_pass:.3g}-{b.rps_per_gpu_fail:.3g} RPS/GPU); interpolated capacity "
                f"{b.interpolated_rps_per_gpu:.3g} RPS/GPU (an estimate, not a measured point)"
            )
            if b.coarse:
                lines.append(
                    f"warning: {c.arm}'s loads {b.load_pass:g} and {b.load_fail:g} are more than {COARSE_GRID:g}x "
                    "apart: the grid cannot place its capacity, and GPUs saved are read at grid points only; add "
                    "load points between them"
                )
    for s in result.savings:
        if s.gpus_saved is None:
            lines.append(f"GPUs saved by {s.arm} vs {s.baseline}: unknown (an arm meets the SLO at no load point)")
            continue
        lines.append(
            f"GPUs saved by {s.arm} vs {s.baseline} at {s.target_rps:g} req/s: {s.gpus_baseline} − {s.gpus_arm} = "
            f"{gpus(s.gpus_saved)}, ${s.usd_per_year_saved:,.0f}/year at ${s.usd_per_gpu_hour:g}/GPU-hour "
            f"(capacity × {_f(s.capacity_ratio)})"
        )
    return lines


def analytical_rows(result: SweepResult) -> tuple[list[str], list[list[str]]]:
    """Predicted vs measured later-round TTFT per (treatment arm, load)."""
    header = [
        "arm",
        "load",
        "N",
        "a",
        "a GPU",
        "a tier",
        "a'",
        "regime",
        "pred TTFT",
        "pred base",
        "meas p50",
        "meas base p50",
        "pred ×",
        "meas ×",
        "out TPS ×",
    ]
    body = []
    for c in result.analytical:
        i = c.inputs
        body.append(
            [
                c.arm,
                f"{c.load:g}",
                f"{i.n_tokens:.0f}",
                f"{i.a:.3f}",
                f"{i.a_gpu:.3f}",
                f"{i.a_tier:.3f}",
                f"{c.prediction.a:.3f}",
                c.regime,
                f"{c.predicted_ttft_ms:.1f}",
                f"{c.predicted_baseline_ttft_ms:.1f}",
                _f(c.measured_ttft_ms, ".1f"),
                _f(c.measured_baseline_ttft_ms, ".1f"),
                _f(c.predicted_speedup_vs_baseline),
                _f(c.measured_speedup),
                _f(c.measured_output_tps_ratio),
            ]
        )
    return header, body


def analytical_lines(result: SweepResult) -> list[str]:
    """Per treatment arm: the model's inputs, e and a*, and the end-to-end bound vs the capacity gain."""
    lines = []
    seen: set[str] = set()
    for c in result.analytical:
        if c.arm in seen:
            continue
        seen.add(c.arm)
        i = c.inputs
        pred = c.prediction
        lines.append(
            f"{c.arm} vs {c.baseline}: T = {i.t_s * 1e6:.3g} µs/token ({i.t_source}); R = {i.r_s * 1e6:.3g} µs/token, "
            f"W = {i.w_s * 1e6:.3g} µs/token ({i.tier}); e = T/R = {pred.e:.3g}, a* = e/(1+e) = {pred.a_star:.3f} "
            "(compute-bound below, IO-bound above)"
        )
        lines.append(f"  a from {i.a_source}")
        lines.append(
            f"  E2E TPS gain bound 1 + AP/AH = {_f(c.e2e_gain_bound)}; measured capacity ratio within the SLO "
            f"{_f(c.measured_capacity_ratio)}"
        )
    if result.analytical:
        lines.append(
            "TTFT predictions are prefill only (the deck's model: no queueing, no first decode step), so "
            "they are closest at the lowest load"
        )
    lines.extend(f"note: {note}" for note in result.analytical_notes)
    return lines


def write_markdown(result: SweepResult, path: Path, provenance: str = "") -> Path:
    header, body = points_rows(result)
    text = [
        f"# {md_text(result.scenario_name)}",
        "",
        *([f"**{md_text(provenance)}**", ""] if provenance else []),
        f"{_title(result)}; {_slo_text(result)}; baseline {md_text(result.baseline_arm)}. Latencies in ms; RPS/GPU = "
        f"completed requests/s in the window / {result.gpus} GPU(s); TPS/user = mean decode tokens/s per request.",
        "",
        *md_table(header, body),
        "",
        *(f"- {line}" for line in energy_lines(result)),
        *([""] if energy_lines(result) else []),
        *(f"- {line}" for line in client_lines(result)),
        *([""] if client_lines(result) else []),
        "## Capacity within the SLO",
        "",
        *(f"- {line}" for line in capacity_lines(result)),
        "",
        *decode_tax_markdown(result.points, result.baseline_arm, _load_unit(result)),
        "## Analytical prefill model vs measurement (rounds ≥ 2; TTFT in ms)",
        "",
        *md_table(*analytical_rows(result)),
        "",
        *(f"- {line}" if not line.startswith("  ") else f"  - {line.strip()}" for line in analytical_lines(result)),
        "",
        "![capacity](capacity.svg)",
        "",
        "![ttft p99](ttft_p99.svg)",
        "",
    ]
    path.write_text("\n".join(text), encoding="utf-8")
    return path


def write_sweep_reports(result: SweepResult, out_dir: Path, provenance: str = "") -> list[Path]:
    """Every sweep output, from the result (and the provenance line of its manifest) alone."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = save(capacity_figure(result, provenance), out_dir / "capacity")
    paths += save(ttft_figure(result, provenance), out_dir / "ttft_p99")
    paths.append(write_csv(result, out_dir / "sweep.csv", provenance))
    paths.append(write_markdown(result, out_dir / "capacity.md", provenance))
    return paths


def print_sweep(result: SweepResult, console: Console, provenance: str = "") -> None:
    header, body = points_rows(result)
    caption = console_text(f"{_slo_text(result)}; {provenance}" if provenance else _slo_text(result))
    table = Table(title=f"{console_text(result.scenario_name)} — per load point", caption=caption)
    print_table(console, text_table(table, header, body))
    for line in [*energy_lines(result), *client_lines(result), *capacity_lines(result)]:
        console.print(line, highlight=False, markup=False)
    print_decode_tax(result.points, result.baseline_arm, _load_unit(result), console)
    a_header, a_body = analytical_rows(result)
    if a_body:
        a_table = Table(title="Analytical prefill model vs measurement (rounds ≥ 2, TTFT ms)")
        for index, column in enumerate(a_header):
            a_table.add_column(column, justify="left" if index in (0, 7) else "right")
        for row in a_body:
            a_table.add_row(*row)
        print_table(console, a_table)
    for line in analytical_lines(result):
        console.print(line, highlight=False, markup=False)
    if not result.complete:
        console.print("[yellow]The sweep is incomplete: resume it with `kvbench sweep --resume RUN_DIR`.[/]")
    if result.requests.errors:
        console.print(f"[yellow]{result.requests.errors} of {result.requests.measured} measured requests failed[/]")
