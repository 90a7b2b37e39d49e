"""The bundled ``agent-replay-sim`` scenario (a Bailian-format agent trace, replayed causally on the simulator) at
four times the speed (the 43 s trace in 11 s per arm): every child call is sent after its parent completed (from the
records), every call is replayed once per arm, and the CPU tier's hit rate is above the GPU-only arm's and at most the
trace's ceiling (the simulator's hit rates are the same as at twice the speed: 0.71 and 0.77 of 0.77). About 30 s on
2 cores."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import yaml

from harness.results.replay_result import ReplayResult
from harness.store.records import read_records
from tests import support
from tests.support import kvbench_scenario

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


kvbench = partial(support.kvbench, timeout=500)


def test_the_bundled_agent_replay_is_causal_and_the_tier_beats_the_gpu_alone(tmp_path: Path) -> None:
    scenario = yaml.safe_load((REPO / "scenarios" / "agent-replay-sim.yaml").read_text())
    assert scenario["workload"]["path"] == "sample-bailian.jsonl"  # the bundled sample, found by name
    scenario["workload"]["time_scale"] = 0.25
    stats = kvbench("trace", "stats", "sample-bailian.jsonl", "--json", cwd=tmp_path)
    assert stats.returncode == 0, stats.stderr
    ceiling = json.loads(stats.stdout)["infinite_cache_hit_rate"]
    assert json.loads(stats.stdout)["format"] == "bailian"

    _, run_dir = kvbench_scenario("replay", scenario, tmp_path, timeout=500)
    result = ReplayResult.read_file(run_dir / "replay.json")
    assert result.complete and result.trace.infinite_cache_hit_rate == pytest.approx(ceiling)
    off, on = result.arm("AMG-OFF"), result.arm("AMG-ON")
    assert off is not None and on is not None and off.errors == on.errors == 0
    assert off.hit_rate is not None and on.hit_rate is not None
    assert off.hit_rate < on.hit_rate <= ceiling + 1e-9
    assert off.child_calls == on.child_calls == 32 and off.causal_violations == on.causal_violations == 0
    assert "causal order kept" in (run_dir / "report" / "replay.md").read_text()

    records = [r for r in read_records(run_dir / "records.jsonl") if r.call_id is not None]
    for arm in ("AMG-OFF", "AMG-ON"):
        mine = {r.call_id: r for r in records if r.arm == arm}
        assert len(mine) == 40 and all(r.ok for r in mine.values())
        children = [r for r in mine.values() if r.parent_call is not None]
        assert len(children) == 32  # 8 sessions, each a root and four calls that wait for one
        for child in children:
            parent = mine[child.parent_call or ""]
            assert parent.e2e_ns is not None
            assert child.started_ns >= parent.started_ns + parent.e2e_ns, (arm, child.call_id)
