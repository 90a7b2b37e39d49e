"""End to end against the real simulator process: the offload tier is what makes turn 2 fast.

These run `kvbench run` the way a user does (a subprocess), so engine start-up, the client, records,
resume and reports are all real; the engine is the built-in simulator (Llama-3.1-8B on 1x H100).
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
from tests import support
from tests.scenarios import sim_scenario
from tests.support import kvbench, kvbench_process, kvbench_scenario, wait_for_run_file

pytestmark = [pytest.mark.integration, pytest.mark.long]

WORKLOAD = {
    "kind": "multi_round_qa",
    "context_tokens": [2000, 16000],
    "conversations": 2,
    "turns": 2,
    "answer_tokens": 8,
    "warmup_requests": 1,
    "between_turns": {"mode": "reset_prefix_cache"},
}
SCENARIO = sim_scenario("it-probe", WORKLOAD, compare={"baseline": "AMG-OFF"}, seed=3)


def write_scenario(tmp_path: Path, **overrides: object) -> Path:
    return support.write_scenario(tmp_path / "scenario.yaml", {**SCENARIO, **overrides})


def only_run_dir(parent: Path) -> Path:
    dirs = [p for p in parent.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_offload_makes_turn2_fast_and_report_rebuilds(tmp_path: Path) -> None:
    done, run_dir = kvbench_scenario("run", SCENARIO, tmp_path)
    assert "% diff (t2)" in done.stdout
    result = RunResult.read_file(run_dir / "summary.json")
    assert result.complete and result.requests.errors == 0

    def median(arm: str, ctx: int, turn: int) -> float:
        cell = result.cell(arm, ctx, turn)
        assert cell is not None and cell.ttft is not None
        return cell.ttft.median_ms

    # OFF: the GPU cache was reset, nothing else holds the KV -> turn 2 recomputes everything
    assert 0.8 < median("AMG-OFF", 16000, 2) / median("AMG-OFF", 16000, 1) < 1.3
    # ON: turn 2 loads the KV from the CPU tier -> far below both turn 1 and OFF's turn 2
    assert median("AMG-ON", 16000, 2) < 0.5 * median("AMG-OFF", 16000, 2)
    assert median("AMG-ON", 16000, 2) < 0.5 * median("AMG-ON", 16000, 1)
    diff = result.diff("AMG-ON", 16000, 2)
    assert diff is not None and diff > 100

    # the engine's own counters say why: offload-tier hits only in the ON arm's turn 2
    on_t2 = result.cache_stats("AMG-ON", 16000, 2)
    off_t2 = result.cache_stats("AMG-OFF", 16000, 2)
    assert on_t2 is not None and on_t2.external_hits and on_t2.external_hits > 0.9 * 2 * 16000
    assert off_t2 is not None and not off_t2.external_hits and not off_t2.gpu_hits

    # the engine's own clock (vLLM's histograms, which the simulator exports too): queue + prefill is its TTFT,
    # and the ON arm's turn 2 is short inside the engine, not only at the client
    on_clock = result.timing("AMG-ON", 16000, 2)
    off_clock = result.timing("AMG-OFF", 16000, 2)
    assert on_clock is not None and off_clock is not None and on_clock.requests == 2
    assert on_clock.ttft_ms is not None and on_clock.queue_ms is not None and on_clock.prefill_ms is not None
    assert on_clock.queue_ms + on_clock.prefill_ms == pytest.approx(on_clock.ttft_ms, rel=1e-6)
    assert off_clock.prefill_ms is not None and on_clock.prefill_ms < 0.5 * off_clock.prefill_ms
    assert on_clock.ttft_ms <= median("AMG-ON", 16000, 2) * 1.05  # the client's clock holds the engine's

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["engines"]["AMG-ON"]["kind"] == "sim"
    assert manifest["attempts"][-1]["status"] == "completed"

    # reports come back from the stored files alone (--rewrite: into the run directory)
    before = (run_dir / "report" / "ttft_table.md").read_text()
    (run_dir / "summary.json").unlink()
    rebuilt = kvbench("report", "--rewrite", str(run_dir), cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert (run_dir / "summary.json").is_file()
    assert (run_dir / "report" / "ttft_table.md").read_text() == before
    assert "## Where TTFT goes" in before and (run_dir / "report" / "engine_timing.csv").is_file()
    csv_lines = (run_dir / "report" / "ttft.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 2 * 2 * 2


def test_killed_run_keeps_records_and_resumes(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path)
    runs = tmp_path / "runs"
    process = kvbench_process("run", str(scenario), "-o", str(runs), cwd=tmp_path, output=subprocess.DEVNULL)

    def five_measured(records: Path) -> bool:
        return sum(1 for r in read_records(records) if r.phase == "measure") >= 5

    records_file = wait_for_run_file(runs, "records.jsonl", five_measured, process)
    assert records_file is not None, "the run never produced records"
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    kept = [r for r in read_records(records_file) if r.phase == "measure"]
    assert len(kept) >= 5

    run_dir = records_file.parent
    resumed = kvbench("run", "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = list(read_records(records_file))
    # nothing measured before the kill was lost, and the second attempt finished the plan
    assert {r.request_id for r in kept} <= {r.request_id for r in after}
    assert {r.attempt for r in after} == {0, 1}
    result = RunResult.read_file(run_dir / "summary.json")
    assert result.complete
    assert all(cell.ttft is not None and cell.ttft.n == 2 for cell in result.cells)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [a["status"] for a in manifest["attempts"]] == ["running", "completed"]


def test_one_arm_per_invocation_then_resume_runs_the_rest(tmp_path: Path) -> None:
    """``--arm`` is how a time-limited GPU session runs one arm per call: the other arms stay pending."""
    workload = {**WORKLOAD, "context_tokens": [2000], "warmup_requests": 2, "warmup_prompt_tokens": [128, 1000]}
    scenario = write_scenario(tmp_path, workload=workload)
    runs = tmp_path / "runs"
    unknown = kvbench("run", str(scenario), "-o", str(runs), "--arm", "AMG-MAYBE", cwd=tmp_path)
    assert unknown.returncode == 2
    assert "AMG-MAYBE" in unknown.stderr and "AMG-OFF, AMG-ON" in unknown.stderr
    assert not runs.exists() or not any(runs.iterdir()), "a bad --arm must fail before a run directory exists"

    first = kvbench("run", str(scenario), "-o", str(runs), "--arm", "AMG-ON", cwd=tmp_path)
    run_dir = only_run_dir(runs)
    assert "--resume" in first.stdout + first.stderr
    measured = [r for r in read_records(run_dir / "records.jsonl") if r.phase == "measure"]
    assert {r.arm for r in measured} == {"AMG-ON"}
    warmups = [r for r in read_records(run_dir / "records.jsonl") if r.phase == "warmup"]
    assert [r.context_tokens for r in warmups] == [128, 1000]  # warm-up at the lengths the scenario asks
    assert all(r.ok and r.prompt_tokens is not None and r.prompt_tokens >= r.context_tokens for r in warmups)
    assert not RunResult.read_file(run_dir / "summary.json").complete

    second = kvbench("run", "--resume", str(run_dir), "--arm", "AMG-OFF", cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    measured = [r for r in read_records(run_dir / "records.jsonl") if r.phase == "measure"]
    assert sorted({r.arm for r in measured}) == ["AMG-OFF", "AMG-ON"]
    assert len(measured) == 2 * 2 * 2  # arms x conversations x turns, nothing run twice
    assert RunResult.read_file(run_dir / "summary.json").complete


def test_token_id_prompts_reach_the_engine_as_the_same_tokens_as_text(tmp_path: Path) -> None:
    """``prompt: token_ids`` sends the ids the engine would make of the text: the same prompt lengths per request,
    and turn 2 still served from the offload tier."""
    prompt_tokens = {}
    for prompt in ("text", "token_ids"):
        workload = {**WORKLOAD, "api": "completions", "prompt": prompt}
        arms = [{"name": "AMG-ON", "offload": "cpu"}]
        (tmp_path / prompt).mkdir()
        data = {**SCENARIO, "workload": workload, "arms": arms, "compare": {"baseline": "AMG-ON"}}
        _, run_dir = kvbench_scenario("run", data, tmp_path / prompt)
        records = [r for r in read_records(run_dir / "records.jsonl") if r.phase == "measure"]
        assert records and all(r.ok and r.api == "completions" for r in records)
        prompt_tokens[prompt] = {(r.context_tokens, r.conversation, r.turn): r.prompt_tokens for r in records}
        result = RunResult.read_file(run_dir / "summary.json")
        for context in result.context_tokens:
            stats = result.cache_stats("AMG-ON", context, 2)
            assert stats is not None and stats.hit_rate is not None and stats.hit_rate > 0.9
    assert prompt_tokens["token_ids"] == prompt_tokens["text"]
