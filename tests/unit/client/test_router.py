"""Routing policies and the fleet page merge, checked against what each policy promises."""

from __future__ import annotations

import collections

from harness.client.fleet import merge_pages, page_counters, replica_pages
from harness.client.router import Router, prefix_hash


def test_round_robin_cycles() -> None:
    router = Router("round_robin", 3)
    assert [router.pick(None, "x") for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_session_affinity_sticks_and_spreads() -> None:
    router = Router("session_affinity", 4)
    keys = [f"conversation-{i}" for i in range(400)]
    first = {key: router.pick(key, "") for key in keys}
    assert all(router.pick(key, "other prompt") == first[key] for key in keys)
    shares = collections.Counter(first.values())
    assert set(shares) == {0, 1, 2, 3}
    assert max(shares.values()) < 2 * min(shares.values())  # consistent hashing spreads keys roughly evenly


def test_affinity_is_stable_across_router_instances() -> None:
    # the same key lands on the same replica in another process/run (BLAKE2b, not Python's hash)
    assert [Router("session_affinity", 8).pick(f"k{i}", "") for i in range(50)] == [
        Router("session_affinity", 8).pick(f"k{i}", "") for i in range(50)
    ]


def test_prefix_aware_follows_the_leading_blocks() -> None:
    router = Router("prefix_aware", 8, block_chars=16, prefix_blocks=2)
    shared = "A" * 16 + "B" * 16
    assert router.pick(None, shared + "question one") == router.pick(None, shared + "something else entirely")
    assert prefix_hash(shared + "x", 16, 2) == prefix_hash(shared + "y", 16, 2)
    assert prefix_hash(shared, 16, 2) != prefix_hash("C" * 16 + "B" * 16, 16, 2)


def test_least_loaded_prefers_idle_replicas() -> None:
    router = Router("least_loaded", 3)
    busy = router.pick(None, "")
    router.started(busy)
    second = router.pick(None, "")
    assert second != busy
    router.started(second)
    third = router.pick(None, "")
    assert third not in (busy, second)
    router.finished(busy)
    assert router.pick(None, "") == busy or router.in_flight[router.pick(None, "")] == 0


def test_random_is_seeded() -> None:
    draws = [Router("random", 5, seed=3).pick(None, "") for _ in range(1)]
    again = [Router("random", 5, seed=3).pick(None, "") for _ in range(1)]
    assert draws == again


PAGE = """# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} {hits}
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} {queries}
# TYPE kvbench_sim:tier_hit_tokens counter
kvbench_sim:tier_hit_tokens_total{model_name="m",tier="shared"} {shared}
"""


def _page(hits: float, queries: float, shared: float) -> str:
    return PAGE.replace("{hits}", str(hits)).replace("{queries}", str(queries)).replace("{shared}", str(shared))


def test_merged_page_sums_and_splits_back() -> None:
    pages = [_page(10, 100, 5), None, _page(30, 200, 7)]
    merged = merge_pages(pages)
    totals = page_counters(merged)
    assert totals["gpu_prefix_hits"] == 40 and totals["gpu_prefix_queries"] == 300
    assert totals["tier_hits:shared"] == 12
    split = replica_pages(merged, 3)
    assert page_counters(split[0])["gpu_prefix_hits"] == 10
    assert page_counters(split[2])["tier_hits:shared"] == 7
    assert split[1].strip() == ""
