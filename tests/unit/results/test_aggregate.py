"""Aggregation from records to the RunResult: % diff formula, medians, attempts, cache stats."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.results.aggregate import aggregate
from harness.results.run_result import RunResult, pct_diff
from harness.scenario.spec import parse_scenario
from harness.store.events import GroupDone, MetricsDelta
from harness.store.records import RecordWriter, RequestRecord, read_records
from reports.renderers import markdown_table, write_all
from reports.ttft_table import settle_line
from tests.resultfiles import request_record

SCENARIO = parse_scenario(
    {
        "name": "agg",
        "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
        "arms": [{"name": "AMG-OFF", "offload": "off"}, {"name": "AMG-ON", "offload": "cpu"}],
        "workload": {"kind": "multi_round_qa", "context_tokens": [1000, 8000], "conversations": 3},
    },
    "test",
)


def test_pct_diff_reference_rows() -> None:
    assert pct_diff(22998.583, 301.481) == pytest.approx(7528.53, abs=0.005)
    assert pct_diff(27.925, 25.328) == pytest.approx(10.25, abs=0.005)
    assert pct_diff(None, 1.0) is None
    assert pct_diff(1.0, 0.0) is None


def rec(
    arm: str,
    ctx: int,
    conv: int,
    turn: int,
    ttft_ms: float | None,
    *,
    attempt: int = 0,
    ok: bool = True,
    phase: str = "measure",
) -> RequestRecord:
    return request_record(
        arm,
        ctx,
        conv,
        turn,
        attempt=attempt,
        phase=phase,
        ttft_ns=None if ttft_ms is None else int(ttft_ms * 1e6),
        e2e_ns=None,
        ok=ok,
        error_kind=None if ok else "timeout",
        prompt_tokens=ctx,
        cached_tokens=0,
    )


def full_records(on_t2: float, attempt: int = 0) -> list[RequestRecord]:
    out = []
    for ctx, base in ((1000, 100.0), (8000, 800.0)):
        for conv, jitter in enumerate((0.0, 10.0, 20.0)):
            out.append(rec("AMG-OFF", ctx, conv, 1, base + jitter, attempt=attempt))
            out.append(rec("AMG-OFF", ctx, conv, 2, base + jitter + 5, attempt=attempt))
            out.append(rec("AMG-ON", ctx, conv, 1, base + jitter, attempt=attempt))
            out.append(rec("AMG-ON", ctx, conv, 2, on_t2 + jitter, attempt=attempt))
    return out


def done_all(attempt: int = 0) -> list[GroupDone]:
    return [
        GroupDone(arm=arm, repetition=0, context_tokens=ctx, attempt=attempt)
        for arm in ("AMG-OFF", "AMG-ON")
        for ctx in (1000, 8000)
    ]


def test_medians_and_diff() -> None:
    result = aggregate(SCENARIO, "r", full_records(on_t2=50.0), done_all())
    cell = result.cell("AMG-OFF", 8000, 2)
    assert cell is not None and cell.ttft is not None
    assert cell.ttft.median_ms == pytest.approx(815.0)
    assert cell.ttft.n == 3
    assert cell.ttft.p90_ms == pytest.approx(823.0)
    # OFF t2 median 815 vs ON t2 median 60 -> (815/60 - 1) * 100
    assert result.diff("AMG-ON", 8000, 2) == pytest.approx((815 / 60 - 1) * 100)
    assert result.complete
    assert result.requests.measured == 24 and result.requests.errors == 0


def test_errors_are_counted_not_timed() -> None:
    records = [*full_records(on_t2=50.0), rec("AMG-ON", 1000, 3, 2, None, ok=False)]
    result = aggregate(SCENARIO, "r", records, done_all())
    cell = result.cell("AMG-ON", 1000, 2)
    assert cell is not None and cell.errors == 1 and cell.ttft is not None and cell.ttft.n == 3
    assert result.requests.errors_by_kind == {"timeout": 1}


def test_superseded_attempt_is_discarded() -> None:
    # attempt 0 died during AMG-ON 8000 (partial, slow numbers); attempt 1 re-ran that group
    first = [r for r in full_records(on_t2=9999.0) if not (r.arm == "AMG-ON" and r.context_tokens == 8000)]
    partial = [rec("AMG-ON", 8000, 0, 1, 5000.0)]
    rerun = [r for r in full_records(on_t2=50.0, attempt=1) if r.arm == "AMG-ON" and r.context_tokens == 8000]
    done = [*done_all()[:3], GroupDone(arm="AMG-ON", repetition=0, context_tokens=8000, attempt=1)]
    result = aggregate(SCENARIO, "r", first + partial + rerun, done)
    cell = result.cell("AMG-ON", 8000, 1)
    assert cell is not None and cell.ttft is not None and cell.ttft.median_ms == pytest.approx(810.0)
    assert result.requests.discarded == 1
    assert result.complete


def test_incomplete_run_reports_what_it_has() -> None:
    records = [r for r in full_records(on_t2=50.0) if r.arm == "AMG-OFF"]
    result = aggregate(SCENARIO, "r", records, done_all()[:2])
    assert not result.complete
    assert result.cell("AMG-ON", 1000, 1) is None
    assert "—" in markdown_table(result)


def test_cache_stats_from_metric_deltas() -> None:
    on_t2 = {
        "gpu_prefix_queries": 24000.0,
        "gpu_prefix_hits": 0.0,
        "external_prefix_queries": 24000.0,
        "external_prefix_hits": 23808.0,
    }
    metrics = [
        MetricsDelta(arm="AMG-ON", attempt=0, repetition=0, context_tokens=8000, turn=2, values=on_t2),
        # a superseded attempt's counters must not count
        MetricsDelta(
            arm="AMG-ON", attempt=7, repetition=0, context_tokens=8000, turn=2, values={"external_prefix_hits": 1e9}
        ),
    ]
    result = aggregate(SCENARIO, "r", full_records(on_t2=50.0), done_all(), metrics)
    stats = result.cache_stats("AMG-ON", 8000, 2)
    assert stats is not None
    assert stats.external_hit_rate == pytest.approx(0.992)
    assert stats.hit_rate == pytest.approx(0.992)
    assert "AMG-ON t2 hit %" in markdown_table(result)


def test_engine_timing_is_the_mean_of_the_engine_histograms_per_cell(tmp_path: Path) -> None:
    # two repetitions' groups of 3 requests each: 6 requests, 0.15 s of engine TTFT in all -> 25 ms each
    def timed(repetition: int, ttft_s: float, queue_s: float, prefill_s: float, attempt: int = 0) -> MetricsDelta:
        values = {
            "engine_ttft_seconds": ttft_s,
            "engine_ttft_requests": 3.0,
            "queue_seconds": queue_s,
            "queued_requests": 3.0,
            "prefill_seconds": prefill_s,
            "prefilled_requests": 3.0,
        }
        return MetricsDelta(
            arm="AMG-ON", attempt=attempt, repetition=repetition, context_tokens=8000, turn=2, values=values
        )

    done = [*done_all(), GroupDone(arm="AMG-ON", repetition=1, context_tokens=8000, attempt=0)]
    metrics = [timed(0, 0.06, 0.003, 0.05), timed(1, 0.09, 0.003, 0.07), timed(1, 99.0, 9.0, 90.0, attempt=5)]
    result = aggregate(SCENARIO, "r", full_records(on_t2=50.0), done, metrics)
    timing = result.timing("AMG-ON", 8000, 2)
    assert timing is not None and timing.requests == 6
    assert timing.ttft_ms == pytest.approx(25.0)
    assert timing.queue_ms == pytest.approx(1.0)
    assert timing.prefill_ms == pytest.approx(20.0)
    assert result.timing("AMG-OFF", 8000, 2) is None  # the engine timed nothing there: no row, not zeros

    # the report shows it beside the client's clock: client mean 60 ms (50, 60, 70) - engine 25 ms
    out = tmp_path / "report"
    written = {path.name for path in write_all(result, {}, out)}
    assert "engine_timing.csv" in written
    text = (out / "ttft_table.md").read_text()
    assert "## Where TTFT goes" in text
    assert "| AMG-ON | 8000 | 2 | 6 | 60.0 | 25.0 | 35.0 | 1.0 | 20.0 |" in text
    rows = (out / "engine_timing.csv").read_text().splitlines()
    assert rows[0].startswith("arm,context_tokens,turn,requests,client_ttft_mean_ms,engine_ttft_mean_ms")
    fields = rows[1].split(",")
    assert fields[:4] == ["AMG-ON", "8000", "2", "6"]
    assert [float(v) for v in fields[4:9]] == pytest.approx([60.0, 25.0, 35.0, 1.0, 20.0])


def test_no_engine_timing_no_section_and_no_file(tmp_path: Path) -> None:
    result = aggregate(SCENARIO, "r", full_records(on_t2=50.0), done_all())
    assert result.engine_timing == []
    written = {path.name for path in write_all(result, {}, tmp_path)}
    assert "engine_timing.csv" not in written and "ttft_table.md" in written
    assert "Where TTFT goes" not in (tmp_path / "ttft_table.md").read_text()


def test_result_file_roundtrip(tmp_path: Path) -> None:
    result = aggregate(SCENARIO, "r", full_records(on_t2=50.0), done_all())
    result.write_file(tmp_path / "summary.json")
    assert RunResult.read_file(tmp_path / "summary.json") == result


def test_record_writer_keeps_records_and_skips_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    with RecordWriter(path, fsync_every=2) as writer:
        for record in full_records(on_t2=50.0)[:3]:
            writer.append(record)
    with path.open("a") as handle:
        handle.write('{"arm": "AMG-ON", "attem')  # a writer killed mid-line
    assert len(list(read_records(path))) == 3


def test_the_median_after_each_pass_and_how_far_the_last_pass_moved_it(tmp_path: Path) -> None:
    scenario = SCENARIO.model_copy(update={"repetitions": 3})
    # AMG-ON t2 at both lengths by pass: 50/60/70, then 100/110/120, then 55/65/75 ms; every other cell steady
    on_t2 = {0: 50.0, 1: 100.0, 2: 55.0}
    records = [
        r.model_copy(update={"repetition": rep, "request_id": f"{r.request_id}-{rep}"})
        for rep in range(3)
        for r in full_records(on_t2=on_t2[rep])
    ]
    failed = rec("AMG-ON", 8000, 3, 2, None, ok=False).model_copy(update={"repetition": 2})  # not a time
    done = [
        GroupDone(arm=g.arm, repetition=rep, context_tokens=g.context_tokens, attempt=0)
        for rep in range(3)
        for g in done_all()
    ]
    result = aggregate(scenario, "r", [*records, failed], done)

    moved = next(c for c in result.pass_medians if (c.arm, c.context_tokens, c.turn) == ("AMG-ON", 8000, 2))
    # 1 pass: median of 50, 60, 70; 2 passes: of 50…120 (70 and 100 in the middle); 3 passes: of nine, the fifth
    assert moved.medians_ms == pytest.approx([60.0, 85.0, 70.0])
    assert moved.last_move == pytest.approx(70.0 / 85.0 - 1)
    steady = next(c for c in result.pass_medians if (c.arm, c.context_tokens, c.turn) == ("AMG-OFF", 1000, 1))
    assert steady.medians_ms == pytest.approx([110.0, 110.0, 110.0]) and steady.last_move == pytest.approx(0.0)
    assert len(result.pass_medians) == 8  # 2 arms x 2 lengths x 2 turns

    written = {path.name for path in write_all(result, {}, tmp_path)}
    assert "pass_medians.csv" in written
    lines = (tmp_path / "pass_medians.csv").read_text().splitlines()
    assert lines[0] == "arm,context_tokens,turn,passes,ttft_median_ms,provenance"
    assert len(lines) == 1 + 8 * 3
    markdown = (tmp_path / "ttft_table.md").read_text()
    assert "## Do the medians settle? (passes)" in markdown
    assert "the last of 3 moved the median of 2 of 8 cells by more than 5%" in markdown  # AMG-ON t2 at both lengths
    line, unsettled = settle_line(result)
    assert unsettled and line is not None and "(largest: AMG-ON 1,000 t2, -17.6%)" in line
    assert RunResult.model_validate_json(result.model_dump_json()) == result


def test_one_pass_has_no_pass_medians(tmp_path: Path) -> None:
    result = aggregate(SCENARIO, "r", full_records(on_t2=50.0), done_all())
    assert result.pass_medians == []
    written = {path.name for path in write_all(result, {}, tmp_path)}
    assert "pass_medians.csv" not in written
    assert "Do the medians settle" not in (tmp_path / "ttft_table.md").read_text()
    assert settle_line(result) == (None, False)
