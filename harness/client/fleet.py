"""One client for a fleet: routes each request to a replica, and says which replica served it.

:class:`FleetClient` has the request methods of :class:`~harness.client.openai.OpenAIClient`
(``chat``, ``completion``, ``metrics_text``), so the probe, the load runner and the soak use a fleet
exactly as they use one engine. Per request it

1. reads the routing key (the conversation, :func:`~harness.client.router.routing_key`) and asks the
   :class:`~harness.client.router.Router` for a replica (prompt text for ``prefix_aware``);
2. sends the request through that replica's pooled client;
3. returns the outcome with ``replica`` set and ``moved`` = whether the conversation's previous
   request went to another replica (None for its first request). With ``external`` routing every
   request goes to the router (``clients[0]``) and ``attribution`` says how the replica is learnt:

   * ``header``: the index of the response header's value in ``replica_names``
     (``routing.replica_header``); None when the router does not say;
   * ``metrics``: per-replica counter deltas. A request is *solo* when no other request was in
     flight from its start until its end (and until the scrape after it); for a solo request
     kvbench reads every replica's prompt-token counter (``prompt_tokens`` of
     :mod:`.scrape`) from each ``metrics_urls`` page just before sending it (or reuses the reading
     taken after the previous solo request) and again after it, and the replica is the only one
     whose counter moved. Requests that overlap another, or after which no counter or more than
     one moved, stay unattributed (None). Exact for sequential traffic (the probe); under
     concurrent load nearly nothing is attributed. The scrape before a request delays its send,
     never its timing (the clock starts when it is sent);
   * ``none``: the replica stays None.

``metrics_text`` returns the replicas' Prometheus pages merged into one, every sample labelled
``kvbench_replica="i"``: kvbench's metric readers sum over label sets, so counter deltas of the
merged page are fleet totals, and :func:`replica_pages` splits it again.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from .connections import idempotent_request
from .openai import OpenAIClient, Request, RequestMethods, RequestOutcome
from .router import Attribution, Router, current_routing_key
from .scrape import counter_values, detect_family, parse_metrics

REPLICA_LABEL = "kvbench_replica"


class FleetClient(RequestMethods):
    """``chat``/``completion`` over a fleet's replicas (see the module docstring)."""

    def __init__(
        self,
        clients: Sequence[OpenAIClient],
        router: Router,
        *,
        metrics_urls: Sequence[str | None] | None = None,
        attribution: Attribution | None = None,
        pages_source: Callable[[aiohttp.ClientSession], Awaitable[list[str | None]]] | None = None,
        on_pages: Callable[[list[str | None]], None] | None = None,
        replica_names: Sequence[str] = (),
    ) -> None:
        if not clients:
            raise ValueError("a fleet client needs at least one replica client")
        self.clients = list(clients)
        self.router = router
        self.metrics_urls: list[str | None] = (
            list(metrics_urls)
            if metrics_urls is not None
            else [client.url(client.endpoint.metrics_path) for client in self.clients]
        )
        self.attribution = attribution
        """None: kvbench's router picks the replica. Else external routing: every request goes to clients[0]
        (the router) and the replica is learnt this way (see the module docstring)."""
        self.pages_source = pages_source
        """Where per-replica pages come from instead of each metrics URL (a Prometheus server)."""
        self.on_pages = on_pages
        """Called with every scrape's per-replica pages (the spine stores their counters)."""
        self.replica_names = list(replica_names)
        """External routing: the header value that names each replica, in replica order."""
        self._last: dict[str, int] = {}
        self._started = 0
        """Requests started so far (metrics attribution: did another start while one was in flight?)."""
        self._baseline: list[float] | None = None
        """Metrics attribution: every replica's prompt-token total with nothing in flight (None: unknown)."""

    async def request(self, request: Request) -> RequestOutcome:
        replica = self._pick(_routing_text(request))
        client = self.clients[replica]
        return await self._sent(replica, lambda: client.request(request))

    def _pick(self, prompt: str) -> int:
        if self.attribution is not None:
            return 0
        return self.router.pick(current_routing_key(), prompt)

    async def _sent(self, target: int, request: Callable[[], Awaitable[RequestOutcome]]) -> RequestOutcome:
        key = current_routing_key()
        solo = self.attribution == "metrics" and sum(self.router.in_flight) == 0
        self.router.started(target)
        self._started += 1
        ticket = self._started
        baseline: list[float] | None = None
        try:
            if solo:
                baseline = self._baseline if self._baseline is not None else await self._prompt_totals()
            outcome = await request()
        finally:
            self.router.finished(target)
        replica: int | None = target
        if self.attribution == "header":
            served = outcome.served_by
            replica = self.replica_names.index(served) if served is not None and served in self.replica_names else None
        elif self.attribution == "metrics":
            replica = await self._attributed(baseline if self._started == ticket else None, ticket)
        elif self.attribution == "none":
            replica = None
        if replica is None:
            return outcome
        moved = None
        if key is not None:
            previous = self._last.get(key)
            moved = None if previous is None else previous != replica
            self._last[key] = replica
        return dataclasses.replace(outcome, replica=replica, moved=moved)

    async def _attributed(self, baseline: list[float] | None, ticket: int) -> int | None:
        """The one replica whose prompt-token total moved since ``baseline`` (None: not solo, or ambiguous)."""
        self._baseline = None
        if baseline is None or sum(self.router.in_flight) != 0:
            return None
        after = await self._prompt_totals()
        if after is None or self._started != ticket:  # another request started meanwhile
            return None
        self._baseline = after
        moved = [index for index, (was, now) in enumerate(zip(baseline, after, strict=True)) if now > was]
        return moved[0] if len(moved) == 1 else None

    async def _prompt_totals(self) -> list[float] | None:
        """Every replica's prompt-token total from its own page (None when one cannot be read)."""
        totals: list[float] = []
        for page in await self._fetch_pages():
            if page is None:
                return None
            try:
                value = page_counters(page).get("prompt_tokens")
            except ValueError:
                return None
            if value is None:
                return None
            totals.append(value)
        return totals

    async def _fetch_pages(self) -> list[str | None]:
        """Each replica's page from its metrics URL (None where it has none or did not answer)."""
        session = self.clients[0].session  # absolute URLs: any replica's pooled session reaches them

        async def fetch(url: str | None) -> str | None:
            if url is None:
                return None
            try:
                async with idempotent_request(session, "GET", url) as response:
                    response.raise_for_status()
                    return await response.text()
            except (aiohttp.ClientError, TimeoutError):
                return None

        return list(await asyncio.gather(*(fetch(url) for url in self.metrics_urls)))

    async def replica_metrics(self) -> list[str | None]:
        """Each replica's Prometheus page (None where it has none or did not answer)."""
        if self.pages_source is not None:
            return await self.pages_source(self.clients[0].session)
        return await self._fetch_pages()

    async def metrics_text(self) -> str:
        """The replicas' pages merged, each sample labelled ``kvbench_replica``; raises if none answered."""
        pages = await self.replica_metrics()
        if self.on_pages is not None:
            self.on_pages(pages)
        if all(page is None for page in pages):
            raise aiohttp.ClientError("no replica of the fleet served its /metrics page")
        return merge_pages(pages)


def _routing_text(request: Request) -> str:
    """The text a router matches prefixes in: a prompt, a chat's contents one a line, or token ids by their
    decimal text (a shared prefix of ids is a shared prefix of that text)."""
    body = request.body
    if isinstance(body, str):
        return body
    if request.kind == "chat":
        return "\n".join(item.get("content", "") for item in body if isinstance(item, dict))
    return " ".join(str(item) for item in body if isinstance(item, int))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def merge_pages(pages: Sequence[str | None]) -> str:
    """One Prometheus text page from several, each sample labelled ``kvbench_replica="<index>"``."""
    types: dict[str, str] = {}
    lines: dict[str, list[str]] = {}
    for index, page in enumerate(pages):
        if page is None:
            continue
        for family in text_string_to_metric_families(page):
            types.setdefault(family.name, str(family.type))
            out = lines.setdefault(family.name, [])
            for sample in family.samples:
                labels = {**sample.labels, REPLICA_LABEL: str(index)}
                rendered = ",".join(f'{name}="{_escape(str(value))}"' for name, value in sorted(labels.items()))
                out.append(f"{sample.name}{{{rendered}}} {float(sample.value)!r}")
    text: list[str] = []
    for name, samples in lines.items():
        text.append(f"# TYPE {name} {types[name]}")
        text.extend(samples)
    return "\n".join(text) + "\n"


def replica_pages(merged: str, replicas: int) -> list[str]:
    """Split a :func:`merge_pages` page back into one page per replica (the label removed)."""
    out: list[list[str]] = [[] for _ in range(replicas)]
    for family in text_string_to_metric_families(merged):
        per: list[list[str]] = [[] for _ in range(replicas)]
        for sample in family.samples:
            index = int(sample.labels.get(REPLICA_LABEL, "-1"))
            if not 0 <= index < replicas:
                continue
            labels = {k: v for k, v in sample.labels.items() if k != REPLICA_LABEL}
            rendered = ",".join(f'{name}="{_escape(str(value))}"' for name, value in sorted(labels.items()))
            per[index].append(f"{sample.name}{{{rendered}}} {float(sample.value)!r}")
        for index, samples in enumerate(per):
            if samples:
                out[index] += [f"# TYPE {family.name} {family.type}", *samples]
    return ["\n".join(lines) + "\n" for lines in out]


TIER_HITS_SAMPLE = "kvbench_sim:tier_hit_tokens_total"
"""Per-tier loaded tokens, labelled ``tier`` (the simulator; engines without it report external hits only)."""


def page_counters(page: str) -> dict[str, float]:
    """A replica page's running totals: kvbench's counter tags, plus ``tier_hits:<kind>`` per tier.

    Raises ValueError for a page that is not Prometheus text.
    """
    snapshot = parse_metrics(page)
    values = counter_values(snapshot, detect_family(snapshot))
    for (name, labels), value in snapshot.items():
        if name == TIER_HITS_SAMPLE:
            tier = dict(labels).get("tier", "unknown")
            values[f"tier_hits:{tier}"] = values.get(f"tier_hits:{tier}", 0.0) + value
    return values
