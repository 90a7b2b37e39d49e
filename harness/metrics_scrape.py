"""Engine ``/metrics`` scraping: immutable snapshots, counter deltas, and the metrics kvbench reads.

A scrape of Prometheus text becomes a :class:`MetricsSnapshot`, an immutable mapping from
``(sample name, frozenset of (label, value) pairs)`` to a float. Counters only mean something as
differences, so a measurement takes a snapshot before and after and works on
:func:`delta`. :data:`METRICS` is a declarative table of what kvbench reads, with one column of
sample names per engine family (only vLLM is filled in today; SGLang, TensorRT-LLM or LMCache
names are added as further entries of each :attr:`MetricSpec.names`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

SampleKey = tuple[str, frozenset[tuple[str, str]]]
"""(sample name, frozenset of (label name, label value) pairs)."""

EngineFamily = str
"""Which column of :data:`METRICS` to read: ``"vllm"`` today; ``"sglang"``, ``"trtllm"``... later."""
VLLM: EngineFamily = "vllm"

_CUMULATIVE_SUFFIXES = ("_sum", "_count", "_bucket")
_HISTOGRAM_TYPES = frozenset({"histogram", "summary", "gaugehistogram"})


class MetricsSnapshot(Mapping[SampleKey, float]):
    """One scrape (or one delta of two scrapes): an immutable mapping of samples to values.

    Besides the samples it remembers the Prometheus type of each sample's family (``counter``,
    ``gauge``, ``histogram``, ``summary``, ``unknown``...), which :func:`delta` needs.
    """

    __slots__ = ("_samples", "_types")

    def __init__(self, samples: Mapping[SampleKey, float], types: Mapping[str, str]) -> None:
        self._samples: Mapping[SampleKey, float] = MappingProxyType(dict(samples))
        self._types: Mapping[str, str] = MappingProxyType(dict(types))

    def __getitem__(self, key: SampleKey) -> float:
        return self._samples[key]

    def __iter__(self) -> Iterator[SampleKey]:
        return iter(self._samples)

    def __len__(self) -> int:
        return len(self._samples)

    def __repr__(self) -> str:
        return f"MetricsSnapshot({len(self._samples)} samples)"

    @property
    def types(self) -> Mapping[str, str]:
        """Sample name -> type of its metric family."""
        return self._types

    def type_of(self, sample_name: str) -> str:
        return self._types.get(sample_name, "unknown")

    def names(self) -> frozenset[str]:
        """The distinct sample names present."""
        return frozenset(name for name, _ in self._samples)

    def value(self, sample_name: str, **labels: str) -> float | None:
        """The value of the sample with exactly these labels, or None."""
        return self._samples.get((sample_name, frozenset(labels.items())))


def labels_key(labels: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())


def parse_metrics(text: str) -> MetricsSnapshot:
    """Parse Prometheus text exposition; raises ValueError on text that is not valid exposition.

    A sample repeated with identical labels keeps its last value.
    """
    samples: dict[SampleKey, float] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        family_type = str(family.type)
        for sample in family.samples:
            name = str(sample.name)
            samples[(name, labels_key(sample.labels))] = float(sample.value)
            types[name] = family_type
    return MetricsSnapshot(samples, types)


def is_cumulative(sample_name: str, family_type: str) -> bool:
    """Whether a sample only grows (until a restart), so that a difference of two scrapes means something.

    Counters (``*_total``; not ``*_created``), histogram/summary ``_sum``/``_count``/``_bucket``, and
    untyped samples named ``*_total``.
    """
    if sample_name.endswith("_created"):
        return False
    if family_type == "counter":
        return True
    if family_type in _HISTOGRAM_TYPES:
        return sample_name.endswith(_CUMULATIVE_SUFFIXES)
    return family_type in {"unknown", "untyped"} and sample_name.endswith("_total")


def delta(before: MetricsSnapshot, after: MetricsSnapshot) -> MetricsSnapshot:
    """``after - before`` for every cumulative sample of ``after`` (gauges are left out).

    A sample absent from ``before`` started at 0. A sample that went down was reset (the engine
    restarted), so its delta is its ``after`` value, as Prometheus' ``increase()`` assumes.
    """
    out: dict[SampleKey, float] = {}
    types: dict[str, str] = {}
    for key, value in after.items():
        name = key[0]
        family_type = after.type_of(name)
        if not is_cumulative(name, family_type):
            continue
        previous = before.get(key, 0.0)
        out[key] = value - previous if value >= previous else value
        types[name] = family_type
    return MetricsSnapshot(out, types)


def sum_metric(
    snapshot: Mapping[SampleKey, float], sample_name: str, labels: Mapping[str, str] | None = None
) -> float | None:
    """Sum a sample over all its label sets (optionally only those containing ``labels``).

    None when no sample of that name (and labels) is present, so "absent" differs from 0.
    """
    wanted = frozenset(labels.items()) if labels else frozenset()
    total = 0.0
    found = False
    for (name, key_labels), value in snapshot.items():
        if name == sample_name and wanted <= key_labels:
            total += value
            found = True
    return total if found else None


def _collect(snapshot: Mapping[SampleKey, float], sample_name: str, labels: Mapping[str, str] | None) -> list[float]:
    wanted = frozenset(labels.items()) if labels else frozenset()
    return [v for (name, key_labels), v in snapshot.items() if name == sample_name and wanted <= key_labels]


Aggregate = Literal["sum", "mean", "max"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric kvbench reads, under each engine family's name for it."""

    tag: str
    """kvbench's own name (stable across engines), used in reports."""
    unit: str
    kind: Literal["counter", "gauge"]
    """Counters are read from a :func:`delta`; gauges from a plain snapshot."""
    formula: str
    """What the value means and how it is computed."""
    names: Mapping[EngineFamily, tuple[str, ...]]
    """Engine family -> candidate sample names, newest first; the first one present is used."""
    aggregate: Aggregate = "sum"
    """How label sets (data-parallel engines, models) combine."""

    def sample_name(self, snapshot: Mapping[SampleKey, float], family: EngineFamily) -> str | None:
        """The first candidate name present in ``snapshot`` (None if none, or unknown family)."""
        candidates = self.names.get(family, ())
        if not candidates:
            return None
        present = {name for name, _ in snapshot}
        return next((name for name in candidates if name in present), None)


def _names(**by_family: tuple[str, ...]) -> Mapping[EngineFamily, tuple[str, ...]]:
    return MappingProxyType(dict(by_family))


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        tag="gpu_prefix_queries",
        unit="tokens",
        kind="counter",
        formula="Σ over label sets of Δ prefix-cache queries: prompt tokens looked up in the GPU prefix cache.",
        names=_names(vllm=("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")),
    ),
    MetricSpec(
        tag="gpu_prefix_hits",
        unit="tokens",
        kind="counter",
        formula="Σ over label sets of Δ prefix-cache hits: prompt tokens found in the GPU prefix cache.",
        names=_names(vllm=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")),
    ),
    MetricSpec(
        tag="external_prefix_queries",
        unit="tokens",
        kind="counter",
        formula="Σ over label sets of Δ external queries: tokens looked up through the KV connector "
        "(offload tier) after the GPU cache missed.",
        names=_names(vllm=("vllm:external_prefix_cache_queries_total",)),
    ),
    MetricSpec(
        tag="external_prefix_hits",
        unit="tokens",
        kind="counter",
        formula="Σ over label sets of Δ external hits: tokens the KV connector (offload tier) supplied.",
        names=_names(vllm=("vllm:external_prefix_cache_hits_total",)),
    ),
    MetricSpec(
        tag="prompt_tokens",
        unit="tokens",
        kind="counter",
        formula="Σ over label sets of Δ prompt tokens processed (prefilled or served from cache).",
        names=_names(vllm=("vllm:prompt_tokens_total",)),
    ),
    MetricSpec(
        tag="generation_tokens",
        unit="tokens",
        kind="counter",
        formula="Σ over label sets of Δ generated tokens.",
        names=_names(vllm=("vllm:generation_tokens_total",)),
    ),
    MetricSpec(
        tag="kv_usage",
        unit="fraction",
        kind="gauge",
        formula="Mean over label sets (engines) of the fraction of GPU KV-cache blocks in use, 0..1.",
        names=_names(vllm=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
        aggregate="mean",
    ),
    MetricSpec(
        tag="requests_running",
        unit="requests",
        kind="gauge",
        formula="Σ over label sets of requests currently scheduled on the engine.",
        names=_names(vllm=("vllm:num_requests_running",)),
    ),
    MetricSpec(
        tag="requests_waiting",
        unit="requests",
        kind="gauge",
        formula="Σ over label sets of requests queued, waiting to be scheduled.",
        names=_names(vllm=("vllm:num_requests_waiting",)),
    ),
)
METRICS_BY_TAG: Mapping[str, MetricSpec] = MappingProxyType({spec.tag: spec for spec in METRICS})


def metric_value(
    snapshot: Mapping[SampleKey, float],
    tag: str,
    family: EngineFamily = VLLM,
    labels: Mapping[str, str] | None = None,
) -> float | None:
    """The value of a tagged metric, aggregated over label sets; None when the engine lacks it.

    Pass a :func:`delta` for counters and a plain snapshot for gauges (a delta has no gauges).
    Raises KeyError for an unknown tag.
    """
    spec = METRICS_BY_TAG[tag]
    name = spec.sample_name(snapshot, family)
    if name is None:
        return None
    values = _collect(snapshot, name, labels)
    if not values:
        return None
    if spec.aggregate == "mean":
        return sum(values) / len(values)
    if spec.aggregate == "max":
        return max(values)
    return sum(values)


def summarize(snapshot: Mapping[SampleKey, float], family: EngineFamily = VLLM) -> dict[str, float | None]:
    """tag -> value for every entry of :data:`METRICS` (None where ``snapshot`` lacks it).

    On a :func:`delta` the gauges are None; on a plain snapshot the counters are running totals.
    """
    return {spec.tag: metric_value(snapshot, spec.tag, family) for spec in METRICS}


@dataclass(frozen=True)
class HitRates:
    """Prefix-cache hit rates over an interval (hits / queries; None when nothing was queried)."""

    gpu: float | None
    external: float | None


def _ratio(hits: float | None, queries: float | None) -> float | None:
    if queries is None or queries <= 0:
        return None
    return (hits or 0.0) / queries


def hit_rates(delta_snapshot: Mapping[SampleKey, float], family: EngineFamily = VLLM) -> HitRates:
    """GPU and external (connector) prefix-cache hit rates from a :func:`delta`."""
    return HitRates(
        gpu=_ratio(
            metric_value(delta_snapshot, "gpu_prefix_hits", family),
            metric_value(delta_snapshot, "gpu_prefix_queries", family),
        ),
        external=_ratio(
            metric_value(delta_snapshot, "external_prefix_hits", family),
            metric_value(delta_snapshot, "external_prefix_queries", family),
        ),
    )


def counter_values(delta_snapshot: Mapping[SampleKey, float], family: EngineFamily = VLLM) -> dict[str, float]:
    """tag -> value for the counter entries of :data:`METRICS` present in a :func:`delta`."""
    values: dict[str, float] = {}
    for spec in METRICS:
        if spec.kind != "counter":
            continue
        value = metric_value(delta_snapshot, spec.tag, family)
        if value is not None:
            values[spec.tag] = value
    return values


def cache_counter_deltas(before_text: str, after_text: str, family: EngineFamily = VLLM) -> dict[str, float]:
    """Counter deltas (tag -> value) between two raw ``/metrics`` pages; what the runner stores per turn.

    Tags the engine does not expose are left out. Raises ValueError if either page is not valid
    Prometheus text.
    """
    return counter_values(delta(parse_metrics(before_text), parse_metrics(after_text)), family)
