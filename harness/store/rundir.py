"""The run directory: it owns every file name, knows its run kind and its next attempt number.

RUN_DIR/
  scenario.yaml        the validated scenario, as run (resume reads it)
  manifest.json        versions, host, git SHA, engine command lines (redacted), attempts
  records.jsonl        one RequestRecord per request, appended as each completes (every kind)
  progress.jsonl       probe: one GroupDone per finished (arm, repetition, context length)
  engine_metrics.jsonl probe: /metrics counter deltas per group and turn
  summary.json         probe: the versioned RunResult (rebuilt by `kvbench report`)
  points.jsonl         sweep: one PointDone per finished (arm, load point)
  sweep.json           sweep: the versioned SweepResult
  intervals.jsonl      soak: one IntervalStats per finished interval
  soak.json            soak: the versioned SoakResult (verdict)
  trace.json           replay: the replayed trace's identity and statistics (TraceInfo)
  samples.jsonl        replay: /metrics deltas per scrape interval and arm
  replayed.jsonl       replay: one ReplayDone per arm that replayed the whole trace
  replay.json          replay: the versioned ReplayResult
  logs/<arm>/          engine logs
  report/              tables and plots rendered from the result file

Every event file is append-only JSON Lines (:mod:`.jsonl`); result files are rewritten atomically.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import yaml

from harness.scenario.spec import Scenario, parse_scenario
from kvbench.errors import RunDirError

from .events import GroupDone, IntervalStats, MetricsDelta, PointDone, ReplayDone, ReplaySample, TraceInfo
from .jsonl import append_jsonl, read_jsonl
from .manifest import read_manifest
from .records import RequestRecord, read_records

RunKind = Literal["probe", "sweep", "soak", "replay"]


@dataclass(frozen=True)
class RunDir:
    path: Path

    # -- file names -------------------------------------------------------------------------
    @property
    def scenario_file(self) -> Path:
        return self.path / "scenario.yaml"

    @property
    def manifest_file(self) -> Path:
        return self.path / "manifest.json"

    @property
    def records_file(self) -> Path:
        return self.path / "records.jsonl"

    @property
    def progress_file(self) -> Path:
        return self.path / "progress.jsonl"

    @property
    def metrics_file(self) -> Path:
        return self.path / "engine_metrics.jsonl"

    @property
    def summary_file(self) -> Path:
        return self.path / "summary.json"

    @property
    def points_file(self) -> Path:
        return self.path / "points.jsonl"

    @property
    def sweep_file(self) -> Path:
        return self.path / "sweep.json"

    @property
    def intervals_file(self) -> Path:
        return self.path / "intervals.jsonl"

    @property
    def soak_file(self) -> Path:
        return self.path / "soak.json"

    @property
    def trace_info_file(self) -> Path:
        return self.path / "trace.json"

    @property
    def samples_file(self) -> Path:
        return self.path / "samples.jsonl"

    @property
    def replayed_file(self) -> Path:
        return self.path / "replayed.jsonl"

    @property
    def replay_file(self) -> Path:
        return self.path / "replay.json"

    @property
    def report_dir(self) -> Path:
        return self.path / "report"

    def log_dir(self, arm: str) -> Path:
        return self.path / "logs" / arm

    @property
    def run_id(self) -> str:
        return self.path.name

    # -- creation -------------------------------------------------------------------------
    @classmethod
    def create(cls, parent: Path, scenario: Scenario) -> RunDir:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", scenario.name).strip("-")[:60] or "run"
        path = parent / f"{slug}-{stamp}"
        suffix = 1
        while path.exists():
            suffix += 1
            path = parent / f"{slug}-{stamp}-{suffix}"
        path.mkdir(parents=True)
        run_dir = cls(path)
        data = scenario.model_dump(mode="json")
        run_dir.scenario_file.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return run_dir

    @classmethod
    def open(cls, path: Path) -> RunDir:
        run_dir = cls(path)
        if not path.is_dir():
            raise RunDirError(f"{path}: not a directory")
        if not run_dir.scenario_file.exists():
            raise RunDirError(f"{path}: no scenario.yaml, so this is not a kvbench run directory")
        return run_dir

    @property
    def kind(self) -> RunKind:
        """What this directory holds, from the files its runner writes (a soak's scenario is also a sweep's);
        a replay is known by its workload kind too, so one interrupted before any file is written resumes."""
        if self.trace_info_file.exists() or self.replay_file.exists() or self._workload_kind() == "trace":
            return "replay"
        if self.intervals_file.exists() or self.soak_file.exists():
            return "soak"
        if self.points_file.exists() or self.sweep_file.exists():
            return "sweep"
        return "probe"

    def _workload_kind(self) -> object:
        if not self.scenario_file.exists():
            return None
        data = yaml.safe_load(self.scenario_file.read_text(encoding="utf-8"))
        workload = data.get("workload") if isinstance(data, dict) else None
        return workload.get("kind") if isinstance(workload, dict) else None

    # -- reading --------------------------------------------------------------------------
    def scenario(self) -> Scenario:
        data = yaml.safe_load(self.scenario_file.read_text(encoding="utf-8"))
        return parse_scenario(data, str(self.scenario_file))

    def records(self) -> list[RequestRecord]:
        return list(read_records(self.records_file))

    def groups_done(self) -> list[GroupDone]:
        return read_jsonl(self.progress_file, GroupDone)

    def metrics(self) -> list[MetricsDelta]:
        return read_jsonl(self.metrics_file, MetricsDelta)

    def points(self) -> list[PointDone]:
        return read_jsonl(self.points_file, PointDone)

    def intervals(self) -> list[IntervalStats]:
        """The soak's intervals by index; where a resumed attempt re-measured an index, the later line wins."""
        by_index = {item.index: item for item in read_jsonl(self.intervals_file, IntervalStats)}
        return [by_index[index] for index in sorted(by_index)]

    def trace_info(self) -> TraceInfo | None:
        if not self.trace_info_file.exists():
            return None
        return TraceInfo.model_validate_json(self.trace_info_file.read_text(encoding="utf-8"))

    def samples(self) -> list[ReplaySample]:
        return read_jsonl(self.samples_file, ReplaySample)

    def replayed(self) -> list[ReplayDone]:
        return read_jsonl(self.replayed_file, ReplayDone)

    def attempts_started(self) -> int:
        """Attempts the manifest recorded (0 before the first run starts)."""
        if not self.manifest_file.exists():
            return 0
        return len(read_manifest(self.manifest_file).get("attempts", []))

    def next_attempt(self) -> int:
        """0 for a new directory; one more than any attempt seen in any stored file otherwise."""
        seen = [record.attempt for record in self.records()]
        seen += [event.attempt for event in self.groups_done()]
        seen += [event.attempt for event in self.points()]
        seen += [event.attempt for event in self.intervals()]
        seen += [event.attempt for event in self.replayed()]
        seen.append(self.attempts_started() - 1)
        return max(seen, default=-1) + 1

    # -- appending ------------------------------------------------------------------------
    def mark_group_done(self, event: GroupDone) -> None:
        append_jsonl(self.progress_file, event)

    def append_metrics(self, delta: MetricsDelta) -> None:
        append_jsonl(self.metrics_file, delta)

    def append_point(self, event: PointDone) -> None:
        append_jsonl(self.points_file, event)

    def append_interval(self, stats: IntervalStats) -> None:
        append_jsonl(self.intervals_file, stats)

    def write_trace_info(self, info: TraceInfo) -> None:
        """Written once, by the first attempt (a resumed replay sends the same window)."""
        tmp = self.trace_info_file.with_name(self.trace_info_file.name + ".tmp")
        tmp.write_text(info.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.trace_info_file)

    def append_sample(self, sample: ReplaySample) -> None:
        append_jsonl(self.samples_file, sample)

    def mark_replayed(self, event: ReplayDone) -> None:
        append_jsonl(self.replayed_file, event)
