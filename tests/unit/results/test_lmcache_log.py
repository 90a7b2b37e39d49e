"""LMCache's log lines beside the client's records: each TTFT split into before the lookup, the load, and after."""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path

import pytest

from harness.results.aggregate import summarize_run_dir
from harness.results.lmcache_log import RANK_MIN_TOKENS, parse_log, ranks, split_requests, timeline
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from tests.resultfiles import request_record

RESULTS = Path(__file__).resolve().parents[3] / "lab" / "runs"
COLOR = "\x1b[32;20m"  # as LMCache colours its level


def record(
    started_s: float, ttft_ms: float, prompt: int, turn: int, *, phase: str = "measure", attempt: int = 0
) -> RequestRecord:
    return request_record(
        "ON",
        96000,
        0,
        turn,
        attempt=attempt,
        phase=phase,
        request_id=f"r{started_s}",
        started_ns=int(started_s * 1e9),
        ttft_ns=int(ttft_ms * 1e6),
        e2e_ns=None,
        ok=True,
        prompt_tokens=prompt,
        cached_tokens=0,
    )


def lookup(stamp: str, request: str, total: int, hit: int) -> str:
    return (
        f"(EngineCore pid=1) {COLOR}[2026-11-27 10:03:{stamp}] LMCache INFO:\x1b[0m Reqid: {request}, Total tokens "
        f"{total}, Inference Engine computed tokens: 0, LMCache hit tokens: {hit}, need to load: {hit} (x.py:1)"
    )


def retrieved(stamp: str, request: str, tokens: int, cost_ms: float, worker: str = "Worker_TP0") -> str:
    return (
        f"({worker} pid=2) {COLOR}[2026-11-27 10:03:{stamp}] LMCache INFO:\x1b[0m [req_id={request}] Retrieved "
        f"{tokens} out of {tokens} required tokens (from {tokens} total tokens). size: 11.7 gb, cost {cost_ms} ms"
    )


# The client sends at monotonic 100 s (warm-up), 110 s (turn 1) and 120 s (turn 2); the engine host's
# clock reads 10:03:10.002 at the warm-up's lookup, so the clocks differ by (10.002 - 100.000) s, the smallest.
RECORDS = [
    record(100.0, 30.0, 130, 1, phase="warmup"),
    record(110.0, 6700.0, 96000, 1),
    record(120.0, 530.0, 96174, 2),
]
LOG = [
    "(APIServer pid=3) INFO 11-27 10:03:10 [api_router.py:39] Resetting prefix cache...",
    lookup("10,002", "chatcmpl-a", 130, 0),
    lookup("10,002", "chatcmpl-a", 130, 0),  # a request looked up twice (it waited): its first lookup counts
    lookup("20,202", "chatcmpl-b", 96000, 0),
    lookup("30,232", "chatcmpl-c", 96174, 96000),
    retrieved("30,412", "chatcmpl-c", 96000, 150.3),
    retrieved("30,413", "chatcmpl-c", 96000, 151.0).split(") ", 1)[1],  # a rank whose prefix was lost: still a rank
    retrieved("30,430", "chatcmpl-c", 96000, 166.3, "Worker_TP1"),  # the slowest rank: the forward waits for it
]


def test_each_ttft_is_split_at_the_lookup_and_the_load() -> None:
    parsed = parse_log(LOG)
    lookups, retrievals = parsed.lookups, parsed.retrievals
    assert [item.request_id for item in lookups] == ["chatcmpl-a", "chatcmpl-b", "chatcmpl-c"]
    assert [(item.worker, item.cost_ms) for item in retrievals["chatcmpl-c"]] == [
        ("Worker_TP0", 150.3),
        ("", 151.0),
        ("Worker_TP1", 166.3),
    ]
    first, second = split_requests(RECORDS, LOG)  # the warm-up only sets the clocks' offset
    assert first.turn == 1 and first.lookup_to_loaded_ms is None and first.retrieve_ms is None
    assert first.rank_spread_ms is None
    assert first.before_lookup_ms == pytest.approx(200.0, abs=0.01)
    assert first.after_load_ms == pytest.approx(6500.0, abs=0.01)
    assert second.before_lookup_ms == pytest.approx(230.0, abs=0.01)
    assert second.lookup_to_loaded_ms == pytest.approx(198.0, abs=0.01)
    assert second.retrieve_ms == 166.3
    assert second.rank_spread_ms == pytest.approx(18.0, abs=0.01)
    assert second.after_load_ms == pytest.approx(530.0 - 230.0 - 198.0, abs=0.01)
    (cell,) = [c for c in timeline(RECORDS, {"ON": parse_log(LOG)}) if c.turn == 2]
    assert cell.requests == 1 and cell.lookup_to_loaded_ms == pytest.approx(198.0, abs=0.01)
    assert cell.rank_spread_ms == pytest.approx(18.0, abs=0.01)


def stored(stamp: str, request: str, tokens: int, cost_ms: float, worker: str = "Worker_TP0") -> str:
    return (
        f"({worker} pid=2) {COLOR}[2026-11-28 08:57:{stamp}] LMCache INFO:\x1b[0m [req_id={request}] Stored {tokens} "
        f"out of total {tokens} tokens. size: 0.1929 GB, cost {cost_ms} ms, throughput: 22.1 GB/s; offload_time: "
        f"{cost_ms} ms, put_time: 0.03 ms (cache_engine.py:1)"
    )


def test_each_request_has_lmcaches_own_store_time_from_its_stored_lines() -> None:
    """Turn 1 stores its whole prompt, chunk by chunk (the slowest rank's sum counts); turn 2 after a tier hit
    only the tail past the hit's last whole chunk (format: LMCache 0.5.3's lines in vLLM 0.26.0's engine log)."""
    lines = [
        *LOG,
        stored("20,300", "chatcmpl-b", 8192, 34.8),
        stored("20,310", "chatcmpl-b", 8192, 35.0, "Worker_TP1"),
        stored("20,500", "chatcmpl-b", 8192, 30.0),
        stored("20,510", "chatcmpl-b", 8192, 31.5, "Worker_TP1"),  # the slowest rank: 35.0 + 31.5
        stored("20,520", "chatcmpl-b", 8192, 90.0).split(") ", 1)[1],  # prefix lost: may be any rank, left out
        stored("30,500", "chatcmpl-c", 174, 2.1),
    ]
    assert [(item.worker, item.tokens) for item in parse_log(lines).stores["chatcmpl-b"]][:2] == [
        ("Worker_TP0", 8192),
        ("Worker_TP1", 8192),
    ]
    first, second = split_requests(RECORDS, lines)
    assert first.store_ms == pytest.approx(66.5) and first.stored_tokens == 16384
    assert second.store_ms == pytest.approx(2.1) and second.stored_tokens == 174
    assert [split.store_ms for split in split_requests(RECORDS, LOG)] == [None, None]  # no Stored lines
    cells = {c.turn: c for c in timeline(RECORDS, {"ON": parse_log(lines)})}
    assert cells[1].store_ms == pytest.approx(66.5) and cells[2].store_ms == pytest.approx(2.1)


def test_one_worker_has_no_rank_spread() -> None:
    one_worker = [line for line in LOG if "Retrieved" not in line or "150.3" in line]
    (split,) = [item for item in split_requests(RECORDS, one_worker) if item.turn == 2]
    assert split.rank_spread_ms is None and split.lookup_to_loaded_ms == pytest.approx(180.0, abs=0.01)


def test_records_that_do_not_pair_with_the_log_give_no_split() -> None:
    assert split_requests(RECORDS[1:], LOG) == []  # one request fewer than lookups
    other_prompt = [*RECORDS[:2], record(120.0, 530.0, 96175, 2)]
    assert split_requests(other_prompt, LOG) == []  # the third lookup is another request
    resumed = [*RECORDS[:2], record(120.0, 530.0, 96174, 2, attempt=1)]
    assert split_requests(resumed, LOG) == []  # two processes' monotonic clocks do not compare
    assert split_requests(RECORDS, [line for line in LOG if "Reqid" not in line]) == []
    assert timeline(RECORDS, {}) == []


@pytest.mark.lab
def test_a_committed_h200_run_splits_every_request_of_its_lmcache_arm(tmp_path: Path) -> None:
    # 1x H200, vLLM 0.26.0 + LMCache 0.5.3, CUDA graphs: every one of the arm's 112 requests pairs with a lookup
    copy = tmp_path / "run"
    shutil.copytree(RESULTS / "gpu-llama8b-lmcache-graphs-h200", copy, ignore=shutil.ignore_patterns("report"))
    result = summarize_run_dir(RunDir.open(copy))
    cells = [cell for cell in result.lmcache_timeline if cell.arm == "AMG-ON-LMCache"]
    assert len(cells) == 18 and all(cell.requests == 6 for cell in cells)
    assert {cell.arm for cell in result.lmcache_timeline} == {"AMG-ON-LMCache"}  # native and OFF log no lookups
    turn2 = {cell.context_tokens: cell for cell in cells if cell.turn == 2}
    for cell in turn2.values():
        assert cell.lookup_to_loaded_ms is not None and cell.retrieve_ms is not None
        assert cell.retrieve_ms <= cell.lookup_to_loaded_ms  # LMCache's own time lies inside the interval
    # LMCache's own load time grows with the tokens loaded, 1k to 128k
    loads = [turn2[length].retrieve_ms or 0.0 for length in sorted(turn2)]
    assert loads == sorted(loads) and loads[0] > 0
    assert statistics.median([cell.before_lookup_ms for cell in cells if cell.context_tokens == 1000]) < 5.0


@pytest.mark.lab
def test_a_committed_tp4_run_waits_for_its_slowest_rank() -> None:
    # 4x H200, vLLM 0.26.0 + LMCache 0.5.3, TP=4: each rank logs its own load, and one was 150 ms behind the others
    run = RunDir.open(RESULTS / "gpu-seed-llama70b-tp4-fp16-h200-3pass")
    lines = run.engine_log("AMG-ON-LMCache")
    assert lines is not None
    retrievals = parse_log(lines).retrievals
    assert {len(workers) for workers in retrievals.values()} == {4}
    records = [record for record in run.records() if record.arm == "AMG-ON-LMCache"]
    loaded = [split for split in split_requests(records, lines) if split.lookup_to_loaded_ms is not None]
    assert loaded and all(split.rank_spread_ms is not None and split.rank_spread_ms >= 0 for split in loaded)
    assert max(split.rank_spread_ms or 0.0 for split in loaded) > 100.0


def test_each_rank_gets_its_rate_and_how_often_the_others_waited_for_it() -> None:
    # synthetic: two requests of 96k tokens on two ranks; TP1 is the slower in both, a lost prefix counts for no rank
    line = retrieved("30,412", "chatcmpl-x", 96000, 100.0).replace("cost", "size: 5.0 gb, cost")
    lines = [
        line,
        line.replace("Worker_TP0", "Worker_TP1").replace("100.0", "250.0"),
        line.replace("chatcmpl-x", "chatcmpl-y").replace("100.0", "125.0"),
        line.replace("chatcmpl-x", "chatcmpl-y").replace("Worker_TP0", "Worker_TP1").replace("100.0", "200.0"),
        line.replace("chatcmpl-x", "chatcmpl-z").split(") ", 1)[1],
        line.replace("chatcmpl-x", "chatcmpl-small").replace("96000", str(RANK_MIN_TOKENS - 1)),
    ]
    tp0, tp1 = ranks({"ON": parse_log(lines)})
    assert (tp0.worker, tp0.loads, tp0.slowest_loads) == ("Worker_TP0", 2, 0)
    assert (tp1.worker, tp1.loads, tp1.slowest_loads) == ("Worker_TP1", 2, 2)
    assert tp0.median_gbps == pytest.approx((50.0 + 40.0) / 2) and tp1.min_gbps == pytest.approx(20.0)


@pytest.mark.lab
def test_a_committed_host_with_a_slow_rank_shows_it() -> None:
    # 4x H200, 70B BF16 eager, vLLM 0.26.0 + LMCache 0.5.3: TP1's median rate was 0.62x TP0's (19.3 / 31.1 GB/s)
    run = RESULTS.parents[1] / "docs" / "results" / "gpu-seed-llama70b-tp4-fp16-h200"
    lines = RunDir.open(run).engine_log("AMG-ON-LMCache")
    assert lines is not None
    by_worker = {rank.worker: rank for rank in ranks({"AMG-ON-LMCache": parse_log(lines)})}
    assert set(by_worker) == {"Worker_TP0", "Worker_TP1", "Worker_TP2", "Worker_TP3"}
    slowest_rate = min(by_worker.values(), key=lambda rank: rank.median_gbps)
    assert slowest_rate.worker == "Worker_TP1"
    assert slowest_rate.median_gbps < 0.7 * by_worker["Worker_TP0"].median_gbps
    assert all(rank.min_gbps <= rank.median_gbps for rank in by_worker.values())
    assert sum(rank.slowest_loads for rank in by_worker.values()) <= max(rank.loads for rank in by_worker.values())
