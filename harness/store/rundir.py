"""The run directory: where a run's files live and how they are read back.

RUN_DIR/
  scenario.yaml        the validated scenario, as run (resume reads it)
  manifest.json        versions, host, git SHA, engine command lines (redacted), attempts
  records.jsonl        one RequestRecord per request, appended as each completes
  progress.jsonl       one line per finished (arm, repetition, context length) group
  engine_metrics.jsonl /metrics counter deltas per group and turn
  summary.json         the versioned RunResult (rebuilt by `kvbench report`)
  logs/<arm>/          engine logs
  report/              tables rendered from summary.json
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import yaml

from harness.scenario.spec import Scenario, parse_scenario
from kvbench.errors import RunDirError

from .events import GroupDone, MetricsDelta
from .records import RequestRecord, append_jsonl, read_records


@dataclass(frozen=True)
class RunDir:
    path: Path

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

    # -- reading --------------------------------------------------------------------------
    def scenario(self) -> Scenario:
        data = yaml.safe_load(self.scenario_file.read_text(encoding="utf-8"))
        return parse_scenario(data, str(self.scenario_file))

    def records(self) -> list[RequestRecord]:
        return list(read_records(self.records_file))

    def groups_done(self) -> list[GroupDone]:
        return [GroupDone.model_validate(event) for event in _read_jsonl(self.progress_file)]

    def metrics(self) -> list[MetricsDelta]:
        return [MetricsDelta.model_validate(event) for event in _read_jsonl(self.metrics_file)]

    def last_attempt(self) -> int:
        attempts = [record.attempt for record in self.records()]
        attempts += [event.attempt for event in self.groups_done()]
        return max(attempts, default=-1)

    # -- appending ------------------------------------------------------------------------
    def mark_group_done(self, event: GroupDone) -> None:
        append_jsonl(self.progress_file, event.model_dump())

    def append_metrics(self, delta: MetricsDelta) -> None:
        append_jsonl(self.metrics_file, delta.model_dump())


def _read_jsonl(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    out = []
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            if number == len(lines) and not line.endswith("\n"):
                break  # torn final line of a killed writer
            raise RunDirError(f"{path}:{number}: not valid JSON") from None
    return out
