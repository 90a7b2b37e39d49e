"""The simulator's HTTP API (in process, tiny model): shapes, usage, tokenize, metrics, errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from harness.sim.server import running_server
from harness.sim.settings import SimSettings
from offload.profiles import BUILTIN_PROFILES

MODEL = "tiny"
MESSAGES = [{"role": "system", "content": "You answer."}, {"role": "user", "content": "What is a cache? " * 100}]


@pytest.fixture
async def api() -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    settings = SimSettings(model=MODEL, hardware="h100-sxm", offload=BUILTIN_PROFILES["cpu"])
    async with running_server(settings, port=0) as url, aiohttp.ClientSession() as session:
        yield session, url


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any], status: int = 200) -> Any:
    async with session.post(url, json=body) as response:
        payload = await response.json()
        assert response.status == status, payload
        return payload


async def sse(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[Any]:
    frames: list[Any] = []
    async with session.post(url, json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        async for raw in response.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                frames.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
    return frames


async def metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


async def test_simple_routes(api: tuple[aiohttp.ClientSession, str]) -> None:
    session, url = api
    async with session.get(url + "/health") as response:
        assert response.status == 200
    async with session.get(url + "/version") as response:
        assert "version" in await response.json()
    async with session.get(url + "/v1/models") as response:
        models = await response.json()
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == 32768
    async with session.post(url + "/reset_prefix_cache") as response:
        assert response.status == 200


async def test_tokenize_matches_usage_and_detokenize_round_trips(api: tuple[aiohttp.ClientSession, str]) -> None:
    session, url = api
    chat = await post(session, url + "/tokenize", {"model": MODEL, "messages": MESSAGES})
    assert chat["count"] == len(chat["tokens"]) and chat["max_model_len"] == 32768
    answer = await post(session, url + "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 3})
    assert answer["usage"]["prompt_tokens"] == chat["count"]
    text = "Exact round trip, with   spaces\nand ünïcode 🎉."
    plain = await post(session, url + "/tokenize", {"model": MODEL, "prompt": text})
    back = await post(session, url + "/detokenize", {"model": MODEL, "tokens": plain["tokens"]})
    assert back == {"prompt": text}


async def test_chat_stream_with_usage(api: tuple[aiohttp.ClientSession, str]) -> None:
    session, url = api
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 5,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    frames = await sse(session, url + "/v1/chat/completions", body)
    assert frames[-1] == "[DONE]"
    assert frames[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [f["choices"][0]["delta"]["content"] for f in frames[1:-2]]
    assert len(content) == 5 and all(content)
    # the last token's chunk carries the finish (vLLM's way: no separate empty finish chunk)
    assert [f["choices"][0]["finish_reason"] for f in frames[1:-2]] == [None] * 4 + ["length"]
    usage = frames[-2]["usage"]
    assert frames[-2]["choices"] == [] and frames[-2]["object"] == "chat.completion.chunk"
    assert usage["completion_tokens"] == 5 and usage["total_tokens"] == usage["prompt_tokens"] + 5
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    # greedy output depends only on the prompt; the repeat hits the HBM prefix cache
    again = await sse(session, url + "/v1/chat/completions", body)
    assert [f["choices"][0]["delta"]["content"] for f in again[1:-2]] == content
    assert again[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    plain = await sse(session, url + "/v1/chat/completions", {**body, "stream_options": None})
    assert all("usage" not in f for f in plain[:-1])


async def test_completions_stream_and_token_prompt(api: tuple[aiohttp.ClientSession, str]) -> None:
    session, url = api
    frames = await sse(
        session,
        url + "/v1/completions",
        {
            "model": MODEL,
            "prompt": "Once upon a time",
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert frames[0]["object"] == "text_completion" and frames[0]["choices"][0]["text"]
    assert frames[-2]["usage"]["prompt_tokens"] == 4
    answer = await post(session, url + "/v1/completions", {"model": MODEL, "prompt": [100, 200, 300], "max_tokens": 2})
    assert answer["object"] == "text_completion" and answer["usage"]["prompt_tokens"] == 3
    assert answer["choices"][0]["finish_reason"] == "length" and answer["choices"][0]["text"]
    default = await post(session, url + "/v1/completions", {"model": MODEL, "prompt": "x"})
    assert default["usage"]["completion_tokens"] == 128


async def test_errors(api: tuple[aiohttp.ClientSession, str]) -> None:
    session, url = api
    wrong = await post(session, url + "/v1/chat/completions", {"model": "other", "messages": MESSAGES}, 404)
    assert wrong["error"]["type"] == "NotFoundError"
    await post(session, url + "/v1/chat/completions", {"model": MODEL, "messages": []}, 400)
    await post(session, url + "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "n": 2}, 400)
    await post(session, url + "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 0}, 400)
    too_long = await post(
        session, url + "/v1/completions", {"model": MODEL, "prompt": [5] * 32000, "max_tokens": 1000}, 400
    )
    assert "maximum context length" in too_long["error"]["message"]
    async with session.post(url + "/v1/completions", data=b"{not json") as response:
        assert response.status == 400


async def test_metrics_have_vllm_names(api: tuple[aiohttp.ClientSession, str]) -> None:
    session, url = api
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2}
    first = await post(session, url + "/v1/chat/completions", body)
    await asyncio.sleep(0.05)  # let the background tier write finish (tiny KV: microseconds)
    async with session.post(url + "/reset_prefix_cache") as response:
        assert response.status == 200
    second = await post(session, url + "/v1/chat/completions", body)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # from the cpu tier
    values = await metrics(session, url)
    labels = '{engine="0",model_name="tiny"}'
    prompt = first["usage"]["prompt_tokens"]
    for name in (
        "vllm:prefix_cache_queries_total",
        "vllm:external_prefix_cache_queries_total",
        "vllm:prompt_tokens_total",
    ):
        assert values[name + labels] == 2 * prompt, name
    assert values["vllm:prefix_cache_hits_total" + labels] == 0
    assert (
        values["vllm:external_prefix_cache_hits_total" + labels]
        == second["usage"]["prompt_tokens_details"]["cached_tokens"]
    )
    assert values["vllm:generation_tokens_total" + labels] == 4
    assert values["vllm:time_to_first_token_seconds_count" + labels] == 2
    assert values['vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"}'] == 2
    # vLLM's per-request phases: waiting, then first scheduling to first token; together the TTFT clock
    for phase in ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds"):
        assert values[phase + "_count" + labels] == 2, phase
    assert values["vllm:request_prefill_time_seconds_sum" + labels] > 0  # at least one modelled step each
    phases = sum(values[f"vllm:request_{p}_time_seconds_sum" + labels] for p in ("queue", "prefill"))
    assert phases == pytest.approx(values["vllm:time_to_first_token_seconds_sum" + labels])
    for gauge in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert values[gauge + labels] == 0


async def test_client_disconnect_aborts_the_request() -> None:
    settings = SimSettings(model=MODEL, hardware="h100-sxm")
    async with running_server(settings) as url, aiohttp.ClientSession() as session:
        body = {"model": MODEL, "prompt": "long answer", "max_tokens": 20000, "stream": True}
        async with session.post(url + "/v1/completions", json=body) as response:
            await response.content.readline()
            running = await metrics(session, url)
            assert running['vllm:num_requests_running{engine="0",model_name="tiny"}'] == 1
            response.close()
        for _ in range(50):
            await asyncio.sleep(0.02)
            if (await metrics(session, url))['vllm:num_requests_running{engine="0",model_name="tiny"}'] == 0:
                break
        else:
            raise AssertionError("the request kept running after its client left")
