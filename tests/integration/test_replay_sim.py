"""A real ``kvbench replay`` of a Mooncake-format trace on the simulator: AMG-ON reaches the trace's ceiling,
AMG-OFF (a GPU cache too small for the trace's reuse distance) gets almost nothing; resume re-runs only
the arm that did not finish.

The trace is generated here from a known structure (no data copied from anywhere): 8 conversations of 3
turns, round robin, 8 × 512-token context blocks each, every turn appending one block. The simulator's
HBM is squeezed to ~22k tokens of KV (gpu_memory_utilization 0.25), less than the 7 other conversations
a returning conversation waits behind (≥ 28k tokens), so only an offload tier can serve the history.
About 60 s on 2 cores.
"""

from __future__ import annotations

import csv
import json
from functools import partial
from pathlib import Path

import pytest
import yaml

from harness.results.replay_result import ReplayResult
from harness.store.records import read_records
from tests import support
from tests.scenarios import sim_scenario
from tests.support import kvbench_scenario

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
B = 512
GROUPS, TURNS, CONTEXT_BLOCKS, GROW_BLOCKS = 8, 3, 8, 1


def mooncake_rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    history: dict[int, list[int]] = {}
    next_id = 0
    for turn in range(TURNS):
        for group in range(GROUPS):
            grow = CONTEXT_BLOCKS if turn == 0 else GROW_BLOCKS
            ids = history.get(group, []) + list(range(next_id, next_id + grow))
            next_id += grow
            history[group] = ids
            rows.append(
                {"timestamp": len(rows) * 150, "input_length": len(ids) * B, "output_length": 8, "hash_ids": ids}
            )
    return rows


def expected_ceiling() -> float:
    """Turn 1 hits nothing; turn t > 1 hits its whole previous prompt."""
    hits = total = 0
    for turn in range(TURNS):
        blocks = CONTEXT_BLOCKS + turn * GROW_BLOCKS
        total += GROUPS * blocks
        if turn:
            hits += GROUPS * (blocks - GROW_BLOCKS)
    return hits / total


kvbench = partial(support.kvbench, timeout=400)


def test_replay_on_the_simulator_reaches_the_ceiling_with_a_tier_and_resumes(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in mooncake_rows()))
    stats = kvbench("trace", "stats", str(trace), "--json", "--cache-tokens", "20000", cwd=tmp_path)
    assert stats.returncode == 0, stats.stderr
    data = json.loads(stats.stdout)
    ceiling = expected_ceiling()
    assert data["requests"] == GROUPS * TURNS
    assert data["infinite_cache_hit_rate"] == pytest.approx(ceiling)
    assert data["lru_hit_rates"] == [{"cache_tokens": 20000, "hit_rate": 0.0}]

    scenario = {
        "name": "it-replay",
        "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm", "gpu_memory_utilization": 0.25},
        "arms": [{"name": "AMG-OFF", "offload": "hbm"}, {"name": "AMG-ON", "offload": "cpu"}],
        "compare": {"baseline": "AMG-OFF"},
        "workload": {
            "kind": "trace",
            "path": str(trace),
            "format": "mooncake",
            "metrics_interval_s": 1,
            "warmup_requests": 1,
        },
        "slo": {"ttft_ms": 2000, "tpot_ms": 50},
        "seed": 2,
    }
    done, run_dir = kvbench_scenario("replay", scenario, tmp_path, timeout=400)
    assert "AMG-ON vs AMG-OFF" in done.stdout
    result = ReplayResult.read_file(run_dir / "replay.json")
    assert result.complete and result.trace.infinite_cache_hit_rate == pytest.approx(ceiling)
    off, on = result.arm("AMG-OFF"), result.arm("AMG-ON")
    assert off is not None and on is not None
    for arm in (off, on):
        assert arm.requests == GROUPS * TURNS and arm.errors == 0 and arm.prompt_tokens_off == 0
        assert arm.lag is not None and not arm.fell_behind and arm.ttft is not None
    # the tier serves what the trace allows (the engine recomputes at least the last token of a full hit)
    assert on.hit_rate is not None and 0.9 * ceiling <= on.hit_rate <= ceiling + 1e-9
    assert on.external_hit_tokens and on.external_hit_tokens > 0.8 * (on.hit_rate * (on.prompt_tokens or 0))
    assert off.hit_rate is not None and off.hit_rate < 0.05
    assert on.ttft.p50_ms < off.ttft.p50_ms  # type: ignore[union-attr]
    assert result.comparisons and result.comparisons[0].ttft_p50_pct is not None
    assert any(p.arm == "AMG-ON" and (p.external_hit_tps or 0) > 0 for p in result.timeline)

    # every arm replayed the same trace lines, each record keeping its line and its due time
    records = [r for r in read_records(run_dir / "records.jsonl") if r.trace_line is not None]
    lines = {arm: sorted(r.trace_line or 0 for r in records if r.arm == arm) for arm in ("AMG-OFF", "AMG-ON")}
    assert lines["AMG-OFF"] == lines["AMG-ON"] == list(range(1, GROUPS * TURNS + 1))
    assert all(r.scheduled_ns is not None and r.started_ns >= r.scheduled_ns for r in records)

    report = run_dir / "report"
    for name in ("replay.md", "replay.csv", "replay.svg"):
        assert (report / name).stat().st_size > 0
    before = (report / "replay.csv").read_text()
    (run_dir / "replay.json").unlink()
    rebuilt = kvbench("report", "--rewrite", str(run_dir), cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert (run_dir / "replay.json").is_file()
    assert (report / "replay.csv").read_text() == before
    with (report / "replay.csv").open() as handle:
        assert [row["arm"] for row in csv.DictReader(handle)] == ["AMG-OFF", "AMG-ON"]

    # an arm without its ReplayDone (killed mid-replay) is replayed again, from the start, by --resume
    replayed = (run_dir / "replayed.jsonl").read_text().splitlines()
    (run_dir / "replayed.jsonl").write_text(replayed[0] + "\n")
    resumed = kvbench("replay", "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    again = ReplayResult.read_file(run_dir / "replay.json")
    on_again = again.arm("AMG-ON")
    assert again.complete and on_again is not None and on_again.attempt == 1
    assert again.arm("AMG-OFF").attempt == 0  # type: ignore[union-attr]
    assert on_again.hit_rate is not None and on_again.hit_rate >= 0.9 * ceiling
    assert len([r for r in read_records(run_dir / "records.jsonl") if r.trace_line is not None]) == 3 * GROUPS * TURNS


def test_a_synthetic_kvbench_trace_replays_closed_loop(tmp_path: Path) -> None:
    workload = {
        "kind": "multi_user_qa",
        "users": 3,
        "rounds": 2,
        "system_prompt_tokens": 128,
        "context_tokens": 700,
        "question_tokens": 20,
        "answer_tokens": 12,
    }
    (tmp_path / "qa.yaml").write_text(yaml.safe_dump(workload))
    trace = tmp_path / "qa.jsonl"
    synth = ("trace", "synth", str(tmp_path / "qa.yaml"), "-o", str(trace), "--sessions", "6", "--block-tokens", "64")
    made = kvbench(*synth, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    stats = json.loads(kvbench("trace", "stats", str(trace), "--format", "kvbench", "--json", cwd=tmp_path).stdout)
    assert stats["requests"] == 12 and stats["sessions"] == 6 and stats["block_tokens"] == 64
    workload = {
        "kind": "trace",
        "path": str(trace),
        "format": "kvbench",
        "mode": "closed",
        "concurrency": 1,
        "metrics_interval_s": 1,
        "warmup_requests": 0,
    }
    scenario = sim_scenario("it-replay-closed", workload, arms=[{"name": "AMG-ON", "offload": "cpu"}])
    done, run_dir = kvbench_scenario("replay", scenario, tmp_path, timeout=400)
    assert "VALID: every validity gate passed (run directory: " in done.stderr
    result = ReplayResult.read_file(run_dir / "replay.json")
    (arm,) = result.results
    # one request at a time, in trace order: every prompt the trace says, and nothing is "late" in a closed loop
    assert arm.requests == 12 and arm.errors == 0 and arm.prompt_tokens_off == 0 and arm.lag is None
    assert arm.hit_rate is not None and 0.9 * stats["infinite_cache_hit_rate"] <= arm.hit_rate
    assert arm.hit_rate <= stats["infinite_cache_hit_rate"] + 1e-9
    records = [r for r in read_records(run_dir / "records.jsonl") if r.trace_line is not None]
    assert sorted(r.trace_line or 0 for r in records) == list(range(2, 14))  # line 1 is the header
    assert sorted({r.conversation for r in records}) == list(range(6))
    assert all(r.scheduled_ns is None for r in records)
