"""Hostile scenario files: refused at validation with the field named, never at run time."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from common.errors import ScenarioError
from harness.scenario.soak import soak_scenario
from harness.scenario.spec import load_scenario, parse_duration

BASE = """\
name: hostile
engine: {kind: sim, model: tiny, hardware: h100-sxm}
arms: [{name: AMG-OFF, offload: "off"}]
workload: {kind: multi_round_qa, context_tokens: [64], conversations: 1}
"""


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def refused(tmp_path: Path, patch: dict[str, object]) -> str:
    data = yaml.safe_load(BASE)
    for dotted, value in patch.items():
        target = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            target = target[part]
        target[leaf] = value
    path = write(tmp_path, yaml.safe_dump(data))
    with pytest.raises(ScenarioError) as error:
        load_scenario(path)
    return str(error.value)


def test_the_base_scenario_is_valid(tmp_path: Path) -> None:
    scenario, _ = load_scenario(write(tmp_path, BASE))
    assert scenario.workload.stall_timeout_s is None


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("workload.request_timeout_s", float("inf"), "workload.request_timeout_s"),
        ("workload.request_timeout_s", float("nan"), "workload.request_timeout_s"),
        ("workload.stall_timeout_s", float("inf"), "workload.stall_timeout_s"),
        ("repetitions", True, "repetitions"),
        ("workload.conversations", "3", "workload.conversations"),
        ("workload.conversations", 1_000_000_000, "workload.conversations"),
        ("workload.answer_tokens", 1.5, "workload.answer_tokens"),
        ("engine.model", "no-such-model", "engine.model"),
        ("engine.hardware", "abacus", "engine.hardware"),
    ],
)
def test_bad_values_are_refused_with_the_field_named(tmp_path: Path, field: str, value: object, shown: str) -> None:
    message = refused(tmp_path, {field: value})
    assert f"  - {shown}:" in message
    assert str(tmp_path / "s.yaml") in message


def test_yaml_inf_literal_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, BASE.replace("conversations: 1}", "conversations: 1, request_timeout_s: .inf}"))
    with pytest.raises(ScenarioError, match=r"workload\.request_timeout_s"):
        load_scenario(path)


def test_stall_timeout_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, BASE.replace("conversations: 1}", "conversations: 1, stall_timeout_s: 2.5}"))
    scenario, _ = load_scenario(path)
    assert scenario.workload.stall_timeout_s == 2.5


def test_non_utf8_file_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(BASE.replace("hostile", "caf\u00e9").encode("latin-1"))
    with pytest.raises(ScenarioError, match="not UTF-8") as error:
        load_scenario(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("text", ["1e400", "inf", "nan", "1e12"])
def test_absurd_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="finite and at most"):
        parse_duration(text)


def test_soak_window_flag_inf_names_the_field() -> None:
    scenario, _ = load_scenario("soak-sim")
    with pytest.raises((ScenarioError, ValueError), match="window"):
        soak_scenario(scenario, window_s=float("inf"))


def test_every_yaml_input_fails_as_its_own_kind_naming_the_file(tmp_path: Path) -> None:
    """Scenarios, playbooks, calibrations and published-table specs share one reader (common.yamlfile)."""
    from common.errors import CalibrationError
    from harness.gate.playbook import PlaybookError, load_playbook
    from harness.sim.calibration import Calibration
    from reports.published import PublishedError, load_spec

    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    for load, kind in (
        (load_playbook, PlaybookError),
        (Calibration.load, CalibrationError),
        (load_spec, PublishedError),
    ):
        with pytest.raises(kind, match=r"list\.yaml: expected a mapping at the top level, got list"):
            load(listed)
        with pytest.raises(kind, match=r"empty\.yaml: expected a mapping at the top level, got nothing"):
            load(empty)
        with pytest.raises(kind, match=r"missing\.yaml: cannot read"):
            load(tmp_path / "missing.yaml")
