"""A kept run's packed files (``NAME.jsonl.xz``, ``engine.log.xz``) read as the plain ones did; appending unpacks.

Packing is for a finished run about to be committed (``kvbench report --rewrite --compress``): the same bytes
pack to the same file, every reader takes the packed form where the plain one is absent, and a ``--resume`` that
appends to a packed file first turns it back into plain JSON Lines holding every line.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from common.errors import RunDirError
from harness.results.run_result import RunResult
from harness.runs.kinds import results_of
from harness.store.events import GroupDone
from harness.store.jsonl import append_jsonl, pack, packed_file, read_jsonl
from harness.store.rundir import PACK_MIN_BYTES, RunDir
from reports.outputs import write_outputs
from tests.kept_runs import PRODUCT_RUNS, plain_copy


def groups(count: int, attempt: int = 0) -> list[GroupDone]:
    return [GroupDone(arm="ON", repetition=0, context_tokens=tokens, attempt=attempt) for tokens in range(count)]


def test_a_packed_file_reads_as_the_plain_one_and_packs_the_same_twice(tmp_path: Path) -> None:
    events = tmp_path / "progress.jsonl"
    for event in groups(500):
        append_jsonl(events, event)
    plain = events.read_bytes()

    first = pack(events)
    assert first == packed_file(events) and not events.exists()
    assert read_jsonl(events, GroupDone) == groups(500)
    packed_once = first.read_bytes()
    assert len(packed_once) < len(plain)

    events.write_bytes(plain)
    first.unlink()
    assert pack(events).read_bytes() == packed_once  # no timestamp inside: the same bytes pack the same


def test_appending_to_a_packed_file_unpacks_it_first(tmp_path: Path) -> None:
    events = tmp_path / "progress.jsonl"
    for event in groups(3):
        append_jsonl(events, event)
    pack(events)

    append_jsonl(events, groups(1, attempt=1)[0])

    assert not packed_file(events).exists()
    assert read_jsonl(events, GroupDone) == [*groups(3), *groups(1, attempt=1)]


def test_a_kept_run_packed_for_keeping_reads_the_same(tmp_path: Path) -> None:
    copy = plain_copy(PRODUCT_RUNS / "quickstart-sim", tmp_path / "run")
    log = copy / "logs" / "AMG-ON" / "engine.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"INFO line {number}" for number in range(PACK_MIN_BYTES // 10)]
    with gzip.open(log.with_name("engine.log.gz"), "wt", encoding="utf-8") as handle:  # as older runs committed it
        handle.write("\n".join(lines) + "\n")
    run_dir = RunDir.open(copy)
    records, metrics, kind = run_dir.records(), run_dir.metrics(), run_dir.kind

    packed = run_dir.pack_for_keeping()

    assert copy / "records.jsonl.xz" in packed and log.with_name("engine.log.xz") in packed
    assert not (copy / "records.jsonl").exists() and not log.with_name("engine.log.gz").exists()
    assert (copy / "progress.jsonl").exists()  # below PACK_MIN_BYTES: stays plain, readable as it is
    assert (run_dir.records(), run_dir.metrics(), run_dir.kind) == (records, metrics, kind)
    assert run_dir.engine_log("AMG-ON") == lines


def test_a_lab_run_packs_its_result_file_too_and_a_rewrite_writes_it_plain_again(tmp_path: Path) -> None:
    kept = PRODUCT_RUNS / "gpu-seed-llama70b-tp4-fp8-h200"  # its summary.json is over PACK_MIN_BYTES
    copy = plain_copy(kept, tmp_path / kept.name)  # the run id is the folder's name
    settings = copy / "logs" / "AMG-OFF" / "sim-settings.json"
    settings.write_text(json.dumps({"padding": "x" * PACK_MIN_BYTES}), encoding="utf-8")
    summary = (copy / "summary.json").read_bytes()
    manifest = (copy / "manifest.json").read_bytes()
    run_dir = RunDir.open(copy)

    assert copy / "summary.json.xz" not in run_dir.pack_for_keeping()  # an event-file packing leaves it plain
    packed = run_dir.pack_for_keeping(results=True)

    assert {copy / "logs" / "AMG-OFF" / "sim-settings.json.xz", copy / "summary.json.xz"} <= set(packed)
    assert copy / "report" / "ttft.csv.xz" in packed  # the lab's tables too
    assert not any(path.parent == copy / "report" and path.name.endswith(".md.xz") for path in packed)
    assert not (copy / "summary.json").exists() and (copy / "manifest.json").read_bytes() == manifest
    assert RunResult.read_file(copy) == RunResult.read_file(kept)
    assert results_of(run_dir).result.file_text().encode() == summary  # rebuilt from the packed run as committed

    written = RunResult.read_file(copy).write_file(copy)
    assert written.read_bytes() == summary and not (copy / "summary.json.xz").exists()  # no stale twin left
    tables = write_outputs(run_dir)
    assert copy / "report" / "ttft.csv" in tables and not (copy / "report" / "ttft.csv.xz").exists()


def test_a_packed_result_file_that_is_not_xz_is_one_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "summary.json.xz").write_bytes(b"not xz at all")

    with pytest.raises(RunDirError, match=r"summary\.json\.xz: not a readable xz file"):
        RunResult.read_file(tmp_path)
