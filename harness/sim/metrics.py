"""``/metrics`` of the simulator, in Prometheus text format with vLLM's metric names.

The values are read from the engine's counters at scrape time by a custom collector in a private
:class:`~prometheus_client.CollectorRegistry`, so several servers can live in one process (tests)
and nothing is counted twice. Prefix-cache counters are in tokens, as in vLLM:

* ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` -- prompt tokens looked
  up in the HBM prefix cache, and tokens found there (only while the HBM prefix cache is on);
* ``vllm:external_prefix_cache_queries_total`` / ``vllm:external_prefix_cache_hits_total`` --
  the same for the offload tiers (the KV connector, in vLLM's terms);
* ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``;
* ``vllm:cache_config_info`` -- vLLM's info gauge (value 1) whose labels ``num_gpu_blocks`` and ``block_size``
  give the HBM KV cache's size: what ``between_turns: auto`` sizes its filler traffic from;
* gauges ``vllm:kv_cache_usage_perc`` (referenced fraction of HBM blocks, 0..1, as vLLM reports
  it), ``vllm:num_requests_running`` (loading requests included), ``vllm:num_requests_waiting``;
* histograms ``vllm:time_to_first_token_seconds`` (arrival to first token), ``vllm:request_queue_time_seconds``
  (arrival to first scheduling) and ``vllm:request_prefill_time_seconds`` (first scheduling to first token), with
  vLLM's buckets. The simulator's arrival is when its engine core takes the request, after the server parsed and
  tokenized it; its calibrated request overhead (counted from the server's receipt) falls in its queue time. vLLM
  0.26 starts its clock when its renderer takes a chat request, before the chat template and tokenizing, and
  counts neither as queue time;
* ``kvbench_sim:*`` -- simulator-only extras (preemptions, steps, busy time, tier traffic).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from .faults import FaultInjector
from .scheduler import EngineCore, Histogram

LABELS = ("model_name", "engine")


class SimCollector(Collector):
    """Turns the engine's counters into metric families on every scrape."""

    def __init__(self, core: EngineCore, model_name: str, faults: FaultInjector | None = None) -> None:
        self._core = core
        self._labels = [model_name, "0"]
        self._faults = faults

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=LABELS)
        family.add_metric(self._labels, value)
        return family

    def _histogram(self, name: str, doc: str, histogram: Histogram) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=LABELS)
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip(histogram.bounds, histogram.buckets, strict=True):
            cumulative += count
            buckets.append((repr(bound), cumulative))
        buckets.append(("+Inf", histogram.count))
        family.add_metric(self._labels, buckets, histogram.total)
        return family

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=LABELS)
        family.add_metric(self._labels, value)
        return family

    def collect(self) -> Iterator[Metric]:
        core = self._core
        stats = core.stats
        yield self._counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_cache_queries,
        )
        yield self._counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            stats.prefix_cache_hits,
        )
        yield self._counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector, in terms of number of queried tokens.",
            stats.external_queries,
        )
        yield self._counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector, in terms of number of cached tokens.",
            stats.external_hits,
        )
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens)
        yield self._counter("vllm:generation_tokens", "Number of generation tokens processed.", stats.generation_tokens)
        config = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["engine", "block_size", "num_gpu_blocks"],
        )
        config.add_metric([self._labels[1], str(core.block_tokens), str(core.pool.num_blocks)], 1.0)
        yield config
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", core.pool.usage)
        yield self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", core.num_running
        )
        yield self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", core.num_waiting)
        yield self._histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", stats.ttft
        )
        yield self._histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            stats.queue,
        )
        yield self._histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            stats.prefill,
        )
        yield self._counter("kvbench_sim:preemptions", "Requests preempted for lack of KV blocks.", stats.preemptions)
        yield self._counter("kvbench_sim:engine_steps", "Engine steps run.", stats.steps)
        yield self._counter("kvbench_sim:engine_busy_seconds", "Modelled time spent in steps.", stats.busy_s)
        yield self._counter("kvbench_sim:hbm_evicted_blocks", "Cached HBM blocks evicted.", core.pool.evictions)
        tier_families = (
            (
                CounterMetricFamily(
                    "kvbench_sim:tier_bytes_written", "Bytes written to an offload tier.", labels=[*LABELS, "tier"]
                ),
                "bytes_written",
            ),
            (
                CounterMetricFamily(
                    "kvbench_sim:tier_bytes_read", "Bytes loaded from an offload tier.", labels=[*LABELS, "tier"]
                ),
                "bytes_read",
            ),
            (
                CounterMetricFamily(
                    "kvbench_sim:tier_evicted_chunks", "Chunks evicted from an offload tier.", labels=[*LABELS, "tier"]
                ),
                "evictions",
            ),
        )
        hits = CounterMetricFamily(
            "kvbench_sim:tier_hit_tokens",
            "Prompt tokens loaded from an offload tier (by tier kind).",
            labels=[*LABELS, "tier"],
        )
        for tier in core.tiers.tiers:
            hits.add_metric([*self._labels, tier.kind], float(stats.tier_hits.get(tier.kind, 0)))
        yield hits
        for family, attribute in tier_families:
            for tier in core.tiers.tiers:
                family.add_metric([*self._labels, tier.kind], float(getattr(tier, attribute)))
            yield family
        if self._faults is not None and self._faults.enabled:
            injected = CounterMetricFamily(
                "kvbench_sim:faults_injected", "Faults injected (testing), by kind.", labels=[*LABELS, "kind"]
            )
            for kind, count in sorted(self._faults.injected.items()):
                injected.add_metric([*self._labels, kind], float(count))
            yield injected


def metrics_registry(core: EngineCore, model_name: str, faults: FaultInjector | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SimCollector(core, model_name, faults))
    # process_start_time_seconds & co., as vLLM exposes them: kvbench sees a restart by the start time
    ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
