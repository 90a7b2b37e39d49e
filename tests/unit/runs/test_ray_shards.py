"""``kvbench sweep --ray``'s parts that need no Ray cluster: the flags, the missing-Ray error, the lazy import, and
how a shard's run directory travels from its worker to the driver (streamed lines and whole files, reassembled
byte for byte). The sweep on a Ray cluster is tests/integration/test_ray_sweep.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from common.errors import KvbenchError
from harness.results.merge import merged_client
from harness.runs.ray_shards import Chunk, ShardFiles, import_ray, write_chunk
from harness.store.events import ClientLag, ProcessLag
from kvbench.cli import app
from tests.support import REPO

runner = CliRunner()
ENDPOINT_SWEEP = """\
name: ray-sweep
engine: {kind: openai, base_url: "http://127.0.0.1:9", model: tiny}
arms: [{name: endpoint, offload: "off"}]
workload:
  kind: multi_user_qa
  users: 4
  rounds: {dist: fixed, value: 2}
  context_tokens: {dist: choice, values: [1000]}
sweep: {mode: concurrency, values: [2, 4]}
"""


@pytest.fixture
def endpoint_sweep(tmp_path: Path) -> str:
    path = tmp_path / "sweep.yaml"
    path.write_text(ENDPOINT_SWEEP, encoding="utf-8")
    return str(path)


def test_without_ray_the_flag_says_what_to_install(monkeypatch: pytest.MonkeyPatch, endpoint_sweep: str) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # an import of it raises ImportError, as when it is not installed
    with pytest.raises(KvbenchError, match=r"--ray: Ray is not installed here: pip install 'kvbench\[ray\]'"):
        import_ray()
    result = runner.invoke(app, ["sweep", endpoint_sweep, "--ray", "local", "--workers", "2"])
    assert result.exit_code == 2, result.output
    assert "pip install 'kvbench[ray]'" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "flags",
    [["--workers", "2"], ["--ray", "local"], ["--ray", "local", "--workers", "2", "--shard", "0/2"]],
    ids=["workers-alone", "ray-alone", "with-shard"],
)
def test_the_ray_flags_go_together(flags: list[str], endpoint_sweep: str) -> None:
    result = runner.invoke(app, ["sweep", endpoint_sweep, *flags])
    assert result.exit_code == 2
    assert "--ray ADDRESS and --workers N go together" in result.output


def test_a_scenario_whose_engine_kvbench_starts_is_refused_before_any_worker() -> None:
    result = runner.invoke(app, ["sweep", "soak-sim", "--ray", "local", "--workers", "2"])
    assert result.exit_code == 2, result.output
    assert "engine.kind: sim: with --ray every worker would start its own engine" in result.output


def test_the_command_line_does_not_import_ray_without_the_flag() -> None:
    code = "import sys, kvbench.cli, harness.runs.ray_shards; print(sorted(m for m in sys.modules if m == 'ray'))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_shard_directory_streams_whole_lines_then_every_file(tmp_path: Path) -> None:
    out, copy = tmp_path / "out", tmp_path / "copy"
    files = ShardFiles(out)
    assert files.changes(final=False) == []  # kvbench has not made its run directory yet
    run = out / "run-1"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text('{"status": "running"}')
    (run / "records.jsonl").write_text('{"a": 1}\n{"b": 2}\n{"c": ')  # the last line still being written
    (run / "sweep.json").write_text("{}")
    (run / ".attempt.lock").write_text("pid")
    first = files.changes(final=False)
    assert {(chunk.path, chunk.offset) for chunk in first} == {("manifest.json", None), ("records.jsonl", 0)}
    assert next(c for c in first if c.path == "records.jsonl").data == b'{"a": 1}\n{"b": 2}\n'
    assert files.changes(final=False) == []  # nothing new
    with (run / "records.jsonl").open("a") as handle:
        handle.write('3}\n{"d": 4}\n')
    (run / "manifest.json").write_text('{"status": "complet')  # caught mid-rewrite: sent when it parses
    (run / "report").mkdir()
    (run / "report" / "capacity.md").write_text("# capacity\n")
    second = files.changes(final=False)
    assert [(chunk.path, chunk.offset) for chunk in second] == [("records.jsonl", len(b'{"a": 1}\n{"b": 2}\n'))]
    (run / "manifest.json").write_text('{"status": "completed"}')
    last = files.changes(final=True)
    assert {chunk.path for chunk in last} == {"manifest.json", "sweep.json", "report/capacity.md"}
    for chunk in [*first, *second, *last]:
        write_chunk(copy, chunk)
    for name in ("manifest.json", "records.jsonl", "sweep.json", "report/capacity.md"):
        assert (copy / name).read_bytes() == (run / name).read_bytes()
    assert not (copy / ".attempt.lock").exists()


def test_a_chunk_outside_its_folder_or_out_of_order_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KvbenchError, match="outside its run directory"):
        write_chunk(tmp_path / "copy", Chunk("../escaped.json", None, b"{}"))
    assert not (tmp_path / "escaped.json").exists()
    write_chunk(tmp_path / "copy", Chunk("records.jsonl", 0, b"{}\n"))
    with pytest.raises(KvbenchError, match="sent bytes at 10, the copy has 3"):
        write_chunk(tmp_path / "copy", Chunk("records.jsonl", 10, b"{}\n"))


def _lag(pid: int, p99: float, delay: float, sent: int) -> ClientLag:
    process = ProcessLag(
        pid=pid, role="runner", ticks=100, loop_delay_p99_ms=delay, loop_delay_max_ms=delay, cpu_fraction=0.5
    )
    return ClientLag(
        send_lag_n=sent,
        send_lag_p50_ms=p99 / 2,
        send_lag_p99_ms=p99,
        send_lag_max_ms=p99 * 2,
        slot_waits=0,
        slot_wait_p99_ms=None,
        slot_wait_max_ms=None,
        processes=[process],
    )


def test_a_merged_point_judges_every_shard_process_and_the_worst_send_lag() -> None:
    merged = merged_client([_lag(11, 3.0, 1.0, 40), _lag(22, 7.0, 30.0, 60)])
    assert merged is not None
    assert [process.pid for process in merged.processes] == [11, 22]  # each process as it measured itself
    assert merged.send_lag_n == 100 and merged.send_lag_p99_ms == 7.0 and merged.send_lag_max_ms == 14.0
    assert merged.slot_waits == 0 and merged.slot_wait_p99_ms is None
    assert merged_client([_lag(11, 3.0, 1.0, 40), None]) is None  # a shard that did not measure: not judged
