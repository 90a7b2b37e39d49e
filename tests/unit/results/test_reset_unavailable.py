"""An engine that cannot reset its prefix cache: the validity gates judge what evidence there is.

:func:`harness.results.validity.with_reset_unavailable` over aggregated cells: the engine's ``/metrics``
counters (judged by the usual gates), else ``usage`` ``cached_tokens``, else nothing -- INCONCLUSIVE.
"""

from __future__ import annotations

from harness.results.aggregate import aggregate
from harness.results.validity import with_reset_unavailable
from harness.scenario.spec import parse_scenario
from harness.store.events import ENGINE_RESTARTS, GroupDone, MetricsDelta
from harness.store.records import RequestRecord
from tests.resultfiles import request_record

WHY = "http://h:1 has no POST /reset_prefix_cache"
SCENARIO = parse_scenario(
    {
        "name": "no-reset",
        "engine": {"kind": "openai", "model": "m", "base_url": "http://h:1"},
        "arms": [{"name": "A", "offload": "hbm"}],
        "workload": {"kind": "multi_round_qa", "context_tokens": [1000], "conversations": 2},
    },
    "test",
)
DONE = [GroupDone(arm="A", repetition=0, context_tokens=1000, attempt=0)]


def records(cached: int | None) -> list[RequestRecord]:
    return [
        request_record(
            "A",
            1000,
            conv,
            turn,
            request_id=f"{conv}-{turn}",
            ttft_ns=1_000_000,
            e2e_ns=2_000_000,
            ok=True,
            prompt_tokens=1100 * turn,
            cached_tokens=None if cached is None else (cached if turn == 2 else 0),
        )
        for conv in range(2)
        for turn in (1, 2)
    ]


def judged(cached: int | None, metrics: list[MetricsDelta]) -> set[str]:
    result = aggregate(SCENARIO, "r", records(cached), DONE, metrics)
    assert result.validity is not None
    validity = with_reset_unavailable(
        result.validity, {"A": WHY}, result.cells, result.cache, SCENARIO.validity.max_reset_hit_rate
    )
    return {finding.gate for finding in validity.findings}


def cold_metrics() -> list[MetricsDelta]:
    values = {"prompt_tokens": 2200.0, "gpu_prefix_queries": 2200.0, "gpu_prefix_hits": 0.0, ENGINE_RESTARTS: 0.0}
    return [
        MetricsDelta(arm="A", attempt=0, repetition=0, context_tokens=1000, turn=turn, values=values) for turn in (1, 2)
    ]


def test_no_evidence_at_all_is_inconclusive() -> None:
    assert judged(None, []) == {"reset_unavailable"}


def test_the_engines_counters_judge_where_it_has_them() -> None:
    assert judged(None, cold_metrics()) == set()  # turn 2 did not hit: the missing reset did not matter


def test_usage_cached_tokens_judge_without_counters() -> None:
    assert judged(2000, []) == {"reset_missed"}  # 2000 of 2200 prompt tokens cached in turn 2
    assert judged(0, []) == set()
