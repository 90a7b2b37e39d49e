"""The spine's fleet: an arm's replicas started together, one routing client, per-replica counters stored.

:func:`open_fleet` is what :meth:`harness.runs.spine.Runner.arm_session` does when
``engine.replicas > 1`` or the arm's routing names a ``router``: it starts the
:class:`~harness.engines.fleet.Fleet` (every replica in parallel, the arm's shared tier once), then
the router when there is one (:mod:`harness.engines.router_process`: pointed at every replica,
stopped before them), records the fleet in the manifest (the first replica's facts plus
``replicas``, each replica's command, the shared tier, the routing policy and attribution, the
router's version and command), opens one pooled client per replica (or one for the router) and
joins them in a :class:`~harness.client.fleet.FleetClient` that routes by ``scenario.routing``.
Every scrape the run kinds make through that client stores each replica's running counter totals
(``replica_metrics.jsonl``, :class:`~harness.store.events.ReplicaCounters`); with a ``prometheus:``
section the pages come from that server instead of the replicas.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from harness.client.fleet import FleetClient, page_counters
from harness.client.openai import OpenAIClient
from harness.client.prometheus import PrometheusReader
from harness.client.router import Attribution, Router
from harness.engines.base import EngineFacts, LaunchContext, stall_limit
from harness.engines.configs import OpenAIEngineConfig
from harness.engines.fleet import Fleet, RunningFleet
from harness.engines.kinds import engine_kind
from harness.engines.kvbench_replica_header import REPLICA_HEADER
from harness.engines.replicas import RoutingSpec
from harness.engines.router_process import RunningRouter, check_router, start_router
from harness.scenario.spec import Arm, Scenario
from harness.store.events import ReplicaCounters
from harness.store.manifest import Manifest
from harness.store.rundir import RunDir


class FleetRunner(Protocol):
    """What opening a fleet needs of the run that opens it (:class:`harness.runs.spine.Runner` is one)."""

    scenario: Scenario
    run_dir: RunDir
    attempt: int

    def request_timeout_s(self) -> float: ...

    def stall_timeout_s(self) -> float | None: ...

    def connections(self) -> int: ...


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Attributing:
    """How an arm learns which replica served a request: ``how`` (None: kvbench picked it itself) and
    the response header naming it (``header`` attribution only)."""

    how: Attribution | None
    header: str | None = None


def attributing(routing: RoutingSpec, engine_kind_name: str, replicas: int) -> Attributing:
    """The scenario's attribution; for a router kvbench starts in front of replicas that name themselves
    (the kinds table's ``names_replica``: a fleet's replicas, two or more) and no attribution set, their
    ``X-Kvbench-Replica`` header, which is exact under concurrent load (``metrics`` attribution is not)."""
    if routing.policy != "external":
        return Attributing(None)
    unset = routing.attribution is None and routing.replica_header is None
    if unset and routing.router is not None and replicas > 1 and engine_kind(engine_kind_name).names_replica:
        return Attributing("header", REPLICA_HEADER)
    return Attributing(routing.attributed_by, routing.replica_header)


def fleet_facts(
    fleet: RunningFleet, routing: RoutingSpec, attribution: Attributing, router: RunningRouter | None = None
) -> EngineFacts:
    first = fleet.first.facts
    details = dict(first.details)
    details["replicas"] = str(fleet.size)
    details["routing"] = routing.policy
    if attribution.how is not None:
        details["attribution"] = attribution.how if attribution.header is None else f"header {attribution.header}"
    if router is not None:
        details["router"] = f"{router.label} {router.version}"
        details["router_policy"] = router.policy
        details["router_command"] = " ".join(router.command)
        details["router_metrics_url"] = router.metrics_url
    for index, replica in enumerate(fleet.replicas):
        details[f"replica_{index}_command"] = " ".join(replica.facts.command)
        details[f"replica_{index}_base_url"] = replica.endpoint.base_url
        notes = replica.facts.details.get("notes")
        if notes and notes != first.details.get("notes"):  # e.g. its own disk-tier directory
            details[f"replica_{index}_notes"] = notes
    if fleet.shared_tier is not None:
        details["shared_tier"] = fleet.shared_tier.description
        details["shared_tier_serves"] = "all tiers" if fleet.shared_tier.serves_all_tiers else "shared tier"
    return EngineFacts(kind=first.kind, version=first.version, command=first.command, details=details)


def _counters(page: str | None) -> dict[str, float] | None:
    if page is None:
        return None
    try:
        return page_counters(page)
    except ValueError as error:
        log.warning("unparseable replica /metrics page (%s); its counters are not stored", error)
        return None


def server_root(base_url: str) -> str:
    """A replica's server root (``http://host:port``), as routers and metrics URLs want it."""
    return base_url.rstrip("/").removesuffix("/v1")


@contextlib.asynccontextmanager
async def open_fleet(
    runner: FleetRunner,
    arm: Arm,
    context: LaunchContext,
    manifest: Manifest,
) -> AsyncIterator[tuple[RunningFleet, FleetClient]]:
    scenario = runner.scenario
    engine, routing = scenario.engine, arm.routing or scenario.routing
    install = await check_router(routing.router) if routing.router is not None else None
    async with Fleet(engine, context) as fleet, contextlib.AsyncExitStack() as router_stack:
        router = None
        if install is not None:  # after every replica is healthy; stopped before them
            workers = [server_root(replica.endpoint.base_url) for replica in fleet.replicas]
            router = await router_stack.enter_async_context(start_router(install, workers, context.log_dir))
        attribution = attributing(routing, engine.kind, fleet.size)
        manifest.record_engine(arm.name, fleet_facts(fleet, routing, attribution, router))
        external = routing.policy == "external"
        if router is not None:
            targets = [dataclasses.replace(fleet.first.endpoint, base_url=router.base_url)]
        else:
            targets = [replica.endpoint for replica in (fleet.replicas[:1] if external else fleet.replicas)]
        metrics_urls: list[str | None] = []
        for index, replica in enumerate(fleet.replicas):
            configured = engine.metrics_url(index) if isinstance(engine, OpenAIEngineConfig) else None
            own = server_root(replica.endpoint.base_url) + replica.endpoint.metrics_path
            metrics_urls.append(configured or (None if external and router is None else own))
        pages_source = None
        if scenario.prometheus is not None:
            reader = PrometheusReader(
                scenario.prometheus.url,
                scenario.prometheus.replica_label,
                scenario.prometheus.replicas,
                scenario.prometheus.selector,
            )

            async def pages_source(session: aiohttp.ClientSession) -> list[str | None]:
                return await reader.pages(session)

        def on_pages(pages: list[str | None]) -> None:
            runner.run_dir.append_replica_counters(
                ReplicaCounters(
                    arm=arm.name,
                    attempt=runner.attempt,
                    at_ns=time.monotonic_ns(),
                    counters=[_counters(page) for page in pages],
                )
            )

        picker = Router(
            routing.policy, len(targets), seed=routing.seed, block_chars=routing.block_chars,
            prefix_blocks=routing.prefix_blocks,
        )  # fmt: skip
        names = [str(index) for index in range(fleet.size)]
        if isinstance(engine, OpenAIEngineConfig):
            names = [endpoint.name or str(index) for index, endpoint in enumerate(engine.endpoints)] or names
        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(
                    OpenAIClient(
                        endpoint, timeout_s=runner.request_timeout_s(),
                        read_timeout_s=stall_limit(runner.stall_timeout_s(), fleet.first),
                        max_connections=runner.connections(),
                        capture_header=attribution.header,
                        session_header=routing.router.header if routing.router is not None else None,
                    )
                )
                for endpoint in targets
            ]  # fmt: skip
            yield fleet, FleetClient(
                clients, picker, metrics_urls=metrics_urls,
                attribution=attribution.how,
                pages_source=pages_source, on_pages=on_pages, replica_names=names,
            )  # fmt: skip
