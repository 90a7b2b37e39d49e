"""Scenario checks that span sections for fleets (engine replicas x routing x Prometheus x sweep).

Each section validates itself (:mod:`harness.engines.replicas`); :func:`check_fleet` raises
``ValueError`` (the scenario loader names the file) where two sections disagree.
"""

from __future__ import annotations

from harness.engines.base import EngineConfigModel
from harness.engines.configs import OpenAIEngineConfig
from harness.engines.replicas import PrometheusSpec, ReplicaFields, RoutingSpec


def check_fleet(
    engine: EngineConfigModel, routing: RoutingSpec, prometheus: PrometheusSpec | None, client_workers: int
) -> None:
    size = engine.fleet_size if isinstance(engine, ReplicaFields) else 1
    attached = isinstance(engine, OpenAIEngineConfig) and not engine.routed_by_kvbench
    if routing.router is not None:
        if attached:
            raise ValueError(
                "routing.router starts a router in front of replicas whose URLs kvbench knows: an engine kind it "
                "starts, or kind 'openai' with a url for every engine.endpoints entry (not base_url = a router)"
            )
    elif routing.policy == "external":
        if not isinstance(engine, OpenAIEngineConfig) or not engine.base_url or engine.routed_by_kvbench:
            raise ValueError(
                "routing.policy 'external' needs routing.router (a router kvbench starts), or engine kind 'openai' "
                "with base_url = the router and endpoints listing only each replica's metrics_url"
            )
        if (
            routing.attribution == "metrics"
            and engine.endpoints
            and any(endpoint.metrics_url is None for endpoint in engine.endpoints)
        ):
            raise ValueError(
                "routing.attribution 'metrics' needs a metrics_url for every engine.endpoints entry "
                "(or attribution: header with replica_header, or none)"
            )
    elif isinstance(engine, OpenAIEngineConfig) and engine.endpoints and not engine.routed_by_kvbench:
        raise ValueError(
            f"routing.policy {routing.policy!r}: kvbench routes itself, so every engine.endpoints entry needs a url "
            "(or use policy 'external' with a router at base_url)"
        )
    if size > 1 and client_workers > 1:
        raise ValueError(
            "sweep.client_workers > 1 is not supported with engine replicas (routing keeps per-conversation "
            "state in one process); set sweep.client_workers: 1"
        )
    if prometheus is not None and len(prometheus.replicas) != size:
        raise ValueError(f"prometheus.replicas lists {len(prometheus.replicas)} replicas; the fleet has {size}")
