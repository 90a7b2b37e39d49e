"""Readers under hostile input, through the CLI a user runs (``kvbench`` as a subprocess): a one-line error naming the
file (and line, and field where there is one), exit 2, never a traceback.

* JSON nested 100,000 deep (a ``RecursionError`` in ``json.loads``) in a trace (``trace stats``), a manifest and a
  records line (``report``); every other reader: ``tests/unit/store/test_hostile_json.py``;
* a YAML alias bomb in a ``--set`` value (expanded and echoed before: 577 KB), and a long value echoed capped;
* a record whose TTFT is 3x its end-to-end time, refused by ``report``, ``compare`` and ``sim calibrate``;
* ``compare --threshold`` out of range: the option, the field and the allowed range on one line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.kept_runs import plain_copy
from tests.support import REPO, kvbench

DEEP = "[" * 100_000 + "]" * 100_000
RUN = REPO / "docs" / "results" / "quickstart-sim"


def one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The error line of a run that must fail with exit 2, one line, no traceback, naming every needle."""
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-2000:]
    assert "Traceback" not in output and "RecursionError" not in output, output[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def copied_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    plain_copy(RUN, run)  # records.jsonl as the run wrote it (the kept run holds it packed)
    shutil.rmtree(run / "report")
    return run


@pytest.mark.parametrize(("fmt", "deep_line"), [("auto", 2), ("bailian", 2), ("auto", 1), ("claude-code", 1)])
def test_a_deeply_nested_trace_line_is_one_line_naming_file_and_line(tmp_path: Path, fmt: str, deep_line: int) -> None:
    trace = tmp_path / "deep.jsonl"
    first = {"chat_id": "a", "parent_chat_id": -1, "timestamp": 0, "input_length": 16, "output_length": 1}
    lines = [json.dumps(first | {"type": "text", "turn": 1, "hash_ids": [1]})]
    lines.insert(deep_line - 1, DEEP)  # a trace is read in file order: the first bad line is the one named
    trace.write_text("\n".join(lines) + "\n")
    done = kvbench("trace", "stats", str(trace), "--format", fmt, cwd=tmp_path)
    one_line_error(done, f"{trace}:{deep_line}", "nested deeper than")


def test_a_deeply_nested_manifest_is_one_line(tmp_path: Path) -> None:
    run = copied_run(tmp_path)
    (run / "manifest.json").write_text(DEEP)
    one_line_error(kvbench("report", str(run), cwd=tmp_path), f"{run / 'manifest.json'}", "nested deeper than")


def test_a_deeply_nested_records_line_is_one_line(tmp_path: Path) -> None:
    run = copied_run(tmp_path)
    records = run / "records.jsonl"
    count = len(records.read_text().splitlines())
    with records.open("a") as out:
        out.write(DEEP + "\n")
    one_line_error(kvbench("report", str(run), cwd=tmp_path), f"{records}:{count + 1}", "recursion limit")


def alias_bomb(levels: int = 9) -> str:
    """A flow mapping whose every level repeats the one before nine times: 9**levels strings once expanded."""
    text = "{a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"
    previous = "a"
    for name in "bcdefghijklm"[: levels - 1]:
        text += f", {name}: &{name} [{', '.join([f'*{previous}'] * 9)}]"
        previous = name
    return text + "}"


def test_a_yaml_alias_in_a_set_value_is_refused_at_once(tmp_path: Path) -> None:
    done = kvbench(
        "validate", "quickstart", "--set", f"workload.conversations={alias_bomb()}", cwd=tmp_path, timeout=60
    )
    line = one_line_error(done, "--set workload.conversations", "alias *a")
    assert len(line) < 300


def test_an_echoed_set_value_is_capped(tmp_path: Path) -> None:
    huge = "[" + ", ".join(["word"] * 15_000) + "]"  # 90 KB: one argument may hold 128 KiB
    done = kvbench("validate", "quickstart", "--set", f"workload.conversations={huge}", cwd=tmp_path, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output, output[-2000:]
    assert "workload.conversations" in output and len(output) < 2000, output[:3000]


def with_ttft_past_the_end(run: Path) -> int:
    """Make the first successful measured record's TTFT 3x its end-to-end time; return its line number."""
    records = run / "records.jsonl"
    lines = records.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        record = json.loads(line)
        if record["phase"] == "measure" and record["ok"]:
            record |= {"ttft_ns": 3 * record["e2e_ns"], "first_chunk_ns": None, "first_content_ns": None}
            lines[number - 1] = json.dumps(record)
            records.write_text("\n".join(lines) + "\n")
            return number
    raise AssertionError(f"{records}: no successful measured record")


def test_a_record_with_ttft_past_its_end_is_refused_by_every_reader(tmp_path: Path) -> None:
    run = copied_run(tmp_path)
    number = with_ttft_past_the_end(run)
    where = f"{run / 'records.jsonl'}:{number}"
    one_line_error(kvbench("report", str(run), cwd=tmp_path), where, "e2e_ns", "earlier than ttft_ns")
    other = copied_run(tmp_path / "baseline")
    one_line_error(kvbench("compare", str(other), str(run), cwd=tmp_path), where, "e2e_ns")
    calibrated = kvbench("sim", "calibrate", str(run), "-o", str(tmp_path / "cal.yaml"), cwd=tmp_path)
    one_line_error(calibrated, where, "e2e_ns")
    assert not (tmp_path / "cal.yaml").exists()


@pytest.mark.parametrize(
    ("flag", "allowed"),
    [
        ("alpha=5", "> 0 and < 0.5 (a scenario's gate.alpha)"),
        ("alpha=nan", "> 0 and < 0.5"),
        ("ttft=-1", ">= 0 (a scenario's gate.ttft_max_increase_pct)"),
        ("hit_rate=2", ">= 0 and <= 1 (a scenario's gate.hit_rate_max_decrease)"),
        ("error_rate=inf", ">= 0 and <= 1"),
    ],
)
def test_a_threshold_out_of_range_is_one_line_naming_option_field_and_range(
    tmp_path: Path, flag: str, allowed: str
) -> None:
    run = copied_run(tmp_path)
    done = kvbench("compare", str(run), str(run), "-t", flag, cwd=tmp_path)
    one_line_error(done, f"--threshold {flag}: must be a finite number {allowed}")
