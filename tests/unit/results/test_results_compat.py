"""Kept run directories (docs/results; lab/runs under ``lab``) still load, re-aggregate and render with this kvbench.

Records and summaries are append-only files written by older versions; fields added since (the
streaming check, per-request stream accounting) must be optional, and re-aggregating must give the
same TTFT cells as the stored summary.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from harness.gate.playbook import run_kind
from harness.results.run_result import STREAM_RATIO_WARN, RunResult
from harness.runs.kinds import summarize
from harness.store.records import read_records
from harness.store.rundir import RunDir
from reports.outputs import write_outputs
from reports.renderers import markdown_table, print_console, stream_lines
from tests.kept_runs import kept_runs

PROBE_DIRS = kept_runs(lambda path: path.is_dir() and run_kind(path) == "probe")


def test_there_are_kept_probe_runs() -> None:
    assert PROBE_DIRS


@pytest.mark.parametrize("stored", PROBE_DIRS)
def test_kept_run_loads_rebuilds_and_renders(stored: Path, tmp_path: Path) -> None:
    old = RunResult.read_file(stored / "summary.json")
    markdown_table(old)
    stream_lines(old)
    records = list(read_records(stored / "records.jsonl"))
    assert records

    copy = tmp_path / stored.name
    shutil.copytree(stored, copy)
    run_dir = RunDir.open(copy)
    summarize(run_dir)
    write_outputs(run_dir, Console(file=io.StringIO(), width=200))
    new = RunResult.read_file(copy / "summary.json")
    assert [(c.arm, c.context_tokens, c.turn, c.ttft) for c in new.cells] == [
        (c.arm, c.context_tokens, c.turn, c.ttft) for c in old.cells
    ]
    assert new.requests == old.requests

    # a length re-run by --resume counts in its completing attempt only; a length no attempt completed (a run
    # stopped part-way) counts in the latest attempt that measured it
    completing: dict[tuple[str, int, int], int] = {}
    for event in RunDir.open(stored).groups_done():
        completing[event.key] = max(event.attempt, completing.get(event.key, -1))
    latest: dict[tuple[str, int, int], int] = {}
    for r in records:
        if r.phase == "measure":
            key = (r.arm, r.repetition, r.context_tokens or 0)
            latest[key] = max(r.attempt, latest.get(key, -1))
    completing = {**latest, **completing}
    measured = [
        r for r in records
        if r.phase == "measure" and r.ok and r.completion_tokens
        and completing.get((r.arm, r.repetition, r.context_tokens or 0)) == r.attempt
    ]  # fmt: skip
    assert new.stream is not None
    chunks = sum(r.output_chunks for r in measured)
    tokens = sum(r.completion_tokens or 0 for r in measured)
    assert (new.stream.text_chunks, new.stream.completion_tokens) == (chunks, tokens)
    fired = any("text-bearing chunks are" in warning for warning in new.stream.warnings)
    assert fired is (chunks / tokens < STREAM_RATIO_WARN)
    has_new_fields = any(r.first_chunk_ns is not None for r in measured)
    assert (new.stream.late_text is not None) is has_new_fields
    line, warnings = stream_lines(new)
    report = (copy / "report" / "ttft_table.md").read_text(encoding="utf-8")
    assert line is not None and line in report
    assert all(warning in report for warning in warnings)
    console = Console(record=True, width=400)
    print_console(new, {}, console)
    assert line in console.export_text()
