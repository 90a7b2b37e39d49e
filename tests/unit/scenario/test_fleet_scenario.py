"""Fleet sections of a scenario: one clear line naming the file, the field and what is allowed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.errors import ScenarioError
from harness.scenario.spec import parse_scenario

FLEET_SIM = Path(__file__).resolve().parents[3] / "scenarios" / "fleet-sim.yaml"
ROUTER = {"kind": "vllm-router", "policy": "consistent_hash"}


def _scenario(change: Callable[[dict[str, Any]], None]) -> None:
    data: dict[str, Any] = yaml.safe_load(FLEET_SIM.read_text())
    change(data)
    parse_scenario(data, "fleet.yaml")


def behind_a_router(endpoints: list[dict[str, str]]) -> dict[str, object]:
    """An ``openai`` engine reached through a router at ``http://router:1``, its replicas ``endpoints``."""
    return {"kind": "openai", "model": "m", "base_url": "http://router:1", "endpoints": endpoints}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["routing"].update(policy="sticky"), r"routing\.policy: .*'round_robin'.*'external'"),
        (lambda d: d["routing"].update(policy="external"), r"needs routing\.router .*or engine kind 'openai'"),
        (
            lambda d: d["arms"][0].update(routing={"policy": "external"}),
            r"needs routing\.router .*engine kind 'openai'",
        ),
        (lambda d: d["routing"].update(router=ROUTER), "apply to policy 'external' only, not 'round_robin'"),
        (
            lambda d: d["routing"].update(policy="external", router={**ROUTER, "policy": "sticky"}),
            r"routing\.router: .*policy 'sticky' is not a vllm-router policy; one of: round_robin, .*consistent_hash",
        ),
        (
            lambda d: d["routing"].update(policy="external", router={**ROUTER, "kind": "dynamo"}),
            r"routing\.router\.kind: .*'vllm-router'",
        ),
        (
            lambda d: d["routing"].update(policy="external", router=ROUTER, attribution="header"),
            "attribution 'header' needs replica_header",
        ),
        (
            lambda d: d.update(
                engine=behind_a_router([{"metrics_url": "http://a/metrics"}, {"metrics_url": "http://b/metrics"}]),
                routing={"policy": "external", "router": ROUTER},
            ),
            "routing.router starts a router in front of replicas whose URLs kvbench knows",
        ),
        (
            lambda d: d.update(
                engine=behind_a_router([{"metrics_url": "http://a/metrics"}, {"name": "b"}]),
                routing={"policy": "external", "attribution": "metrics"},
            ),
            "attribution 'metrics' needs a metrics_url for every engine.endpoints entry",
        ),
        (lambda d: d["engine"].update(gpus=[0]), r"engine: .*replicas × gpus_per_replica = 2"),
        (lambda d: d.update(prometheus={"url": "http://p", "replicas": ["a"]}), "the fleet has 2"),
    ],
)
def test_bad_fleet_sections(change: Callable[[dict[str, Any]], None], message: str) -> None:
    with pytest.raises(ScenarioError, match=message) as error:
        _scenario(change)
    assert str(error.value).startswith("fleet.yaml: invalid scenario")


def test_client_workers_need_one_replica() -> None:
    def sweep(data: dict[str, Any]) -> None:
        data["workload"] = {
            "kind": "multi_user_qa", "rounds": {"dist": "fixed", "value": 2},
            "context_tokens": {"dist": "fixed", "value": 100},
        }  # fmt: skip
        data["sweep"] = {"mode": "concurrency", "values": [2], "client_workers": 2}

    with pytest.raises(ScenarioError, match="client_workers"):
        _scenario(sweep)


def test_bundled_fleet_scenario_is_a_fleet() -> None:
    data: dict[str, Any] = yaml.safe_load(FLEET_SIM.read_text())
    scenario = parse_scenario(data, "fleet.yaml")
    assert scenario.engine.fleet_size == 2
    assert [(arm.routing or scenario.routing).policy for arm in scenario.arms] == [
        "round_robin",
        "round_robin",
        "session_affinity",
        "random",
    ]


def test_router_section_defaults() -> None:
    def external(data: dict[str, Any]) -> None:
        data["routing"] = {"policy": "external", "router": {**ROUTER, "extra_args": ["--log-level", "warning"]}}

    data: dict[str, Any] = yaml.safe_load(FLEET_SIM.read_text())
    external(data)
    routing = parse_scenario(data, "fleet.yaml").routing
    assert routing.router is not None and routing.router.header == "X-Session-ID"  # what consistent_hash hashes
    assert routing.attributed_by == "metrics"  # it names the replica in no header
    launch = routing.router.launch("py", 1, 2, ["http://a:1", "http://b:2"])
    argv = routing.router.row.argv(launch)
    assert argv[:3] == ("py", "-m", "vllm_router.launch_router")
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--worker-urls") + 3] == ("http://a:1", "http://b:2")
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[-2:] == ("--log-level", "warning")
