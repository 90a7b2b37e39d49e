"""aggregate_replay is a pure function of stored records, samples and events: lag, late sends, falling
behind, hit rate by source, the attempt that counts, and the ON vs OFF % diff."""

from __future__ import annotations

import pytest

from harness.results.replay import aggregate_replay
from harness.scenario.spec import parse_scenario
from harness.store.events import ReplayDone, ReplaySample, TraceInfo
from harness.store.records import RequestRecord
from tests.resultfiles import request_record

MS = 1_000_000
SCENARIO = parse_scenario(
    {
        "name": "r",
        "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
        "arms": [{"name": "OFF", "offload": "hbm"}, {"name": "ON", "offload": "cpu"}],
        "workload": {"kind": "trace", "path": "t.jsonl", "late_ms": 10, "behind_ms": 100},
        "slo": {"ttft_ms": 50},
    },
    "r.yaml",
)
TRACE = TraceInfo(
    path="t.jsonl",
    format="mooncake",
    sha256="0" * 64,
    block_tokens=512,
    start=0,
    requests=4,
    duration_s=3.0,
    time_scale=1.0,
    mode="open",
    concurrency=None,
    prompt_tokens_total=4000,
    input_p50=1000,
    input_p99=1000,
    output_p50=10,
    infinite_cache_hit_rate=0.5,
)


def record(arm: str, line: int, *, ttft_ms: float, lag_ms: float, attempt: int = 0) -> RequestRecord:
    scheduled = line * 1000 * MS
    return request_record(
        arm,
        1000,
        line,
        1,
        attempt=attempt,
        api="completions",
        started_ns=scheduled + int(lag_ms * MS),
        ttft_ns=int(ttft_ms * MS),
        e2e_ns=int((ttft_ms + 90) * MS),
        itl_ns=[10 * MS] * 9,
        output_chunks=10,
        prompt_tokens=1000,
        completion_tokens=10,
        cached_tokens=0,
        expected_prompt_tokens=1000,
        scheduled_ns=scheduled,
        trace_line=line,
    )


def test_lag_late_behind_hits_and_the_comparison() -> None:
    off = [record("OFF", i, ttft_ms=100, lag_ms=lag) for i, lag in enumerate([1, 5, 20, 400], start=1)]
    on = [record("ON", i, ttft_ms=t, lag_ms=1) for i, t in enumerate([40, 40, 40, 60], start=1)]
    stale = [record("ON", 1, ttft_ms=999, lag_ms=1)]  # attempt 0 of ON was superseded by attempt 1
    on = [r.model_copy(update={"attempt": 1}) for r in on]
    samples = [
        ReplaySample(arm="OFF", attempt=0, t_s=2, duration_s=2, values={"prompt_tokens": 4000, "gpu_prefix_hits": 100}),
        ReplaySample(
            arm="ON",
            attempt=1,
            t_s=2,
            duration_s=2,
            values={"prompt_tokens": 3000, "gpu_prefix_hits": 500, "external_prefix_hits": 1000},
        ),
        ReplaySample(arm="ON", attempt=1, t_s=4, duration_s=2, values={"prompt_tokens": 1000}),
        ReplaySample(arm="ON", attempt=0, t_s=2, duration_s=2, values={"prompt_tokens": 1, "gpu_prefix_hits": 1}),
    ]
    done = [
        ReplayDone(arm="OFF", attempt=0, start_ns=0, end_ns=1, sent=4, errors=0, cancelled=0, max_in_flight=1),
        ReplayDone(arm="ON", attempt=1, start_ns=0, end_ns=1, sent=4, errors=0, cancelled=0, max_in_flight=1),
    ]
    result = aggregate_replay(SCENARIO, "run", TRACE, [*off, *stale, *on], samples, done)
    assert result.complete
    r_off, r_on = result.arm("OFF"), result.arm("ON")
    assert r_off is not None and r_on is not None
    assert r_off.late == 2 and r_off.lag is not None and r_off.lag.max_ms == pytest.approx(400)
    # p99 of lags 1, 5, 20, 400 ms (linear) is above behind_ms = 100
    assert r_off.fell_behind and not r_on.fell_behind
    assert r_on.attempt == 1 and r_on.requests == 4 and r_on.ttft is not None and r_on.ttft.max_ms == pytest.approx(60)
    assert r_off.hit_rate == pytest.approx(100 / 4000)
    assert r_on.hit_rate == pytest.approx(1500 / 4000)
    assert (r_on.gpu_hit_tokens, r_on.external_hit_tokens) == (500, 1000)
    assert r_on.slo_attainment == pytest.approx(0.75) and r_off.slo_attainment == 0.0
    (comparison,) = result.comparisons
    assert comparison.ttft_p50_pct == pytest.approx((100 / 40 - 1) * 100)
    on_timeline = [p for p in result.timeline if p.arm == "ON"]
    assert [(p.t_s, p.duration_s, p.external_hit_tps) for p in on_timeline] == [(2, 2, 500), (4, 2, None)]


def test_an_arm_without_its_done_event_is_incomplete() -> None:
    result = aggregate_replay(SCENARIO, "run", TRACE, [record("OFF", 1, ttft_ms=1, lag_ms=0)], [], [])
    assert not result.complete and result.arm("OFF") is not None and not result.arm("OFF").complete  # type: ignore[union-attr]
    assert result.arm("ON") is None and result.comparisons == []
