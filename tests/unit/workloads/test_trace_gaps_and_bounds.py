"""Traces with impossible gaps and synth settings out of range are one-line errors (R9, R10).

* R9: a request 35 days (or 1e15 ms) after the one before is refused by ``trace stats`` and by the
  replay's loader, naming file, line and field, unless ``--allow-gaps``; timestamps never decrease.
* R10: ``trace synth`` refuses NaN or infinite rates, unbounded session counts and a directory as
  output, each with one line and exit 2, never a traceback or a ``NaN`` timestamp.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.runs.trace import load_replayed_trace
from kvbench.cli import app
from workloads.config import TraceReplay
from workloads.trace import MAX_GAP_MS, TraceError, load_trace

DAY_MS = 86_400_000


def mooncake(tmp_path: Path, timestamps: list[float]) -> Path:
    path = tmp_path / "trace.jsonl"
    rows = [{"timestamp": t, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]} for t in timestamps]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("late", [35 * DAY_MS, 1e15])
def test_a_gap_beyond_an_hour_is_refused_unless_allowed(tmp_path: Path, late: float) -> None:
    path = mooncake(tmp_path, [0, 1000, 1000 + late])
    with pytest.raises(TraceError, match=rf"{path}:3: field 'timestamp': .* s after line 2's; a gap longer than 1 h"):
        load_trace(path, "mooncake")
    assert len(load_trace(path, "mooncake", allow_gaps=True).requests) == 3

    runner = CliRunner()
    refused = runner.invoke(app, ["trace", "stats", str(path)])
    assert refused.exit_code == 2 and "--allow-gaps" in refused.output
    assert len([line for line in refused.output.splitlines() if line.strip()]) == 1
    assert runner.invoke(app, ["trace", "stats", str(path), "--allow-gaps"]).exit_code == 0

    replay = TraceReplay.model_validate({"kind": "trace", "path": str(path)})
    with pytest.raises(TraceError, match="timestamp"):
        load_replayed_trace(replay)  # the replay never sits out a month in silence
    allowed = TraceReplay.model_validate({"kind": "trace", "path": str(path), "allow_gaps": True})
    assert len(load_replayed_trace(allowed).requests) == 3  # unless the scenario says it means it


def test_an_hour_exactly_and_decreasing_timestamps(tmp_path: Path) -> None:
    assert len(load_trace(mooncake(tmp_path, [0, MAX_GAP_MS]), "mooncake").requests) == 2
    with pytest.raises(TraceError, match="earlier than line 1's"):
        load_trace(mooncake(tmp_path, [5000, 10]), "mooncake")


WORKLOAD = {"kind": "multi_user_qa", "users": 2, "rounds": 2, "context_tokens": 200, "question_tokens": 10}


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--session-rate", "nan"], "--session-rate nan"),
        (["--session-rate", "inf"], "--session-rate inf"),
        (["--session-rate", "0"], "--session-rate 0.0"),
        (["--sessions", "1000000000"], "--sessions 1000000000"),
        (["--response-s", "nan"], "--response-s nan"),
        (["--block-tokens", "0"], "--block-tokens 0"),
    ],
)
def test_synth_settings_out_of_range_are_one_line(tmp_path: Path, flags: list[str], named: str) -> None:
    source = tmp_path / "workload.yaml"
    source.write_text(yaml.safe_dump(WORKLOAD), encoding="utf-8")
    out = tmp_path / "t.jsonl"
    done = CliRunner().invoke(app, ["trace", "synth", str(source), "-o", str(out), *flags])
    assert done.exit_code == 2, done.output
    lines = [line for line in done.output.splitlines() if line.strip()]
    assert len(lines) == 1 and named in lines[0] and "must be" in lines[0]
    assert not out.exists()


def test_synth_into_a_directory_is_one_line_and_a_good_synth_writes_finite_timestamps(tmp_path: Path) -> None:
    source = tmp_path / "workload.yaml"
    source.write_text(yaml.safe_dump(WORKLOAD), encoding="utf-8")
    runner = CliRunner()
    into_dir = runner.invoke(app, ["trace", "synth", str(source), "-o", str(tmp_path)])
    assert into_dir.exit_code == 2 and "is a directory" in into_dir.output and "Traceback" not in into_dir.output
    out = tmp_path / "t.jsonl"
    done = runner.invoke(app, ["trace", "synth", str(source), "-o", str(out), "--session-rate", "2"])
    assert done.exit_code == 0, done.output
    assert "NaN" not in out.read_text(encoding="utf-8")
    assert load_trace(out, "kvbench").requests
