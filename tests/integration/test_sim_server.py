"""The simulator in real time: what a returning user's TTFT looks like with and without a CPU tier.

A long prompt is sent twice with ``POST /reset_prefix_cache`` in between. Without an offload
tier the second turn is as slow as the first (the HBM prefix cache was dropped); with a CPU tier
it is loaded from host memory, much faster than recomputing; without the reset the HBM prefix cache
serves it. Llama-3.1-8B on one H100 with ~8k-token prompts keeps each run well under a second.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path

import aiohttp
import pytest

from harness.engines.base import LaunchContext
from harness.sim.config import SimEngineConfig
from harness.sim.engine import SimEngine
from harness.sim.server import running_server
from harness.sim.settings import SimSettings
from harness.sim.tokenizer import WORDS
from offload.profiles import BUILTIN_PROFILES

pytestmark = pytest.mark.integration

MODEL = "llama-3.1-8b"
PROMPT = " ".join(random.Random(11).choice(WORDS) for _ in range(8000))


async def ttft(session: aiohttp.ClientSession, url: str, text: str = PROMPT) -> tuple[float, int]:
    """(seconds to the first content token, cached_tokens) of one streamed chat request."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.monotonic()
    first: float | None = None
    cached: int | None = None
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        assert response.status == 200
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            frame = json.loads(line[6:])
            if first is None and frame["choices"] and frame["choices"][0]["delta"].get("content"):
                first = time.monotonic() - started
            if frame.get("usage"):
                cached = frame["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first is not None and cached is not None
    return first, cached


async def reset(session: aiohttp.ClientSession, url: str) -> None:
    async with session.post(url + "/reset_prefix_cache") as response:
        assert response.status == 200


async def external_hits(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith("vllm:external_prefix_cache_hits_total{"):
            return float(line.rpartition(" ")[2])
    raise AssertionError("vllm:external_prefix_cache_hits_total missing")


def settings(offload: str) -> SimSettings:
    return SimSettings(model=MODEL, hardware="h100-sxm", offload=BUILTIN_PROFILES[offload])


async def test_without_tiers_a_reset_makes_turn2_cold() -> None:
    async with running_server(settings("hbm")) as url, aiohttp.ClientSession() as session:
        turn1, _ = await ttft(session, url)
        await reset(session, url)
        turn2, cached = await ttft(session, url)
    assert cached == 0
    assert 0.18 < turn1 < 0.4  # ~0.22 s modelled for 8k tokens
    assert turn2 > 0.8 * turn1


async def test_cpu_tier_serves_turn2_after_reset() -> None:
    async with running_server(settings("cpu")) as url, aiohttp.ClientSession() as session:
        turn1, _ = await ttft(session, url)
        await asyncio.sleep(0.2)  # turn 1's ~1 GB of KV is written in the background at 20 GB/s
        await reset(session, url)
        turn2, cached = await ttft(session, url)
        hits = await external_hits(session, url)
    assert cached > 7500 and hits == cached
    assert turn2 < 0.5 * turn1  # ~0.05 s: 1 GB over a 25 GB/s tier plus the last chunk's prefill


async def test_hbm_prefix_cache_serves_turn2_without_reset() -> None:
    async with running_server(settings("hbm")) as url, aiohttp.ClientSession() as session:
        turn1, _ = await ttft(session, url)
        turn2, cached = await ttft(session, url)
    assert cached > 7900
    assert turn2 < 0.25 * turn1


async def test_sim_engine_runs_the_simulator_as_a_subprocess(tmp_path: Path) -> None:
    config = SimEngineConfig(kind="sim", model="tiny", hardware="h100-sxm", startup_timeout_s=60)
    context = LaunchContext(arm="ON", profile=BUILTIN_PROFILES["cpu"], log_dir=tmp_path, prefix_caching=True)
    async with SimEngine(config, context) as running:
        assert running.endpoint.base_url.startswith("http://127.0.0.1:")
        assert running.endpoint.model == "tiny"
        facts = running.facts
        assert facts.kind == "sim" and facts.command[1:5] == ("-m", "kvbench", "sim", "serve")
        assert facts.details["offload_profile"] == "cpu" and facts.details["model"] == "tiny"
        settings_file = json.loads((tmp_path / "sim-settings.json").read_text())
        assert settings_file["offload"]["name"] == "cpu" and settings_file["prefix_caching"] is True
        ids = await running.tokenizer().encode("Hello there, simulator.")
        async with aiohttp.ClientSession() as session:
            async with session.post(
                running.endpoint.base_url + "/tokenize", json={"prompt": "Hello there, simulator."}
            ) as response:
                assert (await response.json())["tokens"] == ids  # the local tokenizer is the server's
            body = {"model": "tiny", "prompt": "Hello", "max_tokens": 3}
            async with session.post(running.endpoint.base_url + "/v1/completions", json=body) as response:
                assert response.status == 200
        await running.reset_prefix_cache()
        pid = running.pid
        assert pid is not None
    assert any("simulating tiny" in line for line in running.log_tail(200))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(RuntimeError, match="reset_prefix_cache"):
        await running.reset_prefix_cache()
