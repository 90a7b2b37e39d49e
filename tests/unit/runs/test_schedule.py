"""run_schedule: open loop sends at the due times whatever is in flight; closed loop keeps N in flight."""

from __future__ import annotations

import asyncio
import time

from harness.client.openai import RequestOutcome
from harness.runs.load import SendOne, run_schedule

NS = 1_000_000_000


def answer_after(seconds: float, sent: list[int]) -> SendOne:
    async def send_one(index: int) -> RequestOutcome:
        started = time.monotonic_ns()
        sent.append(started)
        await asyncio.sleep(seconds)
        return RequestOutcome(started_ns=started, ttft_ns=1, e2e_ns=time.monotonic_ns() - started)

    return send_one


async def test_open_loop_sends_on_time_without_waiting_for_answers() -> None:
    due = [0.0, 0.05, 0.10, 0.10, 0.30]
    sent: list[int] = []
    outcomes: dict[int, int | None] = {}
    window = await run_schedule(
        len(due),
        answer_after(0.4, sent),
        lambda i, o, d: outcomes.__setitem__(i, d),
        due_s=due,
        concurrency=None,
        drain_timeout_s=5,
    )
    assert window.sent == 5 and window.errors == 0 and window.max_in_flight == 5  # answers take 0.4 s
    for index, offset in enumerate(due):
        scheduled = outcomes[index]
        assert scheduled == window.start_ns + int(offset * NS)
    for started, offset in zip(sorted(sent), due, strict=True):
        # well under the 0.4 s answer: on the clock, not after an answer (a loaded CI machine stalls event loops)
        assert 0 <= started - (window.start_ns + offset * NS) < 0.2 * NS


async def test_an_open_loop_cap_makes_requests_wait_and_counts_them() -> None:
    sent: list[int] = []
    window = await run_schedule(
        4, answer_after(0.2, sent), lambda i, o, d: None, due_s=[0.0] * 4, concurrency=2, drain_timeout_s=5
    )
    assert window.max_in_flight == 2 and window.waited_for_slot == 2
    assert sorted(sent)[2] - sorted(sent)[0] >= 0.19 * NS


async def test_closed_loop_keeps_concurrency_in_flight_in_order() -> None:
    sent: list[int] = []
    order: list[int] = []
    window = await run_schedule(
        6, answer_after(0.05, sent), lambda i, o, d: order.append(i), due_s=None, concurrency=3, drain_timeout_s=5
    )
    assert window.sent == 6 and window.max_in_flight == 3
    assert sorted(order) == list(range(6))
    elapsed = (window.end_ns - window.start_ns) / NS
    assert 0.09 < elapsed < 0.5  # two waves of 0.05 s, not six


async def test_requests_still_running_after_the_drain_are_cancelled_as_errors() -> None:
    outcomes: list[RequestOutcome] = []
    window = await run_schedule(
        2,
        answer_after(5.0, []),
        lambda i, o, d: outcomes.append(o),
        due_s=[0.0, 0.0],
        concurrency=None,
        drain_timeout_s=0.1,
    )
    assert window.cancelled == 2 and window.errors == 2
    assert [o.error_kind for o in outcomes] == ["timeout", "timeout"]
