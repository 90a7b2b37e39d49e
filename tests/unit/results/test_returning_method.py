"""``between_turns: auto``: the method each arm ran (from the manifest's notes), the GPU KV capacity read from a
``/metrics`` page, and the cache gates naming the method and, where nothing could drop the cache, the fix.

The records and counters are the ones of ``test_validity`` (a valid two-arm run); each test changes the least
that trips what it checks, so a gate that does not fire, or fires without its words, fails the test.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from harness.results.aggregate import (
    FILLER_TOKENS_DETAIL,
    GPU_KV_SOURCE_DETAIL,
    GPU_KV_TOKENS_DETAIL,
    METHOD_DETAIL,
    RESET_DETAIL,
    aggregate,
    between_turns_methods,
)
from harness.results.validity import with_reset_unavailable
from harness.runs.probe import gpu_kv_capacity
from tests.unit.results.test_validity import DONE, metrics, records, scenario
from workloads.config import BetweenTurns

HOT_OFF = {("OFF", 8000, 2): {"gpu_prefix_hits": 0.9 * 4 * 8000}}
FILLER_NOTES = {METHOD_DETAIL: "filler", FILLER_TOKENS_DETAIL: "150000", GPU_KV_TOKENS_DETAIL: "120000"}


def test_auto_names_the_method_each_arm_ran_and_explicit_modes_name_themselves() -> None:
    details = {
        "OFF": {**FILLER_NOTES, GPU_KV_SOURCE_DETAIL: "metrics"},
        "ON": {METHOD_DETAIL: "reset_prefix_cache"},
    }
    methods = between_turns_methods(scenario(), details)
    assert [(m.arm, m.method, m.filler_tokens, m.gpu_kv_tokens) for m in methods] == [
        ("OFF", "filler", 150_000, 120_000),
        ("ON", "reset_prefix_cache", None, None),
    ]
    assert methods[0].describe() == "filler 150,000 tokens (GPU KV 120,000 tokens from /metrics)"
    assert between_turns_methods(scenario(), {}) == []  # auto arms that never started chose nothing

    explicit = scenario(
        workload={"kind": "multi_round_qa", "context_tokens": [100], "between_turns": {"mode": "reset_prefix_cache"}}
    )
    no_reset = {"OFF": {RESET_DETAIL: "http://h has no POST /reset_prefix_cache"}}
    assert [m.method for m in between_turns_methods(explicit, no_reset)] == ["unavailable", "reset_prefix_cache"]


def test_filler_that_did_not_evict_is_inconclusive_naming_the_filler() -> None:
    reset = {METHOD_DETAIL: "reset_prefix_cache"}
    details = {"OFF": {**FILLER_NOTES, GPU_KV_SOURCE_DETAIL: "gpu_kv_tokens"}, "ON": reset}
    result = aggregate(scenario(), "r", records(), DONE, metrics(HOT_OFF), details=details)
    assert result.validity is not None and result.validity.verdict == "inconclusive"
    (finding,) = result.validity.findings
    assert finding.gate == "reset_missed" and finding.arm == "OFF"
    assert "between_turns auto (filler 150,000 tokens (GPU KV 120,000 tokens from gpu_kv_tokens))" in finding.message
    assert "the filler did not evict turn 1's KV" in finding.message
    cold = aggregate(scenario(), "r", records(), DONE, metrics(), details=details)
    assert cold.validity is not None and cold.validity.verdict == "valid"
    assert [m.method for m in cold.between_turns] == ["filler", "reset_prefix_cache"]


def test_no_way_to_drop_the_cache_names_the_fix_once_per_arm() -> None:
    why = "http://h has no POST /reset_prefix_cache ...; pass --gpu-kv-tokens N ... (vLLM: VLLM_SERVER_DEV_MODE=1)"
    details = {"OFF": {METHOD_DETAIL: "unavailable", RESET_DETAIL: why}, "ON": {METHOD_DETAIL: "reset_prefix_cache"}}
    hot = {**HOT_OFF, ("OFF", 100, 2): {"gpu_prefix_hits": 0.9 * 4 * 100}}
    result = aggregate(scenario(), "r", records(), DONE, metrics(hot), details=details)
    assert result.validity is not None
    judged = with_reset_unavailable(result.validity, {"OFF": why}, result.cells, result.cache, 0.5)
    assert judged.verdict == "inconclusive"
    messages = [f.message for f in judged.findings]
    assert len(messages) == 2 and all("between_turns auto found no way to drop that cache" in m for m in messages)
    assert sum(m.endswith(why) for m in messages) == 1  # the fix is said once for the arm, not per cell


VLLM_PAGE = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="88014"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",num_gpu_blocks="88000"} 1.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 12.0
"""


@pytest.mark.parametrize(
    ("page", "capacity"),
    [
        (VLLM_PAGE, (88_014 + 88_000) * 16),  # data-parallel: each engine's cache counts
        (VLLM_PAGE.replace('num_gpu_blocks="88000"', 'num_gpu_blocks="None"'), None),  # not yet sized
        ("# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total 1.0\n", None),
        ("not prometheus {{{", None),
    ],
)
def test_gpu_kv_capacity_from_a_metrics_page(page: str, capacity: int | None) -> None:
    assert gpu_kv_capacity(page) == capacity


def test_gpu_kv_tokens_goes_with_mode_auto_only() -> None:
    assert BetweenTurns().mode == "auto"
    assert BetweenTurns(gpu_kv_tokens=1_000_000).gpu_kv_tokens == 1_000_000
    with pytest.raises(ValidationError, match="gpu_kv_tokens sizes mode 'auto''s filler"):
        BetweenTurns(mode="filler", filler_tokens=100, gpu_kv_tokens=1_000)
