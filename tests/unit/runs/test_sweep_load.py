"""The load runner against a real in-process HTTP server with a known latency (the sim's fixed mode).

Each test drives :func:`run_load` for a second or two: closed-loop concurrency, open-loop arrivals,
warm-up exclusion, draining, stop events, failures, and the multi-process client pool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from itertools import pairwise

import pytest

from harness.client.endpoint import Endpoint
from harness.client.openai import OpenAIClient
from harness.client.pool import ProcessClientPool
from harness.runs.load import LoadPlan, RecordContext, run_load
from harness.sim.fixed import FixedLatency, FixedServer
from harness.sim.tokenizer import SimTokenizer
from harness.store.records import RequestRecord
from tests.fakes.serving import app_serving
from tests.scenarios import multi_user_qa, uniform
from tests.support import multi_user_workload
from workloads.multi_user import MultiUserWorkload

TTFT_S = 0.05
ITL_S = 0.01
NS = 1_000_000_000


@pytest.fixture
async def server() -> AsyncIterator[str]:
    async with app_serving(FixedServer(FixedLatency(TTFT_S, ITL_S)).app()) as url:
        yield url


def workload(users: int = 50, rounds: object = 3, think: object = 0.0, answer: object = 4) -> MultiUserWorkload:
    fields = {"system_prompt_tokens": 20, "question_tokens": 10, "answer_tokens": answer, "think_time_s": think}
    return multi_user_workload(multi_user_qa(users, rounds, uniform(50, 150), **fields), seed=5)


def client(url: str) -> OpenAIClient:
    return OpenAIClient(Endpoint(base_url=url, model="fixed-latency"), timeout_s=30, max_connections=64)


CONTEXT = RecordContext(arm="A", attempt=0, point=3)


async def test_concurrency_keeps_that_many_users_busy_and_measures_only_the_window(server: str) -> None:
    records: list[RequestRecord] = []
    plan = LoadPlan(mode="concurrency", value=8, warmup_s=0.4, duration_s=1.0, ramp_up_s=0.2, stagger_rounds=False)
    async with client(server) as c:
        window = await run_load(c, workload(), plan, CONTEXT, on_record=records.append)
    assert window.max_in_flight == 8  # every user sends, none more
    assert window.sent == len(records) and window.errors == 0 and window.cancelled == 0
    assert 0.95 < window.window_s < 1.3  # the window closes on time (a loaded CI machine adds event-loop delay)
    for record in records:
        assert (record.arm, record.point, record.load, record.attempt) == ("A", 3, 8.0, 0)
        assert record.user == record.conversation % 50 and record.ok
        inside = window.window_start_ns <= record.started_ns < window.window_end_ns
        assert (record.phase == "measure") == inside
        assert record.started_ns < window.window_end_ns  # nothing is sent after the window
        assert record.ttft_ns is not None and TTFT_S * NS <= record.ttft_ns < (TTFT_S + 0.25) * NS
    # a request takes ~80 ms (50 ms + 3 × 10 ms): 8 users send ~100 per second
    measured = [r for r in records if r.phase == "measure"]
    assert 60 <= len(measured) <= 110
    # each session's rounds go in order, and every round resends a longer history
    by_session: dict[int, list[RequestRecord]] = {}
    for record in sorted(records, key=lambda r: r.started_ns):
        by_session.setdefault(record.conversation, []).append(record)
    for session in by_session.values():
        assert [r.turn for r in session] == list(range(1, len(session) + 1))
        prompts = [r.expected_prompt_tokens or 0 for r in session]
        assert all(a < b for a, b in pairwise(prompts))


async def test_think_time_spaces_a_users_rounds(server: str) -> None:
    records: list[RequestRecord] = []
    plan = LoadPlan(mode="concurrency", value=2, duration_s=1.0, stagger_rounds=False)
    async with client(server) as c:
        await run_load(c, workload(think=0.3, rounds=10), plan, CONTEXT, on_record=records.append)
    by_session: dict[int, list[RequestRecord]] = {}
    for record in sorted(records, key=lambda r: r.started_ns):
        by_session.setdefault(record.conversation, []).append(record)
    for session in by_session.values():
        for before, after in pairwise(session):
            assert before.e2e_ns is not None
            gap = after.started_ns - (before.started_ns + before.e2e_ns)
            assert gap >= 0.29 * NS
    assert 2 * 2 <= len(records) <= 2 * 3 + 2  # ~0.38 s per round in a 1 s window


async def test_qps_mode_sends_at_the_rate_and_records_the_schedule(server: str) -> None:
    records: list[RequestRecord] = []
    plan = LoadPlan(mode="qps", value=40, arrival="constant", warmup_s=0.25, duration_s=1.0)
    async with client(server) as c:
        window = await run_load(c, workload(), plan, CONTEXT, on_record=records.append)
    measured = [r for r in records if r.phase == "measure"]
    # the rate within the window as it ran (a loaded machine may close it late; the requests inside it count)
    window_s = (window.window_end_ns - window.window_start_ns) / NS
    assert 1.0 <= window_s < 3.0 and abs(len(measured) - 40 * window_s) <= 2, (len(measured), window_s)
    starts = sorted(r.scheduled_ns or 0 for r in records)
    gaps = [(b - a) / NS for a, b in pairwise(starts)]
    assert all(abs(gap - 0.025) < 0.002 for gap in gaps)
    # sent on the clock, not after earlier answers: an answer takes 80 ms and arrivals come every 25 ms, so
    # several are in flight at once, and the lag stays bounded (sending after each answer would add 55 ms per
    # request, seconds by the end); the bound is loose because a loaded 2-core CI machine stalls event loops
    lags = sorted((r.started_ns - (r.scheduled_ns or 0)) / NS for r in records)
    assert all(lag >= 0 for lag in lags)
    assert window.max_in_flight >= 2 and lags[len(lags) // 2] < 0.25, (window.max_in_flight, lags)
    assert window.sessions < len(records)  # users come back for their next round


async def test_poisson_arrivals_are_deterministic_from_the_seed(server: str) -> None:
    async def schedule(seed: int) -> list[int]:
        records: list[RequestRecord] = []
        plan = LoadPlan(mode="qps", value=30, duration_s=0.5, seed=seed)
        async with client(server) as c:
            window = await run_load(c, workload(), plan, CONTEXT, on_record=records.append)
        return sorted((r.scheduled_ns or 0) - window.start_ns for r in records)

    first, again, other = await schedule(1), await schedule(1), await schedule(2)
    assert len(first) == len(again) and all(abs(a - b) < 1_000_000 for a, b in zip(first, again, strict=True))
    assert first != other


async def test_staggered_users_start_mid_session_and_their_first_request_is_warmup(server: str) -> None:
    records: list[RequestRecord] = []
    plan = LoadPlan(mode="concurrency", value=12, duration_s=0.5, stagger_rounds=True)
    async with client(server) as c:
        await run_load(c, workload(rounds=6), plan, CONTEXT, on_record=records.append)
    firsts: dict[int, RequestRecord] = {}
    for record in sorted(records, key=lambda r: r.started_ns):
        firsts.setdefault(record.conversation, record)
    initial = sorted(firsts.values(), key=lambda r: r.started_ns)[:12]
    assert any(r.turn > 1 for r in initial)  # users joined at different rounds
    for record in initial:
        if record.turn > 1:
            assert record.phase == "warmup"


async def test_stop_event_ends_an_open_ended_run_and_ticks_are_called(server: str) -> None:
    records: list[RequestRecord] = []
    ticks: list[int] = []
    stop = asyncio.Event()
    plan = LoadPlan(mode="concurrency", value=4, duration_s=None)
    asyncio.get_running_loop().call_later(0.6, stop.set)
    started = time.monotonic()
    async with client(server) as c:
        window = await run_load(
            c, workload(), plan, CONTEXT, on_record=records.append, stop=stop, on_tick=ticks.append, tick_s=0.1
        )
    assert 0.55 < time.monotonic() - started < 1.0
    assert 4 <= len(ticks) <= 7 and 0.5 < window.window_s < 0.7 and records
    with pytest.raises(ValueError, match="stop event"):
        await run_load(c, workload(), plan, CONTEXT, on_record=records.append)


async def test_requests_running_past_the_drain_timeout_are_cancelled_and_recorded(server: str) -> None:
    records: list[RequestRecord] = []
    plan = LoadPlan(mode="concurrency", value=3, duration_s=0.2, drain_timeout_s=0.1, stagger_rounds=False)
    async with client(server) as c:
        window = await run_load(c, workload(answer=100), plan, CONTEXT, on_record=records.append)
    assert window.cancelled == 3  # each answer takes ~1 s
    cancelled = [r for r in records if not r.ok]
    assert len(cancelled) == 3 and all(r.error_kind == "timeout" and r.phase == "measure" for r in cancelled)


class BrokenTokenizer(SimTokenizer):
    async def encode(self, text: str) -> list[int]:
        if text.startswith("Question"):
            raise RuntimeError("tokenizer endpoint down")
        return await super().encode(text)


async def test_a_workload_failure_stops_the_run_and_propagates(server: str) -> None:
    broken = workload()
    await broken.prepare()
    broken.tokenizer = BrokenTokenizer()
    plan = LoadPlan(mode="concurrency", value=3, duration_s=5.0)
    started = time.monotonic()
    async with client(server) as c:
        with pytest.raises(RuntimeError, match="tokenizer endpoint down"):
            await run_load(c, broken, plan, CONTEXT, on_record=lambda r: None)
    assert time.monotonic() - started < 1.0


def test_bad_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="whole number"):
        LoadPlan(mode="concurrency", value=2.5)
    with pytest.raises(ValueError, match="positive"):
        LoadPlan(mode="qps", value=0)


async def test_process_pool_sends_from_worker_processes_with_the_same_timing(server: str) -> None:
    records: list[RequestRecord] = []
    plan = LoadPlan(mode="concurrency", value=6, warmup_s=0.2, duration_s=0.8, stagger_rounds=False)
    endpoint = Endpoint(base_url=server, model="fixed-latency")
    async with ProcessClientPool(endpoint, workers=2, timeout_s=30, max_connections=16) as pool:
        assert pool.workers == 2
        window = await run_load(pool, workload(), plan, CONTEXT, on_record=records.append)
        answer = await pool.completion("hello there", 3)
        assert answer.ok and answer.text == " tok tok tok" and answer.completion_tokens == 3
    assert window.max_in_flight == 6 and window.errors == 0
    measured = [r for r in records if r.phase == "measure"]
    assert len(measured) >= 40
    for record in records:
        assert record.ttft_ns is not None and TTFT_S * NS <= record.ttft_ns < (TTFT_S + 0.25) * NS
        assert window.start_ns <= record.started_ns <= window.end_ns  # one clock across processes


async def test_pool_fails_requests_of_a_dead_worker(server: str) -> None:
    endpoint = Endpoint(base_url=server, model="fixed-latency")
    async with ProcessClientPool(endpoint, workers=1, timeout_s=30, max_connections=4) as pool:
        pending: Sequence[asyncio.Task[object]] = [asyncio.ensure_future(pool.completion("x", 200)) for _ in range(2)]
        await asyncio.sleep(0.2)
        for worker in pool._workers:
            worker.process.kill()
        results = await asyncio.gather(*pending, return_exceptions=True)
    assert all(type(r).__name__ == "ClientPoolError" for r in results)
