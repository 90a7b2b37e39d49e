"""One definition of a hit rate: the requests' usage first, /metrics counters only where they do not overlap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offload.hits import counter_hit_rate, usage_hit_rate

SOAK = Path(__file__).resolve().parents[3] / "docs" / "results" / "gpu-soak-llama8b-lmcache-h100"


def test_usage_hit_rate_is_the_share_of_summed_prompt_tokens() -> None:
    assert usage_hit_rate(1000.0 + 3000.0, 900.0 + 0.0) == pytest.approx(0.225)
    assert usage_hit_rate(0.0, 0.0) is None


def test_counter_hit_rate_sums_gpu_and_tier_hits() -> None:
    assert counter_hit_rate(2000.0, 500.0, 1000.0) == pytest.approx(0.75)
    assert counter_hit_rate(2000.0, None, None) == 0.0  # prefix cache off: nothing served, not unknown
    assert counter_hit_rate(0.0, 1.0, 1.0) is None and counter_hit_rate(None, 1.0, 1.0) is None


def test_overlapping_counters_are_unknown_not_capped() -> None:
    """The committed 1x H100 LMCache soak: vLLM re-counts GPU lookups of requests waiting for tier loads."""
    rows = [json.loads(line) for line in (SOAK / "intervals.jsonl").read_text().splitlines()]
    before, after = rows[0]["counters"], rows[1]["counters"]
    diff = {key: after[key] - before[key] for key in after}
    assert diff["gpu_prefix_queries"] > 2 * diff["prompt_tokens"]
    assert counter_hit_rate(diff["prompt_tokens"], diff["gpu_prefix_hits"], diff["external_prefix_hits"]) is None
    assert counter_hit_rate(2000.0, 1500.0, 1000.0) is None
