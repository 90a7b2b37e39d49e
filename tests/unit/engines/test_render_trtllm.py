"""Rendering offload profiles into TensorRT-LLM's LLM-API YAML and the trtllm-serve command line.

TensorRT-LLM cannot be installed here, so these tests pin the documented format instead:
``trtllm-serve MODEL --host H --port P --backend pytorch --extra_llm_api_options FILE`` (click
options of ``tensorrt_llm/commands/serve.py``; ``serve`` is the default command) and the
``KvCacheConfig`` fields of ``tensorrt_llm/llmapi/llm_args.py``: ``enable_block_reuse`` (bool),
``host_cache_size`` (int, **bytes**), ``free_gpu_memory_fraction`` (0..1), ``tokens_per_block``;
plus the LLM arguments ``return_perf_metrics`` (Prometheus text on ``/prometheus/metrics``) and
``enable_iter_perf_stats``. The lifecycle against a stand-in trtllm-serve is in
test_engine_lifecycle.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from common.errors import ScenarioError
from harness.engines.base import LaunchContext
from harness.engines.configs import TrtllmEngineConfig
from harness.engines.trtllm import (
    SERVE_ENV_VAR,
    TrtllmEngine,
    build_trtllm_argv,
    build_trtllm_env,
    resolve_serve,
    served_model_name,
)
from harness.engines.trtllm_offload import RESET_ADVICE, SUPPORTED, check_supported, render_trtllm_options
from harness.scenario.spec import parse_scenario
from offload.profiles import BUILTIN_PROFILES, OffloadProfile, OffloadTier

KV_CACHE_CONFIG_FIELDS = {
    "enable_block_reuse",
    "max_tokens",
    "free_gpu_memory_fraction",
    "host_cache_size",
    "tokens_per_block",
    "enable_partial_reuse",
    "copy_on_partial_reuse",
    "onboard_blocks",
}
"""KvCacheConfig fields as documented (nvidia.github.io/TensorRT-LLM, llm-api/reference/KvCacheConfig)."""


def trtllm_config(**overrides: Any) -> TrtllmEngineConfig:
    return TrtllmEngineConfig.model_validate({"kind": "trtllm", "model": "/models/Llama-3.1-8B-Instruct", **overrides})


def options(profile: OffloadProfile, prefix_caching: bool = True, **overrides: Any) -> dict[str, Any]:
    plan = render_trtllm_options(profile, trtllm_config(**overrides), prefix_caching)
    loaded: dict[str, Any] = yaml.safe_load(plan.yaml_text())
    assert loaded == plan.options  # the YAML says exactly what the plan says
    return loaded


# ------------------------------------------------------------------------------------- rendering


def test_cpu_tier_is_host_cache_size_in_bytes() -> None:
    rendered = options(BUILTIN_PROFILES["cpu"])
    assert rendered == {
        "kv_cache_config": {
            "enable_block_reuse": True,
            "free_gpu_memory_fraction": 0.9,
            "host_cache_size": 64_000_000_000,  # 64 GB (1e9 bytes each), an int
        },
        "return_perf_metrics": True,
        "enable_iter_perf_stats": True,
    }
    assert isinstance(rendered["kv_cache_config"]["host_cache_size"], int)
    assert set(rendered["kv_cache_config"]) <= KV_CACHE_CONFIG_FIELDS
    plan = render_trtllm_options(BUILTIN_PROFILES["cpu"], trtllm_config(), True)
    assert plan.host_cache_bytes == 64_000_000_000 and plan.prefix_caching
    assert any("host_cache_size 64000000000 bytes" in note for note in plan.notes)


def test_fractional_gb_rounds_to_whole_bytes() -> None:
    tiny = OffloadProfile(name="t", tiers=(OffloadTier(kind="cpu", capacity_gb=1.5),))
    assert options(tiny)["kv_cache_config"]["host_cache_size"] == 1_500_000_000


def test_host_cache_is_sized_per_rank() -> None:
    rendered = options(BUILTIN_PROFILES["cpu"], parallelism={"tp": 2, "pp": 2})
    assert rendered["kv_cache_config"]["host_cache_size"] == 16_000_000_000  # 64 GB over 4 ranks
    plan = render_trtllm_options(BUILTIN_PROFILES["cpu"], trtllm_config(parallelism={"tp": 2, "pp": 2}), True)
    assert any("per rank (4 ranks)" in note for note in plan.notes)


def test_prefix_caching_is_block_reuse() -> None:
    assert options(BUILTIN_PROFILES["hbm"])["kv_cache_config"] == {
        "enable_block_reuse": True,
        "free_gpu_memory_fraction": 0.9,
    }
    assert options(BUILTIN_PROFILES["off"])["kv_cache_config"]["enable_block_reuse"] is False
    runner_off = options(BUILTIN_PROFILES["hbm"], prefix_caching=False)  # between_turns=disable_prefix_cache
    assert runner_off["kv_cache_config"]["enable_block_reuse"] is False


def test_engine_settings_in_the_yaml() -> None:
    rendered = options(
        BUILTIN_PROFILES["hbm"],
        free_gpu_memory_fraction=0.75,
        tokens_per_block=64,
        dtype="bfloat16",
        load_format="dummy",
        enable_metrics=False,
    )
    assert rendered == {
        "kv_cache_config": {"enable_block_reuse": True, "free_gpu_memory_fraction": 0.75, "tokens_per_block": 64},
        "dtype": "bfloat16",
        "load_format": "dummy",
    }


def test_extra_options_are_merged_under_what_kvbench_renders() -> None:
    rendered = options(
        BUILTIN_PROFILES["cpu"],
        extra_llm_api_options={
            "kv_cache_config": {"enable_partial_reuse": False, "tokens_per_block": 16},
            "max_beam_width": 1,
            "return_perf_metrics": False,
        },
        tokens_per_block=32,
    )
    kv = rendered["kv_cache_config"]
    assert kv["enable_partial_reuse"] is False and kv["host_cache_size"] == 64_000_000_000
    assert kv["tokens_per_block"] == 32  # the config's own field wins
    assert rendered["max_beam_width"] == 1
    assert rendered["return_perf_metrics"] is True  # enable_metrics (the default) wins


def test_rendered_keys_cannot_be_set_through_extra_options() -> None:
    with pytest.raises(ValidationError, match=r"sets \['enable_block_reuse', 'host_cache_size'\]"):
        trtllm_config(extra_llm_api_options={"kv_cache_config": {"host_cache_size": 1, "enable_block_reuse": False}})


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        (BUILTIN_PROFILES["disk"], r"tiers \['cpu', 'disk'\] are not supported"),
        (BUILTIN_PROFILES["shared"], r"tiers \['cpu', 'shared'\] are not supported"),
        (
            OffloadProfile(name="lm", backend="lmcache", tiers=(OffloadTier(kind="cpu", capacity_gb=8),)),
            "backend 'lmcache' is vLLM's",
        ),
        (
            OffloadProfile(name="nc", prefix_caching=False, tiers=(OffloadTier(kind="cpu", capacity_gb=8),)),
            "only serves block reuse",
        ),
    ],
)
def test_unsupported_profiles_say_what_is_supported(profile: OffloadProfile, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        check_supported(profile, trtllm_config())
    assert SUPPORTED in str(caught.value)
    with pytest.raises(ValueError, match=message):
        render_trtllm_options(profile, trtllm_config(), True)


def test_cpu_tier_with_the_gpu_cache_off_is_refused() -> None:
    with pytest.raises(ValueError, match="only serves block reuse"):
        render_trtllm_options(BUILTIN_PROFILES["cpu"], trtllm_config(), False)
    with pytest.raises(ValueError, match="disable_prefix_cache"):
        check_supported(BUILTIN_PROFILES["cpu"], trtllm_config(), between_turns="disable_prefix_cache")
    check_supported(BUILTIN_PROFILES["hbm"], trtllm_config(), between_turns="disable_prefix_cache")


def test_reset_between_turns_is_refused_with_advice() -> None:
    for name in ("off", "hbm", "cpu"):
        with pytest.raises(ValueError, match=r"'reset_prefix_cache' is not possible.*'filler'"):
            check_supported(BUILTIN_PROFILES[name], trtllm_config(), between_turns="reset_prefix_cache")
        check_supported(BUILTIN_PROFILES[name], trtllm_config(), between_turns="filler")
    assert "filler" in RESET_ADVICE


def test_engine_checks_the_profile_when_created(tmp_path: Path) -> None:
    context = LaunchContext(arm="a", profile=BUILTIN_PROFILES["disk"], log_dir=tmp_path, prefix_caching=True)
    with pytest.raises(ValueError, match="not supported"):
        TrtllmEngine(trtllm_config(), context)


# ------------------------------------------------------------------------------------- command line


def test_argv_is_the_documented_format() -> None:
    argv = build_trtllm_argv(trtllm_config(), "/opt/trt/bin/trtllm-serve", 8000, Path("/tmp/w/llm_api_options.yaml"))
    assert argv == (
        "/opt/trt/bin/trtllm-serve",
        "/models/Llama-3.1-8B-Instruct",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--backend",
        "pytorch",
        "--extra_llm_api_options",
        "/tmp/w/llm_api_options.yaml",
    )


def test_argv_with_sizes_parallelism_and_extra_args() -> None:
    config = trtllm_config(
        max_batch_size=128,
        max_num_tokens=8192,
        max_seq_len=32768,
        parallelism={"tp": 4, "pp": 2},
        extra_args=["--log_level", "info", "--trust_remote_code"],
    )
    argv = build_trtllm_argv(config, "trtllm-serve", 8001, Path("o.yaml"))
    text = " ".join(argv)
    for expected in (
        "--tp_size 4",
        "--pp_size 2",
        "--max_batch_size 128",
        "--max_num_tokens 8192",
        "--max_seq_len 32768",
    ):
        assert expected in text, expected
    assert argv[-3:] == ("--log_level", "info", "--trust_remote_code")
    assert "--free_gpu_memory_fraction" not in text  # it lives in the YAML's kv_cache_config
    assert build_trtllm_env(config.model_copy(update={"env": {"CUDA_VISIBLE_DEVICES": "0,1"}})) == {
        "PYTHONUNBUFFERED": "1",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }


def test_config_validation() -> None:
    with pytest.raises(ValidationError, match="no data-parallel flag"):
        trtllm_config(parallelism={"dp": 2})
    with pytest.raises(ValidationError):
        trtllm_config(backend="tensorrt")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        trtllm_config(kv_cache_free_gpu_memory_fraction=0.5)
    assert trtllm_config().startup_timeout_s == 1800


def test_serve_executable_and_served_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SERVE_ENV_VAR, raising=False)
    assert resolve_serve(trtllm_config()) == "trtllm-serve"
    monkeypatch.setenv(SERVE_ENV_VAR, "/opt/trt/bin/trtllm-serve")
    assert resolve_serve(trtllm_config()) == "/opt/trt/bin/trtllm-serve"
    assert resolve_serve(trtllm_config(trtllm_serve="/explicit/trtllm-serve")) == "/explicit/trtllm-serve"
    assert served_model_name(str(tmp_path)) == tmp_path.name  # a local checkpoint: its directory name
    assert served_model_name("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"


# ------------------------------------------------------------------------------------- scenarios


def trtllm_scenario(workload: dict[str, Any], *arms: str) -> dict[str, Any]:
    return {
        "name": "trtllm",
        "engine": {"kind": "trtllm", "model": "/m/llama", "load_format": "dummy"},
        "arms": [{"name": arm, "offload": arm} for arm in arms],
        "workload": workload,
    }


def test_scenario_with_trtllm() -> None:
    probe = {"kind": "multi_round_qa", "context_tokens": [4000]}
    reset = {**probe, "between_turns": {"mode": "reset_prefix_cache"}}
    with pytest.raises(ScenarioError, match=r"arm 'hbm'.*'reset_prefix_cache' is not possible.*'filler'"):
        parse_scenario(trtllm_scenario(reset, "hbm", "cpu"), "t.yaml")
    # the default mode, auto, never tries TensorRT-LLM's missing reset: it sends filler (sized at run time)
    assert isinstance(parse_scenario(trtllm_scenario(probe, "hbm", "cpu"), "t.yaml").engine, TrtllmEngineConfig)
    filler = {**probe, "between_turns": {"mode": "filler", "filler_tokens": 100000}}
    scenario = parse_scenario(trtllm_scenario(filler, "hbm", "cpu"), "t.yaml")
    assert isinstance(scenario.engine, TrtllmEngineConfig)
    with pytest.raises(ScenarioError, match=r"arm 'disk'.*not supported"):
        parse_scenario(trtllm_scenario(filler, "hbm", "disk"), "t.yaml")
    disable = {**probe, "between_turns": {"mode": "disable_prefix_cache"}}
    parse_scenario(trtllm_scenario(disable, "off", "hbm"), "t.yaml")
    with pytest.raises(ScenarioError, match=r"arm 'cpu'.*block reuse"):
        parse_scenario(trtllm_scenario(disable, "cpu"), "t.yaml")
