"""Closed-loop users back off against an engine that refuses connections, so the error count stays a
measurement of the service, not of how fast the client's loop can fail.

A real TCP port with nothing listening (the kernel answers every connect with RST), as after an engine died.
"""

from __future__ import annotations

from harness.client.endpoint import Endpoint
from harness.client.openai import OpenAIClient, RequestOutcome
from harness.engines.process import free_port
from harness.runs.load import REFUSED_BACKOFF_CAP_S, LoadPlan, RecordContext, RefusedBackoff, run_load
from harness.store.records import RequestRecord
from tests.scenarios import multi_user_qa
from tests.support import multi_user_workload
from workloads.multi_user import MultiUserWorkload


def workload() -> MultiUserWorkload:
    fields = {"system_prompt_tokens": 10, "question_tokens": 5, "answer_tokens": 2}
    return multi_user_workload(multi_user_qa(8, 2, 40, **fields), seed=1)


async def test_two_users_against_a_refusing_port_fail_a_bounded_number_of_times() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    records: list[RequestRecord] = []
    plan = LoadPlan(mode="concurrency", value=2, warmup_s=0.0, duration_s=2.0, ramp_up_s=0.0, stagger_rounds=False)
    client = OpenAIClient(Endpoint(base_url=dead, model="m"), timeout_s=5, max_connections=8)
    async with client as c:
        await run_load(c, workload(), plan, RecordContext(arm="A", attempt=0), on_record=records.append)
    assert records and all(not r.ok and r.error_kind == "connection" for r in records)
    # waits of 0.1, 0.2, 0.4, 0.8 s (x 0.5..1.5) fit about five attempts per user into two seconds; without
    # the back-off two users fail hundreds of times a second
    assert len(records) <= 2 * 10, len(records)


def test_the_wait_doubles_per_refusal_up_to_the_cap_and_an_answer_resets_it() -> None:
    backoff = RefusedBackoff(seed=7)
    refused = RequestOutcome(started_ns=0, error_kind="connection", error="refused")
    waits = [backoff.after(refused) for _ in range(10)]
    assert 0.05 <= waits[0] < 0.15 and all(0 < wait < 1.5 * REFUSED_BACKOFF_CAP_S for wait in waits)
    assert max(waits) >= 0.5 * REFUSED_BACKOFF_CAP_S
    assert backoff.after(RequestOutcome(started_ns=0, error_kind="server_error", error="HTTP 500")) == 0.0
    assert 0.05 <= backoff.after(refused) < 0.15  # the streak starts again
