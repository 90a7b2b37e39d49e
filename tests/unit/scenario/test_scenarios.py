"""Every YAML under scenarios/ (and lab/scenarios/, marker ``lab``) validates and the bundled ones say what they
measure; bad files fail with file, field path and allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from common.errors import ScenarioError
from harness.scenario.spec import bundled_scenarios, load_scenario
from kvbench.cli import app
from tests.support import REPO

SCENARIO_FILES = sorted((REPO / "scenarios").rglob("*.yaml"))
LAB_SCENARIO_FILES = sorted((REPO / "lab" / "scenarios").glob("*.yaml"))

GOOD = """
name: t
engine: {kind: sim, model: llama-3.1-8b, hardware: h100-sxm}
arms: [{name: AMG-OFF, offload: "off"}, {name: AMG-ON, offload: cpu}]
workload: {kind: multi_round_qa, context_tokens: [1000]}
"""


@pytest.mark.parametrize(
    "path",
    [*SCENARIO_FILES, *(pytest.param(path, marks=pytest.mark.lab) for path in LAB_SCENARIO_FILES)],
    ids=lambda p: p.name,
)
def test_every_repo_scenario_validates(path: Path) -> None:
    scenario, _ = load_scenario(path)
    assert scenario.arms


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.name)
def test_every_bundled_scenario_has_a_one_line_description(path: Path) -> None:
    """``kvbench scenarios`` prints it beside the name: what the scenario measures, on what."""
    scenario, _ = load_scenario(path)
    assert scenario.description.strip(), f"{path.name}: no description"
    assert "\n" not in scenario.description.strip(), f"{path.name}: the description is more than one line"


def test_repo_has_scenarios_and_they_are_bundled() -> None:
    assert SCENARIO_FILES, "scenarios/ is empty"
    assert {p.stem for p in SCENARIO_FILES} <= set(bundled_scenarios())


def test_bundled_name_resolves() -> None:
    scenario, path = load_scenario("quickstart")
    assert path.name == "quickstart.yaml"
    assert scenario.baseline_arm == "AMG-OFF"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario(_write(tmp_path, text))
    return str(info.value)


def test_good_minimal(tmp_path: Path) -> None:
    scenario, _ = load_scenario(_write(tmp_path, GOOD))
    assert scenario.arms[1].profile.offload_enabled
    assert not scenario.arms[0].profile.prefix_caching


def test_unknown_field_lists_allowed_fields(tmp_path: Path) -> None:
    message = _error(tmp_path, GOOD.replace("context_tokens: [1000]", "context_tokens: [1000], turnz: 3"))
    assert "s.yaml" in message
    assert "workload.turnz" in message
    assert "allowed fields here" in message and "turns" in message


def test_bad_literal_names_allowed_values(tmp_path: Path) -> None:
    text = GOOD.replace("context_tokens: [1000]", "context_tokens: [1000], between_turns: {mode: flush}")
    message = _error(tmp_path, text)
    assert "workload.between_turns.mode" in message
    assert "reset_prefix_cache" in message and "'flush'" in message


def test_unknown_engine_kind_lists_kinds(tmp_path: Path) -> None:
    message = _error(tmp_path, GOOD.replace("kind: sim", "kind: tgi"))
    assert "engine" in message and "'sim'" in message


def test_unknown_offload_profile(tmp_path: Path) -> None:
    message = _error(tmp_path, GOOD.replace("offload: cpu", "offload: nvme"))
    assert "arms.1.offload" in message and "cpu, disk, hbm, off, shared" in message


def test_missing_field(tmp_path: Path) -> None:
    message = _error(tmp_path, GOOD.replace("name: t\n", ""))
    assert "name: required field is missing" in message


def test_duplicate_arms_and_bad_baseline(tmp_path: Path) -> None:
    message = _error(tmp_path, GOOD.replace("AMG-ON", "AMG-OFF"))
    assert "arm names must be unique" in message
    message = _error(tmp_path, GOOD + "compare: {baseline: NOPE}\n")
    assert "compare.baseline 'NOPE' is not an arm" in message


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    assert "not valid YAML" in _error(tmp_path, "name: [unclosed")
    with pytest.raises(ScenarioError, match="no such file"):
        load_scenario(tmp_path / "missing.yaml")


def test_scenario_is_immutable(tmp_path: Path) -> None:
    scenario, _ = load_scenario(_write(tmp_path, GOOD))
    with pytest.raises(ValueError, match="frozen"):
        scenario.seed = 3  # type: ignore[misc]  # frozen on purpose: the runtime refusal


def test_kvbench_scenarios_prints_each_name_with_its_description() -> None:
    result = CliRunner().invoke(app, ["scenarios"], terminal_width=400)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == len(bundled_scenarios())
    quickstart, _ = load_scenario("quickstart")
    assert any(line.split()[0] == "quickstart" and line.endswith(quickstart.description) for line in lines)
