"""Fleet sections of a scenario: one clear line naming the file, the field and what is allowed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.scenario.spec import parse_scenario
from kvbench.errors import ScenarioError

FLEET_SIM = Path(__file__).resolve().parents[3] / "scenarios" / "fleet-sim.yaml"


def _scenario(change: Callable[[dict[str, Any]], None]) -> None:
    data: dict[str, Any] = yaml.safe_load(FLEET_SIM.read_text())
    change(data)
    parse_scenario(data, "fleet.yaml")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["routing"].update(policy="sticky"), r"routing\.policy: .*'round_robin'.*'external'"),
        (lambda d: d["routing"].update(policy="external"), "needs engine kind 'openai'"),
        (lambda d: d["arms"][0].update(routing={"policy": "external"}), "needs engine kind 'openai'"),
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
