"""The run directory: it owns every file name, knows its run kind and its next attempt number.

RUN_DIR/
  scenario.yaml        the validated scenario, as run (resume reads it)
  manifest.json        versions, host, git SHA, engine command lines (redacted), attempts
  records.jsonl        one RequestRecord per request, appended as each completes (every kind)
  progress.jsonl       probe: one GroupDone per finished (arm, repetition, context length)
  engine_metrics.jsonl probe: /metrics counter deltas per group and turn (fleets: summed over replicas)
  replica_metrics.jsonl fleets: every replica's cumulative cache counters at each scrape
  fleet.json           fleets: the versioned FleetResult (same vs moved, per-replica hits and load)
  summary.json         probe: the versioned RunResult (rebuilt by `kvbench report`)
  points.jsonl         sweep: one PointDone per finished (arm, load point)
  sweep.json           sweep: the versioned SweepResult
  intervals.jsonl      soak: one IntervalStats per finished interval
  soak.json            soak: the versioned SoakResult (verdict)
  faults.jsonl         soak: one FaultEvent per rehearsed failure (soak.faults)
  trace.json           replay: the replayed trace's identity and statistics (TraceInfo)
  samples.jsonl        replay: /metrics deltas per scrape interval and arm
  replayed.jsonl       replay: one ReplayDone per arm that replayed the whole trace
  replay.json          replay: the versioned ReplayResult
  logs/<arm>/          engine logs
  report/              tables and plots rendered from the result file

Every event file is append-only JSON Lines (:mod:`.jsonl`); result files are rewritten atomically. A run kept
in a repository has its event files and logs of 16 KiB or more packed (``records.jsonl.xz``,
``logs/<arm>/engine.log.xz``: :meth:`RunDir.pack_for_keeping`); a lab run its result files and the logs' JSON too
(``summary.json.xz``); every reader takes either form.

The directory is created 0700 and scenario.yaml 0600 (:mod:`common.private`). scenario.yaml and
manifest.json hold the scenario with its secrets removed (:func:`common.redact.redact_data`);
resuming such a run reads the secrets back from the original scenario file, which must still
say the same thing (:meth:`RunDir.resume_scenario`).
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import yaml

from common.errors import KvbenchError, RunDirError
from common.private import make_private_dir, write_private_text
from common.redact import REDACTED, redact_data
from harness.scenario.spec import Scenario, load_scenario, parse_scenario

from .events import (
    EngineDown,
    FaultEvent,
    GroupDone,
    IntervalStats,
    MetricsDelta,
    PointDone,
    ReplayDone,
    ReplaySample,
    ReplicaCounters,
    TraceInfo,
)
from .jsonl import append_jsonl, pack, read_jsonl, read_stored_bytes, stored_file
from .manifest import read_manifest
from .records import RequestRecord, read_records

RunKind = Literal["probe", "sweep", "soak", "replay", "agentic"]

PACK_MIN_BYTES = 16 * 1024
"""Files below this stay plain when a run is packed for keeping: small ones read as they are in a browser."""
RESULTS_PACK_MIN_BYTES = 1024
"""The same for a run packed with its results (the lab's, read through kvbench, not a browser)."""


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
    def replica_metrics_file(self) -> Path:
        return self.path / "replica_metrics.jsonl"

    @property
    def fleet_file(self) -> Path:
        return self.path / "fleet.json"

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
    def agentic_file(self) -> Path:
        """An agentic sweep's result (``kvbench sweep`` of workload kind ``agentic``)."""
        return self.path / "agentic.json"

    @property
    def intervals_file(self) -> Path:
        return self.path / "intervals.jsonl"

    @property
    def soak_file(self) -> Path:
        return self.path / "soak.json"

    @property
    def faults_file(self) -> Path:
        return self.path / "faults.jsonl"

    @property
    def engine_events_file(self) -> Path:
        return self.path / "engine_events.jsonl"

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

    def engine_log(self, arm: str) -> list[str] | None:
        """The lines of an arm's engine log (``engine.log``, or packed: ``engine.log.xz``, ``engine.log.gz`` as
        committed before); None without one."""
        plain = self.log_dir(arm) / "engine.log"
        stored = read_stored_bytes(plain)
        if stored is not None:
            return stored.decode("utf-8", errors="replace").splitlines()
        packed = plain.with_name("engine.log.gz")
        if packed.is_file():
            with gzip.open(packed, "rt", encoding="utf-8", errors="replace") as handle:
                return handle.read().splitlines()
        return None

    @property
    def result_files(self) -> tuple[Path, ...]:
        """Every versioned result file a run of some kind writes (``kvbench report`` rebuilds them)."""
        return (
            self.summary_file,
            self.sweep_file,
            self.soak_file,
            self.replay_file,
            self.agentic_file,
            self.fleet_file,
        )

    def pack_for_keeping(self, *, results: bool = False) -> list[Path]:
        """Pack the run's event files and logs (``logs/**/*.log``) of :data:`PACK_MIN_BYTES` or more (an engine log
        committed as ``engine.log.gz`` too); the packed files. For a finished run about to be committed: its readers
        read it as before, and a ``--resume`` unpacks what it appends to.

        ``results``: its result files, the logs' JSON (a simulator's ``sim-settings.json``) and ``report/``'s CSV
        tables too, and everything from :data:`RESULTS_PACK_MIN_BYTES`, for a run nobody opens in a browser (the
        lab's); the manifest stays plain (a
        calibration names its source runs by the manifest's SHA-256), and so do the report's Markdown and figures."""
        packed: list[Path] = []
        for old in sorted(self.path.glob("logs/**/engine.log.gz")):
            plain = old.with_suffix("")
            with gzip.open(old, "rb") as handle:
                plain.write_bytes(handle.read())
            old.unlink()
        candidates = [*self.path.glob("*.jsonl"), *self.path.glob("logs/**/*.log")]
        if results:
            candidates += [
                *(path for path in self.result_files if path.exists()),
                *self.path.glob("logs/**/*.json"),
                *self.report_dir.glob("*.csv"),
            ]
        least = RESULTS_PACK_MIN_BYTES if results else PACK_MIN_BYTES
        for path in sorted(candidates):
            if path.stat().st_size >= least:
                packed.append(pack(path))
        return packed

    @property
    def run_id(self) -> str:
        return self.path.name

    # -- creation -------------------------------------------------------------------------
    @staticmethod
    def new_path(parent: Path, scenario: Scenario) -> Path:
        """A new run directory's path in ``parent``: the scenario's name and the UTC time, not yet taken."""
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", scenario.name).strip("-")[:60] or "run"
        if parent.exists() and not parent.is_dir():
            raise RunDirError(f"{parent}: the output directory is a file, not a directory")
        path = parent / f"{slug}-{stamp}"
        suffix = 1
        while path.exists():
            suffix += 1
            path = parent / f"{slug}-{stamp}-{suffix}"
        return path

    @classmethod
    def create(cls, parent: Path, scenario: Scenario) -> RunDir:
        path = cls.new_path(parent, scenario)
        run_dir = cls(path)
        data = redact_data(scenario.model_dump(mode="json"))
        try:
            make_private_dir(path)
            write_private_text(run_dir.scenario_file, yaml.safe_dump(data, sort_keys=False))
        except OSError as error:
            raise RunDirError(f"{path}: cannot create the run directory: {error.strerror or error}") from None
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
        if self.trace_info_file.exists() or stored_file(self.replay_file) or self._workload_kind() == "trace":
            return "replay"
        if stored_file(self.agentic_file) or self._workload_kind() == "agentic":
            return "agentic"
        if stored_file(self.intervals_file) or stored_file(self.soak_file):
            return "soak"
        if stored_file(self.points_file) or stored_file(self.sweep_file):
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
        """The stored scenario (secrets shown as ``***``); an unreadable file is a RunDirError."""
        try:
            data = yaml.safe_load(self.scenario_file.read_bytes().decode("utf-8"))
        except OSError as error:
            raise RunDirError(f"{self.scenario_file}: cannot read: {error.strerror}") from None
        except (UnicodeDecodeError, yaml.YAMLError) as error:
            raise RunDirError(f"{self.scenario_file}: not a readable scenario: {error}") from None
        try:
            return parse_scenario(data, str(self.scenario_file))
        except KvbenchError as error:
            raise RunDirError(str(error)) from None

    def resume_scenario(self, overrides: Sequence[str] = ()) -> Scenario:
        """The scenario to continue with: the stored one, or, when secrets were removed from it, the
        original file (``scenario_source`` in the manifest), its ``${VAR}`` expanded and ``overrides`` (the
        run's ``--set`` options, given again) applied, if it still says the same thing."""
        stored = self.scenario()
        text = self.scenario_file.read_text(encoding="utf-8")
        if REDACTED not in text:
            if overrides:
                raise RunDirError(
                    f"{self.scenario_file}: --resume continues the stored scenario; --set cannot change it"
                )
            return stored
        source = read_manifest(self.manifest_file).get("scenario_source")
        hint = (
            f"{self.scenario_file} had its secrets removed; resuming needs the original scenario file "
            f"{source or '(unknown)'}"
        )
        if not isinstance(source, str):
            raise RunDirError(hint)
        try:
            original, _ = load_scenario(source, overrides)
        except KvbenchError as error:
            raise RunDirError(f"{hint}, which cannot be read: {error}") from None
        if redact_data(original.model_dump(mode="json")) != stored.model_dump(mode="json"):
            raise RunDirError(
                f"{hint}, which has changed since the run started (or the run had --set options: give the same "
                "ones with --resume)"
            )
        return original

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

    def faults(self) -> list[FaultEvent]:
        return read_jsonl(self.faults_file, FaultEvent)

    def engines_down(self) -> list[EngineDown]:
        return read_jsonl(self.engine_events_file, EngineDown)

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

    def replica_counters(self) -> list[ReplicaCounters]:
        return read_jsonl(self.replica_metrics_file, ReplicaCounters)

    def append_replica_counters(self, event: ReplicaCounters) -> None:
        append_jsonl(self.replica_metrics_file, event)

    def append_point(self, event: PointDone) -> None:
        append_jsonl(self.points_file, event)

    def append_interval(self, stats: IntervalStats) -> None:
        append_jsonl(self.intervals_file, stats)

    def append_fault(self, event: FaultEvent) -> None:
        append_jsonl(self.faults_file, event)

    def append_engine_down(self, event: EngineDown) -> None:
        append_jsonl(self.engine_events_file, event)

    def write_trace_info(self, info: TraceInfo) -> None:
        """Written once, by the first attempt (a resumed replay sends the same window)."""
        tmp = self.trace_info_file.with_name(self.trace_info_file.name + ".tmp")
        tmp.write_text(info.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.trace_info_file)

    def append_sample(self, sample: ReplaySample) -> None:
        append_jsonl(self.samples_file, sample)

    def mark_replayed(self, event: ReplayDone) -> None:
        append_jsonl(self.replayed_file, event)
