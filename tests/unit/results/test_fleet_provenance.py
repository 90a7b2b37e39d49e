"""A fleet's figures name all its GPUs: replicas × GPUs per replica."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.results.provenance import provenance

RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"


def test_fleet_counts_every_replicas_gpus() -> None:
    data: dict[str, Any] = json.loads((RESULTS / "fleet-sim" / "manifest.json").read_text())
    assert "on 2× h100-sxm" in provenance(data).label  # scenarios/fleet-sim.yaml: replicas 2, tp 1
    data["scenario"]["engine"]["parallelism"] = {"tp": 2}
    assert "on 4× h100-sxm" in provenance(data).label
    data["scenario"]["engine"]["gpus_per_replica"] = 3
    assert "on 6× h100-sxm" in provenance(data).label
    del data["scenario"]["engine"]["replicas"]
    data["scenario"]["engine"]["parallelism"] = {"replicas": 5}  # the alias
    assert "on 15× h100-sxm" in provenance(data).label
