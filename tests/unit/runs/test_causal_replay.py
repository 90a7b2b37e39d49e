"""run_causal: a child call is sent only after its parent completed, at max(parent's send + scaled gap, parent's
completion); siblings run concurrently; roots are open loop at the trace's clock; a stalled call is cancelled
and its children still go."""

from __future__ import annotations

import asyncio
import time

from harness.client.openai import RequestOutcome
from harness.runs.load import SendOne
from harness.runs.trace import run_causal
from workloads.trace import Trace, TraceRequest

NS = 1_000_000_000
MS = 1_000_000


def call(t_ms: float, parent: int | None, name: str) -> TraceRequest:
    return TraceRequest(
        line=1, timestamp_ms=t_ms, input_length=16, output_length=1, hash_ids=(1,), call_id=name, parent=parent
    )


def sender(durations: dict[int, float], sent: dict[int, int], ended: dict[int, int]) -> SendOne:
    async def send_one(index: int) -> RequestOutcome:
        started = time.monotonic_ns()
        sent[index] = started
        await asyncio.sleep(durations.get(index, 0.01))
        ended[index] = time.monotonic_ns()
        return RequestOutcome(started_ns=started, ttft_ns=1, e2e_ns=ended[index] - started)

    return send_one


async def test_children_wait_for_their_parent_and_siblings_overlap() -> None:
    # 0 root → 1 (slow answer: due at completion, not at t) → {2, 3} siblings; 4 a second root at 100 ms
    trace = Trace(
        "t",
        "bailian",
        16,
        (call(0, None, "r"), call(10, 0, "a"), call(20, 1, "b"), call(20, 1, "c"), call(100, None, "r2")),
    )
    durations = {0: 0.20, 1: 0.05, 2: 0.15, 3: 0.15, 4: 0.01}
    sent: dict[int, int] = {}
    ended: dict[int, int] = {}
    due: dict[int, int | None] = {}
    window = await run_causal(
        trace,
        sender(durations, sent, ended),
        lambda i, o, d: due.__setitem__(i, d),
        time_scale=1.0,
        open_loop=True,
        concurrency=None,
        drain_timeout_s=5,
    )
    assert window.sent == 5 and window.errors == 0
    start = window.start_ns
    assert due[0] == start and due[4] == start + 100 * MS  # roots at the trace's clock
    assert sent[4] < ended[0]  # the second root did not wait for the first session
    # the parent took 200 ms, longer than the 10 ms gap: the child is due at the parent's completion
    assert sent[1] >= ended[0] and due[1] is not None and due[1] >= ended[0] - MS
    for child in (2, 3):
        assert sent[child] >= ended[1]
    assert max(sent[2], sent[3]) < min(ended[2], ended[3])  # the two branches were in flight together
    assert window.max_in_flight >= 2


async def test_a_fast_parent_leaves_the_gap_scaled() -> None:
    trace = Trace("t", "bailian", 16, (call(0, None, "r"), call(200, 0, "a")))
    sent: dict[int, int] = {}
    ended: dict[int, int] = {}
    due: dict[int, int | None] = {}
    await run_causal(
        trace,
        sender({0: 0.01}, sent, ended),
        lambda i, o, d: due.__setitem__(i, d),
        time_scale=0.5,
        open_loop=True,
        concurrency=None,
        drain_timeout_s=5,
    )
    assert due[1] is not None and abs(due[1] - (sent[0] + 100 * MS)) < 5 * MS  # the 200 ms gap at half scale
    assert sent[1] >= sent[0] + 99 * MS


async def test_a_stalled_call_is_cancelled_and_its_child_still_sent() -> None:
    trace = Trace("t", "bailian", 16, (call(0, None, "r"), call(1, 0, "a")))
    sent: dict[int, int] = {}
    ended: dict[int, int] = {}
    outcomes: dict[int, RequestOutcome] = {}
    window = await run_causal(
        trace,
        sender({0: 60.0}, sent, ended),
        lambda i, o, d: outcomes.__setitem__(i, o),
        time_scale=1.0,
        open_loop=False,
        concurrency=1,
        drain_timeout_s=0.3,
    )
    assert window.cancelled == 1 and window.sent == 2 and window.errors == 1
    assert outcomes[0].error_kind == "timeout" and outcomes[1].ok
