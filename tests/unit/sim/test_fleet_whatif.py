"""The fleet what-if on a virtual clock: 2 replicas, working set larger than one replica's HBM.

Reference times are computed independently: a cold prefill of a returning user's prompt with the
single-engine what-if (:func:`harness.calibrate.whatif.turn2`, compute-only), not constants.
"""

from __future__ import annotations

from harness.calibrate.fleet_whatif import Traffic, run_fleet_whatif
from harness.calibrate.whatif import settings_for, turn2

TRAFFIC = Traffic(users=64, rate=6, context_tokens=16000, duration_s=40, warmup_s=20, skew=0.0)


def test_routing_and_shared_tier_on_two_replicas() -> None:
    results, utilisation = run_fleet_whatif(2, TRAFFIC)
    by = {r.setup.split(" + ")[0] + (" shared" if "shared" in r.setup else ""): r for r in results}
    cold_s, _, _ = turn2(settings_for("llama-3.1-8b", "h100-sxm", "compute-only", 1.0), 16000 + 64, 64)

    rr_own, rr_shared = by["round_robin"], by["round_robin shared"]
    affinity, prefix = by["session_affinity"], by["prefix_aware"]
    # concurrent traffic over 2 replicas with round robin: about half the returning requests move
    assert 0.3 < rr_own.moved_share < 0.7
    # ...and with per-replica tiers a moved request is (nearly) a cold prefill
    assert rr_own.moved_p50_s is not None and rr_own.moved_p50_s > 0.8 * cold_s
    # with the shared tier moved requests hit: far below a cold prefill, and almost all tokens cached
    assert rr_shared.moved_p50_s is not None and rr_shared.moved_p50_s < 0.6 * cold_s
    assert rr_shared.hit_share > 0.9 > rr_own.hit_share
    # affinity and prefix-aware routing keep users on their replica
    assert affinity.moved_share < rr_own.moved_share / 2
    assert prefix.moved_share == 0.0
    assert set(utilisation) == {r.setup for r in results} and all(len(u) == 2 for u in utilisation.values())


def test_skew_makes_hash_routing_hot() -> None:
    skewed = Traffic(users=64, rate=6, context_tokens=4000, duration_s=30, warmup_s=10, skew=1.5)
    results, _ = run_fleet_whatif(4, skewed)
    by = {r.setup: r for r in results}
    round_robin = by["round_robin + own CPU tier"]
    affinity = by["session_affinity + own CPU tier"]
    # a few heavy users pin their replica under affinity; round robin spreads them
    assert affinity.imbalance > round_robin.imbalance
