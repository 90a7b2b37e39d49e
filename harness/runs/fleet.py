"""The spine's fleet: an arm's replicas started together, one routing client, per-replica counters stored.

:func:`open_fleet` is what :meth:`harness.runs.spine.Runner.arm_session` does when
``engine.replicas > 1``: it starts the :class:`~harness.engines.fleet.Fleet` (every replica in
parallel, the arm's shared tier once), records the fleet in the manifest (the first replica's
facts plus ``replicas``, each replica's command, the shared tier and the routing policy), opens
one pooled client per replica and joins them in a :class:`~harness.client.fleet.FleetClient`
that routes by ``scenario.routing``. Every scrape the run kinds make through that client stores
each replica's running counter totals (``replica_metrics.jsonl``,
:class:`~harness.store.events.ReplicaCounters`); with a ``prometheus:`` section the pages come
from that server instead of the replicas.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import aiohttp

from harness.client.fleet import FleetClient, page_counters
from harness.client.openai import OpenAIClient
from harness.client.prometheus import PrometheusReader
from harness.client.router import Router
from harness.engines.base import EngineFacts, LaunchContext
from harness.engines.configs import OpenAIEngineConfig
from harness.engines.fleet import Fleet, RunningFleet
from harness.scenario.spec import Arm
from harness.store.events import ReplicaCounters
from harness.store.manifest import Manifest
from kvbench.schema import VersionedFile

if TYPE_CHECKING:
    from .spine import Runner

log = logging.getLogger(__name__)


def fleet_facts(fleet: RunningFleet, policy: str) -> EngineFacts:
    first = fleet.first.facts
    details = dict(first.details)
    details["replicas"] = str(fleet.size)
    details["routing"] = policy
    for index, replica in enumerate(fleet.replicas):
        details[f"replica_{index}_command"] = " ".join(replica.facts.command)
        details[f"replica_{index}_base_url"] = replica.endpoint.base_url
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


@contextlib.asynccontextmanager
async def open_fleet(
    runner: Runner[VersionedFile],
    arm: Arm,
    context: LaunchContext,
    manifest: Manifest,
) -> AsyncIterator[tuple[RunningFleet, FleetClient]]:
    scenario = runner.scenario
    engine, routing = scenario.engine, arm.routing or scenario.routing
    async with Fleet(engine, context) as fleet:
        manifest.record_engine(arm.name, fleet_facts(fleet, routing.policy))
        external = routing.policy == "external"
        targets = fleet.replicas[:1] if external else fleet.replicas
        metrics_urls: list[str | None] = []
        for index, replica in enumerate(fleet.replicas):
            configured = engine.metrics_url(index) if isinstance(engine, OpenAIEngineConfig) else None
            own = replica.endpoint.base_url.rstrip("/") + replica.endpoint.metrics_path
            metrics_urls.append(configured or (None if external else own))
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

        router = Router(
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
                        replica.endpoint, timeout_s=runner.request_timeout_s(), read_timeout_s=runner.stall_timeout_s(),
                        max_connections=runner.connections(),
                        capture_header=routing.replica_header if external else None,
                    )
                )
                for replica in targets
            ]  # fmt: skip
            yield fleet, FleetClient(
                clients, router, metrics_urls=metrics_urls, attributes_replicas=not external,
                pages_source=pages_source, on_pages=on_pages, replica_names=names,
            )  # fmt: skip
