"""The client measures its own lag: the loop monitor against a loop that really blocks and really burns CPU, and
the load runner's per-window :class:`~harness.store.events.ClientLag` against a real fixed-latency server, with a
client that keeps up and one whose concurrency budget (``max_active_users``) cannot carry the arrival rate."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Literal

import pytest

from harness.client.endpoint import Endpoint
from harness.client.fidelity import LoopMonitor, percentile_ns
from harness.client.openai import OpenAIClient
from harness.client.pool import ProcessClientPool
from harness.runs.load import LoadPlan, RecordContext, run_load
from harness.sim.fixed import FixedLatency, FixedServer
from harness.sim.tokenizer import SimTokenizer
from harness.store.records import RequestRecord
from tests.fakes.serving import app_serving
from tests.scenarios import multi_user_qa
from tests.support import multi_user_workload
from workloads.multi_user import MultiUserWorkload
from workloads.tokenizer import Tokenizer

TTFT_S = 0.05
ITL_S = 0.01
CONTEXT = RecordContext(arm="A", attempt=0, point=0)


@pytest.fixture
async def server() -> AsyncIterator[str]:
    async with app_serving(FixedServer(FixedLatency(TTFT_S, ITL_S)).app()) as url:
        yield url


class RoundTripTokenizer(SimTokenizer):
    """The simulator's tokenizer behind a round trip: like an engine's ``/tokenize`` on a busy server."""

    def __init__(self, round_trip_s: float) -> None:
        super().__init__()
        self.round_trip_s = round_trip_s

    async def encode(self, text: str) -> list[int]:
        await asyncio.sleep(self.round_trip_s)
        return await super().encode(text)


def workload(users: int = 20, think: float = 0.0, tokenizer: Tokenizer | None = None) -> MultiUserWorkload:
    fields = {"system_prompt_tokens": 20, "question_tokens": 10, "answer_tokens": 4, "think_time_s": think}
    return multi_user_workload(multi_user_qa(users, 3, 80, **fields), seed=3, tokenizer=tokenizer)


def test_percentile_is_an_observed_value_by_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile_ns(values, 50) == 50 and percentile_ns(values, 99) == 99 and percentile_ns(values, 100) == 100
    assert percentile_ns([7], 99) == 7
    with pytest.raises(ValueError):
        percentile_ns([], 50)


async def test_the_monitor_sees_a_blocked_loop_and_a_busy_process() -> None:
    async with LoopMonitor("runner") as monitor:
        start = time.monotonic_ns()
        await asyncio.sleep(0.3)
        idle_end = time.monotonic_ns()
        blocked_until = time.monotonic() + 0.12
        while time.monotonic() < blocked_until:
            pass  # holds the loop without yielding: the next tick wakes about 120 ms late
        burn_until = time.process_time() + 0.3
        while time.process_time() < burn_until:
            await asyncio.sleep(0)  # the loop runs, but the process does nothing but spin
        await asyncio.sleep(0.05)
        end = time.monotonic_ns()
    idle, busy = monitor.over(start, idle_end), monitor.over(idle_end, end)
    assert idle.ticks >= 10 and busy.ticks >= 1 and idle.role == "runner"
    assert busy.delay_max_ns is not None and busy.delay_max_ns >= 100_000_000
    assert idle.delay_max_ns is not None and idle.delay_max_ns < busy.delay_max_ns
    # the spin used 0.3 s of CPU (the process's own clock, whatever else the machine runs); the idle loop little
    assert busy.cpu_ns >= 250_000_000 and idle.cpu_ns < busy.cpu_ns / 2
    assert busy.cpu_fraction is not None and 0 < busy.cpu_fraction <= 1.05


async def test_a_client_that_keeps_up_reports_small_lag(server: str) -> None:
    records: list[RequestRecord] = []
    plan = LoadPlan(mode="concurrency", value=6, warmup_s=0.3, duration_s=1.0, stagger_rounds=False)
    endpoint = Endpoint(base_url=server, model="fixed-latency")
    async with OpenAIClient(endpoint, timeout_s=30, max_connections=16) as client:
        window = await run_load(client, workload(), plan, CONTEXT, on_record=records.append)
    lag = window.client
    assert lag is not None
    measured = len([r for r in records if r.phase == "measure"])
    assert measured <= lag.send_lag_n <= measured + 6 and measured > 5  # sent in the window (a user may straddle it)
    assert lag.send_lag_p50_ms is not None and lag.send_lag_p50_ms < TTFT_S * 1000
    assert lag.slot_waits == 0 and lag.slot_wait_p99_ms is None
    (runner,) = lag.processes
    assert runner.role == "runner" and runner.ticks >= 10 and runner.cpu_fraction is not None


@pytest.mark.parametrize("mode, value", [("concurrency", 4), ("qps", 6)])
async def test_a_slow_tokenizer_builds_the_next_user_ahead_not_into_its_send_lag(
    server: str, mode: Literal["concurrency", "qps"], value: float
) -> None:
    # each session tokenizes its text in several round trips (~0.3 s in all) and lasts ~0.3 s (3 rounds, no think
    # time): built on demand, every new user's first send would be ~0.3 s late; open loop learns how many to build
    # ahead from the arrivals that found none ready, in the warm-up
    slow = RoundTripTokenizer(round_trip_s=0.03)
    records: list[RequestRecord] = []
    plan = LoadPlan(mode=mode, value=value, warmup_s=1.5, duration_s=2.0, stagger_rounds=False)
    endpoint = Endpoint(base_url=server, model="fixed-latency")
    async with OpenAIClient(endpoint, timeout_s=30, max_connections=16) as client:
        window = await run_load(client, workload(tokenizer=slow), plan, CONTEXT, on_record=records.append)
    lag = window.client
    assert lag is not None and lag.send_lag_p99_ms is not None
    first_rounds = [r for r in records if r.phase == "measure" and r.turn == 1]
    assert len(first_rounds) >= 2  # new users did start in the window
    assert lag.send_lag_p99_ms < 100, lag


async def test_pool_workers_report_their_own_loops(server: str) -> None:
    plan = LoadPlan(mode="concurrency", value=4, warmup_s=0.2, duration_s=0.8, stagger_rounds=False)
    endpoint = Endpoint(base_url=server, model="fixed-latency")
    async with ProcessClientPool(endpoint, workers=2, timeout_s=30, max_connections=8) as pool:
        window = await run_load(pool, workload(), plan, CONTEXT, on_record=lambda _: None)
        pids = {worker.process.pid for worker in pool._workers}
    assert window.client is not None
    roles = sorted((p.role, p.pid in pids) for p in window.client.processes)
    assert roles == [("runner", False), ("worker", True), ("worker", True)]
    assert all(p.ticks >= 5 for p in window.client.processes)


async def test_a_session_budget_too_small_for_the_rate_shows_as_send_lag_and_slot_waits(server: str) -> None:
    # 40 arrivals/s, one session at a time, each round ~90 ms: the budget carries ~11/s, the rest wait
    plan = LoadPlan(mode="qps", value=40, warmup_s=0.2, duration_s=1.2, max_active_users=1, stagger_rounds=False)
    endpoint = Endpoint(base_url=server, model="fixed-latency")
    async with OpenAIClient(endpoint, timeout_s=30, max_connections=8) as client:
        window = await run_load(client, workload(), plan, CONTEXT, on_record=lambda _: None)
    lag = window.client
    assert lag is not None and lag.slot_waits > 5
    assert lag.send_lag_p99_ms is not None and lag.send_lag_p99_ms > 300
    assert lag.slot_wait_max_ms is not None and lag.slot_wait_max_ms > 300


async def test_the_fixed_server_without_usage_counts_nothing_and_still_keeps_time() -> None:
    latency = FixedLatency(TTFT_S, ITL_S, count_prompt_tokens=False)
    async with app_serving(FixedServer(latency).app()) as url:
        endpoint = Endpoint(base_url=url, model="fixed-latency")
        async with OpenAIClient(endpoint, timeout_s=30, max_connections=4) as client:
            outcome = await client.chat([{"role": "user", "content": "word " * 2000}], 4)
    assert outcome.ok and outcome.output_chunks == 4
    assert outcome.prompt_tokens is None and outcome.completion_tokens is None  # no usage block
    assert outcome.ttft_ns is not None and outcome.ttft_ns >= TTFT_S * 1e9


async def test_pool_workers_on_uvloop_take_prompts_larger_than_a_socket_buffer(server: str) -> None:
    # uvloop makes a watched socket non-blocking; a 2 MB message must still arrive whole
    endpoint = Endpoint(base_url=server, model="fixed-latency")
    async with ProcessClientPool(endpoint, workers=1, timeout_s=30, max_connections=4, use_uvloop=True) as pool:
        outcomes = await asyncio.gather(
            *(pool.chat([{"role": "user", "content": "word " * 400_000}], 2) for _ in range(3))
        )
    assert all(o.ok and o.output_chunks == 2 for o in outcomes)
