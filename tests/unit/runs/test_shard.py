"""Shards (``--shard I/N``): the partition is deterministic, disjoint and whole, and a load run keeps to its part.

The load tests drive :func:`run_load` against a real in-process HTTP server with a known latency (the simulator's
fixed mode), once per shard and once unsharded, and compare what each sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator

import pytest

from common.errors import KvbenchError
from harness.client.endpoint import Endpoint
from harness.client.openai import OpenAIClient
from harness.runs.load import LoadPlan, RecordContext, run_load
from harness.runs.shard import Shard, parse_start_at, shard_salt, wait_until
from harness.runs.trace import due_times, shard_of_trace
from harness.sim.fixed import FixedLatency, FixedServer
from harness.store.records import RequestRecord
from tests.fakes.serving import app_serving
from tests.scenarios import multi_user_qa, uniform
from tests.support import multi_user_workload
from workloads.multi_user import MultiUserWorkload
from workloads.trace_model import Trace, TraceRequest

NS = 1_000_000_000


@pytest.fixture
async def server() -> AsyncIterator[str]:
    async with app_serving(FixedServer(FixedLatency(0.02, 0.005)).app()) as url:
        yield url


def workload() -> MultiUserWorkload:
    fields = {"system_prompt_tokens": 20, "question_tokens": 10, "answer_tokens": 4}
    return multi_user_workload(multi_user_qa(40, 2, uniform(50, 150), **fields), seed=5)


@pytest.mark.parametrize("total", [0, 1, 5, 7, 64])
@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_shards_split_every_item_once_and_as_evenly_as_possible(total: int, count: int) -> None:
    shards = [Shard(index, count) for index in range(count)]
    owned = [{item for item in range(total) if shard.owns(item)} for shard in shards]
    assert sorted(item for part in owned for item in part) == list(range(total))  # disjoint, and the whole
    assert [shard.share(total) for shard in shards] == [len(part) for part in owned]
    assert max(map(len, owned)) - min(map(len, owned)) <= 1
    for shard, part in zip(shards, owned, strict=True):
        assert {shard.global_number(local) for local in range(shard.share(total))} == part


def test_the_flags_parse_or_name_what_is_allowed() -> None:
    assert Shard.parse("1/3") == Shard(1, 3) and Shard.parse(" 0 / 1 ") == Shard(0, 1)
    for bad in ("3/2", "2/2", "1", "a/b", "-1/2", "0/0"):
        with pytest.raises(KvbenchError, match="--shard"):
            Shard.parse(bad)
    assert parse_start_at("1800000000") == 1_800_000_000.0
    assert parse_start_at("2027-01-15T08:00:00Z") == parse_start_at("2027-01-15T09:00:00+01:00") == 1_800_000_000.0
    for bad in ("noon", "2027-01-15T08:00:00", "-5", "nan"):
        with pytest.raises(KvbenchError, match="--start-at"):
            parse_start_at(bad)


def test_the_shards_of_one_run_derive_one_salt_and_a_new_start_a_new_one() -> None:
    assert shard_salt("abc", 2, 1.5) == shard_salt("abc", 2, 1.5)
    assert len({shard_salt("abc", 2, 1.5), shard_salt("abc", 2, 2.5), shard_salt("abd", 2, 1.5)}) == 3


async def test_waiting_for_the_start_counts_down_and_reports_lateness() -> None:
    shown: list[str] = []
    late = await wait_until(time.time() + 1.2, "the run starts", shown.append)
    assert late == 0.0 and shown and shown[0].startswith("the run starts at ") and shown[0].endswith("in 2 s")
    assert await wait_until(time.time() - 3, "x", shown.append) >= 3.0


async def _sent(server: str, plan: LoadPlan) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    async with OpenAIClient(Endpoint(base_url=server, model="fixed"), timeout_s=30, max_connections=64) as client:
        await run_load(client, workload(), plan, RecordContext(arm="A", attempt=0, point=0), on_record=records.append)
    return records


async def test_concurrency_shards_run_their_slots_and_disjoint_sessions(server: str) -> None:
    plans = [
        LoadPlan(mode="concurrency", value=5, duration_s=0.6, stagger_rounds=False, shard=Shard(index, 2))
        for index in range(2)
    ]
    parts = await asyncio.gather(*(_sent(server, plan) for plan in plans))
    in_flight = [{r.conversation % 2 for r in part} for part in parts]
    assert in_flight == [{0}, {1}]  # shard I opens sessions k*2 + I
    assert all(r.load == 5.0 for part in parts for r in part)  # the records keep the point's whole load
    assert [plan.share() for plan in plans] == [3.0, 2.0]


async def test_open_loop_shards_send_the_unsharded_arrivals_between_them(server: str) -> None:
    def plan(shard: Shard) -> LoadPlan:
        return LoadPlan(mode="qps", value=40, duration_s=0.8, seed=11, shard=shard)

    async def offsets(shard: Shard) -> list[float]:
        records = await _sent(server, plan(shard))
        start = min(r.scheduled_ns or 0 for r in records)
        return sorted(((r.scheduled_ns or 0) - start) / NS for r in records)

    whole = await offsets(Shard(0, 1))
    halves = [await offsets(Shard(index, 2)) for index in range(2)]
    # each shard's schedule is every other arrival of the whole one: shard 1's first arrival is the whole run's
    # second, so its offsets count from there
    first_gap = whole[1] - whole[0]
    united = sorted([*halves[0], *(t + first_gap for t in halves[1])])
    assert len(united) in (len(whole), len(whole) - 1, len(whole) + 1)
    pairs = list(zip(united, whole, strict=False))
    assert pairs and all(abs(a - b) < 0.005 for a, b in pairs), pairs[:5]
    assert plan(Shard(1, 2)).share() == 20.0


def test_a_trace_is_dealt_by_conversation_and_keeps_its_times_and_parents() -> None:
    # three agent sessions (a, b, c) of a root and a child each, interleaved, and one request without a session
    sessions = ["a", "b", "a", "c", "b", None, "c"]
    requests = tuple(
        TraceRequest(line=i + 1, timestamp_ms=100.0 * i + 50, input_length=10, output_length=2, session=session)
        for i, session in enumerate(sessions)
    )
    requests = tuple(
        dataclasses.replace(r, parent={2: 0, 4: 1, 6: 3}.get(i), call_id=str(i)) for i, r in enumerate(requests)
    )
    trace = Trace("t.jsonl", "mooncake", 16, requests)
    numbers: dict[str, int] = {}

    def conversation(request: TraceRequest, position: int) -> int:
        return position if request.session is None else numbers.setdefault(request.session, len(numbers))

    parts = [shard_of_trace(trace, Shard(index, 2), conversation) for index in range(2)]
    positions = [part[1] for part in parts]
    assert sorted(p for part in positions for p in part) == list(range(len(requests)))  # disjoint, and the whole
    assert positions == [[0, 2, 3, 6], [1, 4, 5]]  # a (0) and c (2) to shard 0; b (1) and the sessionless one (5)
    for (part, kept), index in zip(parts, range(2), strict=True):
        for request, position in zip(part.requests, kept, strict=True):
            assert request.call_id == str(position)
            if request.parent is not None:  # a parent is re-indexed within the shard, never lost
                assert kept[request.parent] == requests[position].parent
        # due times count from the whole trace's first request, so the shards keep the trace's schedule
        due = due_times(part, 1.0, requests[0].timestamp_ms)
        assert due == [(requests[position].timestamp_ms - 50.0) * 1.0 / 1000.0 for position in kept], index
