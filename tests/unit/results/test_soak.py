"""Stability-window logic without an engine: interval aggregation, the trend test, criteria, files, memory."""

from __future__ import annotations

import gc
import random
import tracemalloc
from pathlib import Path

import pytest

from common.errors import ScenarioError
from harness.client.scrape import counter_totals, parse_metrics, restarted
from harness.results.soak_result import (
    CriterionName,
    IntervalAccumulator,
    MetricsReading,
    SoakVerdict,
    evaluate,
    planned_intervals,
    trend,
)
from harness.runs.soak import interval_hit_rate
from harness.scenario.soak import soak_arm, soak_scenario
from harness.scenario.spec import SLO, SoakSpec, parse_duration, parse_scenario
from harness.store.events import IntervalStats
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from tests.resultfiles import request_record
from tests.resultfiles import soak_interval as interval

NS_MS = 1_000_000
SLO_TARGETS = SLO(ttft_ms=500, tpot_ms=50)


def record(
    ttft_ms: float | None = 100.0,
    *,
    ok: bool = True,
    kind: str | None = None,
    status: int | None = None,
    e2e_ms: float = 400.0,
    tokens: int = 31,
    cached: int = 0,
    prompt: int = 1000,
) -> RequestRecord:
    return request_record(
        "AMG-ON",
        prompt,
        0,
        1,
        request_id="r",
        ttft_ns=None if ttft_ms is None else int(ttft_ms * NS_MS),
        e2e_ns=int(e2e_ms * NS_MS),
        ok=ok,
        error_kind=kind,
        http_status=status,
        completion_tokens=tokens,
        prompt_tokens=prompt,
        cached_tokens=cached,
    )


def status(verdict: SoakVerdict, name: CriterionName) -> str:
    """The named criterion's status; fails the test when the verdict lacks that criterion."""
    criterion = verdict.criterion(name)
    assert criterion is not None, name
    return criterion.status


def spec(**criteria: object) -> SoakSpec:
    return SoakSpec.model_validate({"window": 200, "interval": 10, "criteria": criteria})


def test_durations() -> None:
    assert parse_duration("4h") == 14400
    assert parse_duration("1h30m") == 5400
    assert parse_duration("250ms") == 0.25
    assert parse_duration(90) == 90
    with pytest.raises(ValueError, match="units: ms, s, m, h, d"):
        parse_duration("4 hours")
    with pytest.raises(ValueError, match="longer than the window"):
        SoakSpec.model_validate({"window": "10s", "interval": "1m"})
    assert planned_intervals(14400, 60) == 240
    assert planned_intervals(5, 0.5) == 10


def test_accumulator_aggregates_and_clears() -> None:
    acc = IntervalAccumulator(SLO_TARGETS)
    for ms in range(1, 101):  # TTFT 1..100 ms
        acc.add(record(float(ms), cached=500 if ms % 2 else 0))
    acc.add(record(None, ok=False, kind="http_status", status=503))
    acc.add(record(None, ok=False, kind="stream_dropped"))
    acc.add(record(900.0, e2e_ms=1300.0))  # misses the TTFT target
    stats = acc.close(index=3, attempt=1, start_unix_ns=5, duration_ns=2 * 10**9, metrics=None)
    assert stats.requests == 103 and stats.ok == 101 and stats.errors == 2
    assert stats.errors_by_kind == {"http_status": 1, "stream_dropped": 1}
    assert stats.http_statuses == {"503": 1}
    assert stats.rps == pytest.approx(51.5)
    assert stats.ttft_p50_ms == pytest.approx(51.0)
    assert stats.ttft_p99_ms is not None and 99 < stats.ttft_p99_ms < 900
    # TPOT = (e2e - ttft) / (tokens - 1): (400 - 50) / 30 ms for the median request
    assert stats.tpot_p50_ms == pytest.approx((400 - 51) / 30, rel=0.02)
    assert stats.slo_met == 100
    assert stats.slo_missed == {"failed": 2, "ttft": 1}
    assert stats.hit_rate == pytest.approx(50 * 500 / (101 * 1000))  # from usage when /metrics is absent
    assert stats.hit_rate_source == "usage"
    assert len(acc) == 0 and acc.missed == {}
    empty = acc.close(index=4, attempt=1, start_unix_ns=0, duration_ns=10**9, metrics=MetricsReading(hit_rate=0.7))
    assert empty.requests == 0 and empty.ttft_p99_ms is None and empty.hit_rate == 0.7


def test_memory_stays_flat_over_many_intervals() -> None:
    """Only the current interval is held: 30 intervals cost what 5 do."""
    acc = IntervalAccumulator(SLO_TARGETS)
    kept: list[IntervalStats] = []

    requests = [record(50.0 + i % 97) for i in range(1000)]

    def run(intervals: int) -> None:
        for index in range(intervals):
            for item in requests:
                acc.add(item)
            kept.append(acc.close(index=index, attempt=0, start_unix_ns=0, duration_ns=10**9))

    tracemalloc.start()
    run(5)
    gc.collect()
    after_5, _ = tracemalloc.get_traced_memory()
    run(25)
    gc.collect()
    after_30, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    per_request = 100  # bytes a kept per-request tuple would cost at the very least
    assert after_30 - after_5 < 25 * 1000 * per_request / 20, (after_5, after_30)


def test_trend_detects_drift_not_noise_or_a_spike() -> None:
    rng = random.Random(4)
    minutes = [float(i) for i in range(30)]
    rising = [100 + 3 * i + rng.gauss(0, 5) for i in range(30)]
    found = trend(minutes, rising, 0.95)
    assert found.p_value < 0.001 and found.slope == pytest.approx(3, abs=0.6)
    assert found.slope_low < found.slope < found.slope_high
    assert found.relative_rise > 0.5

    flat = [100 + rng.gauss(0, 5) for _ in range(30)]
    assert trend(minutes, flat, 0.95).p_value > 0.05

    spike = [100 + rng.gauss(0, 2) for _ in range(30)]
    spike[20] = 5000.0  # one bad interval is not a trend
    assert trend(minutes, spike, 0.95).p_value > 0.05
    assert trend([0, 1, 2], [5, 5, 5], 0.95).p_value == 1.0


def test_clean_window_passes() -> None:
    intervals = [interval(i) for i in range(20)]
    verdict = evaluate(intervals, spec(hit_rate_floor=0.5), SLO_TARGETS, planned=20)
    assert verdict.verdict == "PASS", verdict.reasons
    assert {c.name: c.status for c in verdict.criteria} == {
        "slo_compliance": "pass",
        "error_rate": "pass",
        "drift": "pass",
        "hit_rate_floor": "pass",
        "restarts": "pass",
    }


def test_each_criterion_fails_with_its_intervals() -> None:
    burst = [interval(i, errors=30 if i in (7, 8) else 0) for i in range(20)]
    verdict = evaluate(burst, spec(), SLO_TARGETS, planned=20)
    errors = verdict.criterion("error_rate")
    assert verdict.verdict == "FAIL" and errors is not None and errors.status == "fail"
    assert errors.intervals == [7, 8]
    assert "HTTP 503 ×60" in errors.reason
    slo = verdict.criterion("slo_compliance")
    assert slo is not None and slo.status == "fail" and "failed ×60" not in slo.reason  # counted via slo_met

    drifting = [interval(i, p99=200 + 20 * i) for i in range(20)]
    drift = evaluate(drifting, spec(), SLO_TARGETS, planned=20).criterion("drift")
    assert drift is not None and drift.status == "fail"
    assert "Mann-Kendall" in drift.reason and "Theil-Sen" in drift.reason
    assert drift.intervals and drift.intervals[-1] == 19 and 0 not in drift.intervals

    small = [interval(i, p99=200 + 0.5 * i) for i in range(20)]  # significant, but +5% over the window
    assert status(evaluate(small, spec(), SLO_TARGETS, planned=20), "drift") == "pass"

    cold = [interval(i, hit=0.1 if i >= 15 else 0.8) for i in range(20)]
    hit = evaluate(cold, spec(hit_rate_floor=0.5), SLO_TARGETS, planned=20).criterion("hit_rate_floor")
    assert hit is not None and hit.status == "fail" and hit.intervals == [15, 16, 17, 18, 19]

    restart = [interval(i, restarts=1 if i == 4 else 0) for i in range(20)]
    again = evaluate(restart, spec(), SLO_TARGETS, planned=20).criterion("restarts")
    assert again is not None and again.status == "fail" and again.intervals == [4]


def test_warmup_incomplete_and_unset_criteria() -> None:
    intervals = [interval(0, errors=90)] + [interval(i) for i in range(1, 10)]
    assert evaluate(intervals, spec(), SLO_TARGETS, planned=10).verdict == "FAIL"
    warm = SoakSpec.model_validate({"window": 100, "interval": 10, "warmup_intervals": 1})
    assert evaluate(intervals, warm, SLO_TARGETS, planned=10).verdict == "PASS"
    partial = evaluate(intervals[1:5], warm, SLO_TARGETS, planned=10)
    assert partial.verdict == "INCOMPLETE" and "--resume" in partial.reasons[0]
    no_slo = evaluate([interval(i) for i in range(10)], spec(), SLO(), planned=10)
    assert status(no_slo, "slo_compliance") == "not_evaluated"
    unmeasured = evaluate([interval(i, hit=None) for i in range(10)], spec(hit_rate_floor=0.5), SLO(), planned=10)
    assert status(unmeasured, "hit_rate_floor") == "fail"


def test_intervals_file_survives_a_torn_line_and_resumes(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    path = run_dir.intervals_file
    for i in range(3):
        run_dir.append_interval(interval(i))
    run_dir.append_interval(interval(2, p99=999.0))  # a resumed attempt re-measured interval 2
    with path.open("a") as handle:
        handle.write('{"index": 3, "attem')  # killed mid-write
    back = run_dir.intervals()
    assert [i.index for i in back] == [0, 1, 2]
    assert back[2].ttft_p99_ms == 999.0


PAGE = """# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{{model_name="m",engine="0"}} {prompt}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{model_name="m",engine="0"}} {hits}
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{model_name="m",engine="0"}} {prompt}
# TYPE vllm:external_prefix_cache_hits counter
vllm:external_prefix_cache_hits_total{{model_name="m",engine="0"}} {ext}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="m",engine="0"}} 0.25
"""


def test_metrics_hit_rate_and_restart_detection() -> None:
    before = parse_metrics(PAGE.format(prompt=1000, hits=100, ext=0))
    after = parse_metrics(PAGE.format(prompt=3000, hits=700, ext=600))
    assert interval_hit_rate(before, after) == pytest.approx((600 + 600) / 2000)
    first, second = counter_totals(before), counter_totals(after)
    assert not restarted(first, second)
    reset = counter_totals(parse_metrics(PAGE.format(prompt=10, hits=0, ext=0)))
    assert restarted(second, reset)
    assert restarted({"process_start_time_seconds": 100.0}, {"process_start_time_seconds": 250.0})
    # hits beyond the prompt tokens: vLLM re-counted lookups of requests waiting for a tier load
    overlapping = parse_metrics(PAGE.format(prompt=3000, hits=1900, ext=900))
    assert interval_hit_rate(before, overlapping) is None


def test_the_requests_usage_outranks_the_metrics_counters() -> None:
    acc = IntervalAccumulator(SLO_TARGETS)
    acc.add(record(10.0, cached=900))
    acc.add(record(10.0, cached=0))
    stats = acc.close(index=0, attempt=0, start_unix_ns=0, duration_ns=10**9, metrics=MetricsReading(hit_rate=1.0))
    assert stats.hit_rate == pytest.approx(900 / 2000) and stats.hit_rate_source == "usage"


def soak_data() -> dict[str, object]:
    return {
        "name": "soak",
        "engine": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9"},
        "arms": [{"name": "OFF", "offload": "off"}, {"name": "ON", "offload": "cpu"}],
        "compare": {"baseline": "OFF"},
        "workload": {"kind": "multi_user_qa", "users": 4, "rounds": 3, "context_tokens": 1000},
        "sweep": {"mode": "concurrency", "values": [2, 8]},
        "soak": {"window": "1h", "interval": "1m"},
    }


def test_soak_scenario_overrides_and_checks() -> None:
    scenario = parse_scenario(soak_data(), "test")
    effective = soak_scenario(scenario, window_s=7200, interval_s=30)
    assert effective.soak is not None
    assert (effective.soak.window, effective.soak.interval, effective.soak.load) == (7200, 30, 8)
    assert soak_arm(effective, None).name == "ON"
    with pytest.raises(ScenarioError, match="whole number of users"):
        soak_scenario(scenario, load=2.5)
    with pytest.raises(ScenarioError, match="longer than the window"):
        soak_scenario(scenario, interval_s=7200)
    probe = parse_scenario(
        {
            "name": "p",
            "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
            "arms": [{"name": "A", "offload": "off"}],
            "workload": {"kind": "multi_round_qa", "context_tokens": [100]},
        },
        "probe.yaml",
    )
    with pytest.raises(ScenarioError, match=r"probe\.yaml: workload kind 'multi_round_qa'.*multi_user_qa"):
        soak_scenario(probe, source="probe.yaml")


def test_a_window_too_thin_to_judge_its_slo_compliance_is_incomplete_never_pass() -> None:
    # 10 intervals of 1 request, every one within the SLO: 10 < the 20 a 95 % minimum needs
    thin = evaluate(
        [interval(i, requests=1) for i in range(10)], spec(slo_compliance_min=0.95), SLO_TARGETS, planned=10
    )
    assert status(thin, "slo_compliance") == "too_few" and thin.verdict == "INCOMPLETE"
    assert "needs at least 20" in thin.reasons[0]
    # one request more per interval is enough to judge, and to pass
    enough = evaluate(
        [interval(i, requests=2) for i in range(10)], spec(slo_compliance_min=0.95), SLO_TARGETS, planned=10
    )
    assert status(enough, "slo_compliance") == "pass" and enough.verdict == "PASS"
    # misses that sink it whatever the next requests show: 2 of 10 missed, 18 of 20 at best < 95 %
    sunk = [interval(i, requests=1, slo_met=0 if i < 2 else 1) for i in range(10)]
    assert status(evaluate(sunk, spec(slo_compliance_min=0.95), SLO_TARGETS, planned=10), "slo_compliance") == "fail"
    one_miss = [interval(i, requests=1, slo_met=0 if i < 1 else 1) for i in range(10)]  # 19 of 20 at best: 95 %
    assert (
        status(evaluate(one_miss, spec(slo_compliance_min=0.95), SLO_TARGETS, planned=10), "slo_compliance")
        == "too_few"
    )
