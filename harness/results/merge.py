"""``kvbench merge``: one run directory from the run directories of a sharded run's shards (``--shard I/N``).

The merge unites raw files; it computes no figure. Every figure of the merged run is the normal results code's
(:mod:`.sweep`, :mod:`.agentic`, :mod:`.replay`) over the united records, so percentiles are computed over every
shard's requests in one pass, never averaged.

**One run.** The shards must be sweeps, agentic sweeps or replays of one scenario (equal
:func:`~harness.store.manifest.scenario_digest`, which covers the seed), with one shard count, one prompt salt and
every index ``0..N-1`` exactly once; otherwise the merge refuses (exit 2) and names the shards. (A probe's turn-2
gates and a soak's intervals are judged live from one process's view of the engine: they are not merged.)

**One clock.** Records hold monotonic clock readings, which mean nothing across machines. Each shard attempt
recorded ``wall_minus_monotonic_ns`` (:class:`~harness.store.manifest_model.AttemptClock`): the merge adds it to
every clock reading (``started_ns``, ``scheduled_ns``, the points' window edges), so the merged run's readings are
Unix ns and the shards' windows compare, to the accuracy of their wall clocks. Durations (TTFT, inter-token gaps,
end-to-end) are not touched. Each shard's offset from the server's ``Date`` header is reported as recorded.

**One load point.** Per (arm, point), the shards' kept :class:`~harness.store.events.PointDone` (each shard's
latest) become one: its attempt the latest of theirs, to which each shard's records of the attempt that finished the
point are renumbered (a resumed shard finished it later; its discarded attempts keep their numbers), ``load`` the
whole load, counters summed (``max_in_flight`` too: an upper bound of the whole), the measured window the shards'
*intersection* ``[max(start), min(end)]``, inside which every shard applied its part, so the whole load. The
engine's ``/metrics`` deltas and energy are the server's, which every shard scraped alike: the lowest shard's are
kept, not summed. The client's lag (:func:`merged_client`): every shard's sending processes, each as it measured
itself, so the client gate judges every process of the whole load.

**Verdict** (``manifest.json``'s ``merged``): inconclusive, naming the shards, when a shard's last attempt did not
complete (failed, interrupted, still running), a shard lacks a point another finished, or a point's intersection is
shorter than :data:`MIN_OVERLAP` of its shortest shard window, or a replay's shards started the trace more than
:data:`MAX_REPLAY_SKEW_S` apart (the shards did not run it together: ``--start-at`` aligns them); the merged point
then keeps the union of the windows so its figures can still be read. Reading the
merged run never writes to the shard directories.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import __version__
from common.errors import KvbenchError, RunDirError
from common.private import make_private_dir, write_private_text
from common.redact import redact_argv
from harness.store.events import ClientLag, PointDone, ReplayDone
from harness.store.jsonl import append_jsonl
from harness.store.manifest import (
    MANIFEST_VERSION,
    Manifest,
    host_facts,
    now_iso,
    read_manifest,
    scenario_digest,
)
from harness.store.records import RecordWriter, RequestRecord
from harness.store.rundir import RunDir, RunKind

from .points import kept_attempts
from .verdict import EXIT_INCONCLUSIVE, Outcome

MERGEABLE_KINDS: tuple[RunKind, ...] = ("sweep", "agentic", "replay")
MIN_OVERLAP = 0.9
"""A merged point's measured window (the shards' intersection) must be at least this share of its shortest shard
window; less, and the shards did not apply the load together."""
MAX_REPLAY_SKEW_S = 1.0
"""A merged replay's shards must have started their trace within this many seconds of each other (each sends its
conversations at their trace times from its own start)."""
NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class ShardRun:
    """One shard's run directory, as the merge reads it."""

    given: Path
    run_dir: RunDir
    kind: RunKind
    manifest: dict[str, Any]
    index: int
    count: int
    digest: str
    clocks: dict[int, int]
    """Per attempt: wall minus monotonic ns."""

    @property
    def name(self) -> str:
        return f"shard {self.index} ({self.given})"

    @property
    def last_attempt(self) -> dict[str, Any]:
        attempts = self.manifest.get("attempts") or [{}]
        last: dict[str, Any] = attempts[-1]
        return last

    def shift(self, attempt: int) -> int:
        if attempt not in self.clocks:
            raise RunDirError(
                f"{self.run_dir.manifest_file}: attempts[{attempt}].clock: missing, so its monotonic times cannot be "
                "put on a common clock (a shard records it when its first load point starts)"
            )
        return self.clocks[attempt]


def read_shard(path: Path) -> ShardRun:
    """A shard's run directory; a one-line error naming the directory and field when it is not one."""
    run_dir = RunDir.open(path)
    manifest = read_manifest(run_dir.manifest_file)
    block = manifest.get("shard")
    if not (isinstance(block, dict) and isinstance(block.get("index"), int) and isinstance(block.get("count"), int)):
        where = f"{run_dir.manifest_file}: shard"
        raise RunDirError(f"{where}: missing, so {path} is not a shard (run it with --shard I/N)")
    kind = run_dir.kind
    if kind not in MERGEABLE_KINDS:
        raise KvbenchError(
            f"{path}: a {kind} run; kvbench merge merges {', '.join(MERGEABLE_KINDS)} runs (a probe's turn-2 gates and "
            "a soak's intervals are judged live by one process)"
        )
    clocks: dict[int, int] = {}
    for entry in manifest.get("attempts", []):
        clock = entry.get("clock") if isinstance(entry, dict) else None
        if isinstance(clock, dict) and isinstance(clock.get("wall_minus_monotonic_ns"), int):
            clocks[int(entry["attempt"])] = int(clock["wall_minus_monotonic_ns"])
    return ShardRun(
        given=path,
        run_dir=run_dir,
        kind=kind,
        manifest=manifest,
        index=int(block["index"]),
        count=int(block["count"]),
        digest=scenario_digest(run_dir.scenario()),
        clocks=clocks,
    )


def check_one_run(shards: Sequence[ShardRun], absent: Sequence[int] = ()) -> None:
    """Refuse (one line naming the shards) shards that are not the whole of one run; ``absent``: shards known to
    have left no run directory (a Ray worker that died first), not missing."""
    first = shards[0]
    for shard in shards[1:]:
        if shard.kind != first.kind:
            raise KvbenchError(f"{shard.given}: a {shard.kind} run, {first.given} a {first.kind} run: not one run")
        if shard.digest != first.digest:
            raise KvbenchError(
                f"{shard.given}: its scenario (sha256 {shard.digest[:12]}) differs from {first.given}'s "
                f"({first.digest[:12]}): not one run (same scenario, seed and flags on every shard)"
            )
        if shard.count != first.count:
            raise KvbenchError(f"{shard.given}: shard {shard.index}/{shard.count}, {first.given}: of {first.count}")
        if shard.manifest.get("prompt_salt") != first.manifest.get("prompt_salt"):
            raise KvbenchError(
                f"{shard.given}: its prompt salt differs from {first.given}'s: the shards were started with different "
                "--start-at, so they are not one run"
            )
    seen: dict[int, Path] = {}
    for shard in shards:
        if shard.index in seen:
            raise KvbenchError(f"shard {shard.index}/{shard.count} given twice: {seen[shard.index]} and {shard.given}")
        seen[shard.index] = shard.given
    missing = [str(index) for index in range(first.count) if index not in seen and index not in absent]
    if missing:
        raise KvbenchError(
            f"shards {', '.join(missing)} of 0..{first.count - 1} missing: give every shard's run directory"
        )


def shifted_record(record: RequestRecord, shard: ShardRun) -> RequestRecord:
    """The record on the merged run's clock (Unix ns), carrying its shard."""
    shift = shard.shift(record.attempt)
    scheduled = None if record.scheduled_ns is None else record.scheduled_ns + shift
    return record.model_copy(
        update={"started_ns": record.started_ns + shift, "scheduled_ns": scheduled, "shard": shard.index}
    )


Renumbering = dict[tuple[int, str, int | None], tuple[int, int]]
"""(shard, arm, point or None for a replay) -> (the attempt that shard finished it in, the merged run's attempt)."""


def renumber(parts: Sequence[tuple[ShardRun, int]], arm: str, point: int | None, renumbering: Renumbering) -> int:
    """The merged attempt of a point (a replay's arm) the shards finished in attempts ``parts``: the latest; each
    shard's finishing attempt is mapped to it (its earlier, discarded attempts keep their lower numbers)."""
    merged = max(attempt for _, attempt in parts)
    for shard, attempt in parts:
        renumbering[(shard.index, arm, point)] = (attempt, merged)
    return merged


def renumbered(record: RequestRecord, shard: ShardRun, renumbering: Renumbering) -> RequestRecord:
    """The record of a shard's finishing attempt of a point, as the merged point's attempt (see :func:`renumber`)."""
    found = renumbering.get((shard.index, record.arm, record.point))
    if found is None or record.attempt != found[0] or found[0] == found[1]:
        return record
    return record.model_copy(update={"attempt": found[1]})


def merged_point(
    parts: Sequence[tuple[ShardRun, PointDone]], findings: list[str], renumbering: Renumbering
) -> PointDone:
    """One point from every shard's part of it (see the module docstring); a finding when they did not overlap."""
    first = parts[0][1]
    attempt = renumber([(shard, event.attempt) for shard, event in parts], first.arm, first.point, renumbering)
    windows = [
        (event.window_start_ns + shard.shift(event.attempt), event.window_end_ns + shard.shift(event.attempt))
        for shard, event in parts
    ]
    start, end = max(w[0] for w in windows), min(w[1] for w in windows)
    shortest = min(w[1] - w[0] for w in windows)
    if end - start < MIN_OVERLAP * shortest:
        late = max(range(len(parts)), key=lambda i: windows[i][0])
        early = min(range(len(parts)), key=lambda i: windows[i][1])
        overlap_s = max(0, end - start) / NS_PER_S
        findings.append(
            f"arm {first.arm}, point {first.point}: the measured windows of shard {parts[early][0].index} (ends first) "
            f"and shard {parts[late][0].index} (starts last) overlap {overlap_s:.2f} s of the shortest "
            f"{shortest / NS_PER_S:.2f} s (under {MIN_OVERLAP:.0%}): the shards did not run the point together "
            "(start them with one --start-at)"
        )
        start, end = min(w[0] for w in windows), max(w[1] for w in windows)
    return PointDone(
        arm=first.arm,
        point=first.point,
        load=first.load,
        attempt=attempt,
        start_ns=min(event.start_ns + shard.shift(event.attempt) for shard, event in parts),
        window_start_ns=start,
        window_end_ns=end,
        end_ns=max(event.end_ns + shard.shift(event.attempt) for shard, event in parts),
        sent=sum(event.sent for _, event in parts),
        measured=sum(event.measured for _, event in parts),
        errors=sum(event.errors for _, event in parts),
        sessions=sum(event.sessions for _, event in parts),
        max_in_flight=sum(event.max_in_flight for _, event in parts),
        late_arrivals=sum(event.late_arrivals for _, event in parts),
        cancelled=sum(event.cancelled for _, event in parts),
        metrics=first.metrics,
        energy=first.energy,
        client=merged_client([event.client for _, event in parts]),
    )


def merged_client(lags: Sequence[ClientLag | None]) -> ClientLag | None:
    """The client's lag over a merged point: every shard's processes (each process's event-loop delay and CPU use
    are its own, so the union is exact), the counts summed, and of the send-lag and slot-wait percentiles the worst
    shard's. The shards keep no per-request send lag (a closed-loop request's due time is not recorded), so the
    whole's percentile cannot be recomputed; the worst shard's is an upper bound of it (at most 1 % of each shard's
    requests lie above its p99, so at most 1 % of all lie above the largest p99). None: a shard did not measure."""
    if not lags or any(lag is None for lag in lags):
        return None
    known = [lag for lag in lags if lag is not None]

    def worst(values: Sequence[float | None]) -> float | None:
        present = [value for value in values if value is not None]
        return max(present) if present else None

    return ClientLag(
        send_lag_n=sum(lag.send_lag_n for lag in known),
        send_lag_p50_ms=worst([lag.send_lag_p50_ms for lag in known]),
        send_lag_p99_ms=worst([lag.send_lag_p99_ms for lag in known]),
        send_lag_max_ms=worst([lag.send_lag_max_ms for lag in known]),
        slot_waits=sum(lag.slot_waits for lag in known),
        slot_wait_p99_ms=worst([lag.slot_wait_p99_ms for lag in known]),
        slot_wait_max_ms=worst([lag.slot_wait_max_ms for lag in known]),
        processes=[process for lag in known for process in lag.processes],
    )


def merged_points(
    shards: Sequence[ShardRun], findings: list[str], renumbering: Renumbering, absent: Sequence[int] = ()
) -> list[PointDone]:
    kept = [kept_attempts(shard.run_dir.points()) for shard in shards]
    keys = sorted({key for chosen in kept for key in chosen}, key=lambda key: (key[0], key[1]))
    points: list[PointDone] = []
    for key in keys:
        without = sorted(
            [*absent, *(shard.index for shard, chosen in zip(shards, kept, strict=True) if key not in chosen)]
        )
        if without:
            findings.append(
                f"arm {key[0]}, point {key[1]}: shards {', '.join(map(str, without))} did not finish it, so it is not "
                "the whole load and is left out"
            )
            continue
        parts = [(shard, chosen[key]) for shard, chosen in zip(shards, kept, strict=True)]
        points.append(merged_point(parts, findings, renumbering))
    return points


def merged_replays(shards: Sequence[ShardRun], findings: list[str], renumbering: Renumbering) -> list[ReplayDone]:
    by_arm: dict[str, list[tuple[ShardRun, ReplayDone]]] = {}
    for shard in shards:
        latest: dict[str, ReplayDone] = {}
        for event in shard.run_dir.replayed():
            if event.arm not in latest or event.attempt >= latest[event.arm].attempt:
                latest[event.arm] = event
        for arm, event in latest.items():
            by_arm.setdefault(arm, []).append((shard, event))
    done = []
    for arm, parts in by_arm.items():
        if len(parts) < len(shards):
            have = {shard.index for shard, _ in parts}
            without = [str(shard.index) for shard in shards if shard.index not in have]
            findings.append(f"arm {arm}: shards {', '.join(without)} did not finish the replay")
            continue
        starts = {shard.index: event.start_ns + shard.shift(event.attempt) for shard, event in parts}
        first, last = min(starts, key=starts.__getitem__), max(starts, key=starts.__getitem__)
        skew_s = (starts[last] - starts[first]) / NS_PER_S
        if skew_s > MAX_REPLAY_SKEW_S:
            findings.append(
                f"arm {arm}: shard {last} started the trace {skew_s:.2f} s after shard {first} (over "
                f"{MAX_REPLAY_SKEW_S:g} s): the shards did not replay it together (start them with one --start-at)"
            )
        done.append(
            ReplayDone(
                arm=arm,
                attempt=renumber([(shard, event.attempt) for shard, event in parts], arm, None, renumbering),
                start_ns=min(event.start_ns + shard.shift(event.attempt) for shard, event in parts),
                end_ns=max(event.end_ns + shard.shift(event.attempt) for shard, event in parts),
                sent=sum(event.sent for _, event in parts),
                errors=sum(event.errors for _, event in parts),
                cancelled=sum(event.cancelled for _, event in parts),
                max_in_flight=sum(event.max_in_flight for _, event in parts),
            )
        )
    return done


def _shard_entry(shard: ShardRun, records: int) -> dict[str, Any]:
    last = shard.last_attempt
    clock = last.get("clock") if isinstance(last.get("clock"), dict) else {}
    offset = clock.get("server_offset_s") if isinstance(clock, dict) else None
    note = clock.get("server_offset_note") if isinstance(clock, dict) else None
    host = shard.manifest.get("host", {})
    return {
        "index": shard.index,
        "run_id": str(shard.manifest.get("run_id", shard.run_dir.run_id)),
        "path": str(shard.given),
        "host": str(host.get("hostname", "?")) if isinstance(host, dict) else "?",
        "status": str(last.get("status", "unknown")),
        "records": records,
        "server_offset_s": offset if isinstance(offset, int | float) else None,
        "server_offset_note": note if isinstance(note, str) else "not measured: the shard recorded no clock",
    }


def merge_shards(
    paths: Sequence[Path],
    out: Path,
    *,
    lost: Mapping[int, str] | None = None,
    keep: frozenset[str] = frozenset(),
) -> RunDir:
    """Write the merged run directory ``out`` (new, or an empty folder) from the shards' run directories; the shards
    are only read. Its result file is not written here: the run kind's summarize does that, as for any run.

    ``lost``: shard index -> why its worker was lost (a Ray worker that died, ``kvbench sweep --ray``): a finding
    each; a lost shard not among ``paths`` (it never started a load point) lacks every point. ``keep``: names in
    ``out`` that may exist already (the Ray driver's copies of the shards, in ``out/shards``)."""
    if not paths:
        raise KvbenchError("give the shards' run directories")
    shards = sorted((read_shard(path) for path in paths), key=lambda shard: shard.index)
    lost = lost or {}
    absent = sorted(set(lost) - {shard.index for shard in shards})
    check_one_run(shards, absent)
    if out.exists() and (not out.is_dir() or any(entry.name not in keep for entry in out.iterdir())):
        raise RunDirError(f"{out}: exists and is not an empty directory (-o names the merged run directory to create)")
    findings = [
        f"shard {index}: {why}, so the merged run lacks its part of the load" for index, why in sorted(lost.items())
    ] + [
        f"{shard.name} ended {shard.last_attempt.get('status', 'unknown')}"
        + (f" ({shard.last_attempt['reason']})" if shard.last_attempt.get("reason") else "")
        + ", so the merged run lacks part of its load"
        for shard in shards
        if shard.last_attempt.get("status") not in ("completed", "inconclusive")
    ]
    first = shards[0]
    merged = RunDir(out)
    try:
        if not out.is_dir():
            make_private_dir(out)
        write_private_text(merged.scenario_file, first.run_dir.scenario_file.read_text(encoding="utf-8"))
        renumbering: Renumbering = {}
        if first.kind == "replay":
            info = first.run_dir.trace_info()
            if info is not None:
                merged.write_trace_info(info)
            for event in merged_replays(shards, findings, renumbering):
                merged.mark_replayed(event)
            for sample in first.run_dir.samples():  # the server's counters: every shard scraped the same ones
                found = renumbering.get((first.index, sample.arm, None))
                if found is not None and sample.attempt == found[0]:
                    sample = sample.model_copy(update={"attempt": found[1]})
                merged.append_sample(sample)
        else:
            merged.points_file.touch()  # a sweep even when no point is whole (RunDir.kind reads the file's presence)
            for point in merged_points(shards, findings, renumbering, absent):
                merged.append_point(point)
        counts: dict[int, int] = {}
        with RecordWriter(merged.records_file) as writer:
            for shard in shards:
                counts[shard.index] = 0
                for record in shard.run_dir.records():
                    writer.append(renumbered(shifted_record(record, shard), shard, renumbering))
                    counts[shard.index] += 1
        for shard in shards:
            for down in shard.run_dir.engines_down():
                if down.attempt == len(shard.manifest.get("attempts", [])) - 1:
                    append_jsonl(merged.engine_events_file, down.model_copy(update={"attempt": 0}))
        manifest = _merged_manifest(first, shards, counts, findings, out)
        Manifest(merged.manifest_file, manifest).save()
    except OSError as error:
        raise RunDirError(f"{error.filename or out}: cannot write the merged run: {error.strerror or error}") from None
    return merged


def _merged_manifest(
    first: ShardRun, shards: Sequence[ShardRun], counts: dict[int, int], findings: list[str], out: Path
) -> dict[str, Any]:
    base = first.manifest
    verdict = "inconclusive" if findings else "valid"
    return {
        "manifest_version": MANIFEST_VERSION,
        "run_id": out.name,
        "scenario_name": base.get("scenario_name", ""),
        "scenario_source": base.get("scenario_source"),
        "scenario": base.get("scenario", {}),
        "prompt_salt": base.get("prompt_salt"),
        "kvbench_version": __version__,
        "kvbench_git_sha": base.get("kvbench_git_sha"),
        "command": redact_argv(sys.argv),
        "engines": base.get("engines", {}),
        "attempts": [
            {
                "attempt": 0,
                "started_at": now_iso(),
                "ended_at": now_iso(),
                "status": "completed" if not findings else "inconclusive",
                "reason": "; ".join(findings) if findings else f"merged from {len(shards)} shards",
            }
        ],
        "host": host_facts(),
        "shard": None,
        "merged": {
            "verdict": verdict,
            "findings": findings,
            "shards": [_shard_entry(shard, counts[shard.index]) for shard in shards],
        },
    }


def merge_outcome(run_dir: RunDir) -> Outcome | None:
    """A merged run's merge verdict as an outcome (None: not a merged run); ``kvbench report`` and ``kvbench merge``
    take the worse of it and the result file's."""
    block = read_manifest(run_dir.manifest_file).get("merged")
    if not isinstance(block, dict):
        return None
    findings = [str(finding) for finding in block.get("findings", [])]
    if block.get("verdict") != "inconclusive":
        return Outcome(status="completed")
    return Outcome(status="inconclusive", exit_code=EXIT_INCONCLUSIVE, reasons=tuple(findings))


def merge_lines(run_dir: RunDir) -> list[str]:
    """What the console says about a merged run: each shard, its records and its clock offset from the server."""
    block = read_manifest(run_dir.manifest_file).get("merged")
    if not isinstance(block, dict):
        return []
    lines = []
    for entry in block.get("shards", []):
        offset = entry.get("server_offset_s")
        clock = f"clock {offset:+.3f} s vs the server's Date" if isinstance(offset, int | float) else "clock offset "
        if not isinstance(offset, int | float):
            clock += str(entry.get("server_offset_note", "not measured"))
        lines.append(
            f"shard {entry.get('index')}: {entry.get('records')} records, {entry.get('status')}, "
            f"host {entry.get('host')}, {clock}"
        )
    return lines + [f"merge: {finding}" for finding in block.get("findings", [])]
