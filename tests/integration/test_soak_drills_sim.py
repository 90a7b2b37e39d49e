"""Soak fault drills against the real simulator engine that kvbench starts (``soak.faults``).

A short window (8 s in 2 s intervals, 4 users) with ``kill_engine`` at 2.5 s and ``pause_engine``
at 5.5 s for 1 s: kvbench SIGKILLs the simulator's process group and starts it again on the same
port, then SIGSTOPs it for a second. The first warm-up request is answered with HTTP 500 by the
simulator's own fault injection, so the soak must retry it instead of aborting. The verdict
names both drills, the restart kvbench caused is not held against the engine, and the SLO broken
time of the pause is at least the part of the pause a request could not absorb.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.engines.process import free_port
from harness.store.records import read_records
from tests.scenarios import multi_user_qa, sim_scenario, uniform
from tests.support import kvbench, write_scenario

pytestmark = pytest.mark.integration

PAUSE_S = 1.0
TTFT_SLO_MS = 400.0


def scenario() -> dict[str, Any]:
    rounds, context = uniform(2, 4), uniform(1000, 2000)
    return sim_scenario(
        "drills",
        multi_user_qa(8, rounds, context, question_tokens=16, answer_tokens=4, think_time_s=0.05, warmup_requests=1),
        engine={"faults": [{"kind": "http_error", "status": 500, "from_request": 0, "requests": 1}]},
        arms=[{"name": "ON", "offload": "cpu"}],
        sweep={"mode": "concurrency", "values": [4], "ramp_up": 0.2},
        slo={"ttft_ms": TTFT_SLO_MS},
        soak={
            "window": "8s",
            "interval": "2s",
            "faults": [
                {"kind": "kill_engine", "at": "2500ms"},
                {"kind": "pause_engine", "at": "5500ms", "duration": f"{PAUSE_S}s"},
            ],
        },
        seed=2,
    )


def test_kill_and_pause_are_rehearsed_recorded_and_named(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "soak.yaml", scenario())
    done = kvbench("soak", str(path), "-o", str(tmp_path / "runs"), cwd=tmp_path, timeout=180)
    # PASS, FAIL or INCOMPLETE (too few requests to judge the SLO compliance), never an abort
    assert done.returncode in (0, 1, 3), done.stdout + done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()

    warmups = [r for r in read_records(run_dir / "records.jsonl") if r.phase == "warmup" and r.repetition == -1]
    assert [r.ok for r in warmups] == [False, True], "the failed warm-up try is recorded, then retried"

    events = [json.loads(line) for line in (run_dir / "faults.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events] == ["kill_engine", "pause_engine"]
    assert all(e["error"] is None for e in events), events
    log = (run_dir / "logs" / "ON" / "engine.log").read_text().splitlines()
    starts = [line for line in log if line.startswith("$ ")]
    assert len(starts) == 2, "kvbench started the killed simulator again"

    result = json.loads((run_dir / "soak.json").read_text())
    kill, pause = result["faults"]
    assert kill["kind"] == "kill_engine" and kill["recovery_s"] is not None and kill["recovery_s"] > 0
    assert kill["slo_broken_s"] is not None and kill["missed"] > 0, kill
    assert pause["held_s"] >= PAUSE_S
    # a request sent early in the pause waits for it: the SLO is broken for at least pause − SLO
    assert pause["slo_broken_s"] is not None and pause["slo_broken_s"] >= PAUSE_S - TTFT_SLO_MS / 1000, pause
    assert pause["slo_broken_s"] < PAUSE_S + 2.0, pause
    restarts = {c["name"]: c for c in result["verdict"]["criteria"]}["restarts"]
    assert restarts["status"] == "pass", "the restart kvbench caused is not an engine failure"
    assert sum(i["restarts"] for i in map(json.loads, (run_dir / "intervals.jsonl").read_text().splitlines())) >= 1
    assert "kill_engine at 2.5 s, back after" in done.stdout and "pause_engine at 5.5 s" in done.stdout


def test_faults_on_an_engine_kvbench_does_not_start_are_refused_at_validation(tmp_path: Path) -> None:
    from .test_soak_faults import soak_scenario

    # nothing listens there: validation must refuse before any connection
    data = soak_scenario(f"http://127.0.0.1:{free_port()}")
    data["soak"]["faults"] = [{"kind": "kill_engine", "at": "1s"}]
    path = write_scenario(tmp_path / "soak.yaml", data)
    for argv in (["validate", str(path)], ["soak", str(path), "-o", str(tmp_path / "runs")]):
        done = kvbench(*argv, cwd=tmp_path, timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "soak.faults: engine kind 'openai' is not started by kvbench" in done.stderr
    assert not (tmp_path / "runs").exists()
