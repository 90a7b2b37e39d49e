"""Per-replica counters from a Prometheus server's HTTP API, as Prometheus text pages.

Large fleets keep their metrics in Prometheus; kvbench can read a replica's cache counters there
instead of scraping the replica. :class:`PrometheusReader` asks ``GET /api/v1/query`` for ONE
instant vector -- every counter kvbench reads, summed per replica::

    sum by (__name__, <replica_label>, tier) ({__name__=~"<names>", <replica_label>=~"<replicas>", <selector>})

and renders it back into one Prometheus text page per replica (``# TYPE <family> counter`` and
``<name>{tier=...} <value>``), so everything downstream -- merging, counter deltas, stored
per-replica totals -- is the same code as for direct scrapes. ``<names>`` are the sample names of
every counter in :data:`~harness.client.scrape.METRICS` and
:data:`~harness.client.scrape.LMCACHE_METRICS` (label selectors dropped: the page keeps the labels
that matter) plus the simulator's per-tier hits.

A query at ``time=t`` returns the last sample at or before ``t`` (within Prometheus's 5 minute
lookback), so values lag the engines by up to one scrape interval of that server: a difference over
a window of length ``W`` is exact when ``W`` is long against the interval, and is what
``increase(counter[W])`` would give without its extrapolation. Counter resets (a restarted replica)
are not corrected, as with direct scrapes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

import aiohttp

from .fleet import TIER_HITS_SAMPLE
from .scrape import LMCACHE_METRICS, METRICS, parse_candidate

_SUFFIXES = ("_total", "_sum", "_count")


class PrometheusError(Exception):
    """The Prometheus server did not answer the query as expected."""


def counter_sample_names() -> list[str]:
    """Every sample name of a counter kvbench reads (all engine families), sorted."""
    names = {TIER_HITS_SAMPLE}
    for spec in (*METRICS, *LMCACHE_METRICS):
        if spec.kind != "counter":
            continue
        for candidates in spec.names.values():
            names.update(parse_candidate(text).name for text in candidates)
    return sorted(names)


def _family(sample: str) -> str:
    for suffix in _SUFFIXES:
        if sample.endswith(suffix):
            return sample[: -len(suffix)]
    return sample


def _family_type(sample: str) -> str:
    return "summary" if sample.endswith(("_sum", "_count")) else "counter"


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


class PrometheusReader:
    """Reads per-replica counter pages from ``url`` (see the module docstring)."""

    def __init__(self, url: str, replica_label: str, replicas: Sequence[str], selector: str = "") -> None:
        self.url = url.rstrip("/")
        self.replica_label = replica_label
        self.replicas = list(replicas)
        self.selector = selector.strip().strip(",")

    def query(self) -> str:
        names = "|".join(re.escape(name) for name in counter_sample_names())
        replicas = "|".join(re.escape(value) for value in self.replicas)
        matchers = [f'__name__=~"{_quote(names)}"', f'{self.replica_label}=~"{_quote(replicas)}"']
        if self.selector:
            matchers.append(self.selector)
        return f"sum by (__name__, {self.replica_label}, tier) ({{{', '.join(matchers)}}})"

    async def pages(self, session: aiohttp.ClientSession, at_s: float | None = None) -> list[str | None]:
        """One page per replica (None where Prometheus holds nothing for it) at unix time ``at_s`` (default now)."""
        params = {"query": self.query(), "time": repr(time.time() if at_s is None else at_s)}
        async with session.get(self.url + "/api/v1/query", params=params) as response:
            body = await response.json(content_type=None)
            if response.status != 200 or not isinstance(body, dict) or body.get("status") != "success":
                raise PrometheusError(f"{self.url}/api/v1/query: HTTP {response.status}: {str(body)[:300]}")
        data = body.get("data")
        if not isinstance(data, dict) or data.get("resultType") != "vector":
            raise PrometheusError(f"{self.url}: expected an instant vector, got {str(data)[:200]}")
        lines: list[dict[str, list[str]]] = [{} for _ in self.replicas]
        for item in data.get("result", []):
            metric, value = item["metric"], item["value"]
            replica = metric.get(self.replica_label)
            if replica not in self.replicas:
                continue
            name = str(metric["__name__"])
            labels = f'{{tier="{_quote(metric["tier"])}"}}' if "tier" in metric else ""
            lines[self.replicas.index(replica)].setdefault(_family(name), []).append(
                f"{name}{labels} {float(value[1])!r}"
            )
        pages: list[str | None] = []
        for per_name in lines:
            if not per_name:
                pages.append(None)
                continue
            text: list[str] = []
            for family, samples in sorted(per_name.items()):
                kind = _family_type(samples[0].split("{")[0].split(" ")[0])
                text += [f"# TYPE {family} {kind}", *samples]
            pages.append("\n".join(text) + "\n")
        return pages
