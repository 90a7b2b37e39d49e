"""A torn last line (a killed writer, a full disk) is cut off and kept aside before anything is appended."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.store.events import GroupDone
from harness.store.jsonl import append_jsonl, read_jsonl, repair_torn_tail, torn_file
from harness.store.records import RecordWriter, RequestRecord, read_records
from harness.store.rundir import RunDir
from kvbench.cli import app
from tests.resultfiles import request_record
from tests.unit.gate.test_compare import make_run


def record(index: int) -> RequestRecord:
    return request_record(
        "AMG-ON",
        64,
        index,
        1,
        attempt=1,
        request_id=f"r{index}",
        started_ns=index,
        ttft_ns=1_000_000 + index,
        e2e_ns=2_000_000,
        error="caf\u00e9 \u2603",
    )


def tear(path: Path, line: bytes) -> bytes:
    """Append the first part of ``line``, cut inside a multi-byte character; return what was appended."""
    cut = line.index("\u2603".encode()) + 1
    torn = line[:cut]
    with path.open("ab") as handle:
        handle.write(torn)
    return torn


def test_record_writer_repairs_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        writer.append(record(0))
        writer.append(record(1))
    torn = tear(path, record(2).model_dump_json().encode())
    assert [r.request_id for r in read_records(path)] == ["r0", "r1"]  # readers skip the torn line
    with RecordWriter(path) as writer:
        assert writer.repaired_bytes == len(torn)
        writer.append(record(3))
    assert [r.request_id for r in read_records(path)] == ["r0", "r1", "r3"]
    assert torn_file(path).read_bytes() == torn + b"\n"
    assert path.read_bytes().endswith(b"\n") and path.read_bytes().count(b"\n") == 3


def test_append_jsonl_repairs_too(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    first = GroupDone(arm="A", repetition=0, context_tokens=64, attempt=0)
    append_jsonl(path, first)
    with path.open("ab") as handle:
        handle.write(b'{"arm": "A", "repeti')
    append_jsonl(path, GroupDone(arm="A", repetition=1, context_tokens=64, attempt=1))
    assert [event.repetition for event in read_jsonl(path, GroupDone)] == [0, 1]
    assert torn_file(path).read_bytes() == b'{"arm": "A", "repeti\n'


def test_nothing_to_repair_leaves_no_side_file(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    assert repair_torn_tail(path) == 0
    path.write_bytes(b'{"a": 1}\n')
    assert repair_torn_tail(path) == 0
    assert not torn_file(path).exists()


def test_torn_only_line_is_cut_whole(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a": ')
    assert repair_torn_tail(path) == 6
    assert path.read_bytes() == b""


def test_report_and_compare_work_on_a_torn_run_directory(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", seed=1)
    current = make_run(tmp_path / "b", seed=2)
    torn = tear(RunDir(current).records_file, record(9).model_dump_json().encode())
    assert torn
    runner = CliRunner()
    result = runner.invoke(app, ["compare", str(base), str(current)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["report", "--rewrite", str(current)])
    assert result.exit_code == 0, result.output
    assert json.loads((current / "summary.json").read_text(encoding="utf-8"))["schema_version"]


def test_run_directory_is_private(tmp_path: Path) -> None:
    run = make_run(tmp_path / "a", seed=1)
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    assert stat.S_IMODE((run / "scenario.yaml").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("records_middle", "records.jsonl:"),
        ("scenario_latin1", "scenario.yaml"),
        ("scenario_yaml", "scenario.yaml"),
        ("manifest_garbage", "manifest.json"),
        ("records_dir", "records.jsonl"),
    ],
)
def test_compare_exits_2_on_any_input_it_cannot_read(tmp_path: Path, damage: str, expected: str) -> None:
    base = make_run(tmp_path / "a", seed=1)
    current = make_run(tmp_path / "b", seed=2)
    run = RunDir(current)
    if damage == "records_middle":
        lines = run.records_file.read_bytes().splitlines(keepends=True)
        run.records_file.write_bytes(b"".join([lines[0], b"{oops\n", *lines[1:]]))
    elif damage == "scenario_latin1":
        run.scenario_file.write_bytes(run.scenario_file.read_bytes() + "# caf\u00e9\n".encode("latin-1"))
    elif damage == "scenario_yaml":
        run.scenario_file.write_text("name: [unclosed\n", encoding="utf-8")
    elif damage == "manifest_garbage":
        run.manifest_file.write_bytes(b"\xff\xfe not json")
    else:
        run.records_file.unlink()
        run.records_file.mkdir()
    result = CliRunner().invoke(app, ["compare", str(base), str(current)])
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert expected in result.output
    assert "Traceback" not in result.output
