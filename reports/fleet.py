"""The fleet report (``report/fleet.md``), rendered from ``fleet.json`` alone.

Three tables (definitions in :mod:`harness.results.fleet`): same-replica vs moved turns (median TTFT
in ms and counts of turns >= 2, moved share = moved / (same + moved)); per-replica load and hit
tokens by source (share = requests / the arm's requests, busy s = Σ e2e seconds); and, for load
runs, fleet capacity (RPS per GPU = completed requests/s ÷ the fleet's GPUs). ``–`` marks a value
the run could not know.
"""

from __future__ import annotations

from harness.results.fleet import ArmFleet, FleetResult, MovedCell, ReplicaLoad

from .tables import md_rows

MOVED_HEADER = (
    "Arm",
    "Routing",
    "Tokens / load",
    "same t≥2 (n)",
    "same TTFT ms",
    "moved t≥2 (n)",
    "moved TTFT ms",
    "moved share",
)
LOAD_HEADER = (
    "Arm",
    "Replica",
    "Requests",
    "Share",
    "Busy s",
    "Peak in flight",
    "TTFT p90 ms",
    "Own-GPU hits",
    "Own-tier hits",
    "Shared-tier hits",
    "cached_tokens (usage)",
)
CAPACITY_HEADER = ("Arm", "Load", "RPS", "GPUs", "RPS per GPU")


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _tokens(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def _moved_row(arm: ArmFleet, cell: MovedCell) -> list[str]:
    share = cell.moved_share
    where = str(cell.context_tokens) if cell.context_tokens is not None else f"load {cell.load or 0:g}"
    return [
        arm.arm,
        arm.routing,
        where,
        str(cell.same_count),
        _ms(cell.same_ttft_ms),
        str(cell.moved_count),
        _ms(cell.moved_ttft_ms),
        "–" if share is None else f"{share:.0%}",
    ]


def _load_row(arm: ArmFleet, entry: ReplicaLoad) -> list[str]:
    return [
        arm.arm,
        str(entry.replica),
        str(entry.requests),
        f"{entry.share:.0%}",
        f"{entry.busy_s:.2f}",
        str(entry.peak_in_flight),
        _ms(entry.ttft_p90_ms),
        _tokens(entry.own_gpu_hits),
        _tokens(entry.own_tier_hits),
        _tokens(entry.shared_tier_hits),
        _tokens(entry.usage_cached_tokens),
    ]


def markdown(result: FleetResult) -> str:
    """The same-vs-moved table, per-replica load and hits, and capacity, as Markdown."""
    moved = [_moved_row(arm, cell) for arm in result.arms for cell in arm.moved]
    lines = md_rows(MOVED_HEADER, moved, text_columns=2)
    load = [_load_row(arm, entry) for arm in result.arms for entry in arm.load]
    lines += ["", *md_rows(LOAD_HEADER, load)]
    unknown = [
        f"{arm.arm} {arm.unattributed} of {sum(e.requests for e in arm.load) + arm.unattributed}"
        for arm in result.arms
        if arm.unattributed
    ]
    if unknown:
        lines += ["", f"Requests with no known replica (in no column above): {'; '.join(unknown)}."]
    capacity = [
        [arm.arm, f"{point.load:g}", f"{point.rps:.2f}", str(arm.gpus), f"{point.rps_per_gpu:.3f}"]
        for arm in result.arms
        for point in arm.capacity
    ]
    if capacity:
        lines += ["", *md_rows(CAPACITY_HEADER, capacity)]
    return "\n".join(lines) + "\n"
