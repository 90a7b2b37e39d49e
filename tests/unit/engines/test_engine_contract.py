"""The engine contract: one suite, run against every engine client family kvbench speaks to.

Each family is a real process on a real port, driven through kvbench's own
:class:`~harness.client.openai.OpenAIClient` and :mod:`~harness.client.scrape`:

* ``vllm``, ``sglang``, ``trtllm``: ``tests/fakes/fake_engine.py`` replaying the family's golden
  SSE streams and /metrics pages (``tests/golden/sse/contract.json``); the vLLM page carries
  LMCache's counters, the TensorRT-LLM fake reads the LLM-API YAML kvbench renders and serves
  Prometheus text on ``/prometheus/metrics`` only because that YAML turns it on;
* ``sim``: the real simulator, started by :class:`~harness.sim.engine.SimEngine`;
* ``openai``: an endpoint kvbench only attaches to (:class:`OpenAIEngine`), here an SGLang-shaped
  fake that wants an API key; its metric family is recognised from the page (``auto``).

What every family must give: TTFT after the first token (not the role chunk), ITLs, usage with
prompt/completion/cached tokens, the finish reason, HTTP errors mapped to ``http_status`` with the
engine's message, and a metric family that yields prompt tokens and prefix-cache hit counters.
The fakes also check mid-stream error frames (``server_error``), dropped streams
(``stream_dropped``) and HTTP 500; the simulator injects those only through its fault file
(tests/unit/sim/test_soak_sim_faults.py), so it skips them.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.client.endpoint import Endpoint
from harness.client.openai import OpenAIClient, RequestOutcome
from harness.client.scrape import (
    AUTO,
    LMCACHE_METRICS,
    METRICS,
    SGLANG,
    TRTLLM,
    VLLM,
    cache_counter_deltas,
    delta,
    detect_family,
    hit_rates,
    metric_value,
    metrics_path,
    parse_metrics,
    summarize,
    summarize_lmcache,
)
from harness.engines.base import EngineFacts, LaunchContext
from harness.engines.configs import OpenAIEngineConfig, TrtllmEngineConfig
from harness.engines.kinds import metrics_family
from harness.engines.openai import OpenAIEngine
from harness.engines.process import ManagedProcess, free_port
from harness.engines.trtllm_offload import render_trtllm_options
from harness.sim.config import SimEngineConfig
from harness.sim.engine import SimEngine
from offload.profiles import BUILTIN_PROFILES
from tests.support import GOLDEN, fake_engine_spec

CONTRACT: dict[str, Any] = json.loads((GOLDEN / "sse" / "contract.json").read_text(encoding="utf-8"))
FAMILIES = ("vllm", "sglang", "trtllm", "sim", "openai")
FIRST_TOKEN_DELAY_MS = 40.0
API_KEY_ENV = "KVBENCH_CONTRACT_API_KEY"
API_KEY = "sk-contract-test-0123456789"
MS = 1_000_000
QUESTION = "Tell me about Paris, the capital of France, its history and its museums. " * 12
"""Long enough (~200 tokens) for whole KV blocks to be cached, so a repeat can hit the prefix cache."""
MESSAGES = [{"role": "user", "content": QUESTION}]


@dataclass
class Target:
    """One engine family, started and ready."""

    family: str
    kind: str
    """The engine kind whose metric family applies (family_for_engine)."""
    endpoint: Endpoint
    facts: EngineFacts
    golden: dict[str, Any] | None
    """The contract.json entry the fake replays (None for the simulator)."""
    expected_metrics_family: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fake(self) -> bool:
        return self.golden is not None

    @property
    def metrics_family(self) -> str:
        return metrics_family(self.kind)

    @property
    def metrics_path(self) -> str:
        family = self.metrics_family
        return metrics_path(self.expected_metrics_family if family == AUTO else family)


def fake_process(family: str, log_dir: Path, *args: str) -> tuple[ManagedProcess, str]:
    spec = fake_engine_spec(log_dir / f"{family}.log", *args, family=family, startup_timeout_s=20)
    return ManagedProcess(spec), spec.health_url.removesuffix("/health")


@pytest.fixture(scope="module", params=FAMILIES)
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    family: str = request.param
    tmp = tmp_path_factory.mktemp(f"contract-{family}")
    if family == "sim":
        config = SimEngineConfig(kind="sim", model="tiny", hardware="h100-sxm", startup_timeout_s=30)
        context = LaunchContext(arm="on", profile=BUILTIN_PROFILES["cpu"], log_dir=tmp, prefix_caching=True)
        engine = SimEngine(config, context)
        running = asyncio.run(engine.__aenter__())
        try:
            yield Target("sim", "sim", running.endpoint, running.facts, None, VLLM)
        finally:
            asyncio.run(engine.__aexit__(None, None, None))
        return
    if family == "openai":
        process, base_url = fake_process(
            "sglang",
            tmp,
            *("--model-path", "/models/Qwen2.5-7B-Instruct", "--served-model-name", "qwen", "--enable-metrics"),
            *("--api-key", API_KEY, "--first-token-delay-ms", str(FIRST_TOKEN_DELAY_MS)),
        )
        asyncio.run(process.__aenter__())
        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv(API_KEY_ENV, API_KEY)
                endpoint, facts = asyncio.run(_attach(base_url, tmp))
            yield Target("openai", "openai", endpoint, facts, CONTRACT["sglang"], SGLANG)
        finally:
            asyncio.run(process.stop())
        return
    args = ["--first-token-delay-ms", str(FIRST_TOKEN_DELAY_MS)]
    if family == "vllm":
        args += ["--model", "/models/llama-3.1-8b", "--served-model-name", "llama-3.1-8b"]
    elif family == "sglang":
        args += ["--model-path", "/models/Qwen2.5-7B-Instruct", "--served-model-name", "qwen", "--enable-metrics"]
    else:  # trtllm: the LLM-API YAML kvbench renders decides whether Prometheus text is served
        trtllm = TrtllmEngineConfig(kind="trtllm", model="/models/Llama-3.1-8B-Instruct")
        plan = render_trtllm_options(BUILTIN_PROFILES["cpu"], trtllm, prefix_caching=True)
        options = tmp / "llm_api_options.yaml"
        options.write_text(plan.yaml_text(), encoding="utf-8")
        args = ["/models/Llama-3.1-8B-Instruct", "--backend", "pytorch", "--extra_llm_api_options", str(options), *args]
    process, base_url = fake_process(family, tmp, *args)
    asyncio.run(process.__aenter__())
    try:
        served = asyncio.run(_served_name(base_url))
        facts = EngineFacts(kind=family, version="fake", command=tuple(process.redacted_argv))
        yield Target(family, family, Endpoint(base_url=base_url, model=served), facts, CONTRACT[family], family)
    finally:
        asyncio.run(process.stop())


async def _attach(base_url: str, log_dir: Path) -> tuple[Endpoint, EngineFacts]:
    config = OpenAIEngineConfig(kind="openai", model="qwen", base_url=base_url + "/v1", api_key_env=API_KEY_ENV)
    context = LaunchContext(arm="on", profile=BUILTIN_PROFILES["hbm"], log_dir=log_dir, prefix_caching=True)
    async with OpenAIEngine(config, context) as running:
        return running.endpoint, running.facts


async def _served_name(base_url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(base_url + "/v1/models") as response:
        body = await response.json()
    return str(body["data"][0]["id"])


async def fake_state(target: Target) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(target.endpoint.base_url + "/fake/state") as response:
        state: dict[str, Any] = await response.json()
    return state


async def chat(target: Target, content: str = QUESTION, **kwargs: Any) -> RequestOutcome:
    endpoint = kwargs.pop("endpoint", target.endpoint)
    max_tokens = kwargs.pop("max_tokens", 16)
    async with OpenAIClient(endpoint, timeout_s=10.0) as client:
        return await client.chat([{"role": "user", "content": content}], max_tokens, ignore_eos=True, **kwargs)


def _check_golden_outcome(outcome: RequestOutcome, spec: dict[str, Any]) -> None:
    assert outcome.ok, outcome.error
    assert outcome.http_status == 200
    assert outcome.text == spec["text"]
    assert outcome.output_chunks == spec["output_chunks"]
    assert len(outcome.itl_ns) == spec["output_chunks"] - 1
    usage = (outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens)
    assert usage == (spec["prompt_tokens"], spec["completion_tokens"], spec["cached_tokens"])
    assert outcome.finish_reason == spec["finish_reason"]
    assert outcome.ttft_ns is not None and outcome.e2e_ns is not None
    assert outcome.ttft_ns >= FIRST_TOKEN_DELAY_MS * MS * 0.9  # the role chunk came first and did not count
    assert outcome.ttft_ns + sum(outcome.itl_ns) <= outcome.e2e_ns


# ------------------------------------------------------------------------------------- streaming


async def test_engine_is_started_and_described(target: Target) -> None:
    assert target.endpoint.base_url.startswith("http://127.0.0.1:")
    assert target.facts.kind == target.kind
    assert target.facts.version
    if target.family == "openai":
        assert target.facts.version == "0.0.0-fake-sglang"  # from GET /version
        assert target.endpoint.api_key == API_KEY and "sk-" not in repr(target.endpoint)
    if target.family == "sim":
        assert target.facts.command[1:5] == ("-m", "kvbench", "sim", "serve")


async def test_chat_stream_timing_usage_and_cached_tokens(target: Target) -> None:
    outcome = await chat(target)
    if target.golden is not None:
        _check_golden_outcome(outcome, target.golden["chat"])
        last = (await fake_state(target))["requests"][-1]
        assert last["path"] == "/v1/chat/completions"
        sent = last["body"]
        assert sent["model"] == target.endpoint.model and sent["stream"] is True
        assert sent["stream_options"] == {"include_usage": True}  # usage (and cached tokens) are asked for
        return
    # the simulator: its own tokens and counts, and a real prefix cache behind them
    assert outcome.ok, outcome.error
    assert outcome.completion_tokens == 16 and outcome.output_chunks >= 1
    assert outcome.prompt_tokens is not None and outcome.prompt_tokens > 0
    assert outcome.ttft_ns is not None and outcome.e2e_ns is not None and 0 < outcome.ttft_ns <= outcome.e2e_ns
    again = await chat(target)
    assert again.ok and again.prompt_tokens == outcome.prompt_tokens
    assert again.cached_tokens is not None and again.cached_tokens > 0  # the repeated prompt hit the cache


async def test_completions_stream(target: Target) -> None:
    async with OpenAIClient(target.endpoint, timeout_s=10.0) as client:
        outcome = await client.completion("The capital of France is", 8, ignore_eos=True)
    if target.golden is not None:
        _check_golden_outcome(outcome, target.golden["completions"])
        return
    assert outcome.ok, outcome.error
    assert outcome.completion_tokens == 8 and outcome.prompt_tokens and outcome.text


# ------------------------------------------------------------------------------------- error mapping


async def test_unknown_model_is_an_http_error_with_the_engine_message(target: Target) -> None:
    wrong = Endpoint(base_url=target.endpoint.base_url, model="no-such-model", api_key=target.endpoint.api_key)
    outcome = await chat(target, endpoint=wrong)
    assert outcome.error_kind == "http_status"
    assert outcome.http_status == 404
    assert outcome.error is not None and "no-such-model" in outcome.error
    assert outcome.ttft_ns is None and outcome.output_chunks == 0


async def test_invalid_max_tokens_is_http_400(target: Target) -> None:
    outcome = await chat(target, max_tokens=0)
    assert outcome.error_kind == "http_status" and outcome.http_status == 400
    assert outcome.error is not None and "max_tokens" in outcome.error


def _fake_only(target: Target) -> None:
    if not target.fake:
        pytest.skip("the simulator injects mid-stream failures through its fault file (test_soak_sim_faults.py)")


async def test_server_error_answer_is_http_status(target: Target) -> None:
    _fake_only(target)
    outcome = await chat(target, "[[fake:http_500]] please fail")
    assert outcome.error_kind == "http_status" and outcome.http_status == 500
    assert outcome.error is not None and "fake internal error" in outcome.error


async def test_error_frame_mid_stream_is_server_error(target: Target) -> None:
    _fake_only(target)
    outcome = await chat(target, "[[fake:stream_error]] fail after one token")
    assert outcome.error_kind == "server_error"
    assert outcome.error is not None and "mid-stream" in outcome.error
    assert outcome.output_chunks == 1 and outcome.ttft_ns is not None  # the token before the error counted


async def test_dropped_stream_is_stream_dropped(target: Target) -> None:
    _fake_only(target)
    outcome = await chat(target, "[[fake:drop]] drop after one token")
    assert outcome.error_kind == "stream_dropped"
    assert outcome.output_chunks == 1


async def test_connection_refused_is_a_connection_error(target: Target) -> None:
    closed = Endpoint(base_url=f"http://127.0.0.1:{free_port()}", model=target.endpoint.model)
    outcome = await chat(target, endpoint=closed)
    assert outcome.error_kind == "connection" and outcome.http_status is None


async def test_api_key_is_sent_and_required(target: Target) -> None:
    keyless = Endpoint(base_url=target.endpoint.base_url, model=target.endpoint.model)
    outcome = await chat(target, endpoint=keyless)
    if target.endpoint.api_key is None:
        assert outcome.ok, outcome.error  # nothing to send, nothing required
        return
    assert outcome.error_kind == "http_status" and outcome.http_status == 401
    assert (await chat(target)).ok


# ------------------------------------------------------------------------------------- metrics


async def test_metric_family_yields_prompt_tokens_and_hit_counters(target: Target) -> None:
    async with aiohttp.ClientSession() as session:
        await session.post(target.endpoint.base_url + "/fake/reset_counters")  # the fakes: back to "before"
    async with OpenAIClient(target.endpoint, timeout_s=10.0) as client:
        before = await client.get_text(target.metrics_path)
        outcome = await client.chat(MESSAGES, 8, ignore_eos=True)
        assert outcome.ok, outcome.error
        after = await client.get_text(target.metrics_path)
    family = target.metrics_family
    after_page = parse_metrics(after)
    assert detect_family(after_page) == target.expected_metrics_family
    deltas = cache_counter_deltas(before, after, family)
    assert deltas == cache_counter_deltas(before, after)  # auto-detection agrees with the engine kind's family
    assert deltas["prompt_tokens"] > 0 and deltas["gpu_prefix_queries"] > 0
    assert "gpu_prefix_hits" in deltas
    rates = hit_rates(delta(parse_metrics(before), after_page), family)
    assert rates.gpu is not None and 0 <= rates.gpu <= 1
    gauges = summarize(after_page, family)
    assert gauges["kv_usage"] is not None and 0 <= gauges["kv_usage"] <= 1
    assert gauges["requests_running"] is not None and gauges["requests_waiting"] is not None
    if target.golden is not None:
        expected = target.golden["metrics"]["deltas"]
        assert deltas == pytest.approx(expected)
        assert target.metrics_path == target.golden["metrics"]["path"]
    else:  # the simulator counts what it served
        assert deltas["prompt_tokens"] == outcome.prompt_tokens
        assert deltas["generation_tokens"] == outcome.completion_tokens == 8
        assert deltas["gpu_prefix_hits"] == outcome.cached_tokens
    lmcache = summarize_lmcache(after_page)
    if target.family == "vllm":  # vLLM's page carries the in-process LMCache connector's counters
        assert all(value is not None for value in lmcache.values()), lmcache
        assert deltas["lmcache_hit_tokens"] <= deltas["lmcache_requested_tokens"]
        mean_retrieve = deltas["lmcache_retrieve_seconds"] / deltas["lmcache_retrieves"]
        assert mean_retrieve == pytest.approx(0.0125)
    else:
        assert all(value is None for value in lmcache.values())


async def test_trtllm_metrics_endpoint_is_json_and_prometheus_is_elsewhere(target: Target) -> None:
    async with OpenAIClient(target.endpoint, timeout_s=10.0) as client:
        default_page = await client.metrics_text()
    if target.metrics_path == "/metrics":
        assert parse_metrics(default_page)  # Prometheus text on the default path
        return
    stats = json.loads(default_page)  # trtllm-serve: iteration stats as JSON
    assert isinstance(stats, list) and "kvCacheStats" in stats[0]
    with pytest.raises(ValueError):
        cache_counter_deltas(default_page, default_page)


# ------------------------------------------------------------------------------------- the metric table


def test_every_engine_column_names_the_engine_prefix() -> None:
    prefixes = {VLLM: "vllm:", SGLANG: "sglang:", TRTLLM: "trtllm_"}
    for spec in METRICS:
        for family, prefix in prefixes.items():
            for name in spec.names.get(family, ()):
                assert name.startswith(prefix), (spec.tag, family, name)
                base = name.split("{", 1)[0]
                # a counter is a Prometheus counter or a histogram's cumulative _sum or _count
                assert base.endswith(("_total", "_sum", "_count")) == (spec.kind == "counter"), (spec.tag, name)
    for spec in LMCACHE_METRICS:
        assert set(spec.names) == {"lmcache"}
        assert all(name.startswith(("lmcache:", "lmcache_mp_")) for name in spec.names["lmcache"])
        assert spec.kind == "counter"
    for kind in ("sim", "vllm", "sglang", "trtllm", "openai"):
        assert metrics_family(kind) in (VLLM, SGLANG, TRTLLM, AUTO)


def test_label_selectors_split_cache_sources_and_fall_back_on_old_versions() -> None:
    metrics = GOLDEN / "metrics"
    new = parse_metrics((metrics / "sglang_after.prom").read_text(encoding="utf-8"))
    assert metric_value(new, "gpu_prefix_hits", SGLANG) == 3264.0  # cache_source="device"
    assert metric_value(new, "external_prefix_hits", SGLANG) == 832.0  # host + storage_file
    legacy_before = (metrics / "sglang_legacy_before.prom").read_text(encoding="utf-8")
    legacy_after = (metrics / "sglang_legacy_after.prom").read_text(encoding="utf-8")
    deltas = cache_counter_deltas(legacy_before, legacy_after)
    assert deltas["gpu_prefix_hits"] == 256.0  # no cache_source label: all cached tokens
    assert "external_prefix_hits" not in deltas  # and no split to report
    mp_page = parse_metrics(
        "# TYPE lmcache_mp_lookup_requested_tokens counter\n"
        'lmcache_mp_lookup_requested_tokens_total{model_name="m",cache_salt=""} 512\n'
        "# TYPE lmcache_mp_lookup_hit_tokens counter\n"
        'lmcache_mp_lookup_hit_tokens_total{model_name="m",cache_salt=""} 256\n'
    )
    assert metric_value(mp_page, "lmcache_lookup_tokens", VLLM) == 512.0  # the lmcache server's own page
    assert metric_value(mp_page, "lmcache_lookup_hits", SGLANG) == 256.0


def test_environment_is_untouched() -> None:
    assert API_KEY_ENV not in os.environ
