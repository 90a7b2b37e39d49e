"""A production-like endpoint: an aiohttp proxy on 127.0.0.1 in front of a server that has a prefix-cache reset.

``no_reset_proxy(upstream)`` serves on a free port in a thread and forwards every request to ``upstream``
(``http://host:port``), relaying the response as it arrives (a streamed answer stays streamed), except
``POST /reset_prefix_cache``, which it answers with 404 as vLLM does without ``VLLM_SERVER_DEV_MODE``. With
``hide_kv_size`` it also drops the ``vllm:cache_config_info`` lines from ``/metrics``, so the endpoint does not
say how large its GPU KV cache is. ``paths`` lists ``METHOD /path`` of every request, in order.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from harness.engines.process import free_port

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "server", "date"}
KV_SIZE_GAUGE = "vllm:cache_config_info"


@dataclass
class NoResetProxy:
    base_url: str = ""
    paths: list[str] = field(default_factory=list)


@contextmanager
def no_reset_proxy(upstream: str, *, hide_kv_size: bool = False) -> Iterator[NoResetProxy]:
    proxy = NoResetProxy()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = asyncio.Event()
    session_box: list[aiohttp.ClientSession] = []

    async def relay(request: web.Request) -> web.StreamResponse:
        proxy.paths.append(f"{request.method} {request.path}")
        if request.method == "POST" and request.path == "/reset_prefix_cache":
            return web.Response(status=404, text='{"detail":"Not Found"}', content_type="application/json")
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "host"}
        async with session_box[0].request(
            request.method, upstream + request.path_qs, data=body, headers=headers
        ) as answer:
            if request.path == "/metrics" and hide_kv_size:
                text = await answer.text()
                kept = "\n".join(line for line in text.splitlines() if KV_SIZE_GAUGE not in line) + "\n"
                return web.Response(status=answer.status, text=kept, content_type="text/plain")
            response = web.StreamResponse(
                status=answer.status,
                headers={k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP},
            )
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def serve() -> None:
        session_box.append(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300), auto_decompress=False))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", relay)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        proxy.base_url = f"http://127.0.0.1:{port}"
        started.set()
        await stop.wait()
        await session_box[0].close()
        await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    if not started.wait(timeout=30):
        raise AssertionError("the no-reset proxy did not start")
    try:
        yield proxy
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
