"""Engine ``/metrics`` scraping: immutable snapshots, counter deltas, and the metrics kvbench reads.

A scrape of Prometheus text becomes a :class:`MetricsSnapshot`, an immutable mapping from
``(sample name, frozenset of (label, value) pairs)`` to a float. Counters only mean something as
differences, so a measurement takes a snapshot before and after and works on :func:`delta`.
:data:`METRICS` is a declarative table of what kvbench reads (kept in ``metrics.yaml`` beside this
module), with one column of sample names per engine family (``vllm``, ``sglang``, ``trtllm``);
:data:`LMCACHE_METRICS` holds LMCache's own counters, which appear on whatever page LMCache reports to
(vLLM's ``/metrics`` with the in-process connector, the ``lmcache server`` sidecar's own page).
:func:`harness.engines.kinds.metrics_family` maps an engine kind to its family, :func:`metrics_path`
gives the family's Prometheus path (TensorRT-LLM serves Prometheus text on ``/prometheus/metrics``;
its ``/metrics`` is JSON), and :func:`detect_family` recognises a page by its name prefixes (family ``auto``).

A candidate name may carry a Prometheus-style label selector, e.g.
``sglang:cached_tokens_total{cache_source="device"}`` or ``...{cache_source!="device"}``: only
samples whose labels match are read. Candidates are tried in order, so a version without the label
falls back to a later, plain candidate.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal

import yaml
from prometheus_client.parser import text_string_to_metric_families

SampleKey = tuple[str, frozenset[tuple[str, str]]]
"""(sample name, frozenset of (label name, label value) pairs)."""

EngineFamily = str
"""Which column of :data:`METRICS` to read: ``"vllm"``, ``"sglang"``, ``"trtllm"``; ``"auto"`` detects it."""
VLLM: EngineFamily = "vllm"
SGLANG: EngineFamily = "sglang"
TRTLLM: EngineFamily = "trtllm"
LMCACHE: EngineFamily = "lmcache"
"""LMCache's names: read on any engine's page (LMCache runs inside or beside the engine)."""
AUTO: EngineFamily = "auto"
"""Recognise the family from the page's name prefixes (:func:`detect_family`)."""

METRICS_PATHS: Mapping[EngineFamily, str] = MappingProxyType(
    {VLLM: "/metrics", SGLANG: "/metrics", TRTLLM: "/prometheus/metrics"}
)
"""Family -> path of its Prometheus page. trtllm-serve answers ``/metrics`` with JSON iteration stats and
serves Prometheus text on ``/prometheus/metrics`` only with ``return_perf_metrics: true``."""

_FAMILY_PREFIXES: tuple[tuple[EngineFamily, str], ...] = ((SGLANG, "sglang:"), (TRTLLM, "trtllm_"), (VLLM, "vllm:"))


def metrics_path(family: EngineFamily) -> str:
    """The path of a family's Prometheus page (``/metrics`` unless the engine serves it elsewhere)."""
    return METRICS_PATHS.get(family, "/metrics")


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


def detect_family(snapshot: Mapping[SampleKey, float]) -> EngineFamily:
    """The engine family whose names a page uses (``sglang:``, ``trtllm_``, ``vllm:`` prefixes).

    ``vllm`` when none is recognised (the simulator and most OpenAI-compatible servers use vLLM's names).
    """
    names = {name for name, _ in snapshot}
    for family, prefix in _FAMILY_PREFIXES:
        if any(name.startswith(prefix) for name in names):
            return family
    return VLLM


def _resolve_family(snapshot: Mapping[SampleKey, float], family: EngineFamily) -> EngineFamily:
    return detect_family(snapshot) if family == AUTO else family


_CANDIDATE = re.compile(r"^(?P<name>[^{}\s]+)(?:\{(?P<selector>[^{}]*)\})?$")
_MATCHER = re.compile(r'\s*(?P<label>[A-Za-z_][A-Za-z0-9_]*)\s*(?P<op>!=|=)\s*"(?P<value>[^"]*)"\s*(?:,|$)')


@dataclass(frozen=True)
class Candidate:
    """One candidate of :attr:`MetricSpec.names`: a sample name and an optional label selector."""

    name: str
    equal: frozenset[tuple[str, str]] = frozenset()
    """Labels a sample must carry with exactly these values."""
    not_equal: frozenset[tuple[str, str]] = frozenset()
    """Labels a sample must carry with another value. Unlike Prometheus, an absent label does not match:
    ``{cache_source!="device"}`` must not count a version that has no ``cache_source`` label at all."""

    def matches(self, labels: frozenset[tuple[str, str]]) -> bool:
        if not self.equal <= labels:
            return False
        present = dict(labels)
        return all(label in present and present[label] != value for label, value in self.not_equal)


@functools.lru_cache(maxsize=256)
def parse_candidate(text: str) -> Candidate:
    """``name``, ``name{label="value"}`` or ``name{label!="value", ...}``; ValueError otherwise.

    ``label!="value"`` needs the label present with another value (see :attr:`Candidate.not_equal`).
    """
    match = _CANDIDATE.match(text.strip())
    if match is None:
        raise ValueError(f'not a metric candidate: {text!r} (expected name or name{{label="value"}})')
    selector = match.group("selector")
    equal: set[tuple[str, str]] = set()
    not_equal: set[tuple[str, str]] = set()
    if selector and selector.strip():
        position = 0
        while position < len(selector):
            matcher = _MATCHER.match(selector, position)
            if matcher is None or matcher.end() == position:
                raise ValueError(f'bad label selector in {text!r}: use label="value" or label!="value"')
            pair = (matcher.group("label"), matcher.group("value"))
            (equal if matcher.group("op") == "=" else not_equal).add(pair)
            position = matcher.end()
    return Candidate(match.group("name"), frozenset(equal), frozenset(not_equal))


def _collect(
    snapshot: Mapping[SampleKey, float], candidate: Candidate | str, labels: Mapping[str, str] | None
) -> list[float]:
    if isinstance(candidate, str):
        candidate = parse_candidate(candidate)
    wanted = frozenset(labels.items()) if labels else frozenset()
    return [
        v
        for (name, key_labels), v in snapshot.items()
        if name == candidate.name and wanted <= key_labels and candidate.matches(key_labels)
    ]


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
    """Engine family -> candidate sample names (optionally with a label selector), newest first; the
    first one present is used. A spec without a column for the family falls back to its ``lmcache``
    column (LMCache's names, which appear on any engine's page)."""
    aggregate: Aggregate = "sum"
    """How label sets (data-parallel engines, models) combine."""

    def candidates(self, family: EngineFamily) -> tuple[str, ...]:
        return self.names.get(family) or self.names.get(LMCACHE, ())

    def resolve(self, snapshot: Mapping[SampleKey, float], family: EngineFamily) -> Candidate | None:
        """The first candidate with a matching sample in ``snapshot`` (None if none, or unknown family)."""
        found = self._first_present(snapshot, family)
        return None if found is None else found[1]

    def sample_name(self, snapshot: Mapping[SampleKey, float], family: EngineFamily) -> str | None:
        """The first candidate present in ``snapshot``, as written in :attr:`names` (None if none)."""
        found = self._first_present(snapshot, family)
        return None if found is None else found[0]

    def _first_present(self, snapshot: Mapping[SampleKey, float], family: EngineFamily) -> tuple[str, Candidate] | None:
        family = _resolve_family(snapshot, family)
        for text in self.candidates(family):
            candidate = parse_candidate(text)
            if any(name == candidate.name and candidate.matches(labels) for name, labels in snapshot):
                return text, candidate
        return None


METRICS_FILE = Path(__file__).with_name("metrics.yaml")
"""The table of :data:`METRICS` and :data:`LMCACHE_METRICS`: one entry a metric (its header says the fields)."""
_SPEC_FIELDS = frozenset({"unit", "kind", "aggregate", "formula"})
_FAMILIES = frozenset({VLLM, SGLANG, TRTLLM, LMCACHE})


def _spec(tag: str, entry: object) -> MetricSpec:
    """One entry of :data:`METRICS_FILE` as a :class:`MetricSpec`; ValueError naming the tag and field."""
    where = f"{METRICS_FILE.name}: {tag}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a mapping of unit, kind, formula and sample names")
    unknown = sorted(set(entry) - _SPEC_FIELDS - _FAMILIES)
    if unknown:
        raise ValueError(
            f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(sorted(_SPEC_FIELDS | _FAMILIES))})"
        )
    kind, aggregate = entry.get("kind"), entry.get("aggregate", "sum")
    if kind not in ("counter", "gauge"):
        raise ValueError(f"{where}: kind {kind!r} is not one of counter, gauge")
    if aggregate not in ("sum", "mean", "max"):
        raise ValueError(f"{where}: aggregate {aggregate!r} is not one of sum, mean, max")
    names: dict[EngineFamily, tuple[str, ...]] = {}
    for family in sorted(_FAMILIES & set(entry), key=list(entry).index):
        candidates = entry[family]
        if not isinstance(candidates, list) or not candidates or not all(isinstance(n, str) for n in candidates):
            raise ValueError(f"{where}: {family} must be a non-empty list of sample names")
        names[family] = tuple(candidates)
    unit, formula = entry.get("unit"), entry.get("formula")
    if not isinstance(unit, str) or not isinstance(formula, str) or not names:
        raise ValueError(f"{where}: needs a unit, a formula and at least one family's sample names")
    return MetricSpec(tag, unit, kind, formula, MappingProxyType(names), aggregate)


@functools.cache
def _metrics_table() -> object:
    return yaml.safe_load(METRICS_FILE.read_text(encoding="utf-8"))


def _load_specs(section: str) -> tuple[MetricSpec, ...]:
    """The metrics of one section of :data:`METRICS_FILE`, in file order."""
    table = _metrics_table()
    entries = table.get(section) if isinstance(table, dict) else None
    if not isinstance(entries, dict):
        raise ValueError(f"{METRICS_FILE.name}: no {section!r} mapping of metrics")
    return tuple(_spec(str(tag), entry) for tag, entry in entries.items())


METRICS: tuple[MetricSpec, ...] = _load_specs("engine")
"""What kvbench reads from every engine family's page (the ``engine`` section of :data:`METRICS_FILE`)."""
METRICS_BY_TAG: Mapping[str, MetricSpec] = MappingProxyType({spec.tag: spec for spec in METRICS})

LMCACHE_METRICS: tuple[MetricSpec, ...] = _load_specs("lmcache")
"""LMCache's own metrics (lmcache 0.5.x ``observability.py``; ``lmcache_mp_*`` from the ``lmcache
server`` sidecar). Read with any family: they appear beside the engine's names."""
LMCACHE_METRICS_BY_TAG: Mapping[str, MetricSpec] = MappingProxyType({spec.tag: spec for spec in LMCACHE_METRICS})
_ALL_BY_TAG: Mapping[str, MetricSpec] = MappingProxyType({**METRICS_BY_TAG, **LMCACHE_METRICS_BY_TAG})


def metric_value(
    snapshot: Mapping[SampleKey, float],
    tag: str,
    family: EngineFamily = VLLM,
    labels: Mapping[str, str] | None = None,
) -> float | None:
    """The value of a tagged metric, aggregated over label sets; None when the engine lacks it.

    Pass a :func:`delta` for counters and a plain snapshot for gauges (a delta has no gauges).
    ``tag`` is an entry of :data:`METRICS` or :data:`LMCACHE_METRICS`; raises KeyError for an unknown tag.
    """
    spec = _ALL_BY_TAG[tag]
    candidate = spec.resolve(snapshot, family)
    if candidate is None:
        return None
    values = _collect(snapshot, candidate, labels)
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
    family = _resolve_family(snapshot, family)
    return {spec.tag: metric_value(snapshot, spec.tag, family) for spec in METRICS}


def summarize_lmcache(snapshot: Mapping[SampleKey, float]) -> dict[str, float | None]:
    """tag -> value for every entry of :data:`LMCACHE_METRICS` (None where ``snapshot`` lacks it)."""
    return {spec.tag: metric_value(snapshot, spec.tag, LMCACHE) for spec in LMCACHE_METRICS}


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
    family = _resolve_family(delta_snapshot, family)
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
    """tag -> value for the counter entries of :data:`METRICS` and :data:`LMCACHE_METRICS` present in a
    :func:`delta`."""
    family = _resolve_family(delta_snapshot, family)
    values: dict[str, float] = {}
    for spec in (*METRICS, *LMCACHE_METRICS):
        if spec.kind != "counter":
            continue
        value = metric_value(delta_snapshot, spec.tag, family)
        if value is not None:
            values[spec.tag] = value
    return values


def cache_counter_deltas(before_text: str, after_text: str, family: EngineFamily = AUTO) -> dict[str, float]:
    """Counter deltas (tag -> value) between two raw Prometheus pages; what the runner stores per turn.

    ``family`` defaults to ``auto``: the family is recognised from ``after_text`` (:func:`detect_family`),
    so vLLM, SGLang and TensorRT-LLM pages all work. Tags the engine does not expose are left out;
    LMCache counters are included when the page has them. Raises ValueError if either page is not
    valid Prometheus text.
    """
    after = parse_metrics(after_text)
    return counter_values(delta(parse_metrics(before_text), after), _resolve_family(after, family))


RESTART_TOLERANCE = 1e-6
START_TIME_METRIC = "process_start_time_seconds"


def counter_totals(snapshot: MetricsSnapshot) -> dict[str, float]:
    """Running totals of the counters kvbench reads (and the process start time, when exposed)."""
    out: dict[str, float] = {}
    for spec in METRICS:
        if spec.kind == "counter":
            value = metric_value(snapshot, spec.tag)
            if value is not None:
                out[spec.tag] = value
    start = [v for (name, _), v in snapshot.items() if name == START_TIME_METRIC]
    if start:
        out[START_TIME_METRIC] = max(start)
    return out


def restarted(previous: Mapping[str, float], current: Mapping[str, float]) -> bool:
    """Whether the engine restarted between two scrapes: a counter went down, or the start time moved."""
    for name, value in current.items():
        before = previous.get(name)
        if before is None:
            continue
        if name == START_TIME_METRIC:
            if abs(value - before) > RESTART_TOLERANCE:
                return True
        elif value < before - RESTART_TOLERANCE:
            return True
    return False
