"""Reports of an agentic sweep (``agentic.json``): the agents-at-SLO table, the points, and TTFT vs agents.

* ``report/agents.md``: per arm and tier agents at SLO (per GPU, ratio to the baseline, $/Mtok, and where sampled
  J/token, GPU watts and agents per kW, labelled measured or simulated), then every point (TTFT p50/pXX, calls/s,
  tokens/s, measured hit rate beside the infinite-cache ceiling, tier attainment, energy);
* ``report/agents_ttft.svg``: TTFT at the first tier's percentile vs agents per arm, one dashed line per
  tier's TTFT limit;
* the console: the same two tables.

Every figure and table carries the provenance line (measured on what, or simulated).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from common.markup import console_text, md_table, md_text
from harness.results.agentic_result import AgenticResult, AgentPoint, TierCheck
from harness.results.energy import EnergySample

from .decode_tax import decode_tax_markdown, print_decode_tax
from .figures import caption, color, legend_outside, log_scale, new_figure, save, slo_band, styled
from .tables import print_table, text_table

TIER_DASHES = ("--", "-.", ":")


def _f(value: float | None, fmt: str = ".3g") -> str:
    return "—" if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _tier_text(tier: dict[str, float | str]) -> str:
    return (
        f"{tier['name']}: TTFT ≤ {float(tier['ttft_s']):g} s and ≥ {float(tier['min_output_tokens_per_s']):g} "
        f"tok/s for p{float(tier['percentile']):g} of calls"
    )


def energy_label(result: AgenticResult) -> str | None:
    """``simulated`` or ``measured (NVML)`` when any point has energy figures; None when none was sampled."""
    labels = {p.energy.label for p in result.points if p.energy is not None and p.energy.joules is not None}
    return " / ".join(sorted(labels)) if labels else None


def _energy_cells(energy: EnergySample | None) -> list[str]:
    if energy is None or energy.joules is None:
        return ["—", "—", "—"]
    return [_f(energy.joules_per_token), _f(energy.avg_watts, ".0f"), _f(energy.agents_per_kw)]


def _energy_header(result: AgenticResult) -> list[str]:
    label = energy_label(result)
    return [] if label is None else [f"J/token ({label})", f"GPU W ({label})", f"agents/kW ({label})"]


def capacity_rows(result: AgenticResult) -> tuple[list[str], list[list[str]]]:
    header = ["arm", "tier", "agents at SLO", "per GPU", f"vs {result.baseline_arm}", "$/Mtok", "status"]
    header += _energy_header(result)
    rows = []
    for cap in result.capacity:
        ratio = _f(cap.ratio_vs_baseline, ".2f") + ("x" if cap.ratio_vs_baseline is not None else "")
        if cap.ratio_note:
            ratio += f" ({cap.ratio_note})"
        rows.append(
            [
                cap.arm,
                cap.tier,
                cap.describe(),
                _f(cap.agents_at_slo_per_gpu),
                ratio if cap.arm != result.baseline_arm else "baseline",
                _f(cap.usd_per_mtok),
                cap.status,
                *(_energy_cells(cap.energy) if energy_label(result) else []),
            ]
        )
    return header, rows


def _ttft_s(point: AgentPoint, percentile: float) -> float | None:
    q = point.point.ttft
    if q is None:
        return None
    return (q.p99_ms if percentile >= 99 else q.p90_ms if percentile >= 90 else q.p50_ms) / 1000.0


def _tier_cell(check: TierCheck) -> str:
    if check.meets is None and check.attainment is not None:
        return _pct(check.attainment) + " (too few)"
    return _pct(check.attainment) + (" ✓" if check.meets else "")


def point_rows(result: AgenticResult) -> tuple[list[str], list[list[str]]]:
    tiers = [str(t["name"]) for t in result.tiers]
    header = ["arm", "agents", "calls", "TTFT p50 s", "TTFT p90 s", "calls/s", "tok/s", "hit", "ceiling", "$/Mtok"]
    header += [f"{name} att." for name in tiers]
    header += _energy_header(result)
    rows = []
    for p in result.points:
        q = p.point.ttft
        rows.append(
            [
                p.arm,
                str(p.agents),
                str(p.point.measured),
                _f(q.p50_ms / 1000 if q else None),
                _f(q.p90_ms / 1000 if q else None),
                _f(p.point.rps),
                _f(p.tokens_per_s),
                _pct(p.hit_rate),
                _pct(p.ceiling),
                _f(p.usd_per_mtok),
                *(_tier_cell(t) for t in p.tiers),
                *(_energy_cells(p.energy) if energy_label(result) else []),
            ]
        )
    return header, rows


def notes(result: AgenticResult) -> list[str]:
    lines = [_tier_text(t) for t in result.tiers]
    lines.append(
        f"agents at SLO: the largest agents count meeting the tier, interpolated toward the next failing count on the "
        f"attainment (an estimate); per GPU = / {result.gpus} GPU(s); $/Mtok = "
        f"{_f(result.usd_per_gpu_hour)} $/GPU-hour × GPUs / (prompt + generated) tokens per hour at the measured point"
    )
    if any(_tier_cell(t).endswith("(too few)") for p in result.points for t in p.tiers):
        lines.append(
            "too few: fewer measured calls than judge the tier's percentile (⌈1 / (1 − p/100)⌉: 10 at p90), so the "
            "point neither met nor failed it (lengthen the window)"
        )
    lines.append(
        f"ceiling: the infinite-cache hit rate of the calls sent (the workload's over its first sessions: "
        f"{_pct(result.workload_ceiling)}); hit: the engine's measured prefix-hit share of prompt tokens"
    )
    label = energy_label(result)
    if label is not None:
        lines.append(
            f"energy ({label}): the GPUs' joules over each window (not the host's CPUs, memory or offload tier); "
            "J/token = joules / (prompt + generated) tokens of the calls completed in it; agents/kW = agents / "
            "(GPU W / 1000); a tier's figures are those of its measured passing point"
        )
    if not result.complete:
        lines.append("the sweep is incomplete: resume it with `kvbench sweep --resume RUN_DIR`")
    return lines


@styled()
def ttft_figure(result: AgenticResult, provenance: str = "") -> Figure:
    """TTFT at the first tier's percentile vs agents, per arm, with every tier's TTFT limit."""
    percentile = float(result.tiers[0]["percentile"]) if result.tiers else 90.0
    fig = new_figure(8.0, 4.5)
    ax = fig.add_subplot()
    for index, arm in enumerate(result.arms):
        pts = [(p.agents, _ttft_s(p, percentile)) for p in result.points if p.arm == arm]
        shown = [(a, t) for a, t in pts if t is not None and t > 0]
        if shown:
            agents, ttft = zip(*shown, strict=True)
            ax.plot(agents, ttft, "o-", color=color(index), label=f"{arm} TTFT p{percentile:g}")
    log_scale(ax)
    log_scale(ax, "x")
    for index, tier in enumerate(result.tiers):
        label = f"{tier['name']}: TTFT p{float(tier['percentile']):g} ≤ {float(tier['ttft_s']):g} s"
        slo_band(ax, float(tier["ttft_s"]), label, "below", shade=False, dash=TIER_DASHES[index % len(TIER_DASHES)])
    ax.set_xlabel("concurrent agent sessions")
    ax.set_ylabel(f"TTFT p{percentile:g} (s, log scale)")
    fig.suptitle(f"{result.scenario_name}: TTFT vs agents ({result.engine_kind}, {result.gpus} GPU(s))")
    legend_outside(ax)
    caption(fig, provenance)
    return fig


def write_markdown(result: AgenticResult, path: Path, provenance: str = "") -> Path:
    text = [
        f"# {md_text(result.scenario_name)}: agents at SLO",
        "",
        *([f"**{md_text(provenance)}**", ""] if provenance else []),
        *md_table(*capacity_rows(result)),
        "",
        "## Points",
        "",
        *md_table(*point_rows(result)),
        "",
        *(f"- {md_text(line)}" for line in notes(result)),
        "",
        *decode_tax_markdown([p.point for p in result.points], result.baseline_arm, "agents"),
        "![TTFT vs agents](agents_ttft.svg)",
        "",
    ]
    path.write_text("\n".join(text), encoding="utf-8")
    return path


def write_agentic_reports(result: AgenticResult, out_dir: Path, provenance: str = "") -> list[Path]:
    """Every agentic output, from the result (and the provenance line of its manifest) alone."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = save(ttft_figure(result, provenance), out_dir / "agents_ttft")
    paths.append(write_markdown(result, out_dir / "agents.md", provenance))
    return paths


def _table(title: str, header: list[str], rows: list[list[str]], caption_text: str = "") -> Table:
    table = Table(title=console_text(title), caption=console_text(caption_text) if caption_text else None)
    return text_table(table, header, rows, text_columns=2)


def print_agentic(result: AgenticResult, console: Console, provenance: str = "") -> None:
    print_table(console, _table(f"{result.scenario_name} — agents at SLO", *capacity_rows(result), provenance))
    print_table(console, _table("per point", *point_rows(result)))
    for line in notes(result):
        console.print(line, highlight=False, markup=False)
    print_decode_tax([p.point for p in result.points], result.baseline_arm, "agents", console)
