"""External routing: which replica served a request, learnt from per-replica /metrics deltas.

A tiny real HTTP server plays a router in front of two replicas: ``/v1/completions`` streams an
answer and adds the prompt's length to the prompt-token counter of the replica the test told it
to use (``self.plan``), after an optional delay; ``/r<i>/metrics`` serves replica ``i``'s page. The
FleetClient must attribute each sequential request to the planned replica, leave overlapping
requests unattributed, derive ``moved`` from the attributed replicas, and send the conversation id
in the session header.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from harness.client.endpoint import Endpoint
from harness.client.fleet import FleetClient
from harness.client.openai import OpenAIClient
from harness.client.router import Attribution, Router, routing_key
from tests.fakes.serving import app_serving


class PlannedRouter:
    def __init__(self) -> None:
        self.plan: list[int] = []
        self.delay_s = 0.0
        self.prompt_tokens = [0, 0]
        self.session_ids: list[str | None] = []

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        self.session_ids.append(request.headers.get("X-Session-ID"))
        replica = self.plan.pop(0)
        await asyncio.sleep(self.delay_s)
        self.prompt_tokens[replica] += len(str(body["prompt"]).split())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {
            "id": "c",
            "object": "text_completion",
            "choices": [{"index": 0, "text": " ok", "finish_reason": None}],
        }
        await response.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    async def metrics(self, request: web.Request) -> web.Response:
        replica = int(request.match_info["index"])
        page = (
            "# TYPE vllm:prompt_tokens counter\n"
            f'vllm:prompt_tokens_total{{model_name="m"}} {float(self.prompt_tokens[replica])}\n'
        )
        return web.Response(text=page, content_type="text/plain")


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[PlannedRouter, str]]:
    planned = PlannedRouter()
    app = web.Application()
    app.router.add_post("/v1/completions", planned.completions)
    app.router.add_get("/r{index}/metrics", planned.metrics)
    async with app_serving(app) as url:
        yield planned, url


def _client(base: str, attribution: Attribution) -> tuple[OpenAIClient, FleetClient]:
    client = OpenAIClient(Endpoint(base, "m"), timeout_s=10.0, session_header="X-Session-ID")
    metrics = [f"{base}/r0/metrics", f"{base}/r1/metrics"]
    return client, FleetClient([client], Router("external", 1), metrics_urls=metrics, attribution=attribution)


async def test_sequential_requests_are_attributed_and_moves_follow(fleet: tuple[PlannedRouter, str]) -> None:
    planned, base = fleet
    client, fleet_client = _client(base, "metrics")
    planned.plan = [1, 0, 1, 1]
    async with client:
        served = []
        for key in ("a", "b", "a", "b"):
            with routing_key(key):
                served.append(await fleet_client.completion(f"prompt of {key}", 4))
    assert [o.replica for o in served] == [1, 0, 1, 1]
    assert [o.moved for o in served] == [None, None, False, True]
    assert planned.session_ids == ["a", "b", "a", "b"]


async def test_overlapping_requests_stay_unattributed(fleet: tuple[PlannedRouter, str]) -> None:
    planned, base = fleet
    client, fleet_client = _client(base, "metrics")
    planned.plan, planned.delay_s = [0, 1], 0.2
    async with client:
        with routing_key("x"):
            both = await asyncio.gather(fleet_client.completion("one two", 4), fleet_client.completion("three", 4))
        assert [o.replica for o in both] == [None, None]
        planned.plan, planned.delay_s = [1], 0.0
        with routing_key("x"):  # the next solo request is attributed again (a fresh baseline)
            after = await fleet_client.completion("four", 4)
    assert after.replica == 1 and after.moved is None  # no attributed earlier request of "x" to compare with


async def test_attribution_none_never_guesses(fleet: tuple[PlannedRouter, str]) -> None:
    planned, base = fleet
    client, fleet_client = _client(base, "none")
    planned.plan = [1]
    async with client:
        with routing_key("a"):
            outcome = await fleet_client.completion("p", 4)
    assert outcome.ok and outcome.replica is None and outcome.moved is None
