"""A fleet of 2 simulator replicas end to end: routing x per-replica vs shared tier.

What it must show (scenarios/fleet-sim.yaml, one context length to stay CI-sized): with round robin
and per-replica tiers, turn 2s move and a moved turn costs a cold prefill (its TTFT is turn 1's,
nothing hit); with the shared tier moved turns hit; with session affinity nothing moves and every
turn 2 hits its own replica's tier; with random routing one arm has both, and only the moved ones
are cold. Expected values come from the run's own turn-1 TTFTs and prompt sizes, not from constants.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from harness.results.fleet import FleetResult
from reports.outputs import write_outputs
from tests.support import probe_in_process

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def test_fleet_same_vs_moved(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "scenarios" / "fleet-sim.yaml").read_text())
    data["workload"]["context_tokens"] = [8000]
    run_dir = probe_in_process(data, tmp_path, "fleet-sim.yaml")

    records = [r for r in run_dir.records() if r.phase == "measure"]
    assert {r.replica for r in records} == {0, 1}  # both replicas served, every record attributed
    assert all(r.moved is None for r in records if r.turn == 1)
    fleet = FleetResult.read_file(run_dir.fleet_file)
    by_arm = {arm.arm: arm for arm in fleet.arms}

    def turns(arm: str, turn: int) -> list[float]:
        return [r.ttft_ns / 1e6 for r in records if r.arm == arm and r.turn == turn and r.ttft_ns]

    def t2(arm: str, moved: bool) -> list[tuple[float, int, int]]:
        return [
            (r.ttft_ns / 1e6, r.cached_tokens or 0, r.prompt_tokens or 0)
            for r in records
            if r.arm == arm and r.turn == 2 and r.moved is moved and r.ttft_ns
        ]

    # round robin + per-replica tiers: turn 2s move, and a moved turn is a cold prefill
    moved_own = t2("RR-own", True)
    assert moved_own, "round robin over 2 replicas must move turn 2s"
    cold = statistics.median(turns("RR-own", 1))
    for ttft, cached, prompt in moved_own:
        assert cached < 0.05 * prompt  # nothing of the previous turn's KV on the new replica
        assert ttft > 0.8 * cold
    # round robin + shared tier: moved turns hit the shared tier and beat a cold prefill
    moved_shared = t2("RR-shared", True)
    assert moved_shared
    for _ttft, cached, prompt in moved_shared:
        assert cached > 0.9 * prompt
    assert statistics.median(t for t, _, _ in moved_shared) < 0.8 * statistics.median(turns("RR-shared", 1))
    # session affinity: nothing moves, turn 2 hits its replica's own tier
    assert not t2("SA-own", True)
    assert all(cached > 0.9 * prompt for _, cached, prompt in t2("SA-own", False))

    # random routing (seeded) splits one arm: its same-replica turn 2s hit, its moved ones are cold
    same_random, moved_random = t2("RND-own", False), t2("RND-own", True)
    assert same_random and moved_random
    assert all(cached > 0.9 * prompt for _, cached, prompt in same_random)
    assert all(cached < 0.05 * prompt for _, cached, prompt in moved_random)
    assert min(t for t, _, _ in moved_random) > 2 * max(t for t, _, _ in same_random)
    assert by_arm["RR-own"].moved[0].moved_count == len(moved_own)
    shared_hits = sum(entry.shared_tier_hits or 0 for entry in by_arm["RR-shared"].load)
    cached_total = sum(cached for _, cached, _ in moved_shared)
    assert shared_hits >= 0.9 * cached_total  # per-replica /metrics deltas agree with usage.cached_tokens
    assert sum(entry.own_tier_hits or 0 for entry in by_arm["RR-own"].load) < 0.05 * cached_total + 1
    # the report registry renders the fleet table from fleet.json alone
    assert run_dir.report_dir / "fleet.md" in write_outputs(run_dir)
    assert "| RR-own | round_robin | 8000 | 0 |" in (run_dir.report_dir / "fleet.md").read_text()
