"""``--set dotted.path=value`` and ``${VAR}``/``${VAR:-default}`` in scenario files: typed values, one-line errors
naming the path (and the keys allowed there) or the file, field and variable, and a stored scenario that is the
effective one with every secret a variable brought in still redacted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.errors import RunDirError, ScenarioError
from common.redact import REDACTED
from harness.scenario.spec import load_scenario
from harness.store.manifest import Manifest
from harness.store.rundir import RunDir
from workloads.config import MultiRoundQAProbe

VLLM = """\
name: env-{tag}
description: ${{DESCRIPTION:-a probe}}
engine:
  kind: vllm
  model: {model}
  env:
    HF_TOKEN: ${{HF_TOKEN}}
  extra_args: ["--max-num-seqs", "8"]
arms:
  - name: ${{ARM:-AMG-OFF}}
    offload: ${{OFFLOAD:-off}}
  - name: AMG-ON
    offload: cpu
workload:
  kind: multi_round_qa
  context_tokens: [64, 128]
  conversations: ${{CONVERSATIONS:-2}}
  turns: 2
"""


def scenario_file(tmp_path: Path, tag: str = "a") -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    path = tmp_path / f"{tag}.yaml"
    path.write_text(VLLM.format(tag=tag, model=model), encoding="utf-8")
    return path


def probe(scenario: object) -> MultiRoundQAProbe:
    workload = getattr(scenario, "workload", None)
    assert isinstance(workload, MultiRoundQAProbe)
    return workload


# -- ${VAR} ------------------------------------------------------------------------------------------------------
def test_defaults_fill_unset_variables_typed_as_the_file_would_type_them(tmp_path: Path) -> None:
    scenario, _ = load_scenario(scenario_file(tmp_path), environ={"HF_TOKEN": "hf_unit0000000000"})
    assert scenario.description == "a probe"
    assert scenario.arms[0].name == "AMG-OFF" and scenario.arms[0].offload == "off"  # YAML 1.2: off is a string
    assert probe(scenario).conversations == 2  # a plain ${...} is typed: an int, as `conversations: 2` is
    assert scenario.engine.env == {"HF_TOKEN": "hf_unit0000000000"}  # type: ignore[union-attr]


def test_set_variables_win_over_defaults(tmp_path: Path) -> None:
    environ = {"HF_TOKEN": "hf_unit1111111111", "CONVERSATIONS": "5", "ARM": "BASE", "DESCRIPTION": "x: y # z"}
    scenario, _ = load_scenario(scenario_file(tmp_path), environ=environ)
    assert probe(scenario).conversations == 5 and scenario.arms[0].name == "BASE"
    assert scenario.description == "x: y # z"  # a value is text, never YAML structure


def test_a_quoted_reference_stays_a_string(tmp_path: Path) -> None:
    path = scenario_file(tmp_path)
    path.write_text(path.read_text(encoding="utf-8") + '  question_tokens: "${QUESTION:-16}"\n', encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"workload\.question_tokens") as caught:
        load_scenario(path, environ={"HF_TOKEN": "hf_unit2222222222"})
    assert "(got '16')" in str(caught.value)


def test_an_unset_variable_without_default_names_file_field_and_variable(tmp_path: Path) -> None:
    path = scenario_file(tmp_path)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path, environ={})
    message = str(caught.value)
    assert len(message.splitlines()) == 1
    assert str(path) in message and "engine.env.HF_TOKEN" in message and "${HF_TOKEN} is not set" in message


def test_dollar_dollar_is_a_literal_dollar(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: lit\ndescription: costs $$5 and $${NOT_EXPANDED}\n"
        "engine: {kind: sim, model: llama-3.1-8b, hardware: h100-sxm}\n"
        "arms: [{name: A, offload: 'off'}]\nworkload: {kind: multi_round_qa, context_tokens: [64]}\n",
        encoding="utf-8",
    )
    scenario, _ = load_scenario(path, environ={"NOT_EXPANDED": "oops"})
    assert scenario.description == "costs $5 and ${NOT_EXPANDED}"


def test_an_expanded_secret_is_never_stored(tmp_path: Path) -> None:
    token = "hf_EnvStored9f8e7d6c5b"
    api_key = "plainLookingValue-93xq"  # no pattern would find it: only its variable's name says it is secret
    environ = {"HF_TOKEN": token, "DESCRIPTION": f"probe with ${api_key}", "SERVICE_API_KEY": api_key}
    path = scenario_file(tmp_path)
    path.write_text(
        path.read_text(encoding="utf-8").replace("${DESCRIPTION:-a probe}", "'probe ${SERVICE_API_KEY}'"),
        encoding="utf-8",
    )
    scenario, source = load_scenario(path, environ=environ)
    assert scenario.engine.env["HF_TOKEN"] == token  # type: ignore[union-attr]
    assert api_key in scenario.description  # the run itself uses the real values
    run_dir = RunDir.create(tmp_path / "runs", scenario)
    Manifest.start(run_dir.manifest_file, scenario, source, 0).finish("completed")
    for stored in (run_dir.scenario_file, run_dir.manifest_file):
        text = stored.read_text(encoding="utf-8")
        assert token not in text and api_key not in text, stored.name
    assert run_dir.scenario().description == f"probe {REDACTED}"


# -- --set -------------------------------------------------------------------------------------------------------
def test_set_changes_typed_fields_list_items_and_missing_sections() -> None:
    scenario, _ = load_scenario(
        "quickstart",
        [
            "workload.conversations=4",
            "workload.context_tokens=[1000, 8000]",
            "arms.1.name=ON",
            "arms.0.offload=off",
            "soak.window=4h",
            "workload.between_turns.mode=none",
        ],
    )
    assert probe(scenario).conversations == 4 and probe(scenario).context_tokens == [1000, 8000]
    assert [arm.name for arm in scenario.arms] == ["AMG-OFF", "ON"] and scenario.arms[0].offload == "off"
    assert scenario.soak is not None and scenario.soak.window == 4 * 3600
    assert probe(scenario).between_turns.mode == "none"


def test_set_later_wins_and_reaches_engine_lists(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, "b")
    sets = ["engine.extra_args=[--enforce-eager]", "workload.question_tokens=8", "workload.turns=3", "workload.turns=4"]
    scenario, _ = load_scenario(path, sets, environ={"HF_TOKEN": "hf_unit3333333333"})
    assert scenario.engine.extra_args == ["--enforce-eager"]  # type: ignore[union-attr]
    assert probe(scenario).turns == 4


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("workload.bogus=1", "--set workload.bogus: no field 'bogus' in workload; allowed: answer_tokens, api,"),
        ("bogus=1", "--set bogus: no field 'bogus' in (top level); allowed: arm_order, arms,"),
        ("engine.extra_args=[x]", "--set engine.extra_args: no field 'extra_args' in engine; allowed: block_tokens"),
        ("arms.2.name=X", "--set arms.2.name: arms is a list of 2; give an index 0..1"),
        ("arms.first.name=X", "--set arms.first.name: arms is a list of 2; give an index 0..1"),
        ("engine.model.size=1", "--set engine.model.size: engine.model is a value, not a section"),
        ("workload.conversations", "--set 'workload.conversations': give dotted.path=value"),
        ("workload..turns=2", "give dotted.path=value"),
        ("name=[unclosed", "--set name: the value '[unclosed' is not YAML"),
    ],
)
def test_a_bad_path_is_one_line_naming_it_and_what_is_allowed(override: str, expected: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        load_scenario("quickstart", [override])
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and expected in message, message


def test_a_bad_value_is_reported_by_validation_naming_the_override() -> None:
    with pytest.raises(ScenarioError) as caught:
        load_scenario("quickstart", ["workload.conversations=-1"])
    message = str(caught.value)
    assert "with --set workload.conversations=-1" in message
    assert "workload.conversations: Input should be greater than or equal to 1 (got -1)" in message


def test_a_secret_set_on_the_command_line_is_never_stored(tmp_path: Path) -> None:
    token = "setOnTheCommandLine-7f3a"
    path = scenario_file(tmp_path, "c")
    scenario, _ = load_scenario(path, [f"engine.env.HF_TOKEN={token}"], environ={"HF_TOKEN": "x"})
    assert scenario.engine.env["HF_TOKEN"] == token  # type: ignore[union-attr]
    run_dir = RunDir.create(tmp_path / "runs", scenario)
    assert token not in run_dir.scenario_file.read_text(encoding="utf-8")


def test_resume_re_applies_the_same_set_to_the_original_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_resume44444444444")
    path = scenario_file(tmp_path, "d")
    sets = ["workload.conversations=3"]
    scenario, source = load_scenario(path, sets)
    run_dir = RunDir.create(tmp_path / "runs", scenario)
    Manifest.start(run_dir.manifest_file, scenario, source, 0).finish("interrupted")
    assert REDACTED in run_dir.scenario_file.read_text(encoding="utf-8")  # so resuming reads the original file
    resumed = run_dir.resume_scenario(sets)
    assert probe(resumed).conversations == 3 and resumed.engine.env["HF_TOKEN"] == "hf_resume44444444444"  # type: ignore[union-attr]
    with pytest.raises(RunDirError, match="give the same ones with --resume"):
        run_dir.resume_scenario()
    stored = json.loads(run_dir.manifest_file.read_text(encoding="utf-8"))["scenario"]
    assert stored["workload"]["conversations"] == 3  # the manifest keeps the effective scenario too


def test_resume_of_a_run_without_secrets_refuses_set(tmp_path: Path) -> None:
    scenario, _ = load_scenario("quickstart", ["workload.conversations=1"])
    run_dir = RunDir.create(tmp_path / "runs", scenario)
    assert probe(run_dir.resume_scenario()).conversations == 1
    with pytest.raises(RunDirError, match="--set cannot change it"):
        run_dir.resume_scenario(["workload.conversations=2"])
