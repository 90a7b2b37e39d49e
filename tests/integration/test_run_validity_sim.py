"""`kvbench run` against the real simulator must say when it did not measure what it claims.

* every measured request fails (the simulator answers HTTP 500 after the warm-up): exit 1, the
  manifest's attempt says ``failed`` with the reason, the errors are summarised by kind, and
  `kvbench report` exits 1 too;
* turn 2 is not a returning user (``filler`` traffic far too small to evict the GPU prefix cache):
  the arm without tiers hits its GPU cache and the offload arm never loads from its tier, so the
  run is INCONCLUSIVE (exit 3) and the Markdown report says why;
* ``arm_order: interleaved``: repetitions run in ABBA blocks, each arm's engine started per block,
  and a run SIGKILLed mid-way resumes what is left in the same order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from harness.results.run_result import RunResult
from harness.store.records import read_records
from tests.support import kvbench, kvbench_process, wait_for_run_file

from .test_probe_sim import only_run_dir, write_scenario

pytestmark = pytest.mark.integration

SMALL = {
    "kind": "multi_round_qa",
    "context_tokens": [2000],
    "conversations": 2,
    "turns": 2,
    "answer_tokens": 4,
    "warmup_requests": 1,
    "between_turns": {"mode": "reset_prefix_cache"},
}


def test_a_run_whose_every_request_failed_exits_1_and_says_why(tmp_path: Path) -> None:
    engine = {
        "kind": "sim",
        "model": "llama-3.1-8b",
        "hardware": "h100-sxm",
        # request 0 is the warm-up; every measured request gets HTTP 500
        "faults": [{"kind": "http_error", "status": 500, "from_request": 1}],
    }
    scenario = write_scenario(
        tmp_path, engine=engine, workload=SMALL, arms=[{"name": "ON", "offload": "cpu"}], compare={}
    )
    done = kvbench("run", str(scenario), "-o", str(tmp_path / "runs"), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED: all 2 measured requests failed (by kind: http_status 2)" in done.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    attempt = json.loads((run_dir / "manifest.json").read_text())["attempts"][-1]
    assert attempt["status"] == "failed" and "measured requests failed" in attempt["reason"]
    result = RunResult.read_file(run_dir)
    assert result.validity is not None and result.validity.errors_by_kind == {"http_status": 2}
    again = kvbench("report", str(run_dir), cwd=tmp_path)
    assert again.returncode == 1, again.stdout + again.stderr


def test_turn2_served_from_the_gpu_cache_is_inconclusive(tmp_path: Path) -> None:
    workload = {**SMALL, "between_turns": {"mode": "filler", "filler_tokens": 64}}
    arms = [{"name": "HBM", "offload": "hbm"}, {"name": "ON", "offload": "cpu"}]
    scenario = write_scenario(tmp_path, workload=workload, arms=arms, compare={"baseline": "HBM"})
    done = kvbench("run", str(scenario), "-o", str(tmp_path / "runs"), cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    result = RunResult.read_file(run_dir)
    assert result.validity is not None and result.validity.verdict == "inconclusive"
    found = {(f.gate, f.arm) for f in result.validity.findings}
    assert found == {("off_arm_hits", "HBM"), ("no_offload_hits", "ON")}
    markdown = (run_dir / "report" / "ttft_table.md").read_text()
    assert "Verdict: INCONCLUSIVE (exit 3)" in markdown and "no prompt token came from the offload tier" in markdown
    assert "Verdict: INCONCLUSIVE" in done.stdout
    attempt = json.loads((run_dir / "manifest.json").read_text())["attempts"][-1]
    assert attempt["status"] == "inconclusive"


def test_interleaved_arm_order_runs_abba_blocks_with_an_engine_start_each(tmp_path: Path) -> None:
    workload = {**SMALL, "conversations": 1}
    scenario = write_scenario(tmp_path, workload=workload, repetitions=3, arm_order="interleaved")
    done = kvbench("run", str(scenario), "-o", str(tmp_path / "runs"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    order: list[tuple[int, str]] = []
    for rec in read_records(run_dir / "records.jsonl"):
        if rec.phase == "measure" and (rec.repetition, rec.arm) not in order:
            order.append((rec.repetition, rec.arm))
    assert order == [(0, "AMG-OFF"), (0, "AMG-ON"), (1, "AMG-ON"), (1, "AMG-OFF"), (2, "AMG-OFF"), (2, "AMG-ON")]
    for arm in ("AMG-OFF", "AMG-ON"):
        starts = [
            line for line in (run_dir / "logs" / arm / "engine.log").read_text().splitlines() if line.startswith("$ ")
        ]
        assert len(starts) == 3, f"{arm}: one engine start per block"
    result = RunResult.read_file(run_dir)
    assert result.complete and result.validity is not None and result.validity.verdict == "valid"


def test_interleaved_run_killed_mid_way_resumes_in_abba_order(tmp_path: Path) -> None:
    workload = {**SMALL, "conversations": 1}
    scenario = write_scenario(tmp_path, workload=workload, repetitions=3, arm_order="interleaved")
    runs = tmp_path / "runs"
    process = kvbench_process("run", str(scenario), "-o", str(runs), cwd=tmp_path, output=subprocess.DEVNULL)
    progress = wait_for_run_file(runs, "progress.jsonl", lambda p: len(p.read_text().splitlines()) >= 3, process)
    assert progress is not None, "the run never finished three groups"
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    finished = {(e["repetition"], e["arm"]) for e in map(json.loads, progress.read_text().splitlines())}

    resumed = kvbench("run", "--resume", str(progress.parent), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    abba = [(0, "AMG-OFF"), (0, "AMG-ON"), (1, "AMG-ON"), (1, "AMG-OFF"), (2, "AMG-OFF"), (2, "AMG-ON")]
    second: list[tuple[int, str]] = []
    for rec in read_records(progress.parent / "records.jsonl"):
        if rec.phase == "measure" and rec.attempt == 1 and (rec.repetition, rec.arm) not in second:
            second.append((rec.repetition, rec.arm))
    assert second == [key for key in abba if key not in finished], "the resume runs what is left, in ABBA order"
    result = RunResult.read_file(progress.parent)
    assert result.complete and result.validity is not None and result.validity.verdict == "valid"
