"""fleet.json from stored files alone: same vs moved split, per-replica load, hit tokens by source."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from harness.results.fleet import summarize_fleet
from harness.scenario.spec import parse_scenario
from harness.store.events import ReplicaCounters
from harness.store.records import RecordWriter, RequestRecord
from harness.store.rundir import RunDir
from tests.resultfiles import request_record

SCENARIO = {
    "name": "unit-fleet",
    "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm", "replicas": 2},
    "arms": [{"name": "A", "offload": "shared"}],
    "workload": {"kind": "multi_round_qa", "context_tokens": [1000], "conversations": 2, "turns": 2},
}


def _record(conversation: int, turn: int, replica: int, moved: bool | None, ttft_ms: float) -> RequestRecord:
    return request_record(
        "A",
        1000,
        conversation,
        turn,
        ttft_ns=int(ttft_ms * 1e6),
        e2e_ns=int(2 * ttft_ms * 1e6),
        cached_tokens=10 * turn,
        replica=replica,
        moved=moved,
    )


def test_fleet_result_from_stored_files(tmp_path: Path) -> None:
    run_dir = RunDir.create(tmp_path, parse_scenario(SCENARIO, "unit"))
    records = [
        _record(0, 1, 0, None, 100),
        _record(1, 1, 1, None, 110),
        _record(2, 1, 0, None, 120),
        _record(0, 2, 0, False, 20),
        _record(1, 2, 0, True, 90),
        _record(2, 2, 1, True, 70),
    ]
    with RecordWriter(run_dir.records_file) as writer:
        for record in records:
            writer.append(record)
    # replica 0: 5 GPU hits then 40 more, 100 cpu-tier and 300 shared-tier tokens; replica 1 answers once only
    snapshots = [
        [{"gpu_prefix_hits": 5.0, "tier_hits:cpu": 0.0, "tier_hits:shared": 0.0}, None],
        [{"gpu_prefix_hits": 45.0, "tier_hits:cpu": 100.0, "tier_hits:shared": 300.0}, {"gpu_prefix_hits": 7.0}],
    ]
    for index, counters in enumerate(snapshots):
        run_dir.append_replica_counters(ReplicaCounters(arm="A", attempt=0, at_ns=index, counters=counters))

    result = summarize_fleet(run_dir)
    assert result is not None and run_dir.fleet_file.exists()
    [arm] = result.arms
    [cell] = arm.moved
    assert (cell.same_count, cell.moved_count) == (1, 2)
    assert cell.same_ttft_ms == 20 and cell.moved_ttft_ms == statistics.median([90, 70])
    first, second = arm.load
    assert (first.requests, second.requests) == (4, 2)
    assert first.busy_s == sum(2 * t for t in (100, 120, 20, 90)) / 1000
    assert first.usage_cached_tokens == 10 + 10 + 20 + 20
    assert (first.own_gpu_hits, first.own_tier_hits, first.shared_tier_hits) == (40, 100, 300)
    assert second.own_gpu_hits is None  # no pair of scrapes for it: unknown, not zero
    assert arm.imbalance == max(4, 2) / 6 * 2
    assert arm.gpus == 2 and arm.routing == "round_robin"


def test_hits_of_a_server_that_holds_every_tier_are_shared(tmp_path: Path) -> None:
    """vLLM + one LMCache server per arm: no per-tier counters, and the manifest says the server holds all tiers."""
    import json

    data = dict(SCENARIO, arms=[{"name": "A", "offload": "cpu"}])
    run_dir = RunDir.create(tmp_path, parse_scenario(data, "unit"))
    with RecordWriter(run_dir.records_file) as writer:
        writer.append(_record(0, 2, 1, True, 30))
    for index, hits in enumerate((0.0, 900.0)):
        counters: list[dict[str, float] | None] = [None, {"external_prefix_hits": hits, "gpu_prefix_hits": 0.0}]
        run_dir.append_replica_counters(ReplicaCounters(arm="A", attempt=0, at_ns=index, counters=counters))

    def replica_one() -> tuple[float | None, float | None]:
        result = summarize_fleet(run_dir)
        assert result is not None
        entry = result.arms[0].load[1]
        return entry.own_tier_hits, entry.shared_tier_hits

    assert replica_one() == (900, 0)  # a cpu tier of its own, as far as the stored files say
    run_dir.manifest_file.write_text(
        json.dumps({"engines": {"A": {"details": {"shared_tier_serves": "all tiers"}}}}), encoding="utf-8"
    )
    assert replica_one() == (0, 900)


def test_requests_without_a_known_replica_are_counted_not_hidden(tmp_path: Path) -> None:
    """External routing that could not attribute a request (overlap, no header): in no column, but reported."""
    from reports.fleet import markdown

    run_dir = RunDir.create(tmp_path, parse_scenario(SCENARIO, "unit"))
    unknown = _record(1, 2, 0, None, 50).model_copy(update={"replica": None})
    with RecordWriter(run_dir.records_file) as writer:
        for record in (_record(0, 1, 0, None, 100), _record(0, 2, 0, False, 20), unknown):
            writer.append(record)
    result = summarize_fleet(run_dir)
    assert result is not None
    [arm] = result.arms
    assert arm.unattributed == 1 and sum(entry.requests for entry in arm.load) == 2
    assert (arm.moved[0].same_count, arm.moved[0].moved_count) == (1, 0)
    assert "Requests with no known replica (in no column above): A 1 of 3." in markdown(result)


def test_an_arm_not_run_is_left_out_and_unreported_usage_is_unknown(tmp_path: Path) -> None:
    """A run made with --arm has pending arms (no rows of zeros for them), and an engine that reported no
    usage details (cached_tokens None) has unknown, not zero, cached tokens."""
    data = dict(SCENARIO, arms=[{"name": "A", "offload": "shared"}, {"name": "B", "offload": "shared"}])
    run_dir = RunDir.create(tmp_path, parse_scenario(data, "unit"))
    with RecordWriter(run_dir.records_file) as writer:
        writer.append(_record(0, 1, 0, None, 100).model_copy(update={"cached_tokens": None}))
        writer.append(_record(0, 2, 1, True, 50))
    result = summarize_fleet(run_dir)
    assert result is not None and [arm.arm for arm in result.arms] == ["A"]
    first, second = result.arms[0].load
    assert first.usage_cached_tokens is None and second.usage_cached_tokens == 20


def test_a_length_re_run_by_resume_counts_once_as_in_the_ttft_table(tmp_path: Path) -> None:
    """A probe that failed mid-length (the vllm-router arm on 2x H200: a reset failed before 2,000's turn 2) and was
    resumed: attempt 0 completed 1,000 tokens and sent 2,000's turn 1s to replica 1; attempt 1 re-ran 2,000 on
    replica 0. The superseded turn 1s are in no column, and a scrape delta over them is left out."""
    from harness.store.events import GroupDone

    data = dict(SCENARIO, workload=dict(SCENARIO["workload"], context_tokens=[1000, 2000]))  # type: ignore[arg-type]
    run_dir = RunDir.create(tmp_path, parse_scenario(data, "unit"))

    def at(attempt: int, context: int, conversation: int, turn: int, replica: int, started_ns: int) -> RequestRecord:
        return _record(conversation, turn, replica, False if turn > 1 else None, 10.0).model_copy(
            update={"attempt": attempt, "context_tokens": context, "started_ns": started_ns}
        )

    records = [
        at(0, 1000, 0, 1, 0, 10),
        at(0, 1000, 0, 2, 0, 20),  # kept: 1,000 completed in attempt 0
        at(0, 2000, 0, 1, 1, 40),
        at(0, 2000, 1, 1, 1, 41),  # superseded: 2,000 did not complete
        at(1, 2000, 0, 1, 0, 10),
        at(1, 2000, 0, 2, 0, 20),  # kept: 2,000 completed in attempt 1
    ]
    with RecordWriter(run_dir.records_file) as writer:
        for record in records:
            writer.append(record)
    run_dir.mark_group_done(GroupDone(arm="A", repetition=0, context_tokens=1000, attempt=0))
    run_dir.mark_group_done(GroupDone(arm="A", repetition=0, context_tokens=2000, attempt=1))

    def hits(replica0: float, replica1: float) -> list[dict[str, float] | None]:
        return [{"gpu_prefix_hits": replica0}, {"gpu_prefix_hits": replica1}]

    # attempt 0: 7 hits on replica 0 over 1,000 (window 0-30), then 1,000 on replica 1 over the superseded turn 1s
    # (window 30-50); attempt 1 (a new machine: its clock starts again) 3 hits on replica 0
    scrapes = [(0, 0, hits(0, 0)), (0, 30, hits(7, 0)), (0, 50, hits(7, 1000)), (1, 0, hits(0, 0)), (1, 30, hits(3, 0))]
    for attempt, at_ns, counters in scrapes:
        run_dir.append_replica_counters(ReplicaCounters(arm="A", attempt=attempt, at_ns=at_ns, counters=counters))

    result = summarize_fleet(run_dir)
    assert result is not None
    [arm] = result.arms
    first, second = arm.load
    assert (first.requests, second.requests) == (4, 0)
    assert (first.own_gpu_hits, second.own_gpu_hits) == (7 + 3, 0)
    assert [(cell.context_tokens, cell.same_count) for cell in arm.moved] == [(1000, 1), (2000, 1)]


def test_peak_in_flight_and_ttft_p90_show_a_hotspot(tmp_path: Path) -> None:
    """Replica 0 has three requests open at once (a queue); replica 1 two back to back, which never overlap."""
    run_dir = RunDir.create(tmp_path, parse_scenario(SCENARIO, "unit"))
    # (start s, length s, TTFT ms)
    spans = {0: [(0, 10, 100.0), (5, 10, 300.0), (8, 12, 500.0)], 1: [(0, 10, 50.0), (10, 10, 60.0)]}
    with RecordWriter(run_dir.records_file) as writer:
        for replica, requests in spans.items():
            for index, (start, length, ttft_ms) in enumerate(requests):
                record = _record(index, 1, replica, None, ttft_ms)
                writer.append(record.model_copy(update={"started_ns": start * 10**9, "e2e_ns": length * 10**9}))
    result = summarize_fleet(run_dir)
    assert result is not None
    first, second = result.arms[0].load
    assert (first.peak_in_flight, second.peak_in_flight) == (3, 1)
    for entry, requests in ((first, spans[0]), (second, spans[1])):
        ttfts = [ttft for _, _, ttft in requests]
        assert entry.ttft_p90_ms == pytest.approx(statistics.quantiles(ttfts, n=10, method="inclusive")[8])
