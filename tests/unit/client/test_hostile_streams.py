"""Streams a hostile or odd server sends, against a real local HTTP server (tests/unit/test_client.py's).

SSE per the spec (other event types, comments, id/retry lines), invalid UTF-8, a silent
connection under a stall limit, and an API key echoed back in an error body.
"""

from __future__ import annotations

import json
from typing import Any

from harness.client.endpoint import Endpoint
from harness.client.openai import OpenAIClient, RequestOutcome
from tests.unit.client.test_client import FakeServer, Script, run_chat, server

__all__ = ["server"]  # the fixture, re-exported for pytest

WORDS = ["The", " returning", " user", " is", " back"]


def chunk(content: str | None = None, role: str | None = None, finish: str | None = None) -> bytes:
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    body = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


def plain_stream() -> list[bytes]:
    return [chunk(role="assistant"), *(chunk(word) for word in WORDS), chunk(finish="length"), b"data: [DONE]\n\n"]


async def test_other_event_types_comments_id_and_retry_are_not_chunks(server: FakeServer) -> None:
    baseline = await run_chat(server, Script(pieces=[(0.0, piece) for piece in plain_stream()]))
    assert baseline.ok, baseline.error
    noisy: list[bytes] = [b": hello\nretry: 1500\n\n"]
    for index, piece in enumerate(plain_stream()):
        # a ping event with its own JSON (not a chat chunk), an id on the real chunk, a comment
        noisy.append(b'event: ping\ndata: {"type": "ping", "seq": ' + str(index).encode() + b"}\n\n")
        noisy.append(b": keep-alive\n" + b"id: " + str(index).encode() + b"\n" + piece)
    noisy.append(b"event: metrics\ndata: not json at all\n\n")  # after [DONE]: ignored anyway
    outcome = await run_chat(server, Script(pieces=[(0.0, piece) for piece in noisy]))
    assert outcome.ok, outcome.error
    assert outcome.text == baseline.text == "".join(WORDS)
    assert outcome.output_chunks == baseline.output_chunks == len(WORDS)


async def test_other_event_type_with_invalid_json_before_done(server: FakeServer) -> None:
    stream = plain_stream()
    stream.insert(2, b"event: usage-report\ndata: {not json\n\n")
    outcome = await run_chat(server, Script(pieces=[(0.0, piece) for piece in stream]))
    assert outcome.ok, outcome.error
    assert outcome.text == "".join(WORDS)


async def test_invalid_utf8_is_an_error_record_not_a_success(server: FakeServer) -> None:
    stream = plain_stream()
    bad = chunk("caf\u00e9").replace("é".encode(), b"\xe9")  # latin-1 byte inside a UTF-8 stream
    stream.insert(2, bad)
    outcome = await run_chat(server, Script(pieces=[(0.0, piece) for piece in stream]))
    assert outcome.error_kind == "malformed_frame"
    assert outcome.error is not None and "invalid UTF-8" in outcome.error


async def test_utf8_split_across_reads_is_fine(server: FakeServer) -> None:
    stream = b"".join([chunk(role="assistant"), chunk("caf\u00e9 \u2603"), b"data: [DONE]\n\n"])
    cut = stream.index("\u2603".encode()) + 1  # inside the three-byte snowman
    outcome = await run_chat(server, Script(pieces=[(0.0, stream[:cut]), (0.02, stream[cut:])]))
    assert outcome.ok, outcome.error
    assert outcome.text == "caf\u00e9 \u2603"


async def test_silent_connection_fails_at_the_stall_limit_and_names_both_limits(server: FakeServer) -> None:
    stream = plain_stream()
    outcome = await run_chat(
        server, Script(pieces=[(0.0, stream[0] + stream[1])], end="hang"), timeout_s=30.0, read_timeout_s=0.25
    )
    assert outcome.error_kind == "timeout"
    assert outcome.error is not None
    assert "silent" in outcome.error and "stall_timeout_s=0.25" in outcome.error and "timeout_s=30" in outcome.error
    assert outcome.e2e_ns is not None and outcome.e2e_ns < 250_000_000  # the last byte, not the timeout


async def test_keep_alives_without_an_event_are_a_stall(server: FakeServer) -> None:
    keep_alives = [(0.05, b": keep-alive\n\n")] * 40  # never silent for 0.25 s, but no chunk either
    outcome = await run_chat(server, Script(pieces=keep_alives, end="hang"), timeout_s=5.0, read_timeout_s=0.25)
    assert outcome.error_kind == "timeout"
    assert outcome.error == "bytes trickled in but no event for longer than stall_timeout_s=0.25: the endpoint stalled"


async def test_slow_tokens_hit_the_total_limit_and_name_both(server: FakeServer) -> None:
    tokens = [(0.05, chunk(" word"))] * 40  # never silent for 0.25 s, never done within 0.5 s
    outcome = await run_chat(server, Script(pieces=tokens, end="hang"), timeout_s=0.5, read_timeout_s=0.25)
    assert outcome.error_kind == "timeout"
    assert outcome.error is not None
    assert "no complete response within timeout_s=0.5" in outcome.error and "stall_timeout_s=0.25" in outcome.error


async def test_api_key_echoed_with_any_prefix_is_scrubbed(server: FakeServer) -> None:
    key = "Zq9custom77keyvalue"  # matches none of the generic token patterns: only the literal rule catches it
    server.script = Script(status=401, body=f"unknown credential <<{key}>> (X-Key:{key})")
    async with OpenAIClient(Endpoint(base_url=server.base_url, model="m", api_key=key), timeout_s=5.0) as client:
        outcome: RequestOutcome = await client.chat([{"role": "user", "content": "hi"}], 4)
    assert outcome.error_kind == "http_status"
    assert outcome.error is not None and key not in outcome.error and "***" in outcome.error
