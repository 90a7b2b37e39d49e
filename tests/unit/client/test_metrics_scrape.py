"""Tests for /metrics parsing, counter deltas and hit rates (harness.client.scrape)."""

from __future__ import annotations

import re

import pytest

from harness.client.scrape import (
    LMCACHE_METRICS,
    METRICS,
    METRICS_BY_TAG,
    VLLM,
    HitRates,
    MetricsSnapshot,
    cache_counter_deltas,
    delta,
    hit_rates,
    is_cumulative,
    metric_value,
    parse_candidate,
    parse_metrics,
    sum_metric,
    summarize,
)
from harness.client.scrape import _spec as _spec
from tests.support import GOLDEN

GOLDEN_METRICS = GOLDEN / "metrics"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
VLLM_COUNTER_DELTAS = {
    "gpu_prefix_queries": 8192.0,
    "gpu_prefix_hits": 6144.0,
    "external_prefix_queries": 2048.0,
    "external_prefix_hits": 1024.0,
    "prompt_tokens": 8192.0,
    "generation_tokens": 128.0,
    "engine_ttft_seconds": 0.75,
    "engine_ttft_requests": 4.0,
}
"""The tagged counter deltas between vllm_before.prom and vllm_after.prom, read off the two pages by hand."""


def load(name: str) -> MetricsSnapshot:
    return parse_metrics((GOLDEN_METRICS / name).read_text(encoding="utf-8"))


def raw(name: str) -> str:
    return (GOLDEN_METRICS / name).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def before() -> MetricsSnapshot:
    return load("vllm_before.prom")


@pytest.fixture(scope="module")
def after() -> MetricsSnapshot:
    return load("vllm_after.prom")


def test_snapshot_keys_and_values(after: MetricsSnapshot) -> None:
    key = ("vllm:prefix_cache_queries_total", frozenset({("engine", "0"), ("model_name", MODEL)}))
    assert after[key] == 18432.0
    assert after.value("vllm:kv_cache_usage_perc", engine="0", model_name=MODEL) == 0.3125
    assert after.value("process_resident_memory_bytes") == 8.2e9
    assert after.value("vllm:kv_cache_usage_perc") is None  # labels must match exactly
    assert after.type_of("vllm:prefix_cache_queries_total") == "counter"
    assert after.type_of("vllm:kv_cache_usage_perc") == "gauge"
    assert after.type_of("vllm:time_to_first_token_seconds_sum") == "histogram"
    assert after.type_of("nope") == "unknown"
    assert "vllm:request_success_total" in after.names()


def test_snapshot_is_immutable(after: MetricsSnapshot) -> None:
    key = next(iter(after))
    with pytest.raises(TypeError):
        after[key] = 1.0  # type: ignore[index]  # read-only on purpose: the runtime refusal
    with pytest.raises(TypeError):
        after.types["x"] = "counter"  # type: ignore[index]  # read-only on purpose: the runtime refusal
    assert len(after) == len(list(after))


def test_delta_keeps_only_cumulative_samples(before: MetricsSnapshot, after: MetricsSnapshot) -> None:
    d = delta(before, after)
    names = d.names()
    assert "vllm:prefix_cache_queries_total" in names
    assert "vllm:time_to_first_token_seconds_sum" in names
    assert "vllm:time_to_first_token_seconds_count" in names
    assert "vllm:time_to_first_token_seconds_bucket" in names
    assert "python_gc_objects_collected_total" in names
    assert "vllm:kv_cache_usage_perc" not in names  # gauge
    assert "vllm:num_requests_running" not in names
    assert "vllm:prefix_cache_queries_created" not in names
    assert "process_resident_memory_bytes" not in names
    labels = {"engine": "0", "model_name": MODEL}
    assert d.value("vllm:prefix_cache_queries_total", **labels) == 8192.0
    assert d.value("vllm:time_to_first_token_seconds_count", **labels) == 4.0
    assert d.value("vllm:time_to_first_token_seconds_sum", **labels) == pytest.approx(0.75)
    assert d.value("vllm:request_success_total", finished_reason="length", **labels) == 4.0
    assert d.value("vllm:request_success_total", finished_reason="stop", **labels) == 0.0


def test_delta_handles_reset_and_new_series() -> None:
    before = parse_metrics('# TYPE a counter\na_total{x="1"} 100\n')
    after = parse_metrics('# TYPE a counter\na_total{x="1"} 30\na_total{x="2"} 5\n')
    d = delta(before, after)
    assert d.value("a_total", x="1") == 30.0  # went down: restarted, counts from 0
    assert d.value("a_total", x="2") == 5.0  # new series
    assert delta(after, after).value("a_total", x="1") == 0.0


def test_untyped_total_counts_as_counter() -> None:
    assert is_cumulative("foo_total", "unknown")
    assert not is_cumulative("foo", "unknown")
    assert not is_cumulative("foo_created", "counter")
    assert is_cumulative("h_bucket", "histogram")
    assert not is_cumulative("g", "gauge")


def test_sum_metric_across_label_sets(before: MetricsSnapshot, after: MetricsSnapshot) -> None:
    d = delta(before, after)
    assert sum_metric(d, "vllm:request_success_total") == 4.0
    assert sum_metric(after, "vllm:request_success_total") == 14.0
    assert sum_metric(after, "vllm:request_success_total", {"finished_reason": "stop"}) == 3.0
    assert sum_metric(after, "python_gc_objects_collected_total") == 12948.0 + 4428.0 + 529.0
    assert sum_metric(after, "does_not_exist") is None
    assert sum_metric(after, "vllm:request_success_total", {"finished_reason": "nope"}) is None


def test_hit_rates(before: MetricsSnapshot, after: MetricsSnapshot) -> None:
    rates = hit_rates(delta(before, after))
    assert rates == HitRates(gpu=0.75, external=0.5)


def test_hit_rates_none_without_queries(after: MetricsSnapshot) -> None:
    assert hit_rates(delta(after, after)) == HitRates(gpu=None, external=None)
    legacy = load("vllm_legacy_names.prom")
    assert hit_rates(delta(legacy, legacy)).external is None


PD_TAGS = (
    "pd_prefill_queue_seconds",
    "pd_prefill_queued",
    "pd_prefill_seconds",
    "pd_prefilled",
    "pd_decode_queue_seconds",
    "pd_decode_queued",
    "pd_decode_prefill_seconds",
    "pd_decode_prefilled",
    "pd_transferred_tokens",
    "kv_transfer_seconds",
    "kv_transfers",
    "kv_transfer_bytes",
    "kv_transfer_descriptors",
    "kv_transfer_failures",
)


def test_tagged_values(before: MetricsSnapshot, after: MetricsSnapshot) -> None:
    d = delta(before, after)
    assert summarize(d) == {
        **VLLM_COUNTER_DELTAS,
        "kv_usage": None,  # gauges are not in a delta
        "requests_running": None,
        "requests_waiting": None,
        "queue_seconds": None,  # the page has no queue or prefill histograms
        "queued_requests": None,
        "prefill_seconds": None,
        "prefilled_requests": None,
        **dict.fromkeys(PD_TAGS),  # nor a P/D proxy's role-labelled samples or NIXL's
    }
    gauges = summarize(after)
    assert gauges["kv_usage"] == 0.3125
    assert gauges["requests_running"] == 2.0
    assert gauges["requests_waiting"] == 1.0


def test_data_parallel_engines_are_combined() -> None:
    dp = load("vllm_dp2.prom")
    assert metric_value(dp, "requests_running") == 4.0
    assert metric_value(dp, "requests_waiting") == 2.0
    assert metric_value(dp, "kv_usage") == pytest.approx(0.375)  # mean, not sum
    assert metric_value(dp, "gpu_prefix_queries") == 10000.0
    assert metric_value(dp, "gpu_prefix_queries", labels={"engine": "1"}) == 6000.0
    empty = parse_metrics("")
    rates = hit_rates(delta(empty, dp))  # everything counted since start
    assert rates.gpu == pytest.approx(0.4)
    assert rates.external == pytest.approx(0.25)


def test_legacy_vllm_names_are_found() -> None:
    legacy = load("vllm_legacy_names.prom")
    assert metric_value(legacy, "kv_usage") == 0.0625
    assert metric_value(legacy, "gpu_prefix_queries") == 4096.0
    assert metric_value(legacy, "external_prefix_queries") is None
    assert hit_rates(delta(parse_metrics(""), legacy)).gpu == 0.25


def test_cache_counter_deltas_from_raw_pages() -> None:
    values = cache_counter_deltas(raw("vllm_before.prom"), raw("vllm_after.prom"))
    assert values == VLLM_COUNTER_DELTAS
    legacy = raw("vllm_legacy_names.prom")
    assert "external_prefix_queries" not in cache_counter_deltas(legacy, legacy)


def test_unknown_engine_family_gives_none(after: MetricsSnapshot) -> None:
    assert metric_value(after, "kv_usage", family="sglang") is None
    with pytest.raises(KeyError):
        metric_value(after, "no_such_tag")


def test_table_is_well_formed() -> None:
    assert len({spec.tag for spec in METRICS}) == len(METRICS)
    assert set(METRICS_BY_TAG) == {spec.tag for spec in METRICS}
    for spec in METRICS:
        assert spec.unit and spec.formula
        assert spec.names[VLLM]
        for name in spec.names[VLLM]:
            assert name.startswith("vllm:")
            # counters: Prometheus counters, or a histogram's cumulative _sum and _count
            sample = parse_candidate(name).name  # a label selector follows the sample name
            assert sample.endswith(("_total", "_sum", "_count")) == (spec.kind == "counter")


GOOD_ENTRY = {"unit": "tokens", "kind": "counter", "formula": "f", "vllm": ["a_total"]}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("colour", "red", "unknown field 'colour'"),
        ("kind", "histogram", "kind 'histogram' is not one of counter, gauge"),
        ("aggregate", "p99", "aggregate 'p99' is not one of sum, mean, max"),
        ("vllm", "a_total", "vllm must be a non-empty list of sample names"),
        ("formula", None, "needs a unit, a formula"),
    ],
)
def test_a_bad_table_entry_names_its_tag_and_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^metrics\.yaml: some_tag: {re.escape(message)}"):
        _spec("some_tag", {**GOOD_ENTRY, field: value})
    with pytest.raises(ValueError, match="some_tag: expected a mapping"):
        _spec("some_tag", ["a_total"])
    assert _spec("some_tag", GOOD_ENTRY).names == {"vllm": ("a_total",)}


def test_the_table_file_keeps_each_sections_order_and_columns() -> None:
    assert [spec.tag for spec in METRICS][:2] == ["gpu_prefix_queries", "gpu_prefix_hits"]
    assert METRICS_BY_TAG["kv_usage"].aggregate == "mean" and METRICS_BY_TAG["kv_usage"].kind == "gauge"
    assert list(METRICS_BY_TAG["gpu_prefix_hits"].names) == ["vllm", "sglang", "trtllm"]
    assert METRICS_BY_TAG["gpu_prefix_hits"].names["sglang"][0] == 'sglang:cached_tokens_total{cache_source="device"}'
    assert all(list(spec.names) == ["lmcache"] for spec in LMCACHE_METRICS)
    assert not {spec.tag for spec in METRICS} & {spec.tag for spec in LMCACHE_METRICS}


def test_invalid_text_raises_value_error() -> None:
    with pytest.raises(ValueError):
        parse_metrics("this is { not prometheus\n")
