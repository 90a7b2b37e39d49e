"""Scenario YAML is read as the user meant (R13): `offload: off` is the profile "off", an arm named ON is "ON".

YAML 1.1 turns on/off/yes/no into booleans; scenarios use YAML 1.2's booleans (true/false only).
Errors name the field as written in the file, without pydantic's union labels.
"""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from harness.scenario.spec import load_scenario
from kvbench.cli import app

SCENARIO = """
name: yaml-words
engine: {kind: sim, model: llama-3.1-8b, hardware: h100-sxm}
arms:
  - name: ON
    offload: cpu
  - name: OFF
    offload: off
  - name: yes
    offload: 'off'
workload: {kind: multi_round_qa, context_tokens: [1000]}
"""


def test_on_off_yes_are_names_and_profiles_not_booleans(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO, encoding="utf-8")
    scenario, _ = load_scenario(path)
    assert [arm.name for arm in scenario.arms] == ["ON", "OFF", "yes"]
    assert [arm.profile.name for arm in scenario.arms] == ["cpu", "off", "off"]
    done = CliRunner().invoke(app, ["validate", str(path)])
    assert done.exit_code == 0, done.output


def test_a_wrong_offload_names_the_field_without_pydantic_labels(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("offload: 'off'", "offload: 5"), encoding="utf-8")
    done = CliRunner().invoke(app, ["validate", str(path)])
    assert done.exit_code != 0
    problems = [line for line in done.output.splitlines() if line.startswith("  - ")]
    assert problems == [
        "  - arms.2.offload: Input should be a valid string (got 5) or Input should be a valid dictionary or "
        "instance of OffloadProfile (got 5)"
    ]
    assert "function-after" not in done.output and ".str:" not in done.output
