"""An attached fleet behind a router kvbench does not control (``routing.policy: external``).

The test runs two ``kvbench sim serve`` replicas and a small round-robin HTTP router of its own
(streaming proxy) that names the serving replica in an ``x-served-by`` header. kvbench attaches
(``kind: openai``, ``base_url`` = router, ``endpoints`` = the replicas' metrics URLs and names) and
must attribute every request to the replica the router chose, mark ``moved`` from that, and store
per-replica counters scraped from each replica's own ``/metrics``.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.integration.test_prometheus_fleet import _wait_http
from tests.scenarios import multi_round_qa
from tests.support import kvbench_argv, probe_in_process

SERVE = "sim serve --model llama-3.1-8b --hardware h100-sxm --offload cpu --host 127.0.0.1 --port".split()
"""``kvbench sim serve`` of one replica, less its port."""

pytestmark = pytest.mark.integration
NAMES = ("replica-a", "replica-b")


class Router:
    """Round robin over backends for /v1/*; /reset_prefix_cache to all; anything else to the first."""

    def __init__(self, backends: list[str]) -> None:
        self.backends = backends
        self.next = 0
        self.chosen: list[int] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        path = request.rel_url.path_qs
        if request.path == "/reset_prefix_cache":
            targets = list(range(len(self.backends)))
        elif request.path.startswith("/v1/completions") or request.path.startswith("/v1/chat"):
            targets = [self.next % len(self.backends)]
            self.next += 1
            self.chosen.append(targets[0])
        else:
            targets = [0]
        async with aiohttp.ClientSession() as session:
            for index in targets:
                async with session.request(
                    request.method,
                    f"http://{self.backends[index]}{path}",
                    data=body,
                    headers={"Content-Type": request.headers.get("Content-Type", "application/json")},
                ) as upstream:
                    if index != targets[-1]:
                        await upstream.read()
                        continue
                    response = web.StreamResponse(status=upstream.status)
                    response.content_type = upstream.content_type
                    response.headers["x-served-by"] = NAMES[index]
                    await response.prepare(request)
                    async for chunk in upstream.content.iter_any():
                        await response.write(chunk)
                    await response.write_eof()
                    return response
        raise AssertionError("unreachable")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[str, list[str], Router]]:
    from harness.engines.process import free_port

    processes, backends = [], []
    for index in range(2):
        port = free_port()
        processes.append(
            subprocess.Popen(
                kvbench_argv(*SERVE, str(port)),
                stdout=(tmp_path / f"sim-{index}.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
        )
        backends.append(f"127.0.0.1:{port}")
    router = Router(backends)
    loop = asyncio.new_event_loop()
    port = free_port()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", router.handle)
    runner = web.AppRunner(app)

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        for backend in backends:
            _wait_http(f"http://{backend}/health")
        _wait_http(f"http://127.0.0.1:{port}/health")
        yield f"http://127.0.0.1:{port}", backends, router
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        for process in processes:
            process.terminate()
            process.wait(timeout=10)


def test_external_router_attribution(tmp_path: Path, fleet: tuple[str, list[str], Router]) -> None:
    router_url, backends, router = fleet
    run_dir = probe_in_process(
        {
            "name": "fleet-external",
            "seed": 3,
            "engine": {
                "kind": "openai",
                "model": "llama-3.1-8b",
                "base_url": router_url,
                "endpoints": [
                    {"metrics_url": f"http://{b}/metrics", "name": n} for b, n in zip(backends, NAMES, strict=True)
                ],
            },
            "routing": {"policy": "external", "replica_header": "x-served-by"},
            "arms": [{"name": "behind-router", "offload": "cpu"}],
            "workload": multi_round_qa(
                [2000],
                3,
                turns=2,
                question_tokens=16,
                answer_tokens=8,
                warmup_requests=0,
                between_turns={"mode": "reset_prefix_cache"},
            ),
        },
        tmp_path,
    )
    records = [r for r in run_dir.records() if r.phase == "measure"]
    assert [r.replica for r in records] == router.chosen[-len(records) :]  # what the router chose, in order
    first = {r.conversation: r.replica for r in records if r.turn == 1}
    for record in (r for r in records if r.turn == 2):
        assert record.moved is (record.replica != first[record.conversation])
    counters = run_dir.replica_counters()
    assert counters and all(len(event.counters) == 2 for event in counters)
    last = counters[-1].counters
    served = [sum(1 for r in records if r.replica == i) for i in range(2)]
    for index in range(2):  # each replica's own /metrics counted the prompts the router sent it
        entry = last[index]
        assert entry is not None
        assert (entry.get("prompt_tokens", 0) > 0) == (served[index] > 0)
