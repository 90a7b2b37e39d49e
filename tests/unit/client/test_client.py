"""Tests for the streaming client (harness.client.openai) against an in-process aiohttp server.

The server replays the golden streams of tests/golden/sse/ piece by piece with planted delays, so
the tests can check what the timestamps mean (TTFT is not triggered by role-only chunks or
keep-alives, ITLs follow the planted gaps) and how every failure is classified.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import pandas as pd
import pytest
from aiohttp import web

from harness.client.endpoint import Endpoint
from harness.client.openai import SNIPPET_CHARS, OpenAIClient, RequestOutcome
from harness.results.aggregate import stream_check
from harness.results.run_result import STREAM_RATIO_WARN
from tests.resultfiles import request_record
from tests.support import GOLDEN

SSE = GOLDEN / "sse"
EXPECTED: dict[str, dict[str, Any]] = {
    name: spec
    for name, spec in json.loads((SSE / "expected.json").read_text(encoding="utf-8")).items()
    if not name.startswith("_")
}
METRICS_PAGE = (GOLDEN / "metrics" / "vllm_after.prom").read_text(encoding="utf-8")
API_KEY = "sk-test-secret-123456"
MS = 1_000_000


def golden(name: str) -> bytes:
    return (SSE / name).read_bytes()


def frames(payload: bytes) -> list[bytes]:
    """Split a single-style-line-ending stream into its events, each with its terminator."""
    return re.findall(rb"(?s).*?(?:\r\n\r\n|\n\n|\r\r)|.+$", payload)


def pieces(payload: bytes, size: int) -> list[tuple[float, bytes]]:
    return [(0.0, payload[i : i + size]) for i in range(0, len(payload), size)]


End = Literal["finish", "drop", "hang"]


@dataclass
class Script:
    """What the fake server answers to the next streaming request."""

    pieces: list[tuple[float, bytes]] = field(default_factory=list)
    """(delay before writing, bytes) in order."""
    status: int = 200
    body: str = ""
    content_type: str = "text/event-stream"
    end: End = "finish"
    delay_headers_s: float = 0.0


class FakeServer:
    """An OpenAI-compatible server on 127.0.0.1 that replays :class:`Script` values."""

    def __init__(self) -> None:
        self.script = Script()
        self.requests: list[dict[str, Any]] = []
        self.peers: list[object] = []
        self.release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._stream)
        app.router.add_post("/v1/completions", self._stream)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/reset_prefix_cache", self._reset)
        app.router.add_post("/echo_text", self._echo_text)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.2)
        self.base_url = ""

    async def start(self) -> None:
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        self.base_url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self.release.set()
        await self._runner.cleanup()

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        self.requests.append({"path": request.path, "headers": dict(request.headers), "json": await request.json()})
        self.peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        script = self.script
        if script.delay_headers_s:
            await asyncio.sleep(script.delay_headers_s)
        if script.status >= 400:
            return web.Response(status=script.status, text=script.body, content_type="application/json")
        if script.content_type == "application/json":
            return web.Response(text=script.body, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": script.content_type})
        await response.prepare(request)
        for delay, piece in script.pieces:
            if delay:
                await asyncio.sleep(delay)
            await response.write(piece)
        if script.end == "hang":
            await self.release.wait()
        elif script.end == "drop":
            assert request.transport is not None
            request.transport.abort()
            return response
        await response.write_eof()
        return response

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=METRICS_PAGE, content_type="text/plain")

    async def _tokenize(self, request: web.Request) -> web.Response:
        payload = await request.json()
        return web.json_response({"tokens": list(range(len(payload["prompt"].split()))), "count": 2})

    async def _reset(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _echo_text(self, request: web.Request) -> web.Response:
        return web.Response(status=422, text="not json at all")


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    fake = FakeServer()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


def endpoint(server: FakeServer, suffix: str = "") -> Endpoint:
    return Endpoint(base_url=server.base_url + suffix, model="test-model", api_key=API_KEY)


async def run_chat(server: FakeServer, script: Script, **client_kwargs: Any) -> RequestOutcome:
    server.script = script
    client_kwargs.setdefault("timeout_s", 5.0)
    async with OpenAIClient(endpoint(server), **client_kwargs) as client:
        return await client.chat([{"role": "user", "content": "hi"}], 16)


# ---------------------------------------------------------------- golden replays


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_golden_replay_outcome(server: FakeServer, name: str) -> None:
    spec = EXPECTED[name]
    server.script = Script(pieces=pieces(golden(name), 37))
    async with OpenAIClient(endpoint(server), timeout_s=5.0) as client:
        if spec["api"] == "chat":
            outcome = await client.chat([{"role": "user", "content": "hi"}], 16)
        else:
            outcome = await client.completion("The capital of France is", 16)
    assert outcome.error_kind == spec["error_kind"], outcome.error
    assert outcome.ok is (spec["error_kind"] is None)
    assert outcome.http_status == 200
    assert outcome.text == spec["text"]
    assert outcome.output_chunks == spec["output_chunks"]
    assert len(outcome.itl_ns) == max(spec["output_chunks"] - 1, 0)
    if spec["error_kind"] is None:
        assert (outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens) == (
            spec["prompt_tokens"],
            spec["completion_tokens"],
            spec["cached_tokens"],
        )
        assert outcome.finish_reason == spec["finish_reason"]
    if spec["output_chunks"]:
        assert outcome.ttft_ns is not None
        assert outcome.e2e_ns is not None
        assert 0 < outcome.ttft_ns <= outcome.e2e_ns
    else:
        assert outcome.ttft_ns is None
    assert outcome.started_ns > 0


async def test_server_error_frame_message_is_redacted(server: FakeServer) -> None:
    outcome = await run_chat(server, Script(pieces=[(0.0, golden("error_frame.sse"))]))
    assert outcome.error_kind == "server_error"
    assert outcome.error is not None
    assert "The engine died" in outcome.error
    assert "sk-abcdef123456" not in outcome.error


# ---------------------------------------------------------------- timing


async def test_ttft_waits_for_first_content_not_role_chunk(server: FakeServer) -> None:
    role, *contents = frames(golden("vllm_chat.sse"))
    script = Script(pieces=[(0.0, role), (0.25, contents[0])] + [(0.05, frame) for frame in contents[1:]])
    outcome = await run_chat(server, script)
    assert outcome.ok, outcome.error
    assert outcome.ttft_ns is not None and outcome.e2e_ns is not None
    assert outcome.ttft_ns >= 250 * MS
    # four more content frames, each written 50 ms after the previous one
    assert len(outcome.itl_ns) == 4
    assert all(gap >= 30 * MS for gap in outcome.itl_ns), outcome.itl_ns
    assert outcome.e2e_ns >= outcome.ttft_ns + sum(outcome.itl_ns)
    assert outcome.e2e_ns >= 250 * MS + 7 * 50 * MS - 20 * MS


async def test_keep_alives_do_not_count_as_first_token(server: FakeServer) -> None:
    events = frames(golden("keepalive.sse"))
    first_content = next(i for i, frame in enumerate(events) if b'"still"' in frame)
    script = Script(pieces=[(0.0, b"".join(events[:first_content])), (0.2, b"".join(events[first_content:]))])
    outcome = await run_chat(server, script)
    assert outcome.ok, outcome.error
    assert outcome.ttft_ns is not None and outcome.ttft_ns >= 200 * MS
    assert outcome.text == "still here"


async def test_content_frames_in_one_read_get_zero_gaps(server: FakeServer) -> None:
    outcome = await run_chat(server, Script(pieces=[(0.1, golden("vllm_chat.sse"))]))
    assert outcome.ok, outcome.error
    assert outcome.itl_ns == (0, 0, 0, 0)
    assert outcome.ttft_ns is not None and outcome.ttft_ns >= 100 * MS


async def test_frame_split_across_reads_is_timed_at_completion(server: FakeServer) -> None:
    role, content, *rest = frames(golden("vllm_chat.sse"))
    script = Script(pieces=[(0.0, role + content[:30]), (0.15, content[30:]), (0.0, b"".join(rest))])
    outcome = await run_chat(server, script)
    assert outcome.ok, outcome.error
    assert outcome.ttft_ns is not None and outcome.ttft_ns >= 150 * MS


# ---------------------------------------------------------------- failures


async def test_http_500_is_reported_with_redacted_snippet(server: FakeServer) -> None:
    body = json.dumps({"error": {"message": "boom " + "x" * 2000, "detail": "api_key=sk-verysecret999"}})
    outcome = await run_chat(server, Script(status=500, body=body))
    assert outcome.error_kind == "http_status"
    assert outcome.http_status == 500
    assert not outcome.ok
    assert outcome.error is not None
    assert "HTTP 500" in outcome.error and "boom" in outcome.error
    assert "verysecret" not in outcome.error
    assert len(outcome.error) <= SNIPPET_CHARS
    assert outcome.ttft_ns is None


async def test_json_body_on_200_is_malformed(server: FakeServer) -> None:
    outcome = await run_chat(server, Script(content_type="application/json", body='{"choices": []}'))
    assert outcome.error_kind == "malformed_frame"
    assert outcome.http_status == 200


async def test_hanging_stream_times_out(server: FakeServer) -> None:
    role, content, *_ = frames(golden("vllm_chat.sse"))
    t0 = time.monotonic()
    outcome = await run_chat(server, Script(pieces=[(0.0, role + content)], end="hang"), timeout_s=0.3)
    assert time.monotonic() - t0 < 2.0
    assert outcome.error_kind == "timeout"
    assert outcome.text == "The"
    assert outcome.ttft_ns is not None
    assert outcome.e2e_ns is not None and outcome.e2e_ns < 300 * MS  # last byte, not the timeout


async def test_server_silent_before_headers_times_out(server: FakeServer) -> None:
    outcome = await run_chat(server, Script(delay_headers_s=3.0), timeout_s=0.3)
    assert outcome.error_kind == "timeout"
    assert outcome.http_status is None
    assert outcome.e2e_ns is not None and outcome.e2e_ns >= 250 * MS


async def test_read_timeout_between_chunks(server: FakeServer) -> None:
    role, content, *_ = frames(golden("vllm_chat.sse"))
    t0 = time.monotonic()
    script = Script(pieces=[(0.0, role + content)], end="hang")
    outcome = await run_chat(server, script, timeout_s=30.0, read_timeout_s=0.2)
    assert time.monotonic() - t0 < 2.0
    assert outcome.error_kind == "timeout"


async def test_connection_dropped_mid_stream(server: FakeServer) -> None:
    role, content, *_ = frames(golden("vllm_chat.sse"))
    outcome = await run_chat(server, Script(pieces=[(0.0, role), (0.05, content)], end="drop"))
    assert outcome.error_kind == "stream_dropped", outcome.error
    assert outcome.http_status == 200
    assert outcome.text == "The"
    assert outcome.output_chunks == 1


async def test_clean_end_without_done_is_dropped(server: FakeServer) -> None:
    payload = b"".join(frames(golden("vllm_chat.sse"))[:-1])  # everything but data: [DONE]
    outcome = await run_chat(server, Script(pieces=[(0.0, payload)]))
    assert outcome.error_kind == "stream_dropped"
    assert outcome.prompt_tokens == 1032  # what arrived is kept


async def test_done_without_final_blank_line_is_accepted(server: FakeServer) -> None:
    payload = golden("vllm_chat.sse").rstrip(b"\n") + b"\n"
    outcome = await run_chat(server, Script(pieces=[(0.0, payload)]))
    assert outcome.ok, outcome.error


async def test_connection_refused() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with OpenAIClient(Endpoint(f"http://127.0.0.1:{port}", "m"), timeout_s=2.0) as client:
        outcome = await client.completion("hello", 4)
    assert outcome.error_kind == "connection"
    assert outcome.http_status is None
    assert outcome.ttft_ns is None
    assert outcome.error


async def test_cancellation_propagates(server: FakeServer) -> None:
    server.script = Script(pieces=[(0.0, frames(golden("vllm_chat.sse"))[0])], end="hang")
    async with OpenAIClient(endpoint(server), timeout_s=10.0) as client:
        task = asyncio.create_task(client.chat([{"role": "user", "content": "hi"}], 8))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


# ---------------------------------------------------------------- request shape and session


async def test_request_body_and_headers(server: FakeServer) -> None:
    server.script = Script(pieces=[(0.0, golden("vllm_chat.sse"))])
    async with OpenAIClient(endpoint(server), timeout_s=5.0) as client:
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
        await client.chat(messages, 32)
        await client.chat(messages, 8, ignore_eos=True, extra_body={"top_k": 1, "stream": False})
        server.script = Script(pieces=[(0.0, golden("vllm_completions.sse"))])
        await client.completion("The capital of France is", 4)
    plain, extra, completion = server.requests
    assert plain["path"] == "/v1/chat/completions"
    assert plain["json"] == {
        "model": "test-model",
        "messages": messages,
        "max_tokens": 32,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert plain["headers"]["Authorization"] == f"Bearer {API_KEY}"
    assert extra["json"]["ignore_eos"] is True
    assert extra["json"]["top_k"] == 1
    assert extra["json"]["stream"] is True
    assert completion["path"] == "/v1/completions"
    assert completion["json"]["prompt"] == "The capital of France is"
    assert "messages" not in completion["json"]
    assert "ignore_eos" not in completion["json"]


async def test_one_pooled_session_reuses_its_connection(server: FakeServer) -> None:
    server.script = Script(pieces=[(0.0, golden("vllm_chat.sse"))])
    async with OpenAIClient(endpoint(server), timeout_s=5.0, max_connections=7) as client:
        session = client.session
        assert isinstance(session.connector, aiohttp.TCPConnector)
        assert session.connector.limit == 7
        for _ in range(3):
            assert (await client.chat([{"role": "user", "content": "hi"}], 4)).ok
            assert client.session is session
    assert len(set(server.peers)) == 1  # the stream was read to its end, so the connection was reused
    with pytest.raises(RuntimeError):
        _ = client.session


async def test_concurrent_requests_share_the_session(server: FakeServer) -> None:
    server.script = Script(
        pieces=[(0.0, frames(golden("vllm_chat.sse"))[0]), (0.1, b"")]
        + [(0.0, frame) for frame in frames(golden("vllm_chat.sse"))[1:]]
    )
    async with OpenAIClient(endpoint(server), timeout_s=5.0) as client:
        t0 = time.monotonic()
        outcomes = await asyncio.gather(*(client.chat([{"role": "user", "content": str(i)}], 4) for i in range(20)))
        elapsed = time.monotonic() - t0
    assert all(outcome.ok for outcome in outcomes)
    assert elapsed < 1.5  # concurrent, not serialized


async def test_base_url_with_v1_suffix(server: FakeServer) -> None:
    server.script = Script(pieces=[(0.0, golden("vllm_chat.sse"))])
    async with OpenAIClient(endpoint(server, "/v1/"), timeout_s=5.0) as client:
        assert client.url("/metrics") == server.base_url + "/metrics"
        assert (await client.chat([{"role": "user", "content": "hi"}], 4)).ok


async def test_client_must_be_opened() -> None:
    client = OpenAIClient(Endpoint("http://127.0.0.1:9", "m"), timeout_s=1.0)
    with pytest.raises(RuntimeError):
        await client.chat([{"role": "user", "content": "hi"}], 4)
    with pytest.raises(ValueError):
        OpenAIClient(Endpoint("http://127.0.0.1:9", "m"), timeout_s=0)


# ---------------------------------------------------------------- helpers


async def test_helpers(server: FakeServer) -> None:
    async with OpenAIClient(endpoint(server), timeout_s=5.0) as client:
        assert await client.metrics_text() == METRICS_PAGE
        assert await client.post_json("/tokenize", {"prompt": "a b"}) == (200, {"tokens": [0, 1], "count": 2})
        assert await client.post_json("/reset_prefix_cache", {}) == (200, None)
        assert await client.post_json("/echo_text", {}) == (422, "not json at all")
        with pytest.raises(aiohttp.ClientResponseError):
            await client.get_text("/missing")


async def test_frames_after_done_are_ignored(server: FakeServer) -> None:
    payload = golden("vllm_chat.sse") + b"data: {not json\n\n"
    outcome = await run_chat(server, Script(pieces=[(0.0, payload)]))
    assert outcome.ok, outcome.error


# ---------------------------------------------------------------- text chunks vs generated tokens


async def test_empty_token_chunks_are_timed_and_counted(server: FakeServer) -> None:
    """A stream whose tokens do not all carry text: TTFT is the first text, first_chunk_ns the first token."""
    name = "vllm_chat_untextual.sse"
    spec = EXPECTED[name]
    role, empty, text, *rest = frames(golden(name))
    script = Script(pieces=[(0.0, role), (0.0, empty), (0.2, text)] + [(0.0, frame) for frame in rest])
    outcome = await run_chat(server, script)
    assert outcome.ok, outcome.error
    assert outcome.ttft_ns is not None and outcome.first_chunk_ns is not None
    assert outcome.ttft_ns - outcome.first_chunk_ns >= 200 * MS
    assert outcome.output_chunks == spec["output_chunks"]
    assert outcome.empty_token_chunks == spec["kinds"].count("empty")
    assert outcome.completion_tokens == spec["completion_tokens"]


async def test_stream_check_fires_on_golden_stream_with_fewer_text_chunks_than_tokens(server: FakeServer) -> None:
    name = "vllm_chat_untextual.sse"
    spec = EXPECTED[name]
    role, empty, text, *rest = frames(golden(name))
    outcome = await run_chat(server, Script(pieces=[(0.0, role + empty), (0.05, text + b"".join(rest))]))
    record = request_record(
        "A",
        spec["prompt_tokens"],
        0,
        1,
        request_id="r",
        started_ns=outcome.started_ns,
        ttft_ns=outcome.ttft_ns,
        e2e_ns=outcome.e2e_ns,
        output_chunks=outcome.output_chunks,
        first_chunk_ns=outcome.first_chunk_ns,
        empty_token_chunks=outcome.empty_token_chunks,
        finish_reason=outcome.finish_reason,
        completion_tokens=outcome.completion_tokens,
        ok=outcome.ok,
    )
    check = stream_check(
        pd.DataFrame([record.model_dump()]), [], answer_tokens=spec["completion_tokens"], ignore_eos=True
    )
    assert check is not None and check.ratio is not None
    assert check.ratio == pytest.approx(spec["output_chunks"] / spec["completion_tokens"])
    assert check.ratio < STREAM_RATIO_WARN
    assert check.late_text == 1 and check.short_answers == 0
    assert any("text-bearing chunks are" in warning for warning in check.warnings)
    assert any("empty token chunk before their first text" in warning for warning in check.warnings)
