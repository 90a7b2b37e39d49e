"""JSON Schemas of every file kvbench stores, generated from the pydantic models that read them.

One row per file (:data:`STORED_FILES`): its schema name (``kvbench schema NAME``), where it lives, and the
model kvbench validates it with. The schemas are generated in pydantic's *validation* mode, so a schema accepts
exactly what kvbench reads back (an older file without a field that has a default included), and shipped as
package data in ``harness/results/schemas/NAME.schema.json``; a test keeps the shipped files equal to freshly
generated ones, and another validates every kept run against them. JSON Lines files (``*.jsonl``) have one
object per line: the schema is that of one line. The calibration is YAML: its schema is that of the mapping.

Regenerate the shipped files after changing a model: ``python3 -m harness.results.file_schemas``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from harness.results.agentic_result import AgenticResult
from harness.results.calibrated import CalibratedTtft
from harness.results.fleet import FleetResult
from harness.results.pd_breakdown import PdBreakdownResult
from harness.results.replay_result import ReplayResult
from harness.results.run_result import RunResult
from harness.results.soak_result import SoakResult
from harness.results.sweep_result import SweepResult
from harness.results.workers import RayWorkers
from harness.scenario.spec import Scenario
from harness.sim.calibration import Calibration
from harness.store import events
from harness.store.manifest_model import ManifestFile
from harness.store.records import RequestRecord

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
"""Where the generated schemas are shipped (package data)."""
DIALECT = "https://json-schema.org/draft/2020-12/schema"


@dataclass(frozen=True)
class StoredFile:
    """A file kvbench writes: ``file`` (its name in a run directory, or how it is named), the model that reads it."""

    name: str
    file: str
    model: type[BaseModel]
    what: str
    lines: bool = False
    """JSON Lines: the schema is one line's."""

    @property
    def schema_file(self) -> Path:
        return SCHEMA_DIR / f"{self.name}.schema.json"


STORED_FILES: dict[str, StoredFile] = {
    row.name: row
    for row in (
        StoredFile(
            "records", "records.jsonl", RequestRecord, "a request: timings, tokens, errors (every run kind)", lines=True
        ),
        StoredFile("manifest", "manifest.json", ManifestFile, "what ran, where, with which versions"),
        StoredFile("scenario", "scenario.yaml", Scenario, "the effective scenario as stored (YAML; secrets redacted)"),
        StoredFile("summary", "summary.json", RunResult, "kvbench run: the probe's result"),
        StoredFile("sweep", "sweep.json", SweepResult, "kvbench sweep: capacity curves, SLO, GPUs saved"),
        StoredFile("soak", "soak.json", SoakResult, "kvbench soak: intervals and the verdict"),
        StoredFile("replay", "replay.json", ReplayResult, "kvbench replay: per-arm latency, SLO and hit rates"),
        StoredFile("agentic", "agentic.json", AgenticResult, "kvbench sweep (agentic): agents at SLO per tier, energy"),
        StoredFile("fleet", "fleet.json", FleetResult, "fleets: same vs moved, per-replica hits and load"),
        StoredFile(
            "pd-breakdown", "pd-breakdown.json", PdBreakdownResult, "prefill/decode arms: TTFT parts, KV physics"
        ),
        StoredFile("workers", "workers.json", RayWorkers, "kvbench sweep --ray: the Ray worker of each shard"),
        StoredFile("calibration", "calibration.yaml", Calibration, "kvbench sim calibrate -o FILE (YAML)"),
        StoredFile("calibrated-ttft", "calibrated_ttft.json", CalibratedTtft, "kvbench sim predict: TTFT per cell"),
        StoredFile(
            "progress",
            "progress.jsonl",
            events.GroupDone,
            "kvbench run: a finished group (arm, repetition, length)",
            lines=True,
        ),
        StoredFile(
            "engine-metrics",
            "engine_metrics.jsonl",
            events.MetricsDelta,
            "kvbench run: /metrics deltas of one turn of a group",
            lines=True,
        ),
        StoredFile(
            "replica-metrics",
            "replica_metrics.jsonl",
            events.ReplicaCounters,
            "fleets: every replica's cache counters at a scrape",
            lines=True,
        ),
        StoredFile(
            "points", "points.jsonl", events.PointDone, "kvbench sweep: a finished load point of an arm", lines=True
        ),
        StoredFile(
            "intervals", "intervals.jsonl", events.IntervalStats, "kvbench soak: one interval's aggregates", lines=True
        ),
        StoredFile("faults", "faults.jsonl", events.FaultEvent, "kvbench soak: a rehearsed failure", lines=True),
        StoredFile("engine-events", "engine_events.jsonl", events.EngineDown, "an arm's engine died", lines=True),
        StoredFile("trace-info", "trace.json", events.TraceInfo, "kvbench replay: the trace's identity and statistics"),
        StoredFile(
            "samples",
            "samples.jsonl",
            events.ReplaySample,
            "kvbench replay: /metrics deltas of a scrape interval",
            lines=True,
        ),
        StoredFile(
            "replayed",
            "replayed.jsonl",
            events.ReplayDone,
            "kvbench replay: an arm that replayed the whole trace",
            lines=True,
        ),
    )
}


def generate(name: str) -> dict[str, object]:
    """The JSON Schema of stored file ``name``, fresh from its model."""
    row = STORED_FILES[name]
    schema: dict[str, object] = {"$schema": DIALECT}
    lines = ", one JSON object per line" if row.lines else ""
    schema["$comment"] = f"kvbench {row.file}{lines}: {row.what}. Generated from {row.model.__name__}; do not edit."
    schema.update(row.model.model_json_schema(mode="validation"))
    return schema


def render(name: str) -> str:
    """:func:`generate` as the shipped file's text."""
    return json.dumps(generate(name), indent=2, ensure_ascii=False) + "\n"


def shipped(name: str) -> str:
    """The shipped schema file's text (what ``kvbench schema NAME`` prints)."""
    return STORED_FILES[name].schema_file.read_text(encoding="utf-8")


def write_all(folder: Path = SCHEMA_DIR) -> list[Path]:
    """Write every schema into ``folder``; the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in STORED_FILES:
        path = folder / f"{name}.schema.json"
        path.write_text(render(name), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write_all():
        sys.stdout.write(f"wrote {path}\n")
