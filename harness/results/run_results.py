"""A run directory's result files held together: its kind's result file and, run on a fleet, ``fleet.json``;
with prefill/decode arms, ``pd-breakdown.json``.

``harness.runs.kinds.results_of`` aggregates them from the stored files without writing anything (``kvbench
report``); ``reports.outputs.write_outputs`` renders them, or reads the committed files when given none.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.schema import VersionedFile

from .fleet import FleetResult
from .pd_breakdown import PdBreakdownResult


@dataclass(frozen=True)
class RunResults:
    result: VersionedFile
    """summary.json, sweep.json, soak.json, replay.json or agentic.json, by the run's kind."""
    fleet: FleetResult | None
    """fleet.json; None when the engine is a single replica."""
    pd: PdBreakdownResult | None = None
    """pd-breakdown.json; None when no arm ran a prefill/decode deployment (engine kind vllm-pd)."""
