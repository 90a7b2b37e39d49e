"""Flags-only runs: the scenario :func:`harness.scenario.flags.scenario_from_flags` builds, and its one-line errors.

The model discovery is stubbed here (``discover``); the attached-endpoint tests
(``tests/integration/test_flags_endpoint.py``) run it against real servers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import ScenarioError
from harness.engines.configs import OpenAIEngineConfig
from harness.scenario.flags import EndpointFlags, FlagKind, scenario_from_flags, tier_declaration
from workloads.config import MultiRoundQAProbe, MultiUserQA, TraceReplay


class Served:
    """A stand-in for GET /v1/models: always ``model``; remembers the URLs asked."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.asked: list[str] = []

    def __call__(self, url: str, api_key: str | None) -> str:
        self.asked.append(url)
        return self.model


def test_one_endpoint_is_one_arm_with_the_probe_defaults_and_the_discovered_model() -> None:
    discover = Served("m-1")
    scenario = scenario_from_flags(
        "probe", EndpointFlags(base_url="http://127.0.0.1:8000/v1/", contexts="32000,8000"), discover=discover
    )
    assert discover.asked == ["http://127.0.0.1:8000"]
    engine = scenario.engine
    assert isinstance(engine, OpenAIEngineConfig)
    assert (engine.model, engine.base_url, engine.arm_urls) == ("m-1", "http://127.0.0.1:8000", {})
    assert [(arm.name, arm.offload) for arm in scenario.arms] == [("endpoint", "hbm")]
    workload = scenario.workload
    assert isinstance(workload, MultiRoundQAProbe)
    defaults = MultiRoundQAProbe.model_validate({"kind": "multi_round_qa", "context_tokens": [16]})
    assert workload.context_tokens == [8000, 32000]
    assert (workload.conversations, workload.turns, workload.answer_tokens) == (
        defaults.conversations,
        defaults.turns,
        defaults.answer_tokens,
    )
    assert workload.between_turns.mode == "auto" and workload.between_turns.gpu_kv_tokens is None


def test_arms_compare_endpoints_first_is_baseline_unless_named_and_profiles_are_declared() -> None:
    flags = EndpointFlags(
        arms=("OFF=http://a:1/v1", "ON:cpu=https://b/v1"), model="m", conversations=3, turns=3, answer_tokens=4
    )
    scenario = scenario_from_flags("probe", flags, discover=lambda url, key: pytest.fail("--model was given"))
    engine = scenario.engine
    assert isinstance(engine, OpenAIEngineConfig)
    assert engine.base_url is None and engine.arm_urls == {"OFF": "http://a:1", "ON": "https://b"}
    assert [(arm.name, arm.offload) for arm in scenario.arms] == [("OFF", "hbm"), ("ON", "cpu")]
    assert scenario.baseline_arm == "OFF"
    workload = scenario.probe_workload
    assert (workload.conversations, workload.turns, workload.answer_tokens) == (3, 3, 4)
    named = scenario_from_flags("probe", EndpointFlags(arms=flags.arms, model="m", baseline="ON"))
    assert named.baseline_arm == "ON"


def test_sweep_and_replay_flags(tmp_path: Path) -> None:
    sweep = scenario_from_flags(
        "sweep",
        EndpointFlags(base_url="http://h:1", model="m", concurrency="16,1,4", duration="5s", contexts="1000"),
    )
    assert sweep.sweep is not None and sweep.sweep.values == [1, 4, 16] and sweep.sweep.duration == 5
    assert isinstance(sweep.workload, MultiUserQA) and sweep.workload.users == 32  # 2 x the largest concurrency
    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    replay = scenario_from_flags("replay", EndpointFlags(base_url="http://h:1", model="m", trace=trace))
    assert isinstance(replay.workload, TraceReplay) and replay.workload.path == str(trace.resolve())


def test_gpu_kv_tokens_sizes_the_auto_filler() -> None:
    flags = EndpointFlags(base_url="http://127.0.0.1:8000/v1", gpu_kv_tokens=1_408_240)
    workload = scenario_from_flags("probe", flags, discover=lambda url, key: "m").workload
    assert isinstance(workload, MultiRoundQAProbe)
    assert (workload.between_turns.mode, workload.between_turns.gpu_kv_tokens) == ("auto", 1_408_240)


def test_several_endpoints_serving_different_models_need_model() -> None:
    models = iter(["a", "b"])
    with pytest.raises(ScenarioError, match=r"different models .* choose one with --model NAME"):
        scenario_from_flags(
            "probe", EndpointFlags(arms=("X=http://h:1", "Y=http://h:2")), discover=lambda url, key: next(models)
        )


@pytest.mark.parametrize(
    ("kind", "flags", "message"),
    [
        ("probe", EndpointFlags(arms=("foo",)), r"^--arm 'foo': give NAME=URL"),
        ("probe", EndpointFlags(base_url="ftp://h/v1"), r"^--base-url 'ftp://h/v1': give an http:// or https:// URL"),
        ("probe", EndpointFlags(base_url="127.0.0.1:8000"), r"give an http:// or https:// URL"),
        ("probe", EndpointFlags(arms=("A=http://h:1",), baseline="Z"), r"^--baseline 'Z': no such arm; arms: A$"),
        ("probe", EndpointFlags(arms=("A:gpu=http://h:1",)), r"unknown offload profile 'gpu'; allowed: cpu, disk,"),
        ("probe", EndpointFlags(arms=("A=http://h:1", "A=http://h:2")), r"arm 'A' given twice"),
        ("probe", EndpointFlags(base_url="http://h", offload="dram"), r"^--offload: unknown offload profile 'dram';"),
        ("probe", EndpointFlags(arms=("A=http://h:1",), offload="cpu"), r"^--offload goes with --base-url URL; with"),
        ("probe", EndpointFlags(base_url="http://h", arms=("A=http://h:1",)), r"not both"),
        ("probe", EndpointFlags(base_url="http://h", contexts="8k"), r"^--contexts '8k': give whole numbers"),
        ("probe", EndpointFlags(base_url="http://h", turns=1), r"^--turns: .*greater than or equal to 2"),
        ("probe", EndpointFlags(base_url="http://h", concurrency="1"), r"^--concurrency: kvbench run does not take"),
        ("sweep", EndpointFlags(base_url="http://h"), r"needs --concurrency"),
        ("sweep", EndpointFlags(base_url="http://h", concurrency="1", duration="soon"), r"^--duration: expected"),
        ("replay", EndpointFlags(base_url="http://h"), r"needs --trace FILE"),
        ("replay", EndpointFlags(base_url="http://h", trace=Path("/nonexistent/t.jsonl")), r"no such file"),
        ("probe", EndpointFlags(base_url="http://h", api_key_env="sk-123"), r"give the NAME of an environment"),
        ("probe", EndpointFlags(base_url="http://h", tokenizer="/nonexistent/dir"), r"^--tokenizer .*no such file"),
        ("probe", EndpointFlags(base_url="http://h", gpu_kv_tokens=0), r"^--gpu-kv-tokens: .*greater than or equal to"),
        ("sweep", EndpointFlags(base_url="http://h", concurrency="1", gpu_kv_tokens=99), r"^--gpu-kv-tokens: kvbench"),
    ],
)
def test_bad_flags_are_one_line_errors_naming_the_flag(kind: FlagKind, flags: EndpointFlags, message: str) -> None:
    with pytest.raises(ScenarioError, match=message) as caught:
        scenario_from_flags(kind, flags, discover=lambda url, key: "m")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("profile", ["cpu", "disk", "off"])
def test_offload_declares_what_the_one_endpoint_offloads(profile: str) -> None:
    flags = EndpointFlags(base_url="http://127.0.0.1:8000/v1", offload=profile, model="m")
    scenario = scenario_from_flags("probe", flags)
    assert [(arm.name, arm.offload) for arm in scenario.arms] == [("endpoint", profile)]
    assert scenario.arms[0].profile.offload_enabled == (profile != "off" and profile != "hbm")


@pytest.mark.parametrize(
    ("command", "declared"),
    [
        (["kvbench", "run", "--base-url", "http://h/v1", "--contexts", "8000"], "--offload cpu"),
        (["kvbench", "sweep", "--base-url=http://h/v1"], "--offload cpu"),
        (["kvbench", "run", "--arm", "OFF=http://a/v1", "--arm", "ON=http://b/v1"], "--arm ON:cpu=URL"),
        (["kvbench", "run", "--arm=ON=http://b/v1"], "--arm ON:cpu=URL"),
        (["kvbench", "run", "scenario.yaml", "--arm", "ON"], "arms[1].offload: cpu"),
        ([], "arms[1].offload: cpu"),
    ],
)
def test_an_undeclared_tier_is_declared_the_way_the_run_was_started(command: list[str], declared: str) -> None:
    assert tier_declaration(command, "ON", 1, "cpu") == declared
