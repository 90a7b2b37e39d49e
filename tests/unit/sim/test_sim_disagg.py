"""Prefill/decode disaggregation on the virtual clock (:mod:`harness.sim.disagg`, :mod:`harness.calibrate.pd_whatif`).

Expected values come from the model's own formulas (the link: ``per_transfer_s + bytes / bandwidth``; bytes:
tokens x the deployment's KV bytes per token) and from the colocated engine run on its own, never from
numbers copied from an output.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from pydantic import ValidationError

from harness.calibrate import pd_whatif
from harness.calibrate.whatif import settings_for
from harness.calibrate.whatif import turn2 as colocated_turn2
from harness.sim.config import SimEngineConfig
from harness.sim.disagg import (
    NIXL_PULL_TCP_GBPS,
    NIXL_PUSH_GBPS,
    Cluster,
    ClusterRequest,
    Disaggregation,
    KvLink,
    TtftParts,
)
from harness.sim.scheduler import Event, FinishEvent, ignore_event
from harness.sim.server import running_server
from harness.sim.settings import SimSettings
from offload.profiles import BUILTIN_PROFILES

MODEL, HARDWARE = "llama-3.1-8b", "h100-sxm"
LONG = 131072


def _by_name(tokens: int, link_gbps: tuple[float, ...] = (NIXL_PUSH_GBPS, NIXL_PULL_TCP_GBPS)) -> dict[str, TtftParts]:
    points = pd_whatif.run_pd_whatif(MODEL, HARDWARE, [tokens], link_gbps=link_gbps)
    return {p.deployment: p.parts for p in points}


def _assert_sums(parts: TtftParts) -> None:
    assert math.isclose(parts.parts_s, parts.ttft_s, rel_tol=1e-12, abs_tol=1e-12), parts
    for name in ("queue_s", "load_s", "prefill_s", "transfer_s", "admission_s", "first_step_s"):
        assert getattr(parts, name) >= 0, (name, parts)


def test_link_alone_takes_per_transfer_plus_bytes_over_bandwidth() -> None:
    for bandwidth, size, fixed in ((49e9, 1e9, 1e-3), (0.5e9, 1e9, 1e-3), (49e9, 4e9, 0.0), (10e9, 2e9, 5e-3)):
        link = KvLink(bandwidth, fixed)
        transfer = link.start(size, 2.0)
        due = link.next_event()
        while due is not None:
            link.advance(due)
            due = link.next_event()
        assert transfer.done_at is not None
        assert transfer.done_at - transfer.started_at == pytest.approx(fixed + size / bandwidth, rel=1e-12)


def test_overlapping_transfers_share_the_bandwidth() -> None:
    bandwidth, fixed, size = 10e9, 1e-3, 1e9
    link = KvLink(bandwidth, fixed)
    first = link.start(size, 0.0)
    half_way = fixed + size / bandwidth / 2
    link.advance(half_way)
    second = link.start(size, half_way)
    while (due := link.next_event()) is not None:
        link.advance(due)
    assert first.done_at is not None and second.done_at is not None
    # the first is alone until the second's fixed cost is paid, then each moves at half the bandwidth
    shared_from = half_way + fixed
    left = size - (shared_from - fixed) * bandwidth
    assert first.done_at == pytest.approx(shared_from + left / (bandwidth / 2), rel=1e-12)
    # then the second is alone again with what it has left
    second_left = size - left
    assert second.done_at == pytest.approx(first.done_at + second_left / bandwidth, rel=1e-12)
    assert first.done_at - first.started_at > fixed + size / bandwidth


def test_turn2_parts_sum_to_ttft_and_transfer_follows_bytes_and_bandwidth() -> None:
    tokens = 32768
    by = _by_name(tokens)
    bytes_per_token = SimSettings(model=MODEL, hardware=HARDWARE).deployment().kv_bytes_per_token
    fixed = Disaggregation().per_transfer_ms / 1e3
    for name, parts in by.items():
        _assert_sums(parts)
        if name.startswith("colocated"):
            assert parts.transfer_bytes == 0 and parts.transfer_s == parts.admission_s == parts.first_step_s == 0
            continue
        gbps = NIXL_PUSH_GBPS if f"{NIXL_PUSH_GBPS:g} GB/s" in name else NIXL_PULL_TCP_GBPS
        # P/D moves the whole prompt's KV (the decode side's cache was reset), tier or not
        assert parts.transfer_bytes == parts.prompt_tokens * bytes_per_token
        assert parts.transfer_s == pytest.approx(fixed + parts.transfer_bytes / (gbps * 1e9), rel=1e-9)
        assert parts.first_step_s > 0
    # the colocated cluster is the colocated engine: the same TTFT as the single-engine what-if
    alone, _, _ = colocated_turn2(settings_for(MODEL, HARDWARE, "compute-only", 25.0), tokens, 128)
    assert by["colocated"].ttft_s == pytest.approx(alone, rel=1e-12)


def test_prefill_side_tier_skips_recompute_but_the_transfer_still_happens() -> None:
    by = _by_name(LONG, (NIXL_PUSH_GBPS,))
    label = f"1P1D {NIXL_PUSH_GBPS:g} GB/s"
    bare, tiered = by[label], by[f"{label} + CPU tier"]
    assert bare.loaded_tokens == 0 and tiered.loaded_tokens > 0.9 * tiered.prompt_tokens
    assert tiered.load_s > 0
    # the tier replaces recompute: prefill (with the load) far below the bare prefill
    assert tiered.load_s + tiered.prefill_s < 0.5 * bare.prefill_s
    # ... but the KV still crosses the link, whole
    assert tiered.transfer_bytes == bare.transfer_bytes > 0
    assert tiered.transfer_s == pytest.approx(bare.transfer_s, rel=1e-12)
    # the prefill side is the colocated engine: its load and prefill are colocated-with-tier's
    coloc = by["colocated + CPU tier"]
    assert tiered.load_s + tiered.prefill_s == pytest.approx(coloc.load_s + coloc.prefill_s, rel=1e-12)


def test_slow_link_loses_to_colocated_at_long_contexts_a_fast_one_costs_only_its_transfer() -> None:
    by = _by_name(LONG)
    colocated = by["colocated"]
    slow, fast = by[f"1P1D {NIXL_PULL_TCP_GBPS:g} GB/s"], by[f"1P1D {NIXL_PUSH_GBPS:g} GB/s"]
    assert slow.ttft_s > 2 * colocated.ttft_s
    # slow: moving the KV takes longer than computing it
    assert slow.transfer_s > slow.prefill_s
    # fast: P/D adds the transfer and one decode step to the same prefill, a small share of it
    extra = fast.transfer_s + fast.admission_s + fast.first_step_s
    assert fast.ttft_s - colocated.ttft_s == pytest.approx(extra, rel=1e-9)
    assert extra < 0.1 * colocated.ttft_s
    # and with the tier on its prefill side the fast P/D beats colocated without one
    assert by[f"1P1D {NIXL_PUSH_GBPS:g} GB/s + CPU tier"].ttft_s < colocated.ttft_s
    # the slow link's cost does not shrink with the tier: the whole prompt still crosses it
    assert by[f"1P1D {NIXL_PULL_TCP_GBPS:g} GB/s + CPU tier"].ttft_s > colocated.ttft_s


def _two_requests(blocks: int | None) -> tuple[list[ClusterRequest], dict[str, float]]:
    """Two different 1,000-token prompts at once, 50 output tokens each; when each one finished."""
    settings = SimSettings(model=MODEL, hardware=HARDWARE, num_gpu_blocks_override=blocks)
    cluster = Cluster(settings, Disaggregation())
    finished: dict[str, float] = {}

    def sink_for(name: str) -> Callable[[Event], None]:
        def sink(event: Event) -> None:
            if isinstance(event, FinishEvent):
                finished[name] = cluster.clock

        return sink

    requests = [
        cluster.submit(name, list(range(offset, offset + 1000)), 50, sink_for(name))
        for name, offset in (("a", 1000), ("b", 20000))
    ]
    cluster.run()
    return requests, finished


def test_decode_admission_waits_while_the_decode_pool_is_full() -> None:
    # 100 blocks of 16 tokens: one 1,050-token request (66 blocks) fits on the decode instance, two do not
    requests, finished = _two_requests(100)
    first, second = (request.parts(True) for request in requests)
    _assert_sums(first)
    _assert_sums(second)
    assert first.admission_s == 0
    assert second.admission_s > 0
    b = requests[1].decode
    assert b is not None and b.first_scheduled_at is not None
    assert b.first_scheduled_at >= finished["a"]  # admitted once a's blocks were free
    # with room for both, b joins a's batch at the end of the step running when it arrives
    roomy, done = _two_requests(None)
    joined = roomy[1].decode
    assert joined is not None and joined.first_scheduled_at is not None
    assert joined.first_scheduled_at < done["a"]
    assert roomy[1].parts(True).admission_s < second.admission_s


def test_decode_side_prefix_cache_hit_is_not_sent_again() -> None:
    settings = SimSettings(model=MODEL, hardware=HARDWARE)
    cluster = Cluster(settings, Disaggregation())
    prompt = list(range(1000, 9000))
    first = cluster.submit("t1", prompt, 4, ignore_event)
    cluster.run()
    second = cluster.submit("t2", [*prompt, *range(60000, 60064)], 4, ignore_event)
    cluster.run()
    one, two = first.parts(True), second.parts(True)
    _assert_sums(two)
    assert one.decode_hit_tokens == 0 and two.decode_hit_tokens > 0
    sent = two.prompt_tokens - two.decode_hit_tokens
    assert two.transfer_bytes == sent * settings.deployment().kv_bytes_per_token
    assert two.transfer_s < one.transfer_s


def test_layout_must_fit_the_tensor_parallelism() -> None:
    settings = SimSettings(model="llama-3.1-70b", hardware=HARDWARE, tp=4, dtype="fp8")
    with pytest.raises(ValueError, match=r"disaggregation\.decode_gpus 2: must be a multiple of parallelism\.tp 4"):
        Cluster(settings, Disaggregation(prefill_gpus=4, decode_gpus=2))


def test_capacity_is_the_highest_rate_up_to_which_the_slo_holds() -> None:
    points = [
        pd_whatif.LoadedPoint("x", 2, rate, 10, 0.1, p90)
        for rate, p90 in ((1.0, 0.2), (2.0, 0.4), (4.0, 0.9), (8.0, 0.3))
    ] + [pd_whatif.LoadedPoint("y", 2, 1.0, 10, 0.1, 0.9)]
    assert pd_whatif.capacity(points, 0.5) == {"x": 2.0, "y": None}


def test_a_calibrated_comparison_charges_the_decode_engine_its_own_request_overhead() -> None:
    calibrated = pd_whatif.load_calibration("auto", MODEL, HARDWARE, "native")
    deployments = pd_whatif.deployments(MODEL, HARDWARE, link_gbps=[NIXL_PUSH_GBPS], calibrated=calibrated)
    pd = next(d for d in deployments if d.disaggregation is not None and d.tier)
    assert pd.settings.calibration is not None and pd.settings.offload.backend == "native"
    parts = pd_whatif.turn2(pd, 32768, 128)
    _assert_sums(parts)
    # the proxy sends the request to the idle decode engine again: it waits out its calibrated overhead
    assert parts.admission_s == pytest.approx(pd.settings.request_overhead_s(parts.prompt_tokens), rel=1e-9)
    assert parts.queue_s == pytest.approx(parts.admission_s, rel=1e-9)
    assert parts.loaded_tokens > 0


def test_transfers_that_leave_one_prefill_step_together_share_its_link() -> None:
    settings = SimSettings(model=MODEL, hardware=HARDWARE)
    layout = Disaggregation()
    cluster = Cluster(settings, layout)
    tokens = 3000  # both prompts fit one 8,192-token step: their prefills end together
    requests = [cluster.submit("x", list(range(40000, 40100)), 2, ignore_event)]  # a and b wait for the next step
    for name, offset in (("a", 1000), ("b", 20000)):
        requests.append(cluster.submit(name, list(range(offset, offset + tokens)), 2, ignore_event))
    cluster.run()
    x, a, b = (request.parts(True) for request in requests)
    assert x.ttft_s < a.queue_s + a.prefill_s  # x's transfer was over before theirs began
    assert a.queue_s + a.prefill_s == pytest.approx(b.queue_s + b.prefill_s, rel=1e-12)
    size = tokens * settings.deployment().kv_bytes_per_token
    shared = layout.per_transfer_ms / 1e3 + 2 * size / (layout.link_gbps * 1e9)
    assert a.transfer_s == pytest.approx(shared, rel=1e-9) and b.transfer_s == pytest.approx(shared, rel=1e-9)
    for parts in (a, b):
        _assert_sums(parts)


def test_tensor_parallel_instances_move_each_ranks_share_over_its_own_link() -> None:
    settings = SimSettings(model="llama-3.1-70b", hardware=HARDWARE, tp=4, dtype="fp8")
    layout = Disaggregation(prefill_gpus=8, decode_gpus=4)
    cluster = Cluster(settings, layout)
    assert (len(cluster.prefill), len(cluster.decode), cluster.gpus) == (2, 1, 12)
    requests = [
        cluster.submit(name, list(range(offset, offset + 2000)), 2, ignore_event)
        for name, offset in (("a", 1000), ("b", 20000))
    ]
    cluster.run()
    deployment = settings.deployment()
    for request in requests:
        parts = request.parts(True)
        _assert_sums(parts)
        assert parts.transfer_bytes == 2000 * deployment.kv_bytes_per_token_per_gpu * 4
        expected = layout.per_transfer_ms / 1e3 + parts.transfer_bytes / (layout.link_gbps * 1e9 * 4)
        assert parts.transfer_s == pytest.approx(expected, rel=1e-9)
    # two prefill instances, the least busy first: one request each, so neither queues behind the other
    assert cluster.prefill[0].stats.finished == cluster.prefill[1].stats.finished == 1


async def _first_token_s(url: str, prompt: list[int]) -> float:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 3, "stream": True}
    async with aiohttp.ClientSession() as session:
        sent = time.monotonic()
        async with session.post(url + "/v1/completions", json=body) as response:
            assert response.status == 200
            first: float | None = None
            frames = 0
            async for raw in response.content:
                if raw.startswith(b"data: {"):
                    first = time.monotonic() if first is None else first
                    frames += 1
            assert frames == 3 and first is not None
            return first - sent


async def test_the_simulator_server_runs_p_d_on_the_wall_clock() -> None:
    # a slow link makes the transfer the TTFT: 2,000 tokens x 4,096 B (tiny) at 0.02 GB/s is 0.41 s
    layout = Disaggregation(link_gbps=0.02)
    settings = SimSettings(model="tiny", hardware=HARDWARE, disaggregation=layout)
    prompt = list(range(1000, 3000))
    transfer_s = layout.per_transfer_ms / 1e3 + len(prompt) * settings.deployment().kv_bytes_per_token / 0.02e9
    async with running_server(settings, port=0) as url:
        pd_ttft = await _first_token_s(url, prompt)
        async with aiohttp.ClientSession() as session, session.post(url + "/reset_prefix_cache") as reset:
            assert reset.status == 200
    async with running_server(SimSettings(model="tiny", hardware=HARDWARE), port=0) as url:
        colocated_ttft = await _first_token_s(url, prompt)
    assert pd_ttft >= transfer_s  # the real-time loop cannot be earlier than its model
    assert colocated_ttft < transfer_s < pd_ttft


def test_a_colocated_settings_file_is_written_as_before(tmp_path: Path) -> None:
    settings = SimSettings(model="tiny", hardware=HARDWARE)
    settings.write(tmp_path / "colocated.json")
    assert "disaggregation" not in json.loads((tmp_path / "colocated.json").read_text())
    pd = settings.model_copy(update={"disaggregation": Disaggregation(link_gbps=5)})
    pd.write(tmp_path / "pd.json")
    assert SimSettings.load(tmp_path / "pd.json").disaggregation == Disaggregation(link_gbps=5)


def test_engine_kind_sim_takes_a_disaggregation_block() -> None:
    section = {"kind": "sim", "model": "tiny", "hardware": HARDWARE, "disaggregation": {"link_gbps": 0.5}}
    config = SimEngineConfig.model_validate(section)
    settings = SimSettings.from_engine_config(config, BUILTIN_PROFILES["cpu"], prefix_caching=True)
    assert settings.disaggregation == Disaggregation(link_gbps=0.5)
    with pytest.raises(ValidationError, match="link_gbps"):
        SimEngineConfig.model_validate({**section, "disaggregation": {"link_gbps": 0}})
    with pytest.raises(
        ValidationError, match=r"disaggregation\.decode_gpus 1: must be a multiple of parallelism\.tp 2"
    ):
        SimEngineConfig.model_validate({**section, "parallelism": {"tp": 2}, "disaggregation": {"prefill_gpus": 2}})


def test_a_request_aborted_during_its_transfer_never_reaches_the_decode_instance() -> None:
    settings = SimSettings(model=MODEL, hardware=HARDWARE)
    cluster = Cluster(settings, Disaggregation(link_gbps=NIXL_PULL_TCP_GBPS))
    gone = cluster.submit("gone", list(range(1000, 9000)), 8, ignore_event)
    while gone.transfer is None:
        due = cluster.next_event_time()
        assert due is not None
        cluster.advance_to(due)
    cluster.abort(gone)
    kept = cluster.submit("kept", list(range(20000, 21000)), 8, ignore_event)
    cluster.run()
    decode = cluster.decode[0]
    assert not gone.delivered and gone.decode is not None and gone.decode.first_token_at is None
    assert kept.served.first_token_at is not None and decode.stats.finished == 1
    assert not decode.has_work and not cluster.prefill[0].has_work
