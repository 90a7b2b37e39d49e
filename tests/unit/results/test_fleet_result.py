"""fleet.json from stored files alone: same vs moved split, per-replica load, hit tokens by source."""

from __future__ import annotations

import statistics
from pathlib import Path

from harness.results.fleet import summarize_fleet
from harness.scenario.spec import parse_scenario
from harness.store.events import ReplicaCounters
from harness.store.records import RecordWriter, RequestRecord
from harness.store.rundir import RunDir

SCENARIO = {
    "name": "unit-fleet",
    "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm", "replicas": 2},
    "arms": [{"name": "A", "offload": "shared"}],
    "workload": {"kind": "multi_round_qa", "context_tokens": [1000], "conversations": 2, "turns": 2},
}  # fmt: skip


def _record(conversation: int, turn: int, replica: int, moved: bool | None, ttft_ms: float) -> RequestRecord:
    return RequestRecord(
        arm="A", attempt=0, phase="measure", repetition=0, context_tokens=1000, conversation=conversation,
        turn=turn, request_id=f"{conversation}-{turn}", api="chat", started_ns=0, ttft_ns=int(ttft_ms * 1e6),
        e2e_ns=int(2 * ttft_ms * 1e6), ok=True, cached_tokens=10 * turn, replica=replica, moved=moved,
    )  # fmt: skip


def test_fleet_result_from_stored_files(tmp_path: Path) -> None:
    run_dir = RunDir.create(tmp_path, parse_scenario(SCENARIO, "unit"))
    records = [
        _record(0, 1, 0, None, 100), _record(1, 1, 1, None, 110), _record(2, 1, 0, None, 120),
        _record(0, 2, 0, False, 20), _record(1, 2, 0, True, 90), _record(2, 2, 1, True, 70),
    ]  # fmt: skip
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
    from harness.results.fleet import markdown

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
