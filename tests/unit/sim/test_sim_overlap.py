"""Compute and load together in the simulator: ``load_overlap`` none, layerwise, bidirectional (Cake).

The expected values are built from independent pieces (the time model's prefill of a token range,
the tier's bytes over its bandwidth), never copied from a run.
"""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from harness.calibrate.whatif import rows, run_whatif, settings_for, turn2
from harness.sim.scheduler import EngineCore, Event, SimRequest
from harness.sim.settings import SimSettings
from harness.sim.timemodel import TimeModel
from offload.profiles import OffloadProfile

MODEL, HARDWARE = "llama-3.1-8b", "h100-sxm"
KV_BYTES = 131072  # Llama-3.1-8B bf16, per token
LATENCY_S = 10e-6  # the what-if's CPU tier
CHUNK = 256


def model() -> TimeModel:
    return TimeModel(SimSettings(model=MODEL, hardware=HARDWARE).deployment())


def load_s(tokens: int, gbps: float) -> float:
    return LATENCY_S + tokens * KV_BYTES / (gbps * 1e9)


def test_profile_field_defaults_to_none_and_names_its_values() -> None:
    assert OffloadProfile(name="old").load_overlap == "none"
    assert OffloadProfile.model_validate_json('{"name": "old", "tiers": []}').load_overlap == "none"
    with pytest.raises(ValidationError) as error:
        OffloadProfile(name="x", load_overlap="both")  # type: ignore[arg-type]  # the refusal is what is tested
    text = str(error.value)
    assert "load_overlap" in text and all(v in text for v in ("'none'", "'layerwise'", "'bidirectional'"))


def test_none_loads_then_computes() -> None:
    ttft, cached, prompt = turn2(settings_for(MODEL, HARDWARE, "load-only", 5.0), 32768, 128)
    assert cached == 32512  # 127 full chunks of the 32,641 turn-1 tokens
    expected = load_s(cached, 5.0) + model().prefill_seconds(prompt, cached)
    assert math.isclose(ttft, expected, rel_tol=1e-9), (ttft, expected)


@pytest.mark.parametrize("gbps", [2.0, 50.0])
def test_layerwise_is_a_pipeline_over_the_layers(gbps: float) -> None:
    # 16,384 new tokens, so that at 50 GB/s their prefill is longer than the load (compute-bound)
    ttft, cached, prompt = turn2(settings_for(MODEL, HARDWARE, "layerwise", gbps), 32768, 16384)
    load, compute, layers = load_s(cached, gbps), model().prefill_seconds(prompt, cached), 32
    expected = load / layers + (layers - 1) / layers * max(load, compute) + compute / layers
    assert math.isclose(ttft, expected, rel_tol=1e-9), (ttft, expected)
    none, _, _ = turn2(settings_for(MODEL, HARDWARE, "load-only", gbps), 32768, 16384)
    assert ttft < none


@pytest.mark.parametrize("gbps", [1.0, 4.0, 25.0])
def test_bidirectional_is_the_best_meeting_point(gbps: float) -> None:
    ttft, loaded, prompt = turn2(settings_for(MODEL, HARDWARE, "bidirectional", gbps), 32768, 128)
    cached = 32512
    time = model()

    def split_cost(split: int) -> float:
        head = time.prefill_seconds(split, 0, 8192, sample=False)
        tail = load_s(cached - split, gbps) if split < cached else 0.0
        return max(head, tail)

    best = min(split_cost(s) for s in range(0, cached + 1, CHUNK))
    expected = best + time.prefill_seconds(prompt, cached)
    assert math.isclose(ttft, expected, rel_tol=1e-9), (ttft, expected)
    assert 0 < loaded < cached  # both halves used at these bandwidths


def test_bidirectional_never_slower_and_gains_most_where_compute_equals_load() -> None:
    bandwidths = [round(50 ** (i / 15), 3) for i in range(16)]  # 1 to 50 GB/s
    table = rows(run_whatif(MODEL, HARDWARE, [32768, 131072], bandwidths))
    for length in (32768, 131071):
        mine = [r for r in table if r.tokens == length]
        for row in mine:
            better = min(row.ttft_s["compute-only"], row.ttft_s["load-only"])
            assert row.ttft_s["bidirectional"] <= better * (1 + 1e-9), row
            assert row.ttft_s["layerwise"] <= row.ttft_s["load-only"] * (1 + 1e-9), row
        balance = [abs(math.log(r.ttft_s["compute-only"] / r.ttft_s["load-only"])) for r in mine]
        gain = [r.gain_vs_better for r in mine]
        assert gain.index(max(gain)) == balance.index(min(balance)), (gain, balance)
        assert max(gain) > 1.5 > min(gain[0], gain[-1])  # large where balanced, small at the extremes


def test_two_bidirectional_requests_share_the_gpu_and_the_tier() -> None:
    settings = settings_for(MODEL, HARDWARE, "bidirectional", 5.0)
    core = EngineCore(settings)
    events: list[Event] = []
    prompts = [list(range(1000, 9192)), list(range(20000, 28192))]
    now = 0.0
    for index, prompt in enumerate(prompts):
        core.add_request(SimRequest(f"warm-{index}", prompt, 1, events.append), now)
    now = _drain(core, now)
    now = max([now, *(tier.write_busy_until for tier in core.tiers.tiers)])
    core.reset_prefix_cache()
    second = [SimRequest(f"again-{i}", [*p, 7, 7, 7], 2, events.append) for i, p in enumerate(prompts)]
    for request in second:
        core.add_request(request, now)
    _drain(core, now)
    assert all(r.outputs == 2 and r.cached_tokens and r.cached_tokens > 0 for r in second)
    assert core.num_running == 0 and core.pool.used == 0


def _drain(core: EngineCore, now: float) -> float:
    while core.has_work:
        plan = core.plan(now)
        if plan is None:
            wakeup = core.next_wakeup()
            assert wakeup is not None and wakeup > now
            now = wakeup
            continue
        now += plan.seconds
        core.complete(plan, now)
    return now
